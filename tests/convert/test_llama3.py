"""Llama 3.x's ``llama3`` RoPE frequency scaling (issue 41): Llama 3.1 / 3.2 / 3.3 divide each rotary frequency by a
factor in ``[1, factor]`` (:mod:`specrt.convert.rope`), stored in GGUF as ``rope_freqs.weight`` (llama.cpp's
``freq_factors``) and in Hugging Face ``config.json`` as ``rope_scaling`` (``rope_type: llama3``; transformers 5:
``rope_parameters``).

The tiny llama here has the scaling at a strength that matters at test lengths: ``original_max_position_embeddings``
32 and head_dim 16, so of the 8 frequencies one is kept, one is interpolated and six are divided by 8 (a model that
ignores the factors is off by hundreds of tolerances below). Here: the factors
against transformers' formula, fp32 against the NumPy reference (which reads ``rope_freqs.weight`` from the file
itself) over a prefill, a chunk on the cache, a rollback and a one-token step, from the GGUF and from a Hugging Face
folder with the same weights (both config forms), a model ignoring the factors failing it, and the refusals. Every
other form is checked for each family alike in tests/convert/test_families.py.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from family_checks import FAMILIES, copy_gguf, errors_without, sequence_errors
from specrt.convert import GGUFFormatError, UnsupportedModelError, convert
from specrt.convert.gguf_reader import GGUFModel
from specrt.convert.rope import llama3_freq_factors, rope_scaling_factors
from specrt.convert.tiny import write_hf_folder, write_tiny_gguf

LLAMA3 = FAMILIES["llama3"]
SCALING = LLAMA3["rope_scaling_llama3"]
HF_SCALING = {"rope_type": "llama3", **SCALING}
# Llama 3.1 8B's config.json (rope_theta 500000, head_dim 128).
LLAMA31 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def _hf_llama3_inv_freq(theta: float, dim: int, factor: float, low: float, high: float, old_len: int) -> np.ndarray:
    """transformers' ``_compute_llama3_parameters`` transcribed to NumPy as it is written there (masks over the
    whole vector, smoothing of ``inv_freq / factor`` and ``inv_freq``), an implementation independent of ours."""
    inv_freq = 1.0 / (theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled)


@pytest.mark.parametrize(("theta", "dim", "params"), [(500000.0, 128, LLAMA31), (10000.0, 16, SCALING)])
def test_the_factors_give_transformers_frequencies(theta: float, dim: int, params: dict) -> None:
    factors = llama3_freq_factors(theta, dim, **params)
    base = 1.0 / (theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    want = _hf_llama3_inv_freq(theta, dim, *params.values())
    np.testing.assert_allclose(base / factors.astype(np.float64), want, rtol=1e-6)  # float32 factors
    assert factors[0] == 1 and factors[-1] == params["factor"]
    assert np.all(np.diff(factors) >= 0)
    if dim == 16:  # the tiny model's split, as the module docstring says: one kept, one interpolated, six divided
        assert (factors == 1).sum() == 1 and ((factors > 1) & (factors < 8)).sum() == 1 and (factors == 8).sum() == 6


def test_the_hf_forms_of_the_config_and_the_refusals() -> None:
    want = llama3_freq_factors(10000.0, 16, **SCALING)
    assert np.array_equal(rope_scaling_factors(HF_SCALING, 10000.0, 16), want)
    assert np.array_equal(rope_scaling_factors({"type": "llama3", **SCALING}, 10000.0, 16), want)  # older key
    assert rope_scaling_factors(None, 10000.0, 16) is None
    assert rope_scaling_factors({"rope_type": "default", "rope_theta": 1e4}, 10000.0, 16) is None
    with pytest.raises(UnsupportedModelError, match=r"RoPE scaling 'yarn' \(config.json rope_scaling.rope_type\)"):
        rope_scaling_factors({"rope_type": "yarn", "factor": 4.0}, 10000.0, 16)
    bad = dict(HF_SCALING, high_freq_factor=None)
    with pytest.raises(UnsupportedModelError, match=r"rope_parameters.high_freq_factor must be a number"):
        rope_scaling_factors(bad, 10000.0, 16, "rope_parameters")
    with pytest.raises(UnsupportedModelError, match=r"rope_scaling.factor must be >= 1"):
        rope_scaling_factors(dict(HF_SCALING, factor=0.5), 10000.0, 16)


@pytest.fixture(scope="module")
def gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("llama3") / "m.gguf", seed=1, **LLAMA3)


def test_the_tiny_llama3_carries_its_factors(gguf: Path) -> None:
    with GGUFModel(gguf) as model:
        spec = model.spec()
        assert spec.architecture == "llama" and spec.head_dim == 16
        assert spec.rope_freq_factors == tuple(float(f) for f in llama3_freq_factors(10000.0, 16, **SCALING))


@pytest.mark.parametrize("source", ["gguf", "hf", "hf-transformers5"])
def test_fp32_equals_the_reference_over_prefill_chunk_rollback_and_step(tmp_path: Path, source: str) -> None:
    g = write_tiny_gguf(tmp_path / "m.gguf", seed=1, **LLAMA3)
    src: Path = g
    if source != "gguf":
        src = write_hf_folder(g, tmp_path / "hf", rope_scaling=HF_SCALING)
        if source == "hf-transformers5":  # rope_parameters instead of rope_theta + rope_scaling
            cfg = json.loads((src / "config.json").read_text())
            cfg["rope_parameters"] = {**cfg.pop("rope_scaling"), "rope_theta": cfg.pop("rope_theta")}
            (src / "config.json").write_text(json.dumps(cfg))
    folder = convert(src, tmp_path / "onnx", progress=False)
    cfg = json.loads((folder / "specrt_config.json").read_text())
    assert len(cfg["rope_freq_factors"]) == 8
    errors = sequence_errors(folder, GGUFModel(g))
    assert max(errors) <= 1, errors


def test_ignoring_the_factors_fails_the_reference(tmp_path: Path) -> None:
    g = write_tiny_gguf(tmp_path / "m.gguf", seed=1, **LLAMA3)
    errors = errors_without(g, tmp_path / "broken", rope_freq_factors=None)
    assert min(errors) > 100, errors  # each step off by more than 100 tolerances (observed 2900-11000)


def test_misshapen_factors_and_other_scalings_are_refused(tmp_path: Path) -> None:
    g = write_tiny_gguf(tmp_path / "m.gguf", seed=1, **LLAMA3)
    with pytest.raises(ValueError, match=r"does not give the GGUF's rope_freqs\.weight"):
        write_hf_folder(g, tmp_path / "hf-bad", rope_scaling=dict(HF_SCALING, factor=4.0))
    with pytest.raises(ValueError, match=r"does not give the GGUF's rope_freqs\.weight"):
        write_hf_folder(g, tmp_path / "hf-none")
    hf = write_hf_folder(g, tmp_path / "hf", rope_scaling=HF_SCALING)
    cfg = json.loads((hf / "config.json").read_text())
    cfg["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0}  # longrope is phi3's (tests/convert/test_phi3.py)
    (hf / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError, match=r"'yarn' \(config.json rope_scaling.rope_type\)"):
        convert(hf, tmp_path / "out", progress=False)
    copy_gguf(g, tmp_path / "bad.gguf", change=lambda name, x: x[:4] if name == "rope_freqs.weight" else x)
    with (
        pytest.raises(GGUFFormatError, match=r"'rope_freqs.weight' has shape \[4\], expected \[8\]"),
        GGUFModel(tmp_path / "bad.gguf") as model,
    ):
        model.spec()
