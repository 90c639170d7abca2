"""The ``qwen3`` family (issue 41): the qwen2 decoder without q/k/v biases, with a per-head RMSNorm of q and of k
(weights ``[head_dim]``) after the projections and before rotary, and a head_dim of its own (here 32 over a
64 / 4 = 16 split). The tiny qwen3 GGUF has every feature on: q/k norms with weights ~ 1 +- 0.3, head_dim != hidden /
heads, tied embeddings (and an untied copy through a Hugging Face folder).

Every form is checked the way the existing families are (the helpers and checks of those tests are reused): fp32
against the NumPy reference over a prefill, a chunk on the cache, a rollback and a one-token step; int4 / int8 on
their own weights, fp16 loosely; the batched form, the graph form, the prefill graph and a pruned vocabulary against
fp32; greedy speculative decoding against the target alone. A converter that skips the norms fails the reference.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import specrt
from specrt.convert import GGUFFormatError, HFFormatError, convert
from specrt.convert.gguf_reader import GGUFModel
from specrt.convert.reference import reference_logits
from specrt.convert.tiny import write_hf_folder, write_tiny_gguf
from test_batched_graph import Batch, Solo
from test_batched_graph import test_each_row_equals_its_solo_run as rows_equal_solo_runs
from test_convert_formats import IDS, Runner
from test_convert_formats import test_chunk_on_cache_equals_full_prefill_and_rollback_forgets as cache_check
from test_convert_formats import test_fp16_graph_stays_close_to_the_reference as fp16_check
from test_convert_formats import test_quantized_graph_equals_the_reference_on_its_own_weights as quantized_check
from test_graph_form import test_graph_form_gives_the_default_forms_logits as graph_form_check

QWEN3 = {"arch": "qwen3", "tied": True, "matrix_type": "Q8_0"}
# fp32 tolerance: float32 rounding (unit roundoff 6e-8) over dot products of <= 128 terms in 2 layers, on logits of
# magnitude ~30, is ~1e-4 at worst (observed 3e-5); the budget is 1e-3 per 10 units of the largest logit, that of
# the llama / qwen2 reference tests. Skipping the q/k norms is off by ~10 (test below).
ATOL = 1e-3


def _tol(ref: np.ndarray) -> float:
    return ATOL * max(1.0, float(np.abs(ref).max()) / 10)


def _sequence_errors(folder: Path, model: GGUFModel) -> list[float]:
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
        errors.append(float(np.abs(got - want).max()) / _tol(want))
        if errors[-1] <= 1:
            np.testing.assert_array_equal(got.argmax(-1), want.argmax(-1))
    return errors


@pytest.fixture(scope="module")
def gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("qwen3") / "m.gguf", seed=1, **QWEN3)


def test_the_tiny_qwen3_has_every_feature(gguf: Path) -> None:
    with GGUFModel(gguf) as model:
        spec = model.spec()
        assert (spec.architecture, spec.qk_norm, spec.qkv_bias, spec.tied_embeddings) == ("qwen3", True, False, True)
        assert spec.head_dim == 32 != spec.hidden_size // spec.num_attention_heads
        assert spec.arch.hf_architecture == "Qwen3ForCausalLM"
        norm = model.tensor("blk.1.attn_k_norm.weight")
        assert norm.shape == (32,) and np.abs(norm - 1).max() > 0.3  # far from the identity


@pytest.mark.parametrize("source", ["gguf", "hf"])
def test_fp32_equals_the_reference_over_prefill_chunk_rollback_and_step(tmp_path: Path, source: str) -> None:
    if source == "gguf":
        g = write_tiny_gguf(tmp_path / "m.gguf", seed=1, **QWEN3)
        src = g
    else:  # untied, through a Hugging Face folder (config.json head_dim, self_attn.q_norm / k_norm)
        g = write_tiny_gguf(tmp_path / "m.gguf", seed=2, **dict(QWEN3, tied=False, matrix_type="F16"))
        src = write_hf_folder(g, tmp_path / "hf", shards=2)
        cfg = json.loads((src / "config.json").read_text())
        assert (cfg["model_type"], cfg["architectures"], cfg["head_dim"]) == ("qwen3", ["Qwen3ForCausalLM"], 32)
    folder = convert(src, tmp_path / "onnx", progress=False)
    cfg = json.loads((folder / "specrt_config.json").read_text())
    assert (cfg["architecture"], cfg["hf_architecture"], cfg["head_dim"]) == ("qwen3", "Qwen3ForCausalLM", 32)
    errors = _sequence_errors(folder, GGUFModel(g))
    assert max(errors) <= 1, errors


def test_skipping_the_norms_fails_the_reference(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    g = write_tiny_gguf(tmp_path / "m.gguf", seed=1, **QWEN3)
    spec = GGUFModel.spec
    monkeypatch.setattr(GGUFModel, "spec", lambda self: dataclasses.replace(spec(self), qk_norm=False))
    broken = convert(g, tmp_path / "broken", progress=False)
    monkeypatch.undo()
    errors = _sequence_errors(broken, GGUFModel(g))
    assert min(errors) > 100, errors  # each step off by more than 100 tolerances


def test_missing_or_misshapen_norms_are_named(tmp_path: Path) -> None:
    g = write_tiny_gguf(tmp_path / "m.gguf", seed=1, **QWEN3)
    hf = write_hf_folder(g, tmp_path / "hf", drop=("model.layers.1.self_attn.k_norm.weight",))
    with pytest.raises(HFFormatError, match=r"'model.layers.1.self_attn.k_norm.weight' is missing"):
        convert(hf, tmp_path / "out", progress=False)
    cfg = json.loads((write_hf_folder(g, tmp_path / "hf2") / "config.json").read_text())
    cfg["head_dim"] = 16
    (tmp_path / "hf2" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(HFFormatError, match=r"q_proj.weight' has shape \[128, 64\], expected \[64, 64\]"):
        convert(tmp_path / "hf2", tmp_path / "out", progress=False)
    import gguf as gguf_pkg

    w = gguf_pkg.GGUFWriter(str(tmp_path / "nonorm.gguf"), "qwen3")  # a qwen3 GGUF without its norms
    reader = GGUFModel(g)
    for key in ("block_count", "context_length", "embedding_length", "feed_forward_length"):
        w.add_uint32(f"qwen3.{key}", int(reader.get(f"qwen3.{key}")))
    for key in ("head_count", "head_count_kv", "key_length"):
        w.add_uint32(f"qwen3.attention.{key}", int(reader.get(f"qwen3.attention.{key}")))
    w.add_float32("qwen3.attention.layer_norm_rms_epsilon", 1e-5)
    for name in reader.tensors:
        if name not in ("blk.1.attn_q_norm.weight", "blk.1.attn_k_norm.weight"):
            w.add_tensor(name, reader.raw_tensor(name))
    reader.close()
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with (
        pytest.raises(GGUFFormatError, match=r"'blk.1.attn_q_norm.weight' is missing \(a qwen3 q/k norm needs \[32\]"),
        GGUFModel(tmp_path / "nonorm.gguf") as model,
    ):
        model.spec()


@pytest.mark.parametrize("storage", ["int4", "int8"])
def test_quantized_forms_equal_the_reference_on_their_own_weights(tmp_path: Path, storage: str) -> None:
    quantized_check(tmp_path, QWEN3, storage)


def test_fp16_stays_close_to_the_reference(tmp_path: Path) -> None:
    fp16_check(tmp_path, QWEN3)


@pytest.mark.parametrize("dtype", ["fp16", "int4", "int8"])
def test_cache_chunk_rollback_and_step_in_every_dtype(tmp_path: Path, dtype: str) -> None:
    cache_check(tmp_path, QWEN3, dtype)


def _sessions(gguf: Path, root: Path, forms: list[str], dtype: str = "fp32") -> dict:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    out = {}
    for attention in forms:
        folder = convert(gguf, root / f"{attention}-{dtype}", dtype=dtype, progress=False, attention=attention)
        out[attention] = ort.InferenceSession(str(folder / "model.onnx"), so, providers=["CPUExecutionProvider"])
        out[f"{attention}_config"] = out["config"] = json.loads((folder / "specrt_config.json").read_text())
    return out


@pytest.mark.parametrize("dtype", ["fp32", "int4"])
def test_graph_form_gives_the_default_forms_logits(gguf: Path, tmp_path: Path, dtype: str) -> None:
    forms = _sessions(gguf, tmp_path, ["gqa", "gqa-graph"], dtype)
    for total_is_capacity in (False, True):
        graph_form_check(forms, total_is_capacity)


def test_batched_rows_equal_their_solo_runs(gguf: Path, tmp_path: Path) -> None:
    rows_equal_solo_runs(_sessions(gguf, tmp_path, ["gqa", "batched"]))


@pytest.mark.parametrize("attention", ["gqa", "batched"])
def test_the_prefill_graph_is_the_same_model(gguf: Path, tmp_path: Path, attention: str) -> None:
    # As the qwen2 prefill-graph test: per-tensor uint8 activations on a tiny random model lose a few percent
    # (relative RMS of the logits); a wrong weight or layout is ~100%.
    folder = convert(gguf, tmp_path / "m", progress=False, attention=attention, prefill_graph=True)
    cfg = json.loads((folder / "specrt_config.json").read_text())
    so = ort.SessionOptions()
    so.log_severity_level = 3
    files = ["model.onnx", cfg["prefill_graph"]]
    sessions = [ort.InferenceSession(str(folder / f), so, providers=["CPUExecutionProvider"]) for f in files]
    ids = [int(t) for t in IDS]
    if attention == "gqa":
        ref, got = (Solo(s, cfg).run(ids) for s in sessions)
    else:
        ref, got = (Batch(s, cfg, 1).run([ids])[0] for s in sessions)
    rel_rms = np.sqrt(np.mean((got - ref) ** 2) / np.mean(ref**2))
    assert 0 < rel_rms < 0.15, rel_rms


def test_a_pruned_vocabulary_scores_the_same_logits(gguf: Path, tmp_path: Path) -> None:
    keep = [3, 5, 17, 42, 99, 200, 261, 262, 263]
    full = Runner(convert(gguf, tmp_path / "full", progress=False))(IDS, 0)
    sub = Runner(convert(gguf, tmp_path / "sub", progress=False, vocab_subset=keep))(IDS, 0)
    np.testing.assert_allclose(sub, full[:, keep], rtol=0, atol=1e-5)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A 2-layer qwen3 target and its first layer as the draft, in the default, graph and batched forms."""
    root = tmp_path_factory.mktemp("qwen3-pair")
    g = write_tiny_gguf(root / "t.gguf", seed=3, arch="qwen3", n_layers=2)
    out = {}
    for form in ("gqa", "gqa-graph", "batched"):
        out[f"target-{form}"] = convert(g, root / f"target-{form}", progress=False, attention=form)
        out[f"draft-{form}"] = convert(g, root / f"draft-{form}", progress=False, attention=form, num_layers=1)
    return out


@pytest.mark.parametrize("form", ["gqa", "gqa-graph", "batched"])
def test_greedy_speculative_decoding_equals_the_target_alone(pair: dict[str, Path], form: str) -> None:
    kw = {"max_new_tokens": 32, "temperature": 0, "ignore_eos": True}
    prompt = [3, 14, 15, 92, 6, 5, 35]
    extra = {"max_batch": 2} if form == "batched" else {}
    want = specrt.Decoder(pair[f"target-{form}"], max_seq_len=128, **extra).generate(prompt, **kw).token_ids
    dec = specrt.Decoder(pair[f"target-{form}"], pair[f"draft-{form}"], max_seq_len=128, **extra)
    accepted = 0
    for k in (1, 4):
        got = dec.generate(prompt, **kw, num_speculative_tokens=k)
        assert got.token_ids == want, k
        accepted += got.stats.n_accepted
    assert accepted > 0  # the draft really proposed and was right at times
