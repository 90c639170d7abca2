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

Phi-3 / Phi-3.5 / Phi-4-mini's ``longrope`` (Hugging Face ``rope_type: "longrope"`` or the older ``"su"``;
transformers' ``_compute_longrope_parameters``; llama.cpp's ``rope_factors_short`` / ``rope_factors_long`` tensors and
``rope.scaling.attn_factor``) has two sets of divisors, ``short_factor`` and ``long_factor`` (``[rotary_dim / 2]``
each), and multiplies cos and sin by ``sqrt(1 + ln(s) / ln(L))`` with ``s = max_position_embeddings / L``
(1 when ``s <= 1``; ``rope_scaling.attention_factor`` where the config sets one). Which set rotates is decided once
per graph (:func:`longrope_choice`), as llama.cpp decides it once per context: the long factors when the graph is
made for more than ``L`` positions (``max_positions``, by default ``max_position_embeddings``), else the short ones.
Every cached key is then rotated by the same rule whatever the later positions are; transformers instead recomputes
the frequencies from the longest position of each forward call (``dynamic`` update), which re-rotates nothing already
cached and so mixes both sets in one cache once a generation crosses ``L``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from specrt.convert.errors import UnsupportedModelError

__all__ = [
    "LLAMA3_KEYS",
    "LongRope",
    "hf_rope",
    "inv_freq",
    "llama3_freq_factors",
    "longrope_attention_factor",
    "longrope_choice",
    "rope_cache",
    "rope_scaling_factors",
]

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
    theta: float,
    head_dim: int,
    max_positions: int,
    freq_factors: np.ndarray | tuple[float, ...] | None = None,
    attention_factor: float = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin tables for half-split rotary embedding.

    Args:
        theta, head_dim, freq_factors: as :func:`inv_freq` (``head_dim``: the rotary width, ``rotary_dim`` under
            partial rotary).
        max_positions: rows.
        attention_factor: multiplies every entry (longrope's magnitude correction; 1 otherwise).

    Returns:
        ``(cos, sin)``, each float32 ``[max_positions, head_dim // 2]``: entry
        ``[p, i] = attention_factor * cos/sin(p * inv_freq[i])`` (:func:`inv_freq`; computed in float64, then
        rounded).
    """
    angles = np.outer(np.arange(max_positions, dtype=np.float64), inv_freq(theta, head_dim, freq_factors))
    a = float(attention_factor)
    return (a * np.cos(angles)).astype(np.float32), (a * np.sin(angles)).astype(np.float32)


@dataclass(frozen=True)
class LongRope:
    """A ``longrope`` scaling (the module docstring gives the rule and its sources).

    Attributes:
        short_factors: float ``[rotary_dim / 2]`` divisors used up to ``original_max_position_embeddings``.
        long_factors: float ``[rotary_dim / 2]`` divisors used beyond it.
        original_max_position_embeddings: ``L``, the pretrained context.
        attention_factor: the cos/sin multiplier (:func:`longrope_attention_factor`).
    """

    short_factors: tuple[float, ...]
    long_factors: tuple[float, ...]
    original_max_position_embeddings: int
    attention_factor: float


def longrope_attention_factor(max_position_embeddings: int, original_max_position_embeddings: int) -> float:
    """``sqrt(1 + ln(s) / ln(L))`` with ``s = max_position_embeddings / L``, or 1 when ``s <= 1`` (transformers'
    ``_compute_longrope_parameters``; llama.cpp's converter writes the same as ``rope.scaling.attn_factor``)."""
    scale = max_position_embeddings / original_max_position_embeddings
    if scale <= 1.0:
        return 1.0
    return math.sqrt(1.0 + math.log(scale) / math.log(original_max_position_embeddings))


def longrope_choice(
    short_factors: tuple[float, ...] | None,
    long_factors: tuple[float, ...] | None,
    original_max_position_embeddings: int | None,
    max_positions: int,
) -> tuple[float, ...] | None:
    """The divisors a graph made for ``max_positions`` positions rotates with: ``long_factors`` when there are any and
    ``max_positions > original_max_position_embeddings`` (llama.cpp's ``get_rope_factors`` with the context size),
    else ``short_factors`` (also Llama 3.x's single set, or None for plain RoPE)."""
    if long_factors is not None and original_max_position_embeddings is not None:
        return long_factors if max_positions > original_max_position_embeddings else short_factors
    return short_factors


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


def _checked_factors(value: object, half: int, field: str) -> tuple[float, ...]:
    if (
        not isinstance(value, list)
        or len(value) != half
        or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in value)
    ):
        raise UnsupportedModelError(
            f"config.json {field} must be a list of {half} positive numbers (rotary_dim / 2), got {value!r}"
        )
    return tuple(float(v) for v in value)


def hf_rope(
    scaling: Mapping[str, Any] | None,
    theta: float,
    rotary_dim: int,
    max_position_embeddings: int,
    original_max_position_embeddings: object = None,
    field: str = "rope_scaling",
) -> np.ndarray | LongRope | None:
    """The rotary scaling of a Hugging Face ``config.json``: Llama 3.x's divisors, a :class:`LongRope`, or None.

    Args:
        scaling: the ``rope_scaling`` / ``rope_parameters`` object.
        theta: ``rope_theta``.
        rotary_dim: the rotated width (``head_dim * partial_rotary_factor``).
        max_position_embeddings: ``config.json``'s, for longrope's attention factor.
        original_max_position_embeddings: the top-level ``config.json`` key (Phi-3); the object's own key otherwise.
        field: the object's name in messages.

    Returns:
        float32 ``[rotary_dim / 2]`` (``llama3``: :func:`rope_scaling_factors`), a :class:`LongRope` (``longrope`` /
        ``su``), or None (no scaling).

    Raises:
        UnsupportedModelError: another type, or a malformed longrope key (the message names ``<field>.<key>``).
    """
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type"))
    if not scaling or kind not in ("longrope", "su"):
        return rope_scaling_factors(scaling, theta, rotary_dim, field)
    half = rotary_dim // 2
    short = _checked_factors(scaling.get("short_factor"), half, f"{field}.short_factor")
    long = _checked_factors(scaling.get("long_factor"), half, f"{field}.long_factor")
    original = original_max_position_embeddings
    where = "original_max_position_embeddings"
    if original is None:
        original, where = scaling.get("original_max_position_embeddings"), f"{field}.original_max_position_embeddings"
    if isinstance(original, bool) or not isinstance(original, int) or original < 2:
        raise UnsupportedModelError(f"config.json {where} must be an integer >= 2 (longrope scaling), got {original!r}")
    attention = scaling.get("attention_factor")
    if attention is None:
        attention = longrope_attention_factor(max_position_embeddings, original)
    elif isinstance(attention, bool) or not isinstance(attention, (int, float)) or not attention > 0:
        raise UnsupportedModelError(
            f"config.json {field}.attention_factor must be a positive number, got {attention!r}"
        )
    return LongRope(short, long, original, float(attention))


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
            f"RoPE scaling {kind!r} (config.json {field}.rope_type) is not implemented; supported: 'llama3', 'longrope'"
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
