"""Checks every converter family runs the same way (tests/convert/test_qwen3.py, test_llama3.py, ...): a GGUF
copied with
some tensors dropped or changed (for error tests), a tiny target / truncated-draft pair in each attention form, greedy
speculative decoding against the target alone, and the seeded Monte Carlo losslessness certificate with the broken
sampler it must catch."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

import specrt
from specrt.convert import convert
from specrt.convert.gguf_reader import GGUFModel
from specrt.convert.reference_forward import reference_logits
from specrt.convert.tiny import write_tiny_gguf
from test_convert_formats import IDS, Runner

FORMS = ("gqa", "gqa-graph", "batched")
#: Each family's tiny GGUF (``write_tiny_gguf`` keywords) with every structural feature of the family on.
FAMILIES: dict[str, dict] = {
    # llama.cpp's permuted q/k rows (NORM rotary) undone by the reader; an untied head
    "llama": {"arch": "llama", "tied": False, "matrix_type": "Q8_0"},
    # q/k/v biases, tied embeddings
    "qwen2": {"arch": "qwen2", "tied": True, "matrix_type": "Q8_0"},
    # q/k norms with weights ~ 1 +- 0.3, head_dim 32 over a 64 / 4 = 16 split, tied embeddings
    "qwen3": {"arch": "qwen3", "tied": True, "matrix_type": "Q8_0"},
    # Llama 3.x rope scaling strong at test lengths: of head_dim 16's 8 frequencies one kept, one interpolated,
    # six divided by 8 (original_max_position_embeddings 32); an untied head
    "llama3": {
        "arch": "llama",
        "tied": False,
        "matrix_type": "Q8_0",
        "rope_scaling_llama3": {
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
    },
    # Mistral as llama.cpp writes it (a llama file: permuted q/k rows), head_dim 16 under a 128 / 4 = 32 split (as
    # Mistral NeMo's 128 under 5120 / 32 = 160; ONNX Runtime's GroupQueryAttention needs multiples of 16), a sliding
    # window of 5 positions, shorter than every test's sequence; an untied head
    "mistral": {
        "arch": "mistral",
        "tied": False,
        "matrix_type": "Q8_0",
        "hidden": 128,
        "head_dim": 16,
        "sliding_window": 5,
    },
    # Phi-3 as llama.cpp writes Phi-3.5 / Phi-4-mini: fused attn_qkv and ffn_up (gate | up), partial rotary over 48 of
    # head_dim 64 (Phi-4-mini's 0.75; q width 3 x 64 = hidden, as llama.cpp's phi3 needs), longrope with
    # original_max_position_embeddings 32 under the 256-position context: the long factors (1 .. 70) rotate and
    # cos / sin carry the attention factor sqrt(1 + ln 8 / ln 32); an untied head
    "phi3": {
        "arch": "phi3",
        "tied": False,
        "matrix_type": "Q8_0",
        "hidden": 192,
        "n_heads": 3,
        "n_kv_heads": 1,
        "rotary_dim": 48,
        "longrope": {
            "short_factor": [1.0 + 0.1 * i for i in range(24)],
            "long_factor": [1.0 + 3.0 * i for i in range(24)],
            "original_max_position_embeddings": 32,
        },
    },
    # Gemma 3: q/k norms, post-attention and post-MLP norms (weights ~ 1 +- 0.3), GELU-tanh, embeddings times
    # sqrt(hidden), tied embeddings; layer 0 local (window 5, rotary base 1e4), layer 1 global (1e6, no window)
    "gemma3": {
        "arch": "gemma3",
        "tied": True,
        "matrix_type": "Q8_0",
        "sliding_window": 5,
        "sliding_window_pattern": 2,
        "rope_theta": 1e6,
        "rope_local_theta": 1e4,
    },
}


# fp32 tolerance: float32 rounding (unit roundoff 6e-8) over dot products of <= 128 terms in 2 layers, on logits of
# magnitude ~30, is ~1e-4 at worst (observed 3e-5); the budget is 1e-3 per 10 units of the largest logit, that of
# the llama / qwen2 reference tests. A qwen3 model without its q/k norms, a llama3
# model without its frequency factors are off by hundreds of tolerances (their tests).
ATOL = 1e-3


def tolerance(ref: np.ndarray) -> float:
    return ATOL * max(1.0, float(np.abs(ref).max()) / 10)


def hf_folder_kwargs(family_kw: dict) -> dict:
    """``write_hf_folder`` keywords giving the ``config.json`` of a family's tiny GGUF (``FAMILIES`` value): its
    ``rope_scaling`` (llama3's; phi3's longrope sets)."""
    if family_kw.get("rope_scaling_llama3"):
        return {"rope_scaling": {"rope_type": "llama3", **family_kw["rope_scaling_llama3"]}}
    if family_kw.get("longrope"):
        factors = {k: family_kw["longrope"][k] for k in ("short_factor", "long_factor")}
        return {"rope_scaling": {"rope_type": "longrope", **factors}}
    return {}


def sequence_errors(folder: Path, model: GGUFModel) -> list[float]:
    """Max |converted - reference| of a prefill of 6, a 4-token chunk on that cache, a rollback of 2 with 3 other
    tokens, then a one-token step; each divided by its tolerance (<= 1 passes). Also asserts equal argmaxes."""
    run = Runner(folder)
    alt = [1, 2, 3]
    full = reference_logits(model, IDS[:10])
    rolled = reference_logits(model, [*IDS[:8], *alt, 9])
    steps = [
        (run(IDS[:6], 0), full[:6]),
        (run(IDS[6:10], 6), full[6:10]),
        (run(alt, 8), rolled[8:11]),
        (run([9], 11), rolled[11:]),
    ]
    errors = []
    for got, want in steps:
        errors.append(float(np.abs(got - want).max()) / tolerance(want))
        if errors[-1] <= 1:
            np.testing.assert_array_equal(got.argmax(-1), want.argmax(-1))
    return errors


def convert_changed(gguf: Path, out: Path, **spec_changes: object) -> Path:
    """``gguf`` converted to ``out`` with its ``ModelSpec`` fields replaced by ``spec_changes`` (a converter that
    drops or misreads a feature of the family)."""
    import dataclasses

    real = GGUFModel.spec
    try:
        GGUFModel.spec = lambda self: dataclasses.replace(real(self), **spec_changes)  # type: ignore[method-assign]
        return convert(gguf, out, progress=False)
    finally:
        GGUFModel.spec = real  # type: ignore[method-assign]


def errors_without(gguf: Path, out: Path, **spec_changes: object) -> list[float]:
    """:func:`sequence_errors` of ``gguf`` converted by :func:`convert_changed`, measured against the reference of the
    real file."""
    broken = convert_changed(gguf, out, **spec_changes)
    with GGUFModel(gguf) as model:
        return sequence_errors(broken, model)


def sessions(gguf: Path, root: Path, forms: list[str], dtype: str = "fp32") -> dict:
    """ONNX Runtime sessions of ``gguf`` converted to each attention form (and its specrt_config.json)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    out = {}
    for attention in forms:
        folder = convert(gguf, root / f"{attention}-{dtype}", dtype=dtype, progress=False, attention=attention)
        out[attention] = ort.InferenceSession(str(folder / "model.onnx"), so, providers=["CPUExecutionProvider"])
        out[f"{attention}_config"] = out["config"] = json.loads((folder / "specrt_config.json").read_text())
    return out


def copy_gguf(
    src: Path, dst: Path, *, drop: tuple[str, ...] = (), change: Callable[[str, np.ndarray], np.ndarray] | None = None
) -> Path:
    """Write ``src``'s hyperparameters the converter reads and its tensors to ``dst``, leaving out ``drop`` and
    passing each kept tensor through ``change(name, array)``; no tokenizer (enough for ``GGUFModel.spec``)."""
    import gguf

    with GGUFModel(src) as reader:
        arch = reader.architecture
        w = gguf.GGUFWriter(str(dst), arch)
        for key in ("block_count", "context_length", "embedding_length", "feed_forward_length"):
            w.add_uint32(f"{arch}.{key}", int(reader.get(f"{arch}.{key}")))
        for key in ("head_count", "head_count_kv", "key_length"):
            if reader.get(f"{arch}.attention.{key}") is not None:
                w.add_uint32(f"{arch}.attention.{key}", int(reader.get(f"{arch}.attention.{key}")))
        w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
        for name in reader.tensors:
            if name not in drop:
                x = reader.raw_tensor(name)
                w.add_tensor(name, change(name, x) if change else x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def speculative_pair(root: Path, **gguf_kw: object) -> dict[str, Path]:
    """A 2-layer target (``write_tiny_gguf(seed=3, n_layers=2, **gguf_kw)``) and its first layer as the draft, in each
    of :data:`FORMS`: keys ``target-<form>`` / ``draft-<form>``."""
    g = write_tiny_gguf(root / "t.gguf", **{"seed": 3, "n_layers": 2, **gguf_kw})
    out = {}
    for form in FORMS:
        out[f"target-{form}"] = convert(g, root / f"target-{form}", progress=False, attention=form)
        out[f"draft-{form}"] = convert(g, root / f"draft-{form}", progress=False, attention=form, num_layers=1)
    return out


def check_greedy_speculative(pair: dict[str, Path], form: str, *, self_draft: bool = True) -> None:
    """Greedy speculative output equals the target alone token for token at K = 1 and 4, with the layer-truncated
    draft (and the target as its own draft when ``self_draft``); each draft is right at times."""
    kw = {"max_new_tokens": 32, "temperature": 0, "ignore_eos": True}
    prompt = [3, 14, 15, 92, 6, 5, 35]
    extra = {"max_batch": 2} if form == "batched" else {}
    want = specrt.Decoder(pair[f"target-{form}"], max_seq_len=128, **extra).generate(prompt, **kw).token_ids
    drafts = [pair[f"draft-{form}"], *([pair[f"target-{form}"]] if self_draft else [])]
    for draft in drafts:
        dec = specrt.Decoder(pair[f"target-{form}"], draft, max_seq_len=128, **extra)
        accepted = 0
        for k in (1, 4):
            got = dec.generate(prompt, **kw, num_speculative_tokens=k)
            assert got.token_ids == want, (draft.name, k)
            accepted += got.stats.n_accepted
        assert accepted > 0  # the draft really proposed and was right at times


def check_certificate(pair: dict[str, Path]) -> None:
    """specrt certify's seeded Monte Carlo check (PIT + Kolmogorov-Smirnov at alpha 1e-3 over N >= 12,000 positions;
    the critical distance derives from N: specrt/certify.py) passes on the pair at T = 1, K = 4 with rejections in
    play, and the same check rejects the sampler that draws recovered tokens from q instead of norm(max(0, p - q))."""
    from specrt.certify import CertifyConfig, certify

    cfg = {"settings": {"temperature": 1.0, "num_speculative_tokens": 4, "ignore_eos": True}}
    good = certify(CertifyConfig(str(pair["target-gqa"]), str(pair["draft-gqa"]), **cfg))
    assert good.passed and good.n >= 12_000 and good.parity_passed, good
    assert good.acceptance_rate is not None and 0 < good.acceptance_rate < 0.9  # rejections happen
    bad = certify(CertifyConfig(str(pair["target-gqa"]), str(pair["draft-gqa"]), fault="residual_from_draft", **cfg))
    assert not bad.passed and bad.p_value < bad.alpha, bad


__all__ = [
    "FAMILIES",
    "FORMS",
    "check_certificate",
    "check_greedy_speculative",
    "convert_changed",
    "copy_gguf",
    "errors_without",
    "hf_folder_kwargs",
    "sequence_errors",
    "sessions",
    "speculative_pair",
    "tolerance",
]
