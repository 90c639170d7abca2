"""Rotary position embedding frequencies, including Llama 3.x's ``llama3`` frequency scaling.

Plain RoPE rotates the pair ``i`` of a head (``i = 0 .. d/2 - 1``) by ``p * inv_freq[i]`` with
``inv_freq[i] = theta^(-2i/d)`` (Su et al. 2021, arXiv:2104.09864). Llama 3.1 / 3.2 / 3.3 divide each frequency by a
factor ``f[i] >= 1`` (Meta's ``apply_scaling`` in llama-models; Hugging Face ``rope_type: "llama3"``,
``_compute_llama3_parameters``; llama.cpp stores the factors as the ``rope_freqs.weight`` tensor and divides by them
in ``ggml_rope_ext``'s ``freq_factors``). With ``L = original_max_position_embeddings`` and the wavelength
``w[i] = 2 pi / inv_freq[i]``:

- ``w < L / high_freq_factor`` (high frequencies): ``f = 1``;
- ``w > L / low_freq_factor`` (low frequencies): ``f = factor``;
- otherwise, with ``s = (L / w - low_freq_factor) / (high_freq_factor - low_freq_factor)``:
  ``f = 1 / ((1 - s) / factor + s)`` (the frequency is interpolated linearly between ``inv_freq / factor`` and
  ``inv_freq``).

The attention scale is unchanged (``llama3`` has no magnitude correction, unlike YaRN).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from specrt.convert.errors import UnsupportedModelError

__all__ = ["LLAMA3_KEYS", "inv_freq", "llama3_freq_factors", "rope_cache", "rope_scaling_factors"]

#: The keys of a Hugging Face ``rope_scaling`` of type ``llama3`` (besides ``rope_type`` / ``type``).
LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def inv_freq(theta: float, head_dim: int, freq_factors: np.ndarray | tuple[float, ...] | None = None) -> np.ndarray:
    """Rotary frequencies ``theta^(-2i/d) / f[i]``.

    Args:
        theta: the rotary base (``rope_theta``).
        head_dim: ``d`` (even).
        freq_factors: ``[d / 2]`` divisors (llama.cpp's ``rope_freqs``), or None for plain RoPE.

    Returns:
        float64 ``[d / 2]``.

    Raises:
        ValueError: ``freq_factors`` not of length ``d / 2`` or not all positive.
    """
    base = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    if freq_factors is None:
        return base
    f = np.asarray(freq_factors, dtype=np.float64)
    if f.shape != base.shape or not np.all(f > 0):
        raise ValueError(f"rope frequency factors must be {base.shape[0]} positive numbers, got shape {list(f.shape)}")
    return base / f


def rope_cache(
    theta: float, head_dim: int, max_positions: int, freq_factors: np.ndarray | tuple[float, ...] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin tables for half-split rotary embedding.

    Returns:
        ``(cos, sin)``, each float32 ``[max_positions, head_dim // 2]``: entry ``[p, i] = cos/sin(p * inv_freq[i])``
        (:func:`inv_freq`; angles computed in float64, then rounded).
    """
    angles = np.outer(np.arange(max_positions, dtype=np.float64), inv_freq(theta, head_dim, freq_factors))
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def llama3_freq_factors(
    theta: float,
    head_dim: int,
    *,
    factor: float,
    low_freq_factor: float,
    high_freq_factor: float,
    original_max_position_embeddings: int,
) -> np.ndarray:
    """Llama 3.x's per-frequency divisors (the module docstring gives the rule and its sources).

    Returns:
        float32 ``[head_dim / 2]``, each in ``[1, factor]`` (float32 as llama.cpp's converter stores ``rope_freqs``).

    Raises:
        UnsupportedModelError: ``factor < 1``, ``high_freq_factor <= low_freq_factor`` or a non-positive length
            (the message names the ``rope_scaling`` field).
    """
    if not factor >= 1.0:
        raise UnsupportedModelError(f"rope_scaling.factor must be >= 1 for llama3 scaling, got {factor}")
    if not high_freq_factor > low_freq_factor > 0:
        raise UnsupportedModelError(
            "rope_scaling.high_freq_factor must be greater than rope_scaling.low_freq_factor > 0, got "
            f"{high_freq_factor} and {low_freq_factor}"
        )
    if not original_max_position_embeddings > 0:
        raise UnsupportedModelError(
            f"rope_scaling.original_max_position_embeddings must be positive, got {original_max_position_embeddings}"
        )
    length = float(original_max_position_embeddings)
    out = []
    for freq in inv_freq(theta, head_dim):
        wavelen = 2.0 * math.pi / freq
        if wavelen < length / high_freq_factor:
            out.append(1.0)
        elif wavelen > length / low_freq_factor:
            out.append(factor)
        else:
            s = (length / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            out.append(1.0 / ((1.0 - s) / factor + s))
    return np.asarray(out, dtype=np.float32)


def rope_scaling_factors(
    scaling: Mapping[str, Any] | None, theta: float, head_dim: int, field: str = "rope_scaling"
) -> np.ndarray | None:
    """The frequency divisors of a Hugging Face ``config.json`` ``rope_scaling``, or None where there is none.

    Args:
        scaling: the ``rope_scaling`` object (None, empty or of type ``default``: plain RoPE).
        theta: ``rope_theta``.
        head_dim: the rotary width.
        field: the object's name in messages (``rope_scaling``; transformers 5 writes ``rope_parameters``).

    Returns:
        float32 ``[head_dim / 2]`` (:func:`llama3_freq_factors`) or None.

    Raises:
        UnsupportedModelError: a type other than ``llama3`` (``linear``, ``dynamic``, ``yarn``, ``longrope`` ...) or a
            missing / non-numeric ``llama3`` key; the message names ``rope_scaling.<key>``.
    """
    if not scaling:
        return None
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "default":
        return None
    if kind != "llama3":
        raise UnsupportedModelError(
            f"RoPE scaling {kind!r} (config.json {field}.rope_type) is not implemented; supported: 'llama3'"
        )
    values: dict[str, float] = {}
    for key in LLAMA3_KEYS:
        v = scaling.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise UnsupportedModelError(f"config.json {field}.{key} must be a number (llama3 scaling), got {v!r}")
        values[key] = float(v)
    return llama3_freq_factors(
        theta,
        head_dim,
        factor=values["factor"],
        low_freq_factor=values["low_freq_factor"],
        high_freq_factor=values["high_freq_factor"],
        original_max_position_embeddings=int(values["original_max_position_embeddings"]),
    )
