"""The phi3 family (issue 43): Phi-3 / Phi-3.5 / Phi-4-mini (``Phi3ForCausalLM``; GGUF ``phi3``).

What differs from llama: q/k/v stored as one matrix (GGUF ``attn_qkv``, Hugging Face ``qkv_proj``) and gate/up as
one (GGUF ``ffn_up`` ``[2F, H]``, Hugging Face ``gate_up_proj``; the gate's rows first), split on conversion;
``longrope`` rotary scaling (short and long divisors, the long ones beyond ``original_max_position_embeddings``, and
cos / sin multiplied by ``sqrt(1 + ln(s) / ln(L))``); partial rotary (Phi-4-mini: ``partial_rotary_factor`` 0.75).

The switch: a converted graph rotates every position with one set, chosen by the positions it is made for
(``max_positions``, default ``max_position_embeddings``): long beyond ``original_max_position_embeddings``, as
llama.cpp chooses by its context size (:func:`specrt.convert.rope.longrope_choice`).

The tiny phi3 of ``family_checks.FAMILIES`` has every feature on at a strength that matters at test lengths. Here:
longrope against transformers' formula, fp32 against the NumPy reference (which splits the fused products itself and
reads the factors, width and attention factor from the file as llama.cpp does) over a prefill, a chunk, a rollback
and a step, from the GGUF and from a Hugging Face folder, in the default and batched layouts, with the long and the
short factors; converters that use the wrong set, drop the attention factor or swap gate and up failing it; and the
refusals. Every other form: tests/convert/test_families.py; llama.cpp: tests/convert/test_llama_cpp_oracle.py.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

import test_llama_cpp_oracle
import test_mistral
from family_checks import FAMILIES, copy_gguf, errors_without, hf_folder_kwargs, sequence_errors, tolerance
from specrt.convert import GGUFFormatError, UnsupportedModelError, convert, gguf_reader
from specrt.convert.gguf_reader import GGUFModel
from specrt.convert.hf_reader import HFModel
from specrt.convert.reference_forward import reference_logits
from specrt.convert.rope import LongRope, hf_rope, inv_freq, longrope_choice
from specrt.convert.tiny import write_hf_folder, write_tiny_gguf
from test_convert_formats import IDS, Runner
from test_mistral import batched_errors

#: Fixtures of other modules: llama.cpp's venv python (skips where it is not built), a SentencePiece model trained here.
llama_cpp_python = test_llama_cpp_oracle.llama_cpp_python
spm = test_mistral.spm
PHI3 = FAMILIES["phi3"]
LONGROPE = PHI3["longrope"]


def _hf_longrope(config: dict, seq_len: int) -> tuple[np.ndarray, float]:
    """transformers' ``_compute_longrope_parameters`` transcribed to NumPy as it is written there (Phi-3's
    ``max_position_embeddings / original_max_position_embeddings`` as the factor, the long factors when
    ``seq_len > original``): ``(inv_freq, attention_factor)``, an implementation independent of ours."""
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    dim = int(head_dim * config.get("partial_rotary_factor", 1.0))
    scaling = config["rope_scaling"]
    original = config["original_max_position_embeddings"]
    factor = config["max_position_embeddings"] / original
    attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    ext = np.asarray(scaling["long_factor"] if seq_len > original else scaling["short_factor"], dtype=np.float32)
    shape = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / dim
    return 1.0 / (ext * config["rope_theta"] ** shape), attention_factor


@pytest.mark.parametrize(("hidden", "heads", "partial"), [(3072, 32, 1.0), (3072, 24, 0.75)])  # Phi-3.5, Phi-4-mini
def test_longrope_gives_transformers_frequencies_and_attention_factor(hidden: int, heads: int, partial: float) -> None:
    dim = int(hidden // heads * partial)
    rng = np.random.default_rng(0)
    scaling = {
        "type": "longrope",
        "short_factor": list(1 + rng.random(dim // 2)),
        "long_factor": list(1 + 40 * rng.random(dim // 2)),
    }
    config = {
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "partial_rotary_factor": partial,
        "rope_theta": 10000.0,
        "max_position_embeddings": 131072,
        "original_max_position_embeddings": 4096,
        "rope_scaling": scaling,
    }
    rope = hf_rope(scaling, 10000.0, dim, 131072, 4096)
    assert isinstance(rope, LongRope)
    for positions in (4096, 4097, 131072):  # the graph's positions pick the set as transformers' seq_len does
        want, attention = _hf_longrope(config, positions)
        factors = longrope_choice(rope.short_factors, rope.long_factors, 4096, positions)
        np.testing.assert_allclose(inv_freq(10000.0, dim, factors), want, rtol=1e-6)
        assert rope.attention_factor == pytest.approx(attention, rel=1e-12)
    assert rope.attention_factor == pytest.approx(math.sqrt(1 + math.log(32) / math.log(4096)))  # 1.1902
    assert hf_rope(dict(scaling, attention_factor=1.5), 1e4, dim, 131072, 4096).attention_factor == 1.5


@pytest.fixture(scope="module")
def gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("phi3") / "m.gguf", seed=1, **PHI3)


@pytest.fixture(scope="module")
def model(gguf: Path) -> GGUFModel:
    with GGUFModel(gguf) as m:
        yield m


def test_the_reader_splits_the_fused_matrices_and_reads_the_rope(gguf: Path, model: GGUFModel) -> None:
    spec = model.spec()
    assert spec.architecture == "phi3" and spec.head_dim == 64 and spec.rotary_dim == 48 and spec.rope_dim == 48
    assert spec.rope_freq_factors == pytest.approx(LONGROPE["short_factor"])
    assert spec.rope_long_freq_factors == pytest.approx(LONGROPE["long_factor"])
    assert spec.rope_original_context == 32
    assert spec.rope_attn_factor == pytest.approx(math.sqrt(1 + math.log(256 / 32) / math.log(32)))
    qkv, gate_up = model.raw_tensor("blk.0.attn_qkv.weight"), model.raw_tensor("blk.0.ffn_up.weight")
    parts = [model.tensor(f"blk.0.attn_{n}.weight", spec) for n in "qkv"]
    assert [p.shape for p in parts] == [(192, 192), (64, 192), (64, 192)]
    np.testing.assert_array_equal(np.concatenate(parts), qkv)
    gate, up = model.tensor("blk.0.ffn_gate.weight", spec), model.tensor("blk.0.ffn_up.weight", spec)
    np.testing.assert_array_equal(np.concatenate([gate, up]), gate_up)  # the gate's rows first
    bq = model.block_quant("blk.0.ffn_up.weight", 8, spec)  # exact Q8_0 blocks of the up half
    np.testing.assert_allclose(bq.q.shape, up.shape)


@pytest.mark.parametrize("source", ["gguf", "hf", "hf-transformers5"])
def test_fp32_equals_the_reference_with_the_long_factors(
    gguf: Path, model: GGUFModel, tmp_path: Path, source: str
) -> None:
    src = gguf if source == "gguf" else write_hf_folder(gguf, tmp_path / "hf", **hf_folder_kwargs(PHI3))
    if source == "hf-transformers5":  # rope_parameters, holding the theta, the partial factor, the original length too
        cfg = json.loads((src / "config.json").read_text())
        moved = {k: cfg.pop(k) for k in ("rope_theta", "partial_rotary_factor", "original_max_position_embeddings")}
        cfg["rope_parameters"] = {**cfg.pop("rope_scaling"), **moved}
        (src / "config.json").write_text(json.dumps(cfg))
    folder = convert(src, tmp_path / "onnx", progress=False)
    cfg = json.loads((folder / "specrt_config.json").read_text())
    assert cfg["rotary_dim"] == 48 and cfg["rope_scaling"]["factors"] == "long"
    assert cfg["rope_freq_factors"] == pytest.approx(LONGROPE["long_factor"])
    errors = sequence_errors(folder, model)  # the reference runs at the file's 256 positions: long factors
    assert max(errors) <= 1, errors


def test_a_graph_for_the_original_context_uses_the_short_factors(gguf: Path, model: GGUFModel, tmp_path: Path) -> None:
    folder = convert(gguf, tmp_path / "short", progress=False, max_positions=32)
    assert json.loads((folder / "specrt_config.json").read_text())["rope_scaling"]["factors"] == "short"
    got = Runner(folder)(IDS[:10], 0)
    short, long = reference_logits(model, IDS[:10], context=32), reference_logits(model, IDS[:10])
    assert float(np.abs(got - short).max()) <= tolerance(short)
    assert float(np.abs(got - long).max()) > 100 * tolerance(long)  # the two sets differ by far at these lengths


def test_the_batched_layout_equals_the_reference(gguf: Path, model: GGUFModel, tmp_path: Path) -> None:
    errors = batched_errors(convert(gguf, tmp_path / "batched", progress=False, attention="batched"), model)
    assert max(errors) <= 1, errors


@pytest.mark.parametrize(
    ("change", "least"),
    [
        ({"rope_long_freq_factors": None}, 1000),  # the short factors where the long ones rotate
        ({"rope_attn_factor": 1.0}, 1000),  # no attention factor
    ],
)
def test_converters_dropping_a_rope_feature_fail_the_reference(
    gguf: Path, tmp_path: Path, change: dict, least: float
) -> None:
    errors = errors_without(gguf, tmp_path / "broken", **change)
    print(f"phi3 with {change}: error / tolerance per step {[round(e) for e in errors]}")
    assert min(errors) > least, errors  # observed 7000-14400


def test_gate_and_up_swapped_fail_the_reference(
    gguf: Path, model: GGUFModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = gguf_reader.fused_rows

    def swapped(name: str, spec: object, stored: object) -> tuple[str, slice] | None:
        other = {"ffn_gate": "ffn_up", "ffn_up": "ffn_gate"}
        part = name.split(".")[2] if name.startswith("blk.") else ""
        return real(name.replace(part, other[part]) if part in other else name, spec, stored)  # type: ignore[arg-type]

    monkeypatch.setattr(gguf_reader, "fused_rows", swapped)
    broken = convert(gguf, tmp_path / "swapped", progress=False)
    monkeypatch.undo()
    errors = sequence_errors(broken, model)
    print(f"phi3 with gate and up swapped: error / tolerance per step {[round(e) for e in errors]}")
    assert min(errors) > 1000, errors  # observed 9600-11800


def test_refusals(gguf: Path, tmp_path: Path) -> None:
    # a rotary width ONNX Runtime's GroupQueryAttention cannot rotate (multiples of 16); the batched form can
    odd = write_tiny_gguf(tmp_path / "odd.gguf", seed=1, **dict(PHI3, rotary_dim=40, longrope=None))
    with pytest.raises(UnsupportedModelError, match=r"partial rotary over 40 of head_dim 64 .* multiples of 16"):
        convert(odd, tmp_path / "odd", progress=False)
    convert(odd, tmp_path / "odd-batched", progress=False, attention="batched")
    # partial rotary is phi3's: a llama GGUF with rope.dimension_count below head_dim is refused naming the key
    llama = write_tiny_gguf(tmp_path / "l.gguf", seed=1, arch="llama", rotary_dim=8)
    with pytest.raises(UnsupportedModelError, match=r"partial rotary \(llama.rope.dimension_count 8 != head_dim 16\)"):
        GGUFModel(llama).spec()
    # Hugging Face configs: a malformed longrope key and partial rotary outside phi3, each named
    hf = write_hf_folder(gguf, tmp_path / "hf", **hf_folder_kwargs(PHI3))
    config = json.loads((hf / "config.json").read_text())
    bad = dict(config, rope_scaling=dict(config["rope_scaling"], long_factor=[1.0] * 23))
    (hf / "config.json").write_text(json.dumps(bad))
    with pytest.raises(UnsupportedModelError, match=r"rope_scaling.long_factor must be a list of 24 positive numbers"):
        HFModel(hf).spec()
    (hf / "config.json").write_text(json.dumps(dict(config, original_max_position_embeddings=None)))
    with pytest.raises(UnsupportedModelError, match=r"rope_scaling.original_max_position_embeddings must be"):
        HFModel(hf).spec()
    llama_hf = write_hf_folder(write_tiny_gguf(tmp_path / "plain.gguf", seed=1, arch="llama"), tmp_path / "lhf")
    cfg = json.loads((llama_hf / "config.json").read_text())
    (llama_hf / "config.json").write_text(json.dumps(dict(cfg, partial_rotary_factor=0.5)))
    with pytest.raises(UnsupportedModelError, match=r"partial rotary \(config.json partial_rotary_factor = 0.5\)"):
        HFModel(llama_hf).spec()
    # a GGUF with one longrope set only
    one = copy_gguf(gguf, tmp_path / "one.gguf", drop=("rope_factors_long.weight",))
    with pytest.raises(GGUFFormatError, match=r"longrope needs both 'rope_factors_short.weight'"):
        GGUFModel(one).spec()


def test_a_converted_phi3_decodes(gguf: Path, tmp_path: Path) -> None:
    """The converted folder runs in specrt's decoder (greedy, 8 tokens) from the GGUF and the HF folder alike."""
    import specrt

    hf = write_hf_folder(gguf, tmp_path / "hf", **hf_folder_kwargs(PHI3))
    outs = []
    for src in (gguf, hf):
        folder = convert(src, tmp_path / f"onnx-{src.name}", progress=False)
        dec = specrt.Decoder(folder, max_seq_len=64)
        outs.append(dec.generate([3, 14, 15, 92], max_new_tokens=8, temperature=0, ignore_eos=True).token_ids)
    assert outs[0] == outs[1] and len(outs[0]) == 8


@pytest.mark.parametrize("source", ["gguf", "hf"])
def test_a_window_is_honoured(tmp_path: Path, source: str) -> None:
    """Phi-3-mini-4k's ``sliding_window`` (2047 of 4096; Mistral's convention, M1 in docs/models.md), here 5 positions:
    the reference with the window equals the converted model, and a converter ignoring it fails by far. llama.cpp
    disables Phi's window, so the oracle cannot check this one."""
    g = write_tiny_gguf(tmp_path / "w.gguf", seed=1, **dict(PHI3, sliding_window=5))
    src = g if source == "gguf" else write_hf_folder(g, tmp_path / "hf", **hf_folder_kwargs(PHI3))
    if source == "hf":
        assert json.loads((src / "config.json").read_text())["sliding_window"] == 5
    with GGUFModel(g) as model:
        assert model.spec().sliding_window == 5
        errors = sequence_errors(convert(src, tmp_path / "onnx", progress=False), model)
    assert max(errors) <= 1, errors
    broken = errors_without(g, tmp_path / "broken", sliding_window=None)
    assert min(broken) > 100, broken


def llama_cpp_tokens(python: Path, gguf: Path, texts: list[str]) -> list[list[int]]:
    """llama.cpp's tokenization of each text (``tokenize(add_bos=False, special=True)``, the vocabulary only), run in
    the llama-cpp-python venv ``python``."""
    import subprocess

    code = (
        "import json, sys, llama_cpp; m = llama_cpp.Llama(model_path=sys.argv[1], vocab_only=True, verbose=False); "
        "print(json.dumps([m.tokenize(t.encode(), add_bos=False, special=True) for t in json.loads(sys.argv[2])]))"
    )
    args = [str(python), "-c", code, str(gguf), json.dumps(texts)]
    r = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


#: Phi-3 chat turns (whitespace after the special tokens) and SentencePiece's own specials.
CHAT_TEXTS = [
    "<|user|>\nHello there<|end|>\n<|assistant|>\n",
    "<|system|>  You are kind.<|end|>\n<|user|>\n\nHi  you<|end|>\n<|assistant|>",
    "<s> x</s>  y<unk> z<|endoftext|> w",
    "plain text  here\n",
]


def test_a_phi3_sentencepiece_vocabulary_tokenizes_chat_turns_as_llama_cpp(
    llama_cpp_python: Path, spm: tuple, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Phi-3.5's GGUF vocabulary is SentencePiece with Phi's chat tokens; llama.cpp drops the whitespace after them in
    a model named phi3 / phi-3 (``<|user|>\\n`` -> no newline token), but not after ``<unk>`` / ``<s>`` /
    ``<|endoftext|>``. Ours from the GGUF tokenizes the chat turns as llama.cpp does; without that rule 3 of 4
    differ."""
    from specrt.convert import tokenizer as tokenizer_module
    from specrt.convert.tokenizer import build_tokenizer

    _, (pieces, scores, types) = spm
    chat = ["<|endoftext|>", "<|assistant|>", "<|end|>", "<|system|>", "<|user|>"]
    vocab = ([*pieces, *chat], [*scores, *[0.0] * len(chat)], [*types, *[3] * len(chat)])  # control tokens
    g = write_tiny_gguf(tmp_path / "p.gguf", seed=1, spm_vocab=vocab, **dict(PHI3, matrix_type="F32"))
    want = llama_cpp_tokens(llama_cpp_python, g, CHAT_TEXTS)

    def ours() -> list[list[int]]:
        with GGUFModel(g) as model:
            tok, _ = build_tokenizer(model)
        return [tok.encode(t, add_special_tokens=False).ids for t in CHAT_TEXTS]

    assert ours() == want
    monkeypatch.setattr(tokenizer_module, "_rstripped_tokens", lambda model: lambda token: False)
    assert sum(a != b for a, b in zip(ours(), want, strict=True)) == 3


#: Cased words, contractions, digits, slashes and newlines: where o200k's split differs from GPT-2's and Qwen2's.
BPE_CORPUS = [
    "The Cat's HAT isn't MINE; we'll see. HelloWorld camelCase XMLHttpRequest",
    "numbers 1234567 and 3.14159, a/b/c\n\npath/to/file",
    "naïve café déjà vu — 東京 タワー 😀 emoji",
    "I'M DONE. They've gone; you'd know. OK?!  spaces   here\r\n",
]


def test_phi4_minis_o200k_split_tokenizes_as_llama_cpp(llama_cpp_python: Path, tmp_path: Path) -> None:
    """Phi-4-mini's GGUF vocabulary is byte-level BPE with ``tokenizer.ggml.pre = gpt-4o`` (o200k's split: cased
    words keep their contraction, digits in threes, ``/`` after punctuation). A byte-level BPE trained in the test
    (500 tokens, so merges cross the places where splits differ), written as a phi3 GGUF: ours equals llama.cpp's
    tokenization on 10 texts; with Qwen2's or GPT-2's split in its place 3 of them differ."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from specrt.convert import tokenizer as tokenizer_module
    from specrt.convert.tokenizer import build_tokenizer

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    trainer = trainers.BpeTrainer(
        vocab_size=500, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    bpe.train_from_iterator(BPE_CORPUS * 50, trainer)
    spec = json.loads(bpe.to_str())["model"]
    tokens = [t for t, _ in sorted(spec["vocab"].items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["merges"]]
    vocab = ([*tokens, "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>"], [1] * len(tokens) + [3, 3, 3, 4])
    g = write_tiny_gguf(tmp_path / "b.gguf", seed=1, bpe_vocab=(*vocab, merges), **dict(PHI3, matrix_type="F32"))
    texts = [
        *BPE_CORPUS,
        "Don't STOP'S we'RE x",
        "ABCdef GHI jkl",
        "12345678",
        "a\n\n\nb  c",
        "x/\ny",
        "CamelCaseWORDS",
    ]
    want = llama_cpp_tokens(llama_cpp_python, g, texts)

    def ours() -> list[list[int]]:
        with GGUFModel(g) as model:
            assert model.get("tokenizer.ggml.pre") == "gpt-4o"
            tok, _ = build_tokenizer(model)
        return [tok.encode(t, add_special_tokens=False).ids for t in texts]

    assert ours() == want
    for other in (tokenizer_module.PRE_TOKENIZERS["qwen2"], None):
        patterns = dict(tokenizer_module.PRE_TOKENIZERS, **{"gpt-4o": other})
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(tokenizer_module, "PRE_TOKENIZERS", patterns)
            assert sum(a != b for a, b in zip(ours(), want, strict=True)) == 3
