"""The ``gemma3`` family (issue 43): Gemma 3's text decoder as llama.cpp's ``gemma3`` graph runs it. The tiny gemma3
GGUF has every feature on: embeddings times sqrt(hidden), per-head q/k norms, RMSNorms before and after attention and
the MLP (four per layer, weights ~ 1 +- 0.3, stored as llama.cpp's converter stores Gemma's ``1 + w``), GELU-tanh
gating, tied embeddings, and interleaved layers: layer 0 local (a window of 5 positions, rotary base 1e4 from
``gemma3.rope.freq_base_swa``), layer 1 global (full attention, rotary base 1e6; ``sliding_window_pattern`` 2).

Here: fp32 against the NumPy reference over a prefill, a chunk on the cache, a rollback and a one-token step (default
and batched layouts); converters that drop each feature failing it; llama.cpp's defaults (every 6th layer global,
local base 1e4) and the refusals. Every other form (quantized, fp16, graph form, prefill graph, pruned vocabulary,
speculative decoding, the losslessness certificate) is checked for each family alike in
tests/convert/test_families.py; llama.cpp itself in tests/convert/test_llama_cpp_oracle.py.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from family_checks import FAMILIES, errors_without, sequence_errors, tolerance
from specrt.convert import UnsupportedModelError, convert, gguf_reader
from specrt.convert.gguf_reader import GGUFModel
from specrt.convert.reference_forward import reference_logits
from specrt.convert.tiny import write_tiny_gguf
from test_convert_formats import IDS, Runner
from test_mistral import batched_errors

GEMMA3 = FAMILIES["gemma3"]


@pytest.fixture(scope="module")
def gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gemma3") / "m.gguf", seed=1, **GEMMA3)


def test_the_tiny_gemma3_has_every_feature(gguf: Path) -> None:
    with GGUFModel(gguf) as model:
        spec = model.spec()
        arch = spec.arch
        assert (arch.sandwich_norms, arch.mlp_activation, arch.embed_scale, spec.qk_norm) == (
            True,
            "gelu_tanh",
            True,
            True,
        )
        assert spec.tied_embeddings and spec.arch.hf_architecture == "Gemma3ForCausalLM"
        assert [spec.is_global_layer(i) for i in range(2)] == [False, True]
        assert [spec.layer_rope_theta(i) for i in range(2)] == [1e4, 1e6]
        assert [spec.layer_window(i, spec.sliding_window) for i in range(2)] == [5, None]
        for name in ("post_attention_norm", "post_ffw_norm", "attn_q_norm"):
            w = model.tensor(f"blk.1.{name}.weight")
            assert np.abs(w - 1).max() > 0.3  # far from the identity


def test_llama_cpps_defaults_every_sixth_layer_global_local_base_1e4(tmp_path: Path) -> None:
    kw = {k: v for k, v in GEMMA3.items() if k not in ("sliding_window_pattern", "rope_local_theta")}
    with GGUFModel(write_tiny_gguf(tmp_path / "m.gguf", n_layers=7, **kw)) as model:
        spec = model.spec()
    assert [spec.is_global_layer(i) for i in range(7)] == [False] * 5 + [True, False]
    assert spec.rope_local_theta == 1e4 and spec.layer_rope_theta(5) == 1e6
    with GGUFModel(write_tiny_gguf(tmp_path / "full.gguf", **dict(kw, sliding_window=None))) as model:
        spec = model.spec()  # no window: every layer global, one rotary base (llama.cpp's LLAMA_SWA_TYPE_NONE)
    assert spec.local_layers_pattern is None and spec.layer_rope_theta(0) == 1e6


def test_fp32_equals_the_reference_over_prefill_chunk_rollback_and_step(gguf: Path, tmp_path: Path) -> None:
    folder = convert(gguf, tmp_path / "onnx", progress=False)
    with GGUFModel(gguf) as model:
        errors = sequence_errors(folder, model)
    assert max(errors) <= 1, errors


def test_the_batched_layout_equals_the_reference(gguf: Path, tmp_path: Path) -> None:
    with GGUFModel(gguf) as model:
        errors = batched_errors(convert(gguf, tmp_path / "batched", progress=False, attention="batched"), model)
    assert max(errors) <= 1, errors


@pytest.mark.parametrize(
    "change",
    [
        {"local_layers_pattern": None},  # every layer local: one rotary base and the window everywhere
        {"rope_local_theta": 1e6},  # the local layers on the global rotary base
        {"sliding_window": None},  # no window on the local layers
    ],
    ids=lambda c: next(iter(c)),
)
def test_dropping_the_layer_pattern_fails_the_reference(gguf: Path, tmp_path: Path, change: dict) -> None:
    errors = errors_without(gguf, tmp_path / "broken", **change)
    assert min(errors) > 100, errors  # observed 146-3080 tolerances


@pytest.mark.parametrize(
    "change",
    [{"sandwich_norms": False}, {"mlp_activation": "silu"}, {"embed_scale": False}],
    ids=lambda c: next(iter(c)),
)
def test_dropping_a_gemma_layer_feature_fails_the_reference(
    gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: dict
) -> None:
    monkeypatch.setitem(gguf_reader.ARCH_INFO, "gemma3", dataclasses.replace(gguf_reader.ARCH_INFO["gemma3"], **change))
    broken = convert(gguf, tmp_path / "broken", progress=False)
    monkeypatch.undo()
    with GGUFModel(gguf) as model:
        errors = sequence_errors(broken, model)
    assert min(errors) > 100, errors


@pytest.mark.parametrize(
    ("key", "value", "feature"),
    [
        ("gemma3.final_logit_softcapping", 30.0, "final logit soft-capping"),
        ("gemma3.attention.logit_softcapping", 50.0, "attention logit soft-capping"),
        ("gemma3.attention.sliding_window_pattern", [True, False], "gemma3.attention.sliding_window_pattern"),
    ],
)
def test_unimplemented_gemma_features_are_refused_naming_them(
    gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key: str, value: object, feature: str
) -> None:
    real = GGUFModel.get
    monkeypatch.setattr(GGUFModel, "get", lambda self, k, d=None: value if k == key else real(self, k, d))
    with pytest.raises(UnsupportedModelError, match=feature):
        convert(gguf, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_a_layer_truncated_draft_keeps_each_layers_kind(gguf: Path, tmp_path: Path) -> None:
    # Layer 0 alone (the self-speculative draft's cut) is still a local layer: its window and its rotary base
    draft = convert(gguf, tmp_path / "draft", progress=False, num_layers=1)
    with GGUFModel(gguf) as model:
        spec = dataclasses.replace(model.spec(), num_layers=1)
        want = reference_logits(model, IDS, spec)
        wrong = reference_logits(model, IDS, dataclasses.replace(spec, rope_local_theta=1e6))
    got = Runner(draft)(IDS, 0)
    assert np.abs(got - want).max() <= tolerance(want)
    assert np.abs(got - wrong).max() > 100 * tolerance(want)


def test_a_gemma3_hugging_face_folder_is_refused_before_any_work(tmp_path: Path) -> None:
    src = tmp_path / "hf"
    src.mkdir()
    (src / "config.json").write_text('{"model_type": "gemma3", "architectures": ["Gemma3ForCausalLM"]}')
    with pytest.raises(UnsupportedModelError, match=r"Gemma 3 Hugging Face folders .* convert its GGUF instead"):
        convert(src, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()
