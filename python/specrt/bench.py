"""End-to-end benchmark behind ``specrt bench``: speculative vs target-only decoding, measured against the cost model.

For a target, a draft and a prompt set (``benches/prompts.json``) the bench runs, in one process:

1. **Verify costs** (:func:`measure_verify_costs`): the target alone (``specrt._specrt.OrtModel``) on a warm cache of
   each prompt's length; the median time of one forward over ``n = K + 1`` tokens against one over a single token,
   rolled back to the same ``n_past`` every time. Gives ``c_verify(K) / c_p`` for every K used later.
2. **Main table** (:func:`run_main`): warm-up, then for each repetition and prompt a target-only generation and a
   speculative one, back to back (the order alternates between repetitions), so that machine load hits both alike.
3. **Sweeps** (:func:`run_sweeps`, fewer prompts and tokens): speculative decoding at each K of a K sweep (greedy)
   and at each temperature of a temperature sweep (at the main K), interleaved with a target-only baseline.
4. **Peers** (optional, :mod:`benches/peers`), each in its own process and virtual environment (never needed by
   specrt itself): onnxruntime-genai on the very same ONNX files, and Hugging Face transformers assisted generation
   (torch, CPU) on the GGUF files the fp32 models were converted from.

Every timing figure is the median over at least three repetitions, with the min and max beside it. Definitions
(per prompt; ms = milliseconds of wall time):

- ``decode_tokens_per_s`` = emitted tokens / (wall time of ``generate`` - ``prefill_ms``); ``tokens_per_s`` =
  emitted tokens / wall time (prefill included, as the peers report it).
- ``speedup`` = speculative ``decode_tokens_per_s`` / target-only ``decode_tokens_per_s``, paired per repetition;
  ``e2e_speedup`` the same with prefill included.
- ``acceptance_rate`` = accepted / drafted (vLLM's definition); ``mean_tokens_per_round`` E = emitted / rounds;
  ``alpha_fit`` = the per-token a whose geometric model (1 - a^(K+1)) / (1 - a) gives E (the seed's a; a different
  quantity from accepted / drafted).
- ``c_q_ms`` = draft ms per draft pass (``draft_ms / n_drafted`` of the speculative run); ``c_p_ms`` = target-only
  decode ms per emitted token (everything a target-only step costs: forward, sampling, bookkeeping).
- ``c_verify_ratio`` = c_verify(K) / c_p from step 1; ``predicted_speedup`` = ``speedup(alpha_fit, K, c_q, c_p,
  c_verify=c_verify_ratio * c_p)`` = c_p E / (K c_q + c_verify(K)); ``measured_over_predicted`` = speedup /
  predicted_speedup. Since alpha_fit reproduces E, measured / predicted is (K c_q + c_verify(K)) / (measured ms per
  round): ``round_ms`` splits the measured round into draft, target and other (verification, Python) ms to show
  which term departs.

Timings depend on machine load: ``machine.load_avg_start`` / ``load_avg_end`` are recorded and the table warns when
the machine was busy.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

__all__ = [
    "BenchConfig",
    "Prompt",
    "add_arguments",
    "default_prompts_path",
    "load_prompts",
    "measure_verify_costs",
    "predict",
    "render_table",
    "run_bench",
    "run_cli",
    "spread",
    "write_plots",
]

#: JSON schema tag of the report.
SCHEMA = "specrt.bench/1"
#: Help line of ``specrt bench``.
HELP = "benchmark speculative vs target-only decoding against the cost model (tokens/s, E, a, c_q, c_p, c_verify)"

_REPO_ROOT = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------------------------------------------------
# Prompts
# --------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Prompt:
    """One benchmark prompt.

    Attributes:
        id: short unique name.
        kind: ``"code_completion"``, ``"chat_answer"``, ``"code_editing"`` or ``"prose"``.
        prompt: raw text (completion without a chat template), or None.
        messages: chat messages rendered with the model's chat template, or None (exactly one of the two is set).
        peer: the letter of the prompt in ``shared/notes/peers.md`` (``"a"`` .. ``"d"``), or None.
        note: free text (what the prompt is, expected token count).
    """

    id: str
    kind: str
    prompt: str | None = None
    messages: tuple[dict[str, str], ...] | None = None
    peer: str | None = None
    note: str = ""

    def generate_kwargs(self) -> dict[str, Any]:
        """``prompt=`` or ``messages=`` for :meth:`specrt.Decoder.generate`."""
        if self.messages is not None:
            return {"messages": [dict(m) for m in self.messages]}
        return {"prompt": self.prompt}


def default_prompts_path() -> Path:
    """``benches/prompts.json`` of the source checkout (the package is used from the repository)."""
    return _REPO_ROOT / "benches" / "prompts.json"


def load_prompts(
    path: str | os.PathLike[str] | None = None, *, set_name: str | None = None, ids: Sequence[str] | None = None
) -> list[Prompt]:
    """Read a prompt file and select prompts.

    The file is ``{"sets": {name: [id, ...]}, "prompts": [{"id", "kind", "prompt" | "messages", "peer"?, "note"?}]}``.

    Args:
        path: the JSON file (default :func:`default_prompts_path`).
        set_name: a named set (``"main"``, ``"sweep"``, ``"quick"``, ``"peers"``, ...) or ``"all"``.
        ids: explicit prompt ids (overrides ``set_name``), in the order given.

    Returns:
        The selected prompts, in set order.

    Raises:
        FileNotFoundError: no such file.
        ValueError: malformed file, unknown set or id (the valid ones are named).
    """
    p = Path(path) if path is not None else default_prompts_path()
    data = json.loads(p.read_text(encoding="utf-8"))
    prompts: dict[str, Prompt] = {}
    for raw in data["prompts"]:
        has_prompt, has_messages = raw.get("prompt") is not None, raw.get("messages") is not None
        if has_prompt == has_messages:
            raise ValueError(f"{p}: prompt {raw.get('id')!r} needs exactly one of 'prompt' and 'messages'")
        msgs = tuple({"role": m["role"], "content": m["content"]} for m in raw["messages"]) if has_messages else None
        prompts[raw["id"]] = Prompt(
            id=raw["id"],
            kind=raw["kind"],
            prompt=raw.get("prompt"),
            messages=msgs,
            peer=raw.get("peer"),
            note=raw.get("note", ""),
        )
    sets: dict[str, list[str]] = data.get("sets", {})
    if ids:
        chosen = list(ids)
    elif set_name is None or set_name == "all":
        chosen = list(prompts)
    elif set_name in sets:
        chosen = sets[set_name]
    else:
        raise ValueError(f"prompt set {set_name!r} is unknown (expected one of: all, {', '.join(sets)})")
    unknown = [i for i in chosen if i not in prompts]
    if unknown:
        raise ValueError(f"prompt ids {unknown} are not in {p} (known: {', '.join(prompts)})")
    return [prompts[i] for i in chosen]


# --------------------------------------------------------------------------------------------------------------------
# Statistics and the cost model
# --------------------------------------------------------------------------------------------------------------------


def spread(values: Iterable[float | None]) -> dict[str, Any] | None:
    """Median, min, max and count of the non-None values (None if there are none)."""
    v = [float(x) for x in values if x is not None]
    if not v:
        return None
    return {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)}


def _med(s: dict[str, Any] | None) -> float | None:
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


# --------------------------------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class BenchConfig:
    """Settings of one bench run (``specrt bench --help`` documents each).

    Token counts are new tokens per generation; ``k`` is an int or ``"auto"``; temperatures are floats (0 =
    greedy); ``threads`` = ONNX Runtime intra-op threads per model.
    """

    target: str = "qwen2.5-coder-1.5b-instruct"
    draft: str = "qwen2.5-coder-0.5b-instruct"
    dtype: str = "fp32"
    prompts_file: str | None = None
    prompt_set: str = "main"
    prompt_ids: tuple[str, ...] = ()
    sweep_set: str = "sweep"
    sweep_ids: tuple[str, ...] = ()
    max_new_tokens: int = 128
    sweep_max_new_tokens: int = 64
    k: int | str = 4
    k_sweep: tuple[int, ...] = (0, 1, 2, 4, 8)
    temperatures: tuple[float, ...] = (0.0, 0.5, 1.0)
    temperature: float = 0.0
    repeats: int = 3
    verify_repeats: int = 5
    warmup_tokens: int = 8
    threads: int | None = 2
    max_seq_len: int = 1024
    seed: int = 0
    ignore_eos: bool = False
    baseline: str = "k0"
    sweeps: bool = True
    plots: bool = True
    peers: tuple[str, ...] = ()
    genai_python: str | None = None
    hf_python: str | None = None
    hf_modes: tuple[str, ...] = ("target_only", "assisted")
    peer_interleave: bool = True
    out_dir: str | None = None
    name: str | None = None
    progress: bool = True

    @classmethod
    def quick(cls, **overrides: Any) -> BenchConfig:
        """A few-minute configuration: two prompts, 32 tokens, a short K sweep."""
        base = cls(
            prompt_set="quick",
            sweep_set="quick",
            max_new_tokens=32,
            sweep_max_new_tokens=32,
            k_sweep=(0, 2, 4),
            temperatures=(0.0, 1.0),
            verify_repeats=3,
            warmup_tokens=4,
        )
        return replace(base, **overrides)


# --------------------------------------------------------------------------------------------------------------------
# Measuring
# --------------------------------------------------------------------------------------------------------------------


def measure_verify_costs(
    model_path: str | os.PathLike[str],
    prompt_tokens: dict[str, list[int]],
    ks: Iterable[int],
    *,
    repeats: int = 7,
    threads: int | None = None,
    max_seq_len: int | None = None,
    ort_library: str | None = None,
    on_step: Callable[[], None] | None = None,
) -> dict[str, dict[str, Any]]:
    """c_verify(K) / c_p of one model on a warm cache of each prompt's length.

    For each prompt (L tokens): prefill the first L - 1 tokens, then time ``forward(n tokens, n_past=L - 1,
    n_logits=n)`` for n = 1 and n = K + 1 (what a verification round feeds: the last committed token and K drafts;
    the filler tokens are the prompt's own), each rolled back to the same n_past, one warm-up call per n, then
    ``repeats`` calls per n interleaved across n.

    Args:
        model_path: a converted model folder.
        prompt_tokens: prompt id -> token ids (>= 2 tokens).
        ks: the K values whose ratio is wanted (0 gives 1.0).
        repeats: timed calls per n (the median is used).
        threads: ONNX Runtime intra-op threads.
        max_seq_len: KV cache length (>= longest prompt + max K + 1).
        ort_library: path of libonnxruntime (default: :func:`specrt._ort.find_ort_library`).
        on_step: called after each timed or warm-up call (progress).

    Returns:
        ``{prompt_id: {"n_prompt_tokens": L, "forward_ms": {str(n): spread}, "c_verify_ratio": {str(K): float},
        "c_verify_ratio_min": {str(K): float}}}`` (ms of wall time per forward; ratio = median ms at n = K + 1 /
        median ms at n = 1; ``_min``: the same with the fastest call of each, for a machine under load).
    """
    import numpy as np

    from specrt import _specrt
    from specrt._ort import find_ort_library

    ks = sorted(set(int(k) for k in ks) | {0})
    ns = [k + 1 for k in ks]
    longest = max(len(t) for t in prompt_tokens.values())
    model = _specrt.OrtModel(
        str(model_path),
        ort_library=ort_library or find_ort_library(),
        max_seq_len=max_seq_len or (longest + max(ns) + 1),
        intra_op_threads=threads,
    )
    out: dict[str, dict[str, Any]] = {}
    try:
        for pid, ids in prompt_tokens.items():
            n_past = len(ids) - 1
            # [n_past] int64: the prompt without its last token (prefilled once).
            prefix = np.asarray(ids[:n_past], dtype=np.int64)
            # [max n] int64: the last prompt token, then filler "drafts" taken from the prompt itself.
            filler = np.asarray(([ids[-1]] + list(ids) * (max(ns) // len(ids) + 1))[: max(ns)], dtype=np.int64)
            if n_past > 0:
                model.forward(prefix, 0, 1)
            samples: dict[int, list[float]] = {n: [] for n in ns}
            for n in ns:  # warm-up: first call at a new shape allocates
                model.forward(filler[:n], n_past, n)
                if on_step:
                    on_step()
            for r in range(repeats):
                order = ns if r % 2 == 0 else ns[::-1]
                for n in order:
                    t0 = time.perf_counter()
                    model.forward(filler[:n], n_past, n)
                    samples[n].append((time.perf_counter() - t0) * 1e3)
                    if on_step:
                        on_step()
            fwd = {str(n): spread(v) for n, v in samples.items()}
            base = statistics.median(samples[1])
            out[pid] = {
                "n_prompt_tokens": len(ids),
                "forward_ms": fwd,
                "c_verify_ratio": {str(k): statistics.median(samples[k + 1]) / base for k in ks},
                # Fastest over fastest: less sensitive to other processes on a shared machine (not used to predict).
                "c_verify_ratio_min": {str(k): min(samples[k + 1]) / min(samples[1]) for k in ks},
            }
    finally:
        del model
        gc.collect()
    return out


@dataclass
class _Run:
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


def _generate(
    dec: Any,
    prompt: Prompt,
    *,
    k: int | str,
    temperature: float,
    max_new_tokens: int,
    seed: int,
    ignore_eos: bool,
    **extra: Any,
) -> _Run:
    """One timed ``dec.generate`` call; ``extra`` = further generate options (proposer, prompt_lookup_min, ...)."""
    kwargs = prompt.generate_kwargs() | extra
    t0 = time.perf_counter()
    res = dec.generate(
        **kwargs,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        num_speculative_tokens=k,
        seed=seed,
        ignore_eos=ignore_eos,
    )
    wall_ms = (time.perf_counter() - t0) * 1e3
    return _Run(
        wall_ms=wall_ms,
        n_emitted=len(res.token_ids),
        stats=res.stats.as_dict(),
        token_ids=list(res.token_ids),
        finish_reason=res.finish_reason,
    )


def _first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _summarize_pair(
    base: list[_Run], spec: list[_Run], k: int | str, c_verify_ratio: dict[str, float], temperature: float
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
    tgt_fwd = _med(out["target_forward_ms"])
    out["c_verify_ratio_in_run"] = None if tgt_round is None or not tgt_fwd else tgt_round["median"] / tgt_fwd
    e, c_q, c_p = _med(out["mean_tokens_per_round"]), _med(out["c_q_ms"]), _med(out["c_p_ms"])
    pred: dict[str, Any] = {"alpha_fit": None, "predicted_speedup": None, "predicted_speedup_seed": None}
    if ratio is not None and e is not None and c_p is not None and (k_model == 0 or c_q is not None):
        pred = predict(e, k_model, c_q or 0.0, c_p, ratio)
    out.update(pred)
    sp = _med(out["speedup"])
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


def _aggregate(
    per_prompt: list[dict[str, Any]], runs_base: list[list[_Run]], runs_spec: list[list[_Run]], ids: list[str]
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
    v = [_med(r.get(key)) for r in rows]
    v = [x for x in v if x is not None]
    return statistics.fmean(v) if v else None


class _Progress:
    """A tqdm bar when available and wanted, else silent."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.bar = None
        if enabled:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, unit="run", file=sys.stderr, dynamic_ncols=True)
            except ImportError:  # pragma: no cover - tqdm is a dependency
                self.bar = None

    def describe(self, text: str) -> None:
        if self.bar is not None:
            self.bar.set_description(text, refresh=True)

    def step(self, n: int = 1) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def write(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _machine() -> dict[str, Any]:
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import onnxruntime

        ort_version = onnxruntime.__version__
    except ImportError:  # pragma: no cover
        ort_version = None
    commit = None
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        git = ["git", "-C", str(_REPO_ROOT), "rev-parse", "--short", "HEAD"]
        commit = subprocess.run(git, capture_output=True, text=True, timeout=5, check=False).stdout.strip() or None
    return {
        "cpu": cpu,
        "n_cpus": os.cpu_count(),
        "python": platform.python_version(),
        "onnxruntime": ort_version,
        "git_commit": commit,
        "load_avg_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def _verify_ks(cfg: BenchConfig, sweeps: bool) -> list[int]:
    ks = set(range(9)) if cfg.k == "auto" else {0, int(cfg.k)}
    if sweeps:
        ks |= set(cfg.k_sweep)
    return sorted(ks)


def _estimate_s(cfg: BenchConfig, fwd1_ms: float, n_main: int, n_sweep: int) -> float:
    """Rough wall time of the generation phases from the measured one-token forward time (E = 3, c_q = c_p / 3)."""
    k = 4 if cfg.k == "auto" else int(cfg.k)
    per_tok_spec = (k * fwd1_ms / 3 + 1.3 * fwd1_ms) / 3

    def pair(n: int) -> float:
        return n * fwd1_ms + n * per_tok_spec

    main = cfg.repeats * n_main * pair(cfg.max_new_tokens)
    n_points = len(cfg.k_sweep) + len([t for t in cfg.temperatures if t != 0])
    sweep = (
        cfg.repeats
        * n_sweep
        * (cfg.sweep_max_new_tokens * fwd1_ms + n_points * cfg.sweep_max_new_tokens * per_tok_spec)
        if cfg.sweeps
        else 0.0
    )
    return (main + sweep) / 1e3


def run_main(
    cfg: BenchConfig, base_dec: Any, spec_dec: Any, prompts: list[Prompt], costs: dict[str, Any], progress: _Progress
) -> dict[str, Any]:
    """Target-only and speculative decoding interleaved over ``prompts`` (warm-up first); per-prompt and total rows."""
    warm = max(1, cfg.warmup_tokens)
    if cfg.warmup_tokens > 0:
        for p in prompts:
            progress.describe(f"warm-up {p.id}")
            for dec, k in ((base_dec, 0), (spec_dec, cfg.k)):
                _generate(dec, p, k=k, temperature=cfg.temperature, max_new_tokens=warm, seed=cfg.seed, ignore_eos=True)
                progress.step()
    base: dict[str, list[_Run]] = {p.id: [] for p in prompts}
    spec: dict[str, list[_Run]] = {p.id: [] for p in prompts}
    for r in range(cfg.repeats):
        for p in prompts:
            order = [("target_only", base_dec, 0), ("speculative", spec_dec, cfg.k)]
            if r % 2 == 1:
                order.reverse()
            for mode, dec, k in order:
                progress.describe(f"main rep {r + 1}/{cfg.repeats} {p.id} {mode}")
                run = _generate(
                    dec,
                    p,
                    k=k,
                    temperature=cfg.temperature,
                    max_new_tokens=cfg.max_new_tokens,
                    seed=cfg.seed + r,
                    ignore_eos=cfg.ignore_eos,
                )
                (base if mode == "target_only" else spec)[p.id].append(run)
                progress.step()
    rows = []
    for p in prompts:
        row = {
            "id": p.id,
            "kind": p.kind,
            "peer": p.peer,
            "n_prompt_tokens": costs[p.id]["n_prompt_tokens"],
            **_summarize_pair(base[p.id], spec[p.id], cfg.k, costs[p.id]["c_verify_ratio"], cfg.temperature),
        }
        rows.append(row)
    groups = {"all": [p.id for p in prompts]}
    peer_ids = [p.id for p in prompts if p.peer]
    if peer_ids and len(peer_ids) != len(prompts):
        groups["peer_prompts"] = peer_ids
    totals = {
        name: _aggregate([row for row in rows if row["id"] in ids], [base[i] for i in ids], [spec[i] for i in ids], ids)
        for name, ids in groups.items()
    }
    if peer_ids and "peer_prompts" not in totals:
        totals["peer_prompts"] = totals["all"]
    return {
        "k": cfg.k,
        "temperature": cfg.temperature,
        "max_new_tokens": cfg.max_new_tokens,
        "prompts": rows,
        "totals": totals,
    }


def run_sweeps(
    cfg: BenchConfig, base_dec: Any, spec_dec: Any, prompts: list[Prompt], costs: dict[str, Any], progress: _Progress
) -> dict[str, Any]:
    """K sweep (greedy) and temperature sweep (at the main K), each point paired with a target-only baseline run.

    The baseline is one greedy target-only run per prompt and repetition, shared by all points of that repetition:
    a target-only step costs the same at any temperature (sampling is well under 1% of a forward). Point order
    rotates between repetitions.
    """
    main_k = cfg.k
    points: list[tuple[str, int | str, float]] = [("k", k, 0.0) for k in cfg.k_sweep]
    for t in cfg.temperatures:
        if t == 0 and main_k in cfg.k_sweep:
            continue  # the K sweep's point at the main K is this one
        points.append(("t", main_k, float(t)))
    base: dict[str, list[_Run]] = {p.id: [] for p in prompts}
    runs: dict[tuple[str, int | str, float, str], list[_Run]] = {}
    for r in range(cfg.repeats):
        for p in prompts:
            progress.describe(f"sweep rep {r + 1}/{cfg.repeats} {p.id} target-only")
            base[p.id].append(
                _generate(
                    base_dec,
                    p,
                    k=0,
                    temperature=0.0,
                    max_new_tokens=cfg.sweep_max_new_tokens,
                    seed=cfg.seed,
                    ignore_eos=cfg.ignore_eos,
                )
            )
            progress.step()
            shift = r % len(points)
            for _, k, t in points[shift:] + points[:shift]:
                progress.describe(f"sweep rep {r + 1}/{cfg.repeats} {p.id} K={k} T={t}")
                runs.setdefault((p.id, k, t, ""), []).append(
                    _generate(
                        spec_dec,
                        p,
                        k=k,
                        temperature=t,
                        max_new_tokens=cfg.sweep_max_new_tokens,
                        seed=cfg.seed + r,
                        ignore_eos=cfg.ignore_eos,
                    )
                )
                progress.step()

    def point(p: Prompt, k: int | str, t: float) -> dict[str, Any]:
        s = _summarize_pair(base[p.id], runs[(p.id, k, t, "")], k, costs[p.id]["c_verify_ratio"], t)
        s.pop("runs")
        s.pop("token_ids")
        return {"k": k, "temperature": t, **s}

    k_sweep, t_sweep = [], []
    for p in prompts:
        kp = [point(p, k, 0.0) for k in cfg.k_sweep]
        # The cost model's curve over K from one a (fitted at the main K) and that point's c_q.
        ref = next((x for x in kp if x["k"] == main_k and x.get("alpha_fit") is not None), None)
        model_curve = []
        if ref is not None and _med(ref["c_q_ms"]) and _med(ref["c_p_ms"]):
            from specrt import _specrt

            c_q, c_p = _med(ref["c_q_ms"]), _med(ref["c_p_ms"])
            for k in cfg.k_sweep:
                ratio = costs[p.id]["c_verify_ratio"][str(k)]
                model_curve.append(
                    {"k": k, "speedup": _specrt.speedup(ref["alpha_fit"], k, c_q, c_p, c_verify=ratio * c_p)}
                )
        k_sweep.append(
            {
                "id": p.id,
                "kind": p.kind,
                "peer": p.peer,
                "points": kp,
                "model_curve": model_curve,
                "alpha_ref": None if ref is None else ref["alpha_fit"],
            }
        )
        tp = []
        for t in cfg.temperatures:
            key = (p.id, main_k, float(t), "")
            if key in runs:
                tp.append(point(p, main_k, float(t)))
        t_sweep.append({"id": p.id, "kind": p.kind, "peer": p.peer, "points": tp})
    return {
        "max_new_tokens": cfg.sweep_max_new_tokens,
        "k_sweep": {"temperature": 0.0, "ks": list(cfg.k_sweep), "prompts": k_sweep},
        "temperature_sweep": {"k": main_k, "temperatures": list(cfg.temperatures), "prompts": t_sweep},
    }


#: Peers ``specrt bench --peers`` knows, and the modes of the ``hf`` peer.
PEERS = ("genai", "hf")
HF_MODES = ("target_only", "assisted", "assisted_dynamic")


def validate_config(cfg: BenchConfig) -> None:
    """Check the settings that would otherwise fail late (after the specrt phases) or silently.

    Raises:
        ValueError: a bad ``baseline``, ``repeats``, peer name or hf mode, naming the value and what is allowed.
    """
    if cfg.baseline not in ("separate", "k0"):
        raise ValueError(f"baseline {cfg.baseline!r} is invalid (expected one of: 'separate', 'k0')")
    if cfg.repeats < 1:
        raise ValueError(f"repeats {cfg.repeats} is invalid (expected >= 1; 3 or more for a spread)")
    unknown = [p for p in cfg.peers if p not in PEERS]
    if unknown:
        raise ValueError(f"peers {unknown} are unknown (expected some of: {', '.join(PEERS)})")
    bad = [m for m in cfg.hf_modes if m not in HF_MODES]
    if bad or not cfg.hf_modes:
        raise ValueError(f"hf modes {bad or list(cfg.hf_modes)} are invalid (expected some of: {', '.join(HF_MODES)})")


def peer_warnings(cfg: BenchConfig) -> list[str]:
    """What will make a peer be skipped, said before the specrt phases run (the run goes on; the JSON records it)."""
    out = []
    for peer in ("genai", "hf"):
        python = _peer_python(cfg, peer)
        if peer in cfg.peers and not python.exists():
            out.append(f"peer {peer} will be skipped: no interpreter at {python} (benches/peers/setup_{peer}_venv.sh)")
    if "hf" in cfg.peers and cfg.dtype != "fp32":
        out.append(f"peer hf will be skipped: it runs float32 only (dtype {cfg.dtype!r})")
    if "hf" not in cfg.peers and tuple(cfg.hf_modes) != BenchConfig.hf_modes:
        out.append("--hf-modes has no effect without --peers hf")
    return out


def run_bench(cfg: BenchConfig) -> dict[str, Any]:
    """Run the whole bench (verify costs, main table, sweeps, peers) and return the JSON-ready report.

    Baseline: ONNX Runtime sessions created later in a process decode faster than the first one (measured on the
    bench machine: the same int4 model loaded three times in one process, 38.8 / 34.7 / 33.1 ms per step), so a
    separate target-only Decoder (loaded after the speculative one) is biased against speculation; the default
    ``"k0"`` times target-only decoding on the speculative Decoder's own target session at K = 0 (the draft is then
    neither prefilled nor run). ``benches/bench_int4.py --runtimes specrt,specrt-k0`` compares a Decoder without
    draft against K = 0 with one process each.

    Memory: the verify-cost model is released before the decoders load; with ``baseline="separate"`` the target is
    loaded twice (a target-only Decoder and the speculative one; fp32 1.5B: about 7 GB each), with ``"k0"`` the
    speculative Decoder at K = 0 is the baseline (one copy).
    """
    import specrt

    t_start = time.perf_counter()
    validate_config(cfg)
    for line in peer_warnings(cfg):
        print(f"specrt bench: warning: {line}", file=sys.stderr)
    prompts = load_prompts(cfg.prompts_file, set_name=cfg.prompt_set, ids=cfg.prompt_ids or None)
    sweep_prompts = (
        load_prompts(cfg.prompts_file, set_name=cfg.sweep_set, ids=cfg.sweep_ids or None) if cfg.sweeps else []
    )
    machine = _machine()
    from specrt.generate import _ModelFolder, _render_chat
    from specrt.models import resolve_model

    target_path = resolve_model(cfg.target, cfg.dtype)
    draft_path = resolve_model(cfg.draft, cfg.dtype)
    folder = _ModelFolder(target_path)

    def encode(p: Prompt) -> list[int]:
        # The same ids Decoder.encode gives (checked against it below), without loading a model.
        if p.messages is not None:
            text = _render_chat(
                folder.chat_template or "",
                [dict(m) for m in p.messages],
                True,
                bos_token=folder.config.get("bos_token", ""),
                eos_token=folder.config.get("eos_token", ""),
            )
            return folder.tokenizer.encode(text, add_special_tokens=False).ids
        return folder.tokenizer.encode(p.prompt).ids

    all_prompts = {p.id: p for p in [*prompts, *sweep_prompts]}
    prompt_tokens = {pid: encode(p) for pid, p in all_prompts.items()}
    longest = max(len(t) for t in prompt_tokens.values())
    max_seq = max(cfg.max_seq_len, longest + max(cfg.max_new_tokens, cfg.sweep_max_new_tokens) + 16)
    ks = _verify_ks(cfg, bool(sweep_prompts))

    n_warm = 2 * len(prompts) if cfg.warmup_tokens > 0 else 0
    n_main = 2 * cfg.repeats * len(prompts)
    n_points = len(cfg.k_sweep) + len([t for t in cfg.temperatures if not (t == 0 and cfg.k in cfg.k_sweep)])
    n_sweep = cfg.repeats * len(sweep_prompts) * (1 + n_points)
    n_verify = len(prompt_tokens) * len(ks) * (cfg.verify_repeats + 1)
    progress = _Progress(n_verify + n_warm + n_main + n_sweep, cfg.progress)
    phase_s: dict[str, Any] = {}
    t_phase = time.perf_counter()

    def phase_done(name: str) -> None:
        nonlocal t_phase
        now = time.perf_counter()
        phase_s[name] = now - t_phase
        t_phase = now

    try:
        progress.describe("verify costs (target alone)")
        costs = measure_verify_costs(
            target_path,
            prompt_tokens,
            ks,
            repeats=cfg.verify_repeats,
            threads=cfg.threads,
            max_seq_len=longest + max(ks) + 2,
            on_step=progress.step,
        )
        fwd1 = statistics.median(c["forward_ms"]["1"]["median"] for c in costs.values())
        est = _estimate_s(cfg, fwd1, len(prompts), len(sweep_prompts))
        progress.write(
            f"specrt bench: one-token target forward {fwd1:.0f} ms; generation phases need "
            + (f"~{est / 60:.0f} min" if est >= 60 else "< 1 min")
        )
        phase_done("verify_costs")
        progress.describe("loading models")
        spec_dec = specrt.Decoder(target_path, draft_path, max_seq_len=max_seq, intra_op_threads=cfg.threads)
        base_dec = (
            spec_dec
            if cfg.baseline == "k0"
            else specrt.Decoder(target_path, None, max_seq_len=max_seq, intra_op_threads=cfg.threads)
        )
        for pid, ids in prompt_tokens.items():
            p = all_prompts[pid]
            if spec_dec.encode(p.prompt, [dict(m) for m in p.messages] if p.messages else None) != ids:
                raise RuntimeError(f"prompt {pid}: the bench's tokenization differs from Decoder.encode")
        report: dict[str, Any] = {
            "schema": SCHEMA,
            "config": _config_dict(cfg),
            "models": {"target": str(target_path), "draft": str(draft_path)},
            "machine": machine,
            "prompts": {
                pid: {"kind": p.kind, "peer": p.peer, "n_prompt_tokens": len(prompt_tokens[pid]), "note": p.note}
                for pid, p in all_prompts.items()
            },
            "verify_costs": costs,
        }
        phase_done("load")
        report["main"] = run_main(cfg, base_dec, spec_dec, prompts, costs, progress)
        phase_done("main")
        if sweep_prompts:
            report["sweeps"] = run_sweeps(cfg, base_dec, spec_dec, sweep_prompts, costs, progress)
            phase_done("sweeps")
    finally:
        progress.close()
    del base_dec, spec_dec
    gc.collect()
    phase_s["specrt"] = time.perf_counter() - t_start
    if cfg.peers:
        report["peers"] = run_peers(cfg, target_path, draft_path, prompts, prompt_tokens)
        for name, peer in report["peers"].items():
            phase_s[f"peer_{name}"] = peer.pop("elapsed_s", None)
            for row in report["main"]["prompts"] if peer.get("status") == "ok" else []:
                theirs = peer["prompts"].get(row["id"], {}).get("token_ids", {}).get("target_only")
                if theirs is not None and cfg.temperature == 0:
                    # Same greedy target (genai: the same ONNX files; hf: the GGUF they came from, in torch).
                    peer["prompts"][row["id"]]["same_tokens_as_specrt"] = theirs == row["token_ids"]["target_only"]
    machine["load_avg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    report["wall_s"] = time.perf_counter() - t_start
    report["phase_s"] = phase_s
    return report


def _config_dict(cfg: BenchConfig) -> dict[str, Any]:
    d = asdict(cfg)
    for key, value in d.items():
        if isinstance(value, tuple):
            d[key] = list(value)
    return d


# --------------------------------------------------------------------------------------------------------------------
# Peers (optional, separate process and environment)
# --------------------------------------------------------------------------------------------------------------------


def _peer_python(cfg: BenchConfig, peer: str) -> Path:
    """The interpreter of a peer's venv: ``--genai-python`` / ``--hf-python``, else ``benches/out/venv-<peer>``."""
    given = cfg.genai_python if peer == "genai" else cfg.hf_python
    return Path(given) if given else _REPO_ROOT / "benches" / "out" / f"venv-{peer}" / "bin" / "python"


def gguf_source(model_path: Path) -> Path | None:
    """The GGUF file a converted model folder came from, when it is in specrt's cache (``<cache>/gguf``), else None."""
    from specrt.models import cache_dir

    try:
        cfg = json.loads((Path(model_path) / "specrt_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    source = str(cfg.get("source") or "")
    path = cache_dir() / "gguf" / source
    return path if source.endswith(".gguf") and path.is_file() else None


def _run_peer_script(python: Path, script: str, work: Path, request: dict[str, Any]) -> dict[str, Any]:
    """Run ``benches/peers/<script>`` under ``python`` with a request file; its result, or the error as a record."""
    work.mkdir(parents=True, exist_ok=True)
    req_path, res_path = work / "request.json", work / "result.json"
    req_path.write_text(json.dumps(request), encoding="utf-8")
    res_path.unlink(missing_ok=True)
    path = _REPO_ROOT / "benches" / "peers" / script
    t0 = time.perf_counter()
    proc = subprocess.run(
        [str(python), str(path), str(req_path), str(res_path)], capture_output=True, text=True, check=False
    )
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0 or not res_path.exists():
        return {
            "status": "error",
            "returncode": proc.returncode,
            "stderr_tail": proc.stderr[-3000:],
            "elapsed_s": elapsed,
        }
    return {"status": "ok", **json.loads(res_path.read_text(encoding="utf-8")), "elapsed_s": elapsed}


def run_peers(
    cfg: BenchConfig, target_path: Path, draft_path: Path, prompts: list[Prompt], prompt_tokens: dict[str, list[int]]
) -> dict[str, Any]:
    """Run the peers named in ``cfg.peers`` in subprocesses; a failure is recorded, never raised.

    Both get the same prompt token ids as specrt, greedy decoding, ``cfg.max_new_tokens`` and ``cfg.repeats``, and
    K = ``cfg.k`` (4 when ``cfg.k`` is ``"auto"``); each peer's record carries ``status`` (``"ok"``, ``"skipped"``
    with a ``reason``, ``"error"`` with the script's stderr) and ``elapsed_s`` (wall seconds, load included).

    ``"genai"``: ``benches/peers/genai_peer.py`` under ``cfg.genai_python`` (a virtual environment with
    onnxruntime-genai 0.18; ``benches/peers/setup_genai_venv.sh``), on the same ONNX files through a generated
    genai_config.json, target-only and speculative, interleaved.
    ``"hf"``: ``benches/peers/hf_peer.py`` under ``cfg.hf_python`` (torch + transformers;
    ``benches/peers/setup_hf_venv.sh``), on the GGUF files the models were converted from (dequantized to float32 by
    transformers, so fp32 runs only), modes ``cfg.hf_modes`` (``target_only``, ``assisted`` = K drafts per round,
    ``assisted_dynamic`` = transformers' default schedule), interleaved.
    """
    out: dict[str, Any] = {}
    k = 4 if cfg.k == "auto" else int(cfg.k)
    ids = {p.id: prompt_tokens[p.id] for p in prompts}
    common = {
        "prompts": ids,
        "max_new_tokens": cfg.max_new_tokens,
        "k": k,
        "repeats": cfg.repeats,
        "warmup_tokens": cfg.warmup_tokens,
        "threads": cfg.threads or 0,
        "ignore_eos": cfg.ignore_eos,
    }
    work_root = Path(cfg.out_dir or _default_out_dir())
    for peer in cfg.peers:
        if peer == "genai":
            python = _peer_python(cfg, peer)
            if not python.exists():
                out[peer] = {"status": "skipped", "reason": f"no interpreter at {python} (see benches/README.md)"}
                continue
            request = {
                **common,
                "target": str(target_path),
                "draft": str(draft_path),
                "work_dir": str(work_root / "genai"),
                "interleave": cfg.peer_interleave,
            }
            out[peer] = _run_peer_script(python, "genai_peer.py", work_root / "genai", request)
        elif peer == "hf":
            python = _peer_python(cfg, peer)
            sources = {role: gguf_source(path) for role, path in (("target", target_path), ("draft", draft_path))}
            missing = [role for role, src in sources.items() if src is None]
            if not python.exists():
                out[peer] = {"status": "skipped", "reason": f"no interpreter at {python} (see benches/README.md)"}
            elif cfg.dtype != "fp32":
                out[peer] = {
                    "status": "skipped",
                    "reason": f"transformers runs the GGUF dequantized to float32; dtype {cfg.dtype!r} would not "
                    "compare the same precision (use --dtype fp32)",
                }
            elif missing:
                out[peer] = {
                    "status": "skipped",
                    "reason": f"no cached GGUF source for the {' and '.join(missing)} (transformers loads the GGUF "
                    "the model was converted from; `specrt models pull` keeps it under ~/.cache/specrt/gguf)",
                }
            else:
                target_cfg = json.loads((Path(target_path) / "specrt_config.json").read_text(encoding="utf-8"))
                request = {
                    **common,
                    "target_gguf": str(sources["target"]),
                    "draft_gguf": str(sources["draft"]),
                    "eos_token_ids": target_cfg["eos_token_ids"],
                    "modes": list(cfg.hf_modes),
                }
                out[peer] = _run_peer_script(python, "hf_peer.py", work_root / "hf", request)
        else:
            out[peer] = {"status": "error", "reason": f"unknown peer {peer!r} (expected 'genai' or 'hf')"}
    return out


# --------------------------------------------------------------------------------------------------------------------
# Output: table, JSON, plots
# --------------------------------------------------------------------------------------------------------------------


def _f(x: float | None, fmt: str = ".2f") -> str:
    return "-" if x is None else format(x, fmt)


def _ms(x: float | None) -> str:
    """Milliseconds with about 3 significant digits, never in exponent form (``1234``, ``83.1``, ``0.42``)."""
    if x is None:
        return "-"
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}"


def _sp(s: dict[str, Any] | None, fmt: str = ".2f") -> str:
    """``median [min-max]``."""
    if s is None:
        return "-"
    if s["n"] == 1 or s["min"] == s["max"]:
        return format(s["median"], fmt)
    return f"{s['median']:{fmt}} [{s['min']:{fmt}}-{s['max']:{fmt}}]"


def _label(p: dict[str, Any]) -> str:
    label = p["id"] + (f" ({p['peer']})" if p["peer"] else "")
    return label + (" !parity" if p.get("greedy_parity") is False else "")


def _main_tables(report: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]], int]]:
    """The main results as two tables (speed; cost model): (title, columns, rows, number of per-prompt rows)."""
    prompts = report["main"]["prompts"]
    all_ids = report["main"]["totals"]["all"]["prompts"]
    totals = {n: t for n, t in report["main"]["totals"].items() if n == "all" or t["prompts"] != all_ids}
    speed_cols = ["prompt", "kind", "L", "n", "target tok/s", "spec tok/s", "speedup", "e2e", "prefill ms t / s"]
    speed = [
        [
            _label(p),
            p["kind"],
            str(p["n_prompt_tokens"]),
            _f(_med(p["speculative"]["n_emitted"]), ".0f"),
            _sp(p["target_only"]["decode_tokens_per_s"]),
            _sp(p["speculative"]["decode_tokens_per_s"]),
            _sp(p["speedup"]),
            _f(_med(p["e2e_speedup"])),
            f"{_ms(_med(p['target_only']['prefill_ms']))} / {_ms(_med(p['speculative']['prefill_ms']))}",
        ]
        for p in prompts
    ]
    for name, t in totals.items():
        for how in ("total", "mean"):
            tps = t[f"{how}_decode_tokens_per_s"]
            speed.append(
                [
                    f"{how} {name}",
                    f"{len(t['prompts'])} prompts",
                    "",
                    "",
                    _sp(tps["target_only"]),
                    _sp(tps["speculative"]),
                    _sp(t[f"{how}_speedup"]),
                    "",
                    "",
                ]
            )
    cost_cols = ["prompt", "K", "acc", "E", "a", "c_q ms", "c_p ms", "cv/cp", "in run", "pred", "meas/pred", "round ms"]
    cost = []
    for p in prompts:
        r = p.get("round_ms") or {}
        k = str(p["k_model"]) if isinstance(report["main"]["k"], int) else f"{p['k_mean']:.1f}~{p['k_model']}"
        cost.append(
            [
                _label(p),
                k,
                _f(_med(p["acceptance_rate"])),
                _f(_med(p["mean_tokens_per_round"])),
                _f(p["alpha_fit"]),
                _ms(_med(p["c_q_ms"])),
                _ms(_med(p["c_p_ms"])),
                _f(p["c_verify_ratio"]),
                _f(p["c_verify_ratio_in_run"]),
                _f(p["predicted_speedup"]),
                _f(p["measured_over_predicted"]),
                f"{_ms(r.get('measured'))} / {_ms(r.get('model'))}" if r else "-",
            ]
        )
    for name, t in totals.items():
        cost.append(
            [
                f"mean {name}",
                "",
                _f(t["mean_acceptance_rate"]),
                _f(t["mean_tokens_per_round"]),
                "",
                "",
                "",
                "",
                "",
                _f(t["mean_predicted_speedup"]),
                _f(t["mean_measured_over_predicted"]),
                "",
            ]
        )
    return [("speed", speed_cols, speed, len(prompts)), ("cost model", cost_cols, cost, len(prompts))]


def _sweep_rows(report: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    cols = ["prompt", "K", "T", "speedup", "pred", "model(a_ref)", "acc", "E", "a", "cv/cp"]
    rows = []
    sw = report.get("sweeps")
    if not sw:
        return cols, rows
    for entry in sw["k_sweep"]["prompts"]:
        curve = {c["k"]: c["speedup"] for c in entry["model_curve"]}
        rows.extend(
            [
                [
                    entry["id"],
                    str(pt["k"]),
                    "0",
                    _sp(pt["speedup"]),
                    _f(pt["predicted_speedup"]),
                    _f(curve.get(pt["k"])),
                    _f(_med(pt["acceptance_rate"])),
                    _f(_med(pt["mean_tokens_per_round"])),
                    _f(pt["alpha_fit"]),
                    _f(pt["c_verify_ratio"]),
                ]
                for pt in entry["points"]
            ]
        )
    in_k_sweep = sw["temperature_sweep"]["k"] in sw["k_sweep"]["ks"]
    for entry in sw["temperature_sweep"]["prompts"]:
        for pt in entry["points"]:
            if pt["temperature"] == 0 and in_k_sweep:
                continue  # already a row of the K sweep
            rows.append(
                [
                    entry["id"],
                    str(pt["k"]),
                    _f(pt["temperature"], "g"),
                    _sp(pt["speedup"]),
                    _f(pt["predicted_speedup"]),
                    "",
                    _f(_med(pt["acceptance_rate"])),
                    _f(_med(pt["mean_tokens_per_round"])),
                    _f(pt["alpha_fit"]),
                    _f(pt["c_verify_ratio"]),
                ]
            )
    return cols, rows


def peer_modes(name: str, peer: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """``(prompt id, label, figures)`` per prompt and speculative mode of one peer's ``ok`` record.

    ``figures`` holds ``target_only`` and ``speculative`` (each ``{"decode_tokens_per_s", "tokens_per_s", ...}``
    spreads), ``speedup``, ``e2e_speedup``, ``acceptance_rate`` and ``same_tokens_as_specrt`` when known; the label
    names the peer and mode (``genai K=4``, ``hf assisted K=4``, ``hf assisted dynamic``).
    """
    out: list[tuple[str, str, dict[str, Any]]] = []
    k = peer.get("k")
    for pid, g in peer["prompts"].items():
        if name == "genai":
            modes = [("speculative", g, f"genai K={k}" if k else "genai")]
        else:
            modes = [
                (m, g[m], f"{name} assisted K={k}" if m == "assisted" else f"{name} {m.replace('_', ' ')}")
                for m in peer.get("modes", [])
                if m != "target_only" and m in g
            ]
        for mode, figs, label in modes:
            out.append(
                (
                    pid,
                    label,
                    {
                        "target_only": g["target_only"],
                        "speculative": g[mode],
                        "speedup": figs.get("speedup"),
                        "e2e_speedup": figs.get("e2e_speedup"),
                        "acceptance_rate": figs.get("acceptance_rate"),
                        "same_tokens_as_specrt": g.get("same_tokens_as_specrt"),
                    },
                )
            )
    return out


def _peer_rows(report: dict[str, Any]) -> tuple[list[str], list[list[str]], list[str]]:
    cols = [
        "prompt",
        "peer",
        "peer target tok/s",
        "peer spec tok/s",
        "peer speedup",
        "peer e2e",
        "peer acc",
        "same tokens",
        "specrt spec / peer spec",
    ]
    rows: list[list[str]] = []
    notes: list[str] = []
    ours = {p["id"]: p for p in (report.get("main") or {}).get("prompts", [])}
    for name, peer in (report.get("peers") or {}).items():
        if peer.get("status") != "ok":
            last = [line.strip() for line in (peer.get("stderr_tail") or "").splitlines() if line.strip()]
            why = peer.get("reason") or (last[-1] if last else f"exit code {peer.get('returncode')}")
            notes.append(f"peer {name}: {peer.get('status')}: {why}" + (" (stderr in the JSON)" if last else ""))
            continue
        rows_before = len(rows)
        for pid, label, g in peer_modes(name, peer):
            mine = _med(ours[pid]["speculative"]["decode_tokens_per_s"]) if pid in ours else None
            theirs = _med(g["speculative"]["decode_tokens_per_s"])
            rows.append(
                [
                    pid,
                    label,
                    _sp(g["target_only"]["decode_tokens_per_s"]),
                    _sp(g["speculative"]["decode_tokens_per_s"]),
                    _sp(g["speedup"]),
                    _f(_med(g["e2e_speedup"])),
                    _f(_med(g.get("acceptance_rate"))),
                    {True: "yes", False: "NO"}.get(g.get("same_tokens_as_specrt"), "-"),
                    _f(mine / theirs if mine and theirs else None),
                ]
            )
        if len(rows) == rows_before:
            base = ", ".join(
                f"{pid} {_sp(g['target_only']['decode_tokens_per_s'])}" for pid, g in peer["prompts"].items()
            )
            notes.append(f"peer {name}: target-only decode tok/s (no speculative mode was asked for): {base}")
    return cols, rows, notes


def _plain_table(cols: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)), "  ".join("-" * w for w in widths)]
    lines += [
        "  ".join(v.rjust(w) if i >= 2 else v.ljust(w) for i, (v, w) in enumerate(zip(r, widths, strict=True)))
        for r in rows
    ]
    return "\n".join(lines)


def _model_label(path: str) -> str:
    """``.../qwen2.5-coder-1.5b-instruct/fp32`` -> ``qwen2.5-coder-1.5b-instruct/fp32``; other folders: their name."""
    p = Path(path)
    return f"{p.parent.name}/{p.name}" if p.name in ("fp32", "fp16", "int4", "int8") else p.name


def _header(report: dict[str, Any]) -> str:
    cfg, m = report["config"], report["machine"]
    load = m.get("load_avg_start")
    busy = load is not None and load[0] > 0.5
    text = (
        f"specrt bench: target {_model_label(report['models']['target'])}, draft "
        f"{_model_label(report['models']['draft'])}, K={cfg['k']}, T={cfg['temperature']}, "
        f"{cfg['max_new_tokens']} new tokens, {cfg['repeats']} interleaved repetitions, threads={cfg['threads']}; "
        f"{m['cpu']} ({m['n_cpus']} CPUs)"
    )
    if busy:
        text += f"\nwarning: load average {load[0]:.2f} when the bench started (CPU shared): timings are noisy"
    return text


_LEGEND = (
    "tok/s: decode tokens/s (prefill excluded), median [min-max] over repetitions; speedup: spec/target paired per "
    "repetition; e2e: with prefill; prefill ms t / s: target-only / speculative; acc: accepted/drafted; "
    "E: tokens/round; a: per-token a fitted to E; c_q: draft ms/pass; c_p: target-only ms/token; "
    "cv/cp: c_verify(K)/c_p measured on the prompt's cache (in run: target ms "
    "per round / per target-only step); pred: c_p E/(K c_q + c_verify(K)); round ms: measured / K c_q + c_verify(K); "
    "K with -k auto: mean drafts per round ~ the K used for the prediction"
)


def _timing_line(report: dict[str, Any]) -> str:
    """``wall 21.3 min: specrt 19.0 (verify costs 0.4, load 0.3, main 12.1, sweeps 6.2), peer genai 2.3``."""
    ph = report.get("phase_s") or {}

    def m(x: float | None) -> str:
        return "-" if x is None else f"{x / 60:.1f}"

    inner = ", ".join(
        f"{k.replace('_', ' ')} {m(ph[k])}" for k in ("verify_costs", "load", "main", "sweeps") if k in ph
    )
    text = f"wall {m(report.get('wall_s'))} min"
    if "specrt" in ph:
        text += f": specrt {m(ph['specrt'])} ({inner})"
    for k, v in ph.items():
        if k.startswith("peer_"):
            text += f", peer {k.removeprefix('peer_')} {m(v)}"
    return text


def render_table(report: dict[str, Any], *, use_rich: bool | None = None, file: Any = None) -> str:
    """Print the results (speed, cost model, sweeps, peers) as tables and return them as plain text.

    Args:
        report: what :func:`run_bench` returned (or its JSON).
        use_rich: draw with rich (when installed); default: when ``file`` is a terminal.
        file: where to print (default stdout).
    """
    file = file or sys.stdout
    tables = _main_tables(report)
    scols, srows = _sweep_rows(report)
    if srows:
        tables.append(("sweeps", scols, srows, 0))
    pcols, prows, pnotes = _peer_rows(report)
    if prows:
        tables.append(("peers", pcols, prows, 0))
    parts = [_header(report)]
    for title, cols, rows, _ in tables:
        parts.append(f"{title}\n{_plain_table(cols, rows)}")
        if title == "cost model":
            parts.append(_LEGEND)
    parts += pnotes
    parts.append(_timing_line(report))
    plain = "\n\n".join(parts)
    if use_rich is None:
        use_rich = getattr(file, "isatty", lambda: False)()
    try:
        if not use_rich:
            raise ImportError
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text
    except ImportError:
        print(plain, file=file)
        return plain
    # Never narrower than the plain table: rich would elide cells; a narrow terminal wraps lines instead.
    widest = max(len(line) for line in plain.splitlines() if not line.startswith(("tok/s:", "specrt bench:")))
    console = Console(file=file)
    console = Console(file=file, width=max(console.width, widest + 3 * 12))
    console.print(Text(_header(report)))
    for title, cols, rows, n_prompt_rows in tables:
        t = Table(title=title, header_style="bold", title_justify="left")
        for i, c in enumerate(cols):
            t.add_column(c, justify="left" if i == 0 or c == "kind" else "right", no_wrap=True)
        for i, r in enumerate(rows):
            t.add_row(*(Text(v) for v in r), end_section=i == n_prompt_rows - 1)
        console.print(t)
        if title == "cost model":
            console.print(Text(_LEGEND, style="dim"))
    for n in pnotes:
        console.print(Text(n, style="yellow"))
    return plain


_PRED_LABEL = "predicted from measured E, c_q, c_p, c_verify(K)"


def write_plots(report: dict[str, Any], out_prefix: str | os.PathLike[str]) -> list[Path]:
    """Draw the K sweep and the temperature sweep (measured and predicted speedup) as PNGs.

    Returns the written paths (``<prefix>-k-sweep.png``, ``<prefix>-temperature-sweep.png``); empty when there are
    no sweeps or matplotlib is not installed (``pip install specrt[bench]``).
    """
    sw = report.get("sweeps")
    if not sw:
        return []
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    prefix = Path(out_prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    written = []
    machine = f"{report['machine']['cpu']}, threads={report['config']['threads']}"
    subtitle = f"{_model_label(report['models']['target'])} / {_model_label(report['models']['draft'])}"

    def panel_grid(n: int) -> tuple[Any, list[Any]]:
        fig, axes = plt.subplots(1, n, figsize=(5.2 * n, 4.2), squeeze=False)
        return fig, list(axes[0])

    def errorbar(ax: Any, xs: list[float], pts: list[dict[str, Any]], **kw: Any) -> None:
        med = [_med(p["speedup"]) for p in pts]
        lo = [m - p["speedup"]["min"] for m, p in zip(med, pts, strict=True)]
        hi = [p["speedup"]["max"] - m for m, p in zip(med, pts, strict=True)]
        ax.errorbar(xs, med, yerr=[lo, hi], fmt="o-", capsize=3, **kw)

    entries = sw["k_sweep"]["prompts"]
    fig, axes = panel_grid(len(entries))
    for ax, e in zip(axes, entries, strict=True):
        pts = e["points"]
        xs = [p["k"] for p in pts]
        errorbar(ax, xs, pts, label="measured (median, min-max)")
        ax.plot(xs, [p["predicted_speedup"] for p in pts], "s--", label=_PRED_LABEL)
        if e["model_curve"]:
            ax.plot(
                [c["k"] for c in e["model_curve"]],
                [c["speedup"] for c in e["model_curve"]],
                ":",
                color="gray",
                label=f"cost model, a={e['alpha_ref']:.2f} fitted at K={sw['temperature_sweep']['k']}",
            )
        ax.axhline(1.0, color="black", lw=0.6)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("K (draft tokens per round)")
        ax.set_ylabel("decode speedup over target-only")
        ax.set_title(f"{e['id']}" + (f" (peer {e['peer']})" if e["peer"] else ""))
        ax.set_xticks(xs)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"K sweep, greedy, {sw['max_new_tokens']} new tokens: {subtitle}\n{machine}", fontsize=10)
    fig.tight_layout()
    p = prefix.with_name(prefix.name + "-k-sweep.png")
    fig.savefig(p, dpi=110)
    plt.close(fig)
    written.append(p)

    entries = sw["temperature_sweep"]["prompts"]
    fig, axes = panel_grid(len(entries))
    for ax, e in zip(axes, entries, strict=True):
        pts = e["points"]
        xs = [p["temperature"] for p in pts]
        errorbar(ax, xs, pts, label="measured (median, min-max)")
        ax.plot(xs, [p["predicted_speedup"] for p in pts], "s--", label=_PRED_LABEL)
        ax2 = ax.twinx()
        ax2.plot(xs, [_med(p["acceptance_rate"]) for p in pts], "^:", color="gray", label="accepted / drafted")
        ax2.set_ylim(0, 1.05)
        ax2.set_ylabel("acceptance rate (accepted / drafted)", color="gray")
        ax.axhline(1.0, color="black", lw=0.6)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("temperature")
        ax.set_ylabel("decode speedup over target-only")
        ax.set_title(f"{e['id']}" + (f" (peer {e['peer']})" if e["peer"] else ""))
        ax.grid(alpha=0.3)
        handles = ax.get_legend_handles_labels()
        handles2 = ax2.get_legend_handles_labels()
    axes[0].legend(handles[0] + handles2[0], handles[1] + handles2[1], fontsize=8, loc="lower left")
    fig.suptitle(
        f"temperature sweep, K={sw['temperature_sweep']['k']}, {sw['max_new_tokens']} new tokens: "
        f"{subtitle}\n{machine}",
        fontsize=10,
    )
    fig.tight_layout()
    p = prefix.with_name(prefix.name + "-temperature-sweep.png")
    fig.savefig(p, dpi=110)
    plt.close(fig)
    written.append(p)
    return written


# --------------------------------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------------------------------


def _default_out_dir() -> Path:
    bench_dir = _REPO_ROOT / "benches"
    return bench_dir / "out" if bench_dir.is_dir() else Path.cwd() / "specrt-bench-out"


def _k_value(value: str) -> int | str:
    if value == "auto":
        return value
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer 0..64 or 'auto'") from None


def _int_list(value: str) -> tuple[int, ...]:
    return tuple(int(v) for v in value.split(",") if v.strip())


def _float_list(value: str) -> tuple[float, ...]:
    return tuple(float(v) for v in value.split(",") if v.strip())


def _str_list(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip())


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the ``specrt bench`` options to ``p``."""
    d = BenchConfig()
    p.add_argument("--target", default=d.target, help=f"target model name or folder (default {d.target})")
    p.add_argument("--draft", default=d.draft, help=f"draft model name or folder (default {d.draft})")
    p.add_argument(
        "--dtype",
        choices=["fp32", "fp16", "int4", "int8"],
        default=d.dtype,
        help="weights of registry-named models (default fp32; folders are used as they are)",
    )
    p.add_argument("--prompts-file", default=None, help="prompt file (default benches/prompts.json)")
    p.add_argument("--prompt-set", default=None, help="named set for the main table (default 'main'; 'all')")
    p.add_argument("--prompts", type=_str_list, default=(), help="comma-separated prompt ids (overrides --prompt-set)")
    p.add_argument("--sweep-set", default=None, help="named set for the sweeps (default 'sweep')")
    p.add_argument("--sweep-prompts", type=_str_list, default=(), help="comma-separated prompt ids for the sweeps")
    p.add_argument("--max-new-tokens", type=int, default=None, help=f"main table (default {d.max_new_tokens})")
    p.add_argument("--sweep-max-new-tokens", type=int, default=None, help=f"sweeps (default {d.sweep_max_new_tokens})")
    p.add_argument("-k", "--num-speculative-tokens", dest="k", type=_k_value, default=d.k, help="main K (or 'auto')")
    p.add_argument("--k-sweep", type=_int_list, default=None, help="Ks of the K sweep (default 0,1,2,4,8)")
    p.add_argument("--temperatures", type=_float_list, default=None, help="temperature sweep (default 0,0.5,1)")
    p.add_argument("--temperature", type=float, default=d.temperature, help="main table temperature (default 0)")
    p.add_argument("--repeats", type=int, default=d.repeats, help="interleaved repetitions per figure (default 3)")
    p.add_argument("--verify-repeats", type=int, default=None, help="forwards per n for c_verify (default 5)")
    p.add_argument("--warmup-tokens", type=int, default=None, help="tokens per warm-up generation (0 = none)")
    p.add_argument("--threads", type=int, default=d.threads, help="ONNX Runtime threads per model (default 2)")
    p.add_argument("--max-seq-len", type=int, default=d.max_seq_len, help="KV cache length (default 1024)")
    p.add_argument("--seed", type=int, default=d.seed, help="seed (repetition r uses seed + r)")
    p.add_argument("--ignore-eos", action="store_true", help="always generate max_new_tokens")
    p.add_argument(
        "--baseline",
        choices=["separate", "k0"],
        default=d.baseline,
        help="target-only = the speculative Decoder at K=0 on the same target session (default: sessions created "
        "later in a process decode faster, so a separate Decoder is biased) or a separate Decoder without draft",
    )
    p.add_argument("--no-sweeps", action="store_true", help="main table only")
    p.add_argument("--no-plots", action="store_true", help="no PNGs")
    p.add_argument("--peers", type=_str_list, default=(), help="comma-separated peers to run after specrt: genai, hf")
    p.add_argument(
        "--genai-python",
        default=None,
        help="python of the onnxruntime-genai venv (default benches/out/venv-genai/bin/python)",
    )
    p.add_argument(
        "--hf-python",
        default=None,
        help="python of the torch + transformers venv (default benches/out/venv-hf/bin/python)",
    )
    p.add_argument(
        "--hf-modes",
        type=_str_list,
        default=None,
        help="hf peer modes: target_only, assisted (K drafts per round), assisted_dynamic (default: the first two)",
    )
    p.add_argument(
        "--peers-sequential",
        action="store_true",
        help="peers load one model set at a time (less memory, no interleaving of their target-only and speculative)",
    )
    p.add_argument("--out-dir", default=None, help="where JSON and PNGs go (default benches/out)")
    p.add_argument("--name", default=None, help="file name prefix (default bench-<date>-<time>)")
    p.add_argument("--quick", action="store_true", help="a few minutes: 2 prompts, 32 tokens, K sweep 0,2,4")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def config_from_args(a: argparse.Namespace) -> BenchConfig:
    """A :class:`BenchConfig` from parsed ``specrt bench`` arguments (``--quick`` changes the defaults only)."""
    cfg = BenchConfig.quick() if a.quick else BenchConfig()
    given = {
        "target": a.target,
        "draft": a.draft,
        "dtype": a.dtype,
        "prompts_file": a.prompts_file,
        "prompt_set": a.prompt_set,
        "prompt_ids": a.prompts,
        "sweep_set": a.sweep_set,
        "sweep_ids": a.sweep_prompts,
        "max_new_tokens": a.max_new_tokens,
        "sweep_max_new_tokens": a.sweep_max_new_tokens,
        "k": a.k,
        "k_sweep": a.k_sweep,
        "temperatures": a.temperatures,
        "temperature": a.temperature,
        "repeats": a.repeats,
        "verify_repeats": a.verify_repeats,
        "warmup_tokens": a.warmup_tokens,
        "threads": a.threads,
        "max_seq_len": a.max_seq_len,
        "seed": a.seed,
        "ignore_eos": a.ignore_eos,
        "baseline": a.baseline,
        "sweeps": not a.no_sweeps,
        "plots": not a.no_plots,
        "peers": a.peers,
        "genai_python": a.genai_python,
        "hf_python": a.hf_python,
        "hf_modes": a.hf_modes or None,
        "peer_interleave": False if a.peers_sequential else None,
        "out_dir": a.out_dir,
        "name": a.name,
        "progress": not a.no_progress,
    }
    return replace(cfg, **{k: v for k, v in given.items() if v is not None})


def save(report: dict[str, Any], cfg: BenchConfig) -> dict[str, Path]:
    """Write ``<out_dir>/<name>.json`` and the sweep PNGs; return their paths."""
    out_dir = Path(cfg.out_dir) if cfg.out_dir else _default_out_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    name = cfg.name or time.strftime("bench-%Y%m%d-%H%M%S")
    paths: dict[str, Path] = {}
    if cfg.plots:
        for p in write_plots(report, out_dir / name):
            paths[p.stem.removeprefix(name + "-")] = p
    report.setdefault("files", {}).update({k: str(v) for k, v in paths.items()})
    json_path = out_dir / f"{name}.json"
    report["files"]["json"] = str(json_path)
    json_path.write_text(json.dumps(report, indent=1, allow_nan=False) + "\n", encoding="utf-8")
    paths["json"] = json_path
    return paths


def run_cli(a: argparse.Namespace) -> int:
    """``specrt bench``: run, print the table, write JSON (+ PNGs). Returns the exit code."""
    cfg = config_from_args(a)
    try:
        validate_config(cfg)
    except ValueError as e:
        print(f"specrt bench: error: {e}", file=sys.stderr)
        return 2
    report = run_bench(cfg)
    paths = save(report, cfg)
    render_table(report)
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    failed = [name for name, peer in (report.get("peers") or {}).items() if peer.get("status") == "error"]
    if failed:
        print(f"specrt bench: peer {', '.join(failed)} failed (see the notes above and the JSON)", file=sys.stderr)
        return 1
    return 0
