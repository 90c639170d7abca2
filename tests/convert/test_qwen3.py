"""The ``qwen3`` family (issue 41): the qwen2 decoder without q/k/v biases, with a per-head RMSNorm of q and of k
(weights ``[head_dim]``) after the projections and before rotary, and a head_dim of its own (here 32 over a
64 / 4 = 16 split). The tiny qwen3 GGUF has every feature on: q/k norms with weights ~ 1 +- 0.3, head_dim != hidden /
heads, tied embeddings (and an untied copy through a Hugging Face folder).

Here: fp32 against the NumPy reference over a prefill, a chunk on the cache, a rollback and a one-token step (from
the GGUF and from a Hugging Face folder), a converter that skips the norms failing it, and the errors for missing
norms. Every other form (quantized, fp16, batched, graph form, prefill graph, pruned vocabulary, speculative decoding,
the losslessness certificate) is checked for each family alike in tests/convert/test_families.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from family_checks import FAMILIES, copy_gguf, errors_without, sequence_errors
from specrt.convert import GGUFFormatError, HFFormatError, UnsupportedModelError, convert
from specrt.convert.gguf_reader import GGUFModel
from specrt.convert.tiny import write_hf_folder, write_tiny_gguf

QWEN3 = FAMILIES["qwen3"]


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
    errors = sequence_errors(folder, GGUFModel(g))
    assert max(errors) <= 1, errors


def test_skipping_the_norms_fails_the_reference(tmp_path: Path) -> None:
    g = write_tiny_gguf(tmp_path / "m.gguf", seed=1, **QWEN3)
    errors = errors_without(g, tmp_path / "broken", qk_norm=False)
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
    # a qwen3 GGUF without its norms
    copy_gguf(g, tmp_path / "nonorm.gguf", drop=("blk.1.attn_q_norm.weight", "blk.1.attn_k_norm.weight"))
    with (
        pytest.raises(GGUFFormatError, match=r"'blk.1.attn_q_norm.weight' is missing \(a qwen3 q/k norm needs \[32\]"),
        GGUFModel(tmp_path / "nonorm.gguf") as model,
    ):
        model.spec()


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_a_qwen_sliding_window_is_refused_naming_the_field(tmp_path: Path, family: str) -> None:
    """Qwen2 / Qwen3 folders with ``use_sliding_window`` (their windows cover only some layers: not implemented)."""
    g = write_tiny_gguf(tmp_path / "m.gguf", seed=1, **FAMILIES[family])
    hf = write_hf_folder(g, tmp_path / "hf")
    cfg = json.loads((hf / "config.json").read_text())
    convert(hf, tmp_path / "full", progress=False)  # the same folder converts without the window
    cfg.update(use_sliding_window=True, sliding_window=4, max_window_layers=1)
    (hf / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError, match=r"sliding-window attention \(config.json use_sliding_window\)"):
        convert(hf, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()
