"""The prefill graph (``convert(..., prefill_graph=True)``, ``specrt convert --prefill-graph``): the same decoder with
its attention and gate|up matrices in int8 (``DynamicQuantizeMatMul``), on which a draft runs its passes of at least
``prefill_min_tokens`` new tokens per row (prompt prefill, catch-up). It only changes the draft's proposals: the output
stays the target's, which these tests check with a deliberately wrong prefill graph (another model's weights), on
the single-stream and the batched engine, and they check that the graph is used at all (acceptance changes) and what
the converter writes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import specrt
from specrt.convert import PREFILL_MIN_TOKENS, UnsupportedModelError, convert
from specrt.convert.tiny import write_tiny_gguf
from specrt.convert.weights import WeightPlan
from specrt.scheduler import Scheduler

PROMPTS = [list(range(5, 5 + n)) for n in (40, 23, 61)]  # every prompt >= PREFILL_MIN_TOKENS: prefilled on it


def _initializers(model_file: Path) -> dict[str, np.ndarray]:
    import onnx
    from onnx import numpy_helper

    m = onnx.load(str(model_file))
    return {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}


def test_the_converter_writes_the_prefill_graph_and_records_it(tmp_path: Path) -> None:
    import onnx

    g = write_tiny_gguf(tmp_path / "m.gguf", arch="qwen2", seed=1, tied=False, matrix_type="F16", embed_type="F16")
    folder = convert(g, tmp_path / "q", dtype="int4", attention="batched", prefill_graph=True, progress=False)
    cfg = json.loads((folder / "specrt_config.json").read_text())
    assert cfg["prefill_graph"] == "prefill.onnx" and cfg["prefill_min_tokens"] == PREFILL_MIN_TOKENS
    assert cfg["prefill_weights"]["attn"] == cfg["prefill_weights"]["mlp"] == "qint8"
    # The down projection, head and embedding keep the model's storage.
    assert cfg["prefill_weights"]["down"] == cfg["weights"]["mlp"] == "int4"
    assert cfg["prefill_weights"]["head"] == cfg["weights"]["head"] == "int4"
    main = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    pre = onnx.load(str(folder / "prefill.onnx"), load_external_data=False)
    # Same contract: the same inputs and outputs, by name, type and shape.
    assert [str(i) for i in main.graph.input] == [str(i) for i in pre.graph.input]
    assert [str(o) for o in main.graph.output] == [str(o) for o in pre.graph.output]
    ops = [n.op_type for n in pre.graph.node]
    n_layers = cfg["num_layers"]
    assert ops.count("DynamicQuantizeMatMul") == 3 * n_layers  # qkv, o, gate|up per layer
    assert ops.count("MatMulNBits") == n_layers + 1  # down and the head keep the model's storage
    # Each int8 matrix holds the float weight to half a step of its row's scale.
    inits = _initializers(folder / "prefill.onnx")
    from specrt.convert.gguf_reader import GGUFModel

    with GGUFModel(g) as model:
        w = np.concatenate([model.tensor("blk.0.ffn_gate.weight"), model.tensor("blk.0.ffn_up.weight")])
    q, scale = inits["blk.0.ffn_gate_up.qweight"], inits["blk.0.ffn_gate_up.scale"]
    assert q.dtype == np.int8 and q.shape == (w.shape[1], w.shape[0]) and scale.shape == (w.shape[0],)
    assert np.all(np.abs(q.T * scale[:, None] - w) <= scale[:, None] / 2 + 1e-7)
    assert np.all(inits["blk.0.ffn_gate_up.zero_point"] == 0)


def test_prefill_graph_is_refused_for_fp16_and_qint8_only_for_matrices(tmp_path: Path) -> None:
    g = write_tiny_gguf(tmp_path / "m.gguf", arch="qwen2", seed=1)
    with pytest.raises(UnsupportedModelError, match="prefill_graph needs float32 activations"):
        convert(g, tmp_path / "h", dtype="fp16", prefill_graph=True, progress=False)
    assert not (tmp_path / "h").exists()
    with pytest.raises(UnsupportedModelError, match="graph form 'gqa-graph' is for CUDA"):
        convert(g, tmp_path / "gf", attention="gqa-graph", prefill_graph=True, progress=False)
    for kind in ("embed", "head"):
        with pytest.raises(ValueError, match=f"{kind} storage 'qint8' is invalid"):
            WeightPlan(**{kind: "qint8"})
    with pytest.raises(ValueError, match="needs dtype fp32"):
        WeightPlan(dtype="fp16", mlp="qint8")


@pytest.mark.parametrize(("dtype", "attention"), [("fp16", "gqa"), ("int4", "gqa-graph")])
def test_models_pull_refuses_a_prefill_graph_before_downloading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dtype: str, attention: str
) -> None:
    from specrt import models

    monkeypatch.setenv("SPECRT_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(UnsupportedModelError, match=f"got dtype '{dtype}', attention '{attention}'"):
        models.pull("smollm2-135m-instruct", dtype, attention=attention, prefill_graph=True, progress=False)
    assert not list(tmp_path.rglob("*.gguf")), "nothing may be downloaded for a refused request"


def test_the_prefill_graph_is_the_same_model_and_its_cache_serves_the_model(tmp_path: Path) -> None:
    # The GQA form, driven as specrt-ort drives it: a prefill on prefill.onnx, then steps on model.onnx reading the
    # cache the prefill graph wrote, against model.onnx alone. A tiny random model has outsized activations
    # (per-tensor uint8 activations lose most there; measured: 6% relative RMS error on the logits); a wrong weight or
    # layout is ~100%. The real-model check is the SmolLM2 test below.
    from test_convert_formats import IDS, Runner

    g = write_tiny_gguf(tmp_path / "m.gguf", arch="qwen2", seed=1, tied=False, matrix_type="F16", embed_type="F16")
    folder = convert(g, tmp_path / "m", prefill_graph=True, progress=False)
    pre_folder = tmp_path / "pre"
    pre_folder.mkdir()
    shutil.copy(folder / "prefill.onnx", pre_folder / "model.onnx")  # its weights stay in prefill.onnx.data
    shutil.copy(folder / "prefill.onnx.data", pre_folder / "prefill.onnx.data")
    shutil.copy(folder / "specrt_config.json", pre_folder / "specrt_config.json")
    ref = Runner(folder)(IDS, 0)
    both, pre = Runner(folder), Runner(pre_folder)
    both.kv = pre.kv  # one cache: the prefill graph writes it, the model reads it
    got = np.concatenate([pre(IDS[:8], 0), both(IDS[8:10], 8), both(IDS[10:], 10)])
    rel_rms = np.sqrt(np.mean((got - ref) ** 2) / np.mean(ref**2))
    assert 0 < rel_rms < 0.15, rel_rms


@pytest.mark.model
def test_smollm2_prefill_graph_agrees_with_the_model() -> None:
    # Teacher-forced on real text through specrt's own backend: the prefill graph's argmax agrees with the model's
    # at most positions (measured 0.88 top-1, KL 0.067 nats: int8 weights and per-tensor int8 activations in every
    # matrix but the down projection; 0.73 / 0.60 with it too).
    from tokenizers import Tokenizer

    from specrt import _specrt, models
    from specrt._ort import find_ort_library
    from test_convert_quant_real import TEXTS, _log_softmax

    folder = models.pull("smollm2-135m-instruct", "fp32", progress=False, prefill_graph=True)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    lib = find_ort_library()
    model = _specrt.OrtModel(str(folder), ort_library=lib, max_seq_len=256)
    pre = _specrt.OrtModel(str(folder / "prefill.onnx"), ort_library=lib, max_seq_len=256)
    top1, kl = [], []
    for text in TEXTS:
        ids = np.array(tok.encode(text, add_special_tokens=False).ids, np.int64)
        ref = model.forward(ids, 0, len(ids)).copy()
        got = pre.forward(ids, 0, len(ids)).copy()
        top1.append(got.argmax(-1) == ref.argmax(-1))
        lp_ref, lp = _log_softmax(ref), _log_softmax(got)
        kl.append((np.exp(lp_ref) * (lp_ref - lp)).sum(-1))
    top1_rate, mean_kl = float(np.concatenate(top1).mean()), float(np.concatenate(kl).mean())
    print(f"SmolLM2 prefill graph vs fp32: top1 {top1_rate:.3f}, KL {mean_kl:.4f}")
    assert top1_rate >= 0.85 and mean_kl <= 0.1, (top1_rate, mean_kl)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny int4 pair (2-layer target, 1-layer draft of the same weights) in the GQA and batched forms; the draft
    with its prefill graph, and a copy whose prefill graph holds another model's weights (same shapes)."""
    root = tmp_path_factory.mktemp("prefill")
    out = {}
    for attention in ("gqa", "batched"):
        for name, layers, seed in [("target", 2, 3), ("draft", 1, 3), ("other", 1, 11)]:
            gguf = write_tiny_gguf(root / f"{name}.gguf", arch="qwen2", seed=seed, n_layers=layers)
            out[f"{name}-{attention}"] = convert(
                gguf,
                root / f"{name}-{attention}",
                progress=False,
                attention=attention,
                prefill_graph=name != "target",
                dtype="int4",
            )
        wrong = root / f"wrong-{attention}"
        shutil.copytree(out[f"draft-{attention}"], wrong)
        for f in ("prefill.onnx", "prefill.onnx.data"):
            shutil.copy(out[f"other-{attention}"] / f, wrong / f)
        out[f"wrong-{attention}"] = wrong
    return out


def _run(target: Path, draft: Path | None, batched: bool) -> list:
    kwargs = {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}
    if draft is not None:
        kwargs["num_speculative_tokens"] = 3
    if not batched:
        dec = specrt.Decoder(target, draft, max_seq_len=256)
        return [dec.generate(prompt=p, **kwargs) for p in PROMPTS]
    dec = specrt.Decoder(target, draft, max_seq_len=256, max_batch=3, prefill_chunk=32)
    with Scheduler(dec) as sched:
        handles = [sched.submit(prompt=p, **kwargs) for p in PROMPTS]
        return [h.result() for h in handles]


@pytest.mark.parametrize("attention", ["gqa", "batched"])
def test_a_draft_prefill_graph_changes_proposals_never_the_output(pair, attention: str) -> None:
    batched = attention == "batched"
    want = [r.token_ids for r in _run(pair[f"target-{attention}"], None, batched)]
    honest = _run(pair[f"target-{attention}"], pair[f"draft-{attention}"], batched)
    wrong = _run(pair[f"target-{attention}"], pair[f"wrong-{attention}"], batched)
    assert [r.token_ids for r in honest] == want
    assert [r.token_ids for r in wrong] == want
    # The wrong prefill graph was used: the draft's cache holds another model's keys and values, so it proposes
    # differently (greedy and deterministic: equal counts would mean it never ran).
    acc = [sum(r.stats.n_accepted for r in rs) for rs in (honest, wrong)]
    assert acc[0] != acc[1], acc
    assert sum(r.stats.n_drafted for r in honest) > 0
