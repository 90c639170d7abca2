"""The ``mistral`` family (issue 41): Hugging Face ``MistralForCausalLM`` folders, the llama decoder with a ``head_dim``
of its own (Mistral NeMo: 128 under 5120 / 32 = 160) and an optional sliding window (Mistral 7B v0.1: 4096): the
query at position i attends the keys at positions j with ``i - window < j <= i`` (transformers'
``sliding_window_overlay``: ``kv_idx > q_idx - sliding_window``). llama.cpp writes Mistral GGUFs as ``llama`` files,
so the tiny mistral (``family_checks.FAMILIES["mistral"]``: head_dim 16 under 128 / 4 = 32, a window of 5 positions,
an untied head) is a ``llama`` GGUF carrying ``llama.attention.sliding_window``, and ``write_hf_folder`` makes it a
``MistralForCausalLM`` folder.

Here: the window's convention on the NumPy reference and on ONNX Runtime's GroupQueryAttention; fp32 against the
reference over a prefill longer than the window, a chunk on the cache, a rollback and a one-token step, in the default
and the batched layouts, from the GGUF and from the Hugging Face folder; converters that ignore the window failing
the same checks; a window at least the context being full attention; the refusals. Mistral GGUFs' SentencePiece
tokenizer (``tokenizer.ggml.model = llama``) against the ``sentencepiece`` package on a model trained here, with
tokenizers missing the space prefix or misranking merges failing it. Every other form (quantized,
fp16, graph form, prefill graph, pruned vocabulary, speculative decoding, the losslessness certificate) is checked for
each family alike in tests/convert/test_families.py.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from family_checks import FAMILIES, errors_without, sequence_errors, tolerance
from specrt.convert import UnsupportedArchitectureError, UnsupportedModelError, convert
from specrt.convert.families import GGUF_ARCHITECTURES
from specrt.convert.gguf_reader import GGUFModel
from specrt.convert.graph import MIN_ONNXRUNTIME_WINDOW
from specrt.convert.reference_forward import reference_logits
from specrt.convert.tiny import write_hf_folder, write_tiny_gguf
from specrt.errors import ConfigError
from test_batched_graph import Batch
from test_convert_formats import IDS

MISTRAL = FAMILIES["mistral"]
WINDOW = MISTRAL["sliding_window"]


@pytest.fixture(scope="module")
def gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("mistral") / "m.gguf", seed=1, **MISTRAL)


def test_the_tiny_mistral_has_every_feature(gguf: Path, tmp_path: Path) -> None:
    with GGUFModel(gguf) as model:
        spec = model.spec()
        assert (model.architecture, model.get("general.name")) == ("llama", "tiny-random-mistral")  # as llama.cpp
        assert spec.head_dim == 16 != spec.hidden_size // spec.num_attention_heads
        assert (spec.sliding_window, spec.tied_embeddings) == (5, False)
        assert WINDOW < 6 < len(IDS)  # shorter than the first prefill of every sequence below
    cfg = json.loads((write_hf_folder(gguf, tmp_path / "hf") / "config.json").read_text())
    assert (cfg["model_type"], cfg["architectures"], cfg["head_dim"]) == ("mistral", ["MistralForCausalLM"], 16)
    assert cfg["sliding_window"] == 5


def test_the_reference_window_holds_the_last_window_positions(gguf: Path) -> None:
    # One layer: position i's logits depend on the tokens at i - WINDOW < j <= i only, so changing token 0 changes
    # the logits of positions 0 .. WINDOW - 1 and of no later one (a window of WINDOW + 1 or WINDOW - 1 moves it).
    with GGUFModel(gguf) as model:
        spec = dataclasses.replace(model.spec(), num_layers=1)
        a = reference_logits(model, IDS, spec)
        b = reference_logits(model, [IDS[1], *IDS[1:]], spec)
    changed = np.abs(a - b).max(axis=-1) > 1e-9
    assert changed.tolist() == [i < WINDOW for i in range(len(IDS))]


@pytest.mark.parametrize("window", [1, 2, 4])
def test_onnxruntime_counts_the_window_as_hugging_face(window: int) -> None:
    """GroupQueryAttention with ``local_window_size`` w attends w keys, the query's own included (ONNX Runtime >=
    :data:`MIN_ONNXRUNTIME_WINDOW`; 1.20-1.23 attend w + 1). With q = 0 attention is uniform over the visible keys and
    value j = j, so the output of query i is the mean position it sees: ``mean(max(0, i - w + 1) .. i)``."""
    from onnx import TensorProto, helper

    hd, n = 16, 7
    node = helper.make_node(
        "GroupQueryAttention",
        ["q", "k", "v", "past_k", "past_v", "seqlens_k", "total"],
        ["out", "present_k", "present_v"],
        domain="com.microsoft",
        num_heads=1,
        kv_num_heads=1,
        local_window_size=window,
    )
    f = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info(x, f, [1, n, hd]) for x in "qkv"]
    inputs += [helper.make_tensor_value_info(x, f, [1, 1, n, hd]) for x in ("past_k", "past_v")]
    inputs += [
        helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [1]),
        helper.make_tensor_value_info("total", TensorProto.INT32, []),
    ]
    outputs = [helper.make_tensor_value_info(x, f, None) for x in ("out", "present_k", "present_v")]
    graph = helper.make_graph([node], "window", inputs, outputs)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)]
    )
    model.ir_version = 8
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    empty = np.zeros((1, 1, n, hd), np.float32)
    zeros = np.zeros((1, n, hd), np.float32)
    values = np.repeat(np.arange(n, dtype=np.float32)[None, :, None], hd, axis=2)
    feeds = {"q": zeros, "k": zeros, "v": values, "past_k": empty, "past_v": empty}
    out = sess.run(["out"], {**feeds, "seqlens_k": np.array([n - 1], np.int32), "total": np.array(n, np.int32)})[0]
    want = [np.mean(np.arange(max(0, i - window + 1), i + 1)) for i in range(n)]
    np.testing.assert_allclose(out[0, :, 0], want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("source", ["gguf", "hf"])
def test_fp32_equals_the_reference_over_prefill_chunk_rollback_and_step(tmp_path: Path, source: str) -> None:
    g = write_tiny_gguf(tmp_path / "m.gguf", seed=1, **MISTRAL)
    src = g if source == "gguf" else write_hf_folder(g, tmp_path / "hf", shards=2)
    folder = convert(src, tmp_path / "onnx", progress=False)
    cfg = json.loads((folder / "specrt_config.json").read_text())
    assert (cfg["sliding_window"], cfg["head_dim"], cfg["min_onnxruntime"]) == (5, 16, MIN_ONNXRUNTIME_WINDOW)
    if source == "hf":
        assert (cfg["architecture"], cfg["hf_architecture"]) == ("mistral", "MistralForCausalLM")
    attn = next(n for n in onnx.load(str(folder / "model.onnx")).graph.node if n.op_type == "GroupQueryAttention")
    assert {a.name: a.i for a in attn.attribute}["local_window_size"] == WINDOW
    errors = sequence_errors(folder, GGUFModel(g))
    assert max(errors) <= 1, errors


def test_ignoring_the_window_fails_the_reference(gguf: Path, tmp_path: Path) -> None:
    errors = errors_without(gguf, tmp_path / "broken", sliding_window=None)
    assert min(errors) > 100, errors  # each step off by more than 100 tolerances (observed 1900-13000)


def batched_errors(folder: Path, model: GGUFModel) -> list[float]:
    """Two ragged rows on the batched layout against the reference, each error divided by its tolerance: a prefill
    (6 and 9 tokens), a chunk (4 and 1), a rollback of row 0 by 2 with 3 other tokens (row 1: 2 tokens), then a
    one-token step on each."""
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(folder / "model.onnx"), so, providers=["CPUExecutionProvider"])
    batch = Batch(sess, json.loads((folder / "specrt_config.json").read_text()), 2)
    other = [int(t) for t in np.random.default_rng(0).integers(0, 260, 13)]
    seqs = [[*IDS[:8], 1, 2, 3, 9], other]
    want = [reference_logits(model, IDS[:10]), reference_logits(model, seqs[0]), reference_logits(model, other)]
    errors = []
    for step, (n0, n1) in enumerate([(6, 9), (4, 1), (3, 2), (1, 1)]):
        ref0 = want[0] if step < 2 else want[1]
        if step == 2:
            batch.lens[0] = 8  # the rollback: row 0 forgets its last 2 positions
        starts = batch.lens[:]
        rows = [seqs[0][starts[0] : starts[0] + n0] if step >= 2 else IDS[starts[0] : starts[0] + n0]]
        rows.append(other[starts[1] : starts[1] + n1])
        got = batch.run([[int(t) for t in r] for r in rows], pad=7)
        for g, ref, start in ((got[0], ref0, starts[0]), (got[1], want[2], starts[1])):
            w = ref[start : start + len(g)]
            errors.append(float(np.abs(g - w).max()) / tolerance(w))
    return errors


def test_the_batched_layout_equals_the_reference_and_ignoring_the_window_fails_it(
    gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = GGUFModel(gguf)
    errors = batched_errors(convert(gguf, tmp_path / "batched", progress=False, attention="batched"), model)
    assert max(errors) <= 1, errors
    real = GGUFModel.spec
    monkeypatch.setattr(GGUFModel, "spec", lambda self: dataclasses.replace(real(self), sliding_window=None))
    broken = convert(gguf, tmp_path / "broken", progress=False, attention="batched")
    monkeypatch.undo()
    errors = batched_errors(broken, model)
    assert min(errors) > 100, errors  # each pass of each row off by more than 100 tolerances (observed 1900-15000)


def test_a_window_spanning_the_context_is_full_attention(tmp_path: Path) -> None:
    g = write_tiny_gguf(tmp_path / "m.gguf", seed=1, **dict(MISTRAL, sliding_window=None))
    hf = write_hf_folder(g, tmp_path / "hf")  # the same weights, named mistral
    cfg = json.loads((hf / "config.json").read_text())
    assert (cfg["model_type"], cfg["sliding_window"]) == ("mistral", None)
    cfg["sliding_window"] = cfg["max_position_embeddings"]
    (hf / "config.json").write_text(json.dumps(cfg))
    folder = convert(hf, tmp_path / "onnx", progress=False)
    out = json.loads((folder / "specrt_config.json").read_text())
    assert (out["sliding_window"], out["min_onnxruntime"]) == (None, "1.20")
    assert max(sequence_errors(folder, GGUFModel(g))) <= 1  # the reference without a window
    # a window the converted caches never exceed (max_positions) is no window either
    folder = convert(
        write_tiny_gguf(tmp_path / "w.gguf", **MISTRAL), tmp_path / "short", progress=False, max_positions=5
    )
    assert json.loads((folder / "specrt_config.json").read_text())["sliding_window"] is None


@pytest.mark.parametrize("value", [0, -1, "4096", True, 2.5])
def test_a_malformed_window_is_refused_naming_the_field(gguf: Path, tmp_path: Path, value: object) -> None:
    hf = write_hf_folder(gguf, tmp_path / "hf")
    cfg = json.loads((hf / "config.json").read_text())
    cfg["sliding_window"] = value
    (hf / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError, match=r"sliding-window attention \(config.json sliding_window\)"):
        convert(hf, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_a_mistral_gguf_architecture_and_a_window_in_a_llama_folder_are_refused(gguf: Path, tmp_path: Path) -> None:
    import gguf as gguf_package

    # llama.cpp never writes general.architecture "mistral" (it refuses such a file), nor does specrt read one
    w = gguf_package.GGUFWriter(str(tmp_path / "mistral.gguf"), "mistral")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    listed = ", ".join(GGUF_ARCHITECTURES)  # every family llama.cpp writes under its own name; not mistral
    with pytest.raises(UnsupportedArchitectureError, match=rf"'mistral'; supported architectures: {listed}$"):
        convert(tmp_path / "mistral.gguf", tmp_path / "out", progress=False)
    with pytest.raises(ValueError, match=r"sliding window, which a 'llama' folder cannot carry"):
        write_hf_folder(gguf, tmp_path / "llama", model_type="llama")


# ----- the SentencePiece tokenizer of Mistral GGUFs ---------------------------------------------------------------
#: Training text of the tiny SentencePiece model: whitespace runs, digits, accents, CJK, emoji, code.
SPM_CORPUS = [
    "The quick brown fox jumps over the lazy dog. Hello world, hello specrt!",
    "Two  spaces,   three,    four; tabs\tand\nnewlines\n\n  indented",
    "Numbers 1234567890 and 3.14159; dates 2026-12-05, 0xFF, 1e-6.",
    "Café naïve résumé über façade Ångström crème brûlée",
    "中文 日本語 한국어 Привет мир 你好世界",
    "emoji 🤖😀👍🏽 done 🎉",
    "def f(x):\n    return x * 2  # doubled\n",
]
#: Texts the tokenizers must agree on: unseen characters (byte fallback), leading / trailing / only whitespace, a
#: literal ▁, digits, accents, CJK, emoji with modifiers, mixed scripts.
SPM_TEXTS = [
    "",
    " ",
    "   ",
    "Hello world",
    " Hello   world\n\n\t x ",
    "\n\nstarts with newlines",
    "▁ a literal mark ▁▁",
    "9876543210 + 1234567890 = 11111111100",
    "déjà vu, Ωmega, ǅ, ﬁ ligature, e\u0301 combining",
    "中文 日本語 한국어 Привет мир 未见过的字 ស្ព",
    "🤖😀👍🏽🦀 🏳️‍🌈 flags",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "a" * 100 + " " + "9" * 30,
]


@pytest.fixture(scope="module")
def spm(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, tuple[list[str], list[float], list[int]]]:
    """A tiny SentencePiece BPE model trained on :data:`SPM_CORPUS` as Llama 2 / Mistral's are configured (byte
    fallback, identity normalization, a dummy prefix, whitespace kept, digits split) and its vocabulary as llama.cpp's
    converter writes it to GGUF (pieces, scores, token types: unknown 2, control 3, unused 5, byte 6, else 1)."""
    import sentencepiece as spm_lib

    root = tmp_path_factory.mktemp("spm")
    (root / "corpus.txt").write_text("\n".join(SPM_CORPUS * 30), encoding="utf-8")
    spm_lib.SentencePieceTrainer.train(
        input=str(root / "corpus.txt"),
        model_prefix=str(root / "m"),
        vocab_size=420,
        model_type="bpe",
        byte_fallback=True,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=True,
        split_digits=True,
        allow_whitespace_only_pieces=True,
        character_coverage=0.995,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        num_threads=1,
        minloglevel=2,
    )
    sp = spm_lib.SentencePieceProcessor(model_file=str(root / "m.model"))
    pieces, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        pieces.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        kind = 2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 5 if sp.is_unused(i) else 6 if sp.is_byte(i) else 1
        types.append(kind)
    return sp, (pieces, scores, types)


def spm_mismatches(tok: object, sp: object, bos: bool = True) -> list[str]:
    """The texts of :data:`SPM_TEXTS` that ``tok`` encodes (without BOS, and with it when ``bos``) or decodes
    otherwise than SentencePiece."""
    bad = []
    for text in SPM_TEXTS:
        ids = sp.encode(text)
        if (
            tok.encode(text, add_special_tokens=False).ids != ids
            or (bos and tok.encode(text).ids != [1, *ids])
            or tok.decode(ids) != sp.decode(ids)
        ):
            bad.append(text)
    return bad


def test_the_sentencepiece_tokenizer_equals_sentencepiece(spm: tuple, tmp_path: Path) -> None:
    sp, vocab = spm
    assert 2 in vocab[2] and 6 in vocab[2] and 1 in vocab[2]
    assert "<0xE6>" in [sp.id_to_piece(i) for i in sp.encode(SPM_TEXTS[9])]  # byte fallback in play (未见过的字)
    g = write_tiny_gguf(tmp_path / "m.gguf", seed=1, spm_vocab=vocab, **MISTRAL)
    from specrt.convert.tokenizer import build_tokenizer

    with GGUFModel(g) as model:
        tok, info = build_tokenizer(model)
    assert (info.bos_token_id, info.eos_token_ids, info.add_bos_token) == (1, [2], True)
    assert info.special_tokens == {"<unk>": 0, "<s>": 1, "</s>": 2}
    assert spm_mismatches(tok, sp) == []
    # the texts survive (identity normalization), but for a literal ▁, which SentencePiece decodes as a space too
    assert [t for t in SPM_TEXTS if sp.decode(sp.encode(t)) != t] == ["▁ a literal mark ▁▁"]


def test_a_tokenizer_without_the_space_prefix_or_with_merges_misranked_fails(spm: tuple) -> None:
    from specrt.convert.tokenizer import sentencepiece_bpe

    sp, (pieces, scores, types) = spm
    assert spm_mismatches(sentencepiece_bpe(pieces, scores, types), sp, bos=False) == []
    no_prefix = sentencepiece_bpe(pieces, scores, types, add_space_prefix=False)
    assert len(spm_mismatches(no_prefix, sp, bos=False)) >= 10  # observed 12 of 13
    # merges by the lowest score first instead of the highest
    misranked = sentencepiece_bpe(pieces, [-s for s in scores], types)
    assert len(spm_mismatches(misranked, sp, bos=False)) >= 3  # observed 4 (whitespace runs, accents, code)


def test_a_sentencepiece_mistral_gguf_converts_and_decodes(spm: tuple, tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    import specrt

    sp, vocab = spm
    g = write_tiny_gguf(tmp_path / "m.gguf", seed=1, spm_vocab=vocab, **MISTRAL)
    folder = convert(g, tmp_path / "onnx", progress=False)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert spm_mismatches(tok, sp) == []
    cfg = json.loads((folder / "specrt_config.json").read_text())
    assert (cfg["bos_token_id"], cfg["eos_token_ids"], cfg["vocab_size"]) == (1, [2], len(vocab[0]))
    out = specrt.Decoder(folder, max_seq_len=64).generate(
        "Café 中文 🤖", max_new_tokens=24, temperature=0, ignore_eos=True
    )
    assert out.token_ids[:1] != [] and out.text == tok.decode(out.token_ids)


@pytest.mark.parametrize("attention", ["gqa", "batched"])
def test_a_graph_for_a_newer_onnx_runtime_is_refused_before_it_runs(gguf: Path, tmp_path: Path, attention: str) -> None:
    """A windowed graph needs ONNX Runtime >= 1.24 (``min_onnxruntime``): an older library would run it with one key
    more per window. The loader compares the folder's ``min_onnxruntime`` with the loaded library; raised above it,
    the same folder is refused naming both versions."""
    import specrt
    from specrt._ort import ort_version

    folder = convert(gguf, tmp_path / "m", progress=False, attention=attention)
    specrt.Decoder(folder, max_seq_len=64)  # the installed ONNX Runtime is new enough
    config_path = folder / "specrt_config.json"
    config = json.loads(config_path.read_text())
    config["min_onnxruntime"] = "99.0"
    config_path.write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=rf">= 99\.0 .*loaded library is {re.escape(str(ort_version()))}"):
        specrt.Decoder(folder, max_seq_len=64)
