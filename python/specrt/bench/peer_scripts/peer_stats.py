"""Summaries shared by the peer scripts (standard library only: each peer runs in its own venv, without specrt)."""

from __future__ import annotations

import statistics
from typing import Any

#: Per-run timing fields every peer reports for each mode.
TIMING_KEYS = ("decode_tokens_per_s", "tokens_per_s", "prefill_ms", "n_emitted")


def spread(values: list[float | None]) -> dict[str, Any] | None:
    """Median, min, max and count of the non-None values (None if there are none)."""
    v = [float(x) for x in values if x is not None]
    if not v:
        return None
    return {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)}


def mode_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """``{key: spread}`` of :data:`TIMING_KEYS` over the repetitions of one mode."""
    return {key: spread([r.get(key) for r in runs]) for key in TIMING_KEYS}


def paired_ratios(base: list[dict[str, Any]], spec: list[dict[str, Any]]) -> dict[str, Any]:
    """``speedup`` (decode tokens/s) and ``e2e_speedup`` (tokens/s, prefill included), paired per repetition."""
    return {
        "speedup": spread(
            [s["decode_tokens_per_s"] / b["decode_tokens_per_s"] for b, s in zip(base, spec, strict=True)]
        ),
        "e2e_speedup": spread([s["tokens_per_s"] / b["tokens_per_s"] for b, s in zip(base, spec, strict=True)]),
    }
