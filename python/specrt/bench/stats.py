"""Statistics of timed runs and the cost model's prediction (pure arithmetic, no models).

:class:`Run` is one timed generation; :func:`summarize_pair` turns paired target-only and speculative runs of one
prompt into the per-prompt figures, :func:`aggregate` a group of prompts into totals, :func:`predict` measured terms
into the cost model's speedup, :func:`predict_from_acceptance` costs measured on one pair and a given acceptance into
another pair's speedup over K.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any


def spread(values: Iterable[float | None]) -> dict[str, Any] | None:
    """Median, min, max and count of the non-None values (None if there are none)."""
    v = [float(x) for x in values if x is not None]
    if not v:
        return None
    return {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)}


def med(s: dict[str, Any] | None) -> float | None:
    return None if s is None else s["median"]


def predict(
    mean_tokens_per_round: float, k: int, c_q_ms: float, c_p_ms: float, c_verify_ratio: float
) -> dict[str, float | None]:
    """The cost model's speedup from measured terms (Leviathan et al. 2023, arXiv:2211.17192, with c_verify(K)).

    Inputs: E = measured mean tokens per round in [1, K + 1] (clamped into it), K >= 0 draft tokens per round,
    c_q = ms per draft pass, c_p = target-only ms per token, c_verify_ratio = c_verify(K) / c_p (cost of scoring
    K + 1 tokens relative to one).

    Output: ``alpha_fit`` (the geometric model's per-token a that gives E, in [0, 1]; None at K = 0),
    ``predicted_speedup`` = c_p E(alpha_fit, K) / (K c_q + c_verify_ratio c_p) and ``predicted_speedup_seed`` (the
    same with c_verify = c_p, the seed's model).
    """
    from specrt import _specrt

    if k == 0:
        return {"alpha_fit": None, "predicted_speedup": 1.0 / c_verify_ratio, "predicted_speedup_seed": 1.0}
    e = min(max(mean_tokens_per_round, 1.0), k + 1.0)
    a = _specrt.alpha_from_tokens_per_round(e, k)
    return {
        "alpha_fit": a,
        "predicted_speedup": _specrt.speedup(a, k, c_q_ms, c_p_ms, c_verify=c_verify_ratio * c_p_ms),
        "predicted_speedup_seed": _specrt.speedup(a, k, c_q_ms, c_p_ms),
    }


def predict_from_acceptance(
    a: float, rows: list[dict[str, Any]], verify_costs: dict[str, dict[str, Any]], k: int | str
) -> dict[str, Any]:
    """The cost model's speedup of a pair whose per-token acceptance is ``a``, from costs measured on other weights.

    GPU time does not depend on the weight values, so c_q, c_p and c_verify(K) / c_p measured on random weights in
    a pair's shapes are that pair's; acceptance is a property of its weights (measured on the CPU). Per prompt and
    K (every K whose c_verify(K) was measured, K >= 1): E = (1 - a^(K+1)) / (1 - a) and speedup = c_p E / (K c_q +
    c_verify(K)) (Leviathan et al. 2023, arXiv:2211.17192, with c_verify(K) for c_p in the denominator).

    Inputs: ``a`` in [0, 1]; ``rows`` = the main table's per-prompt rows of a run on the same shapes (``c_q_ms``,
    ``c_p_ms``, target-only ``decode_tokens_per_s``); ``verify_costs`` = :func:`measure_verify_costs` output of its
    target; ``k`` = the main K (``"auto"``: the best K).

    Output: ``{"acceptance", "k", "prompts": [{"id", "c_q_ms", "c_p_ms", "target_tokens_per_s", "per_k": [{"k",
    "expected_tokens", "c_verify_ratio", "predicted_speedup", "predicted_tokens_per_s"}], "best_k"}], "mean_per_k":
    [{"k", "c_verify_ratio", "predicted_speedup", "predicted_tokens_per_s"}] (means over prompts), "best_k",
    "predicted_speedup"}`` (at ``k``, or at the best K for ``"auto"``; None without a measured c_q).
    """
    from specrt import _specrt

    prompts = []
    for row in rows:
        c_q, c_p = med(row.get("c_q_ms")), med(row.get("c_p_ms"))
        tps = med(row["target_only"]["decode_tokens_per_s"])
        ratios = verify_costs[row["id"]]["c_verify_ratio"]
        per_k = []
        if c_q is not None and c_p:
            for kk in sorted(int(x) for x in ratios if int(x) > 0):
                ratio = ratios[str(kk)]
                sp = _specrt.speedup(a, kk, c_q, c_p, c_verify=ratio * c_p)
                per_k.append(
                    {
                        "k": kk,
                        "expected_tokens": _specrt.expected_tokens(a, kk),
                        "c_verify_ratio": ratio,
                        "predicted_speedup": sp,
                        "predicted_tokens_per_s": None if tps is None else tps * sp,
                    }
                )
        best = max(per_k, key=lambda x: x["predicted_speedup"], default=None)
        prompts.append(
            {
                "id": row["id"],
                "c_q_ms": c_q,
                "c_p_ms": c_p,
                "target_tokens_per_s": tps,
                "per_k": per_k,
                "best_k": None if best is None else best["k"],
            }
        )
    mean_per_k = []
    ks = sorted({x["k"] for p in prompts for x in p["per_k"]})
    for kk in ks:
        at_k = [x for p in prompts for x in p["per_k"] if x["k"] == kk]
        tps = [x["predicted_tokens_per_s"] for x in at_k if x["predicted_tokens_per_s"] is not None]
        mean_per_k.append(
            {
                "k": kk,
                "c_verify_ratio": statistics.fmean(x["c_verify_ratio"] for x in at_k),
                "predicted_speedup": statistics.fmean(x["predicted_speedup"] for x in at_k),
                "predicted_tokens_per_s": statistics.fmean(tps) if tps else None,
            }
        )
    best = max(mean_per_k, key=lambda x: x["predicted_speedup"], default=None)
    best_k = None if best is None else best["k"]
    at = best_k if k == "auto" else k
    chosen = next((x for x in mean_per_k if x["k"] == at), None)
    return {
        "acceptance": a,
        "k": k,
        "prompts": prompts,
        "mean_per_k": mean_per_k,
        "best_k": best_k,
        "predicted_speedup": None if chosen is None else chosen["predicted_speedup"],
    }


@dataclass
class Run:
    """One timed generation (ms = wall milliseconds)."""

    wall_ms: float
    n_emitted: int
    stats: dict[str, Any]
    token_ids: list[int] = field(repr=False)
    finish_reason: str = ""

    @property
    def prefill_ms(self) -> float:
        return float(self.stats["prefill_ms"])

    @property
    def decode_ms(self) -> float:
        return max(self.wall_ms - self.prefill_ms, 1e-9)

    @property
    def decode_tokens_per_s(self) -> float:
        return self.n_emitted / self.decode_ms * 1e3

    @property
    def tokens_per_s(self) -> float:
        return self.n_emitted / self.wall_ms * 1e3

    def summary(self) -> dict[str, Any]:
        s = self.stats
        return {
            "wall_ms": self.wall_ms,
            "prefill_ms": self.prefill_ms,
            "decode_ms": self.decode_ms,
            "n_emitted": self.n_emitted,
            "finish_reason": self.finish_reason,
            "decode_tokens_per_s": self.decode_tokens_per_s,
            "tokens_per_s": self.tokens_per_s,
            **{k: s[k] for k in ("n_rounds", "n_drafted", "n_accepted", "n_recovered", "n_bonus")},
            **{k: s[k] for k in ("draft_ms", "target_ms", "core_ms")},
        }


def _first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def summarize_pair(
    base: list[Run], spec: list[Run], k: int | str, c_verify_ratio: dict[str, float], temperature: float
) -> dict[str, Any]:
    """Per-prompt figures from paired repetitions (``base[r]`` and ``spec[r]`` ran back to back)."""
    out: dict[str, Any] = {
        "target_only": {
            "decode_tokens_per_s": spread(r.decode_tokens_per_s for r in base),
            "tokens_per_s": spread(r.tokens_per_s for r in base),
            "prefill_ms": spread(r.prefill_ms for r in base),
            "n_emitted": spread(r.n_emitted for r in base),
        },
        "speculative": {
            "decode_tokens_per_s": spread(r.decode_tokens_per_s for r in spec),
            "tokens_per_s": spread(r.tokens_per_s for r in spec),
            "prefill_ms": spread(r.prefill_ms for r in spec),
            "n_emitted": spread(r.n_emitted for r in spec),
        },
        "speedup": spread(s.decode_tokens_per_s / b.decode_tokens_per_s for b, s in zip(base, spec, strict=True)),
        "e2e_speedup": spread(s.tokens_per_s / b.tokens_per_s for b, s in zip(base, spec, strict=True)),
    }
    n_drafted = sum(r.stats["n_drafted"] for r in spec)
    n_rounds = sum(r.stats["n_rounds"] for r in spec)
    out["acceptance_rate"] = spread(
        r.stats["n_accepted"] / r.stats["n_drafted"] if r.stats["n_drafted"] else None for r in spec
    )
    out["mean_tokens_per_round"] = spread(r.n_emitted / r.stats["n_rounds"] for r in spec if r.stats["n_rounds"])
    out["k_mean"] = n_drafted / n_rounds if n_rounds else 0.0
    # c_q: draft ms per draft pass; c_p: target-only decode ms per emitted token (all-in).
    out["c_q_ms"] = spread(r.stats["draft_ms"] / r.stats["n_drafted"] for r in spec if r.stats["n_drafted"])
    out["c_p_ms"] = spread(r.decode_ms / r.n_emitted for r in base)
    out["target_forward_ms"] = spread(r.stats["target_ms"] / r.stats["n_rounds"] for r in base if r.stats["n_rounds"])
    k_model = k if isinstance(k, int) else max(1, round(out["k_mean"]))
    out["k_model"] = k_model
    ratio = c_verify_ratio.get(str(k_model))
    out["c_verify_ratio"] = ratio
    tgt_round = spread(r.stats["target_ms"] / r.stats["n_rounds"] for r in spec if r.stats["n_rounds"])
    tgt_fwd = med(out["target_forward_ms"])
    out["c_verify_ratio_in_run"] = None if tgt_round is None or not tgt_fwd else tgt_round["median"] / tgt_fwd
    e, c_q, c_p = med(out["mean_tokens_per_round"]), med(out["c_q_ms"]), med(out["c_p_ms"])
    pred: dict[str, Any] = {"alpha_fit": None, "predicted_speedup": None, "predicted_speedup_seed": None}
    if ratio is not None and e is not None and c_p is not None and (k_model == 0 or c_q is not None):
        pred = predict(e, k_model, c_q or 0.0, c_p, ratio)
    out.update(pred)
    sp = med(out["speedup"])
    out["measured_over_predicted"] = sp / pred["predicted_speedup"] if sp and pred["predicted_speedup"] else None
    # Where the round time goes (medians over repetitions, ms per round).
    if n_rounds:
        rounds = [r for r in spec if r.stats["n_rounds"]]
        meas = statistics.median(r.decode_ms / r.stats["n_rounds"] for r in rounds)
        draft = statistics.median(r.stats["draft_ms"] / r.stats["n_rounds"] for r in rounds)
        target = statistics.median(r.stats["target_ms"] / r.stats["n_rounds"] for r in rounds)
        model_ms = None if c_p is None or ratio is None else k_model * (c_q or 0.0) + ratio * c_p
        out["round_ms"] = {
            "measured": meas,
            "draft": draft,
            "target": target,
            "other": meas - draft - target,
            "model": model_ms,
        }
    if temperature == 0:
        divs = [_first_divergence(b.token_ids, s.token_ids) for b, s in zip(base, spec, strict=True)]
        out["greedy_parity"] = all(d is None for d in divs)
        out["first_divergence"] = next((d for d in divs if d is not None), None)
    else:
        out["greedy_parity"] = None
    out["runs"] = {"target_only": [r.summary() for r in base], "speculative": [r.summary() for r in spec]}
    out["token_ids"] = {"target_only": base[0].token_ids, "speculative": spec[0].token_ids}
    return out


def aggregate(
    per_prompt: list[dict[str, Any]], runs_base: list[list[Run]], runs_spec: list[list[Run]], ids: list[str]
) -> dict[str, Any]:
    """Totals over a group of prompts, per repetition then median/min/max.

    ``total_*``: all emitted tokens / all decode time of the group; ``mean_*``: arithmetic mean over prompts of
    per-prompt decode tokens/s (the peers' figure).
    """
    n_rep = min(len(r) for r in runs_base) if runs_base else 0
    tot_b, tot_s, mean_b, mean_s = [], [], [], []
    for r in range(n_rep):
        bs = [runs[r] for runs in runs_base]
        ss = [runs[r] for runs in runs_spec]
        tot_b.append(sum(x.n_emitted for x in bs) / sum(x.decode_ms for x in bs) * 1e3)
        tot_s.append(sum(x.n_emitted for x in ss) / sum(x.decode_ms for x in ss) * 1e3)
        mean_b.append(statistics.fmean(x.decode_tokens_per_s for x in bs))
        mean_s.append(statistics.fmean(x.decode_tokens_per_s for x in ss))
    preds = [p["predicted_speedup"] for p in per_prompt if p.get("predicted_speedup")]
    ratios = [p["measured_over_predicted"] for p in per_prompt if p.get("measured_over_predicted")]
    return {
        "prompts": ids,
        "total_decode_tokens_per_s": {"target_only": spread(tot_b), "speculative": spread(tot_s)},
        "total_speedup": spread(s / b for s, b in zip(tot_s, tot_b, strict=True)),
        "mean_decode_tokens_per_s": {"target_only": spread(mean_b), "speculative": spread(mean_s)},
        "mean_speedup": spread(s / b for s, b in zip(mean_s, mean_b, strict=True)),
        "mean_predicted_speedup": statistics.fmean(preds) if preds else None,
        "mean_measured_over_predicted": statistics.fmean(ratios) if ratios else None,
        "mean_acceptance_rate": _mean_of_medians(per_prompt, "acceptance_rate"),
        "mean_tokens_per_round": _mean_of_medians(per_prompt, "mean_tokens_per_round"),
    }


def _mean_of_medians(rows: list[dict[str, Any]], key: str) -> float | None:
    v = [med(r.get(key)) for r in rows]
    v = [x for x in v if x is not None]
    return statistics.fmean(v) if v else None
