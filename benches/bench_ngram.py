"""Prompt-lookup (n-gram) drafting vs the draft model vs both, against target-only, in one run.

For each prompt of the chosen sets (default: ``edit``, three 79-84-line Python files returned whole with a small
change, and ``copyless``, the two peers.md chat prompts with little to copy), decode with every mode, interleaved
(the order rotates between repetitions so each mode sees the same machine load):

- ``target``: target-only (``proposer="none"``, K = 0, on the same Decoder: the draft is neither prefilled nor run),
- ``draft``: the draft model proposes (``proposer="draft"``),
- ``ngram``: prompt lookup proposes (``proposer="ngram"``; no draft model pass),
- ``ngram+draft``: prompt lookup first, the draft model when nothing matches.

All modes share one Decoder (target + draft); the speculative ones use the same ``-k`` (``auto`` by default: n-gram
proposals take up to K_max = 8 tokens, the draft model's K is chosen by the cost model each round).

Reported per prompt and mode: decode tokens/s (new tokens / wall time after prefill; median [min-max] over
repetitions), speedup over target-only (per repetition, then median), acceptance rate, mean tokens per round E,
n-gram drafted / accepted tokens, and whether greedy output equals target-only output token for token. Then the
#7 checks: ngram and ngram+draft over target-only on the edit set, ngram+draft over the better of its parts, and
ngram+draft over draft on the copyless set.

Usage::

    python benches/bench_ngram.py --dtype fp32 --json benches/out/ngram-fp32.json
    python benches/bench_ngram.py --dtype int4 --json benches/out/ngram-int4.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

import specrt
from specrt.bench import load_prompts, spread
from specrt.bench.runner import _generate, _machine
from specrt.bench.stats import Run, _first_divergence
from specrt.models import resolve_model

MODES = ("target", "draft", "ngram", "ngram+draft")


def _k_arg(value: str) -> int | str:
    return value if value == "auto" else int(value)


def summarize(runs: dict[str, list[Run]]) -> dict[str, Any]:
    """Per-mode figures of one prompt; ``runs[mode][r]`` is repetition r."""
    base = runs["target"]
    out: dict[str, Any] = {}
    for mode, rs in runs.items():
        row: dict[str, Any] = {
            "decode_tokens_per_s": spread(r.decode_tokens_per_s for r in rs),
            "tokens_per_s": spread(r.tokens_per_s for r in rs),
            "prefill_ms": spread(r.prefill_ms for r in rs),
            "n_emitted": spread(r.n_emitted for r in rs),
        }
        if mode != "target":
            row["speedup"] = spread(
                s.decode_tokens_per_s / b.decode_tokens_per_s for b, s in zip(base, rs, strict=True)
            )
            row["e2e_speedup"] = spread(s.tokens_per_s / b.tokens_per_s for b, s in zip(base, rs, strict=True))
            st = [r.stats for r in rs]
            row["acceptance_rate"] = spread(s["n_accepted"] / s["n_drafted"] if s["n_drafted"] else None for s in st)
            row["mean_tokens_per_round"] = spread(r.n_emitted / r.stats["n_rounds"] for r in rs if r.stats["n_rounds"])
            row["n_drafted_ngram"] = spread(s["n_drafted_ngram"] for s in st)
            row["n_accepted_ngram"] = spread(s["n_accepted_ngram"] for s in st)
            row["n_drafted"] = spread(s["n_drafted"] for s in st)
            row["n_accepted"] = spread(s["n_accepted"] for s in st)
            row["draft_ms_per_round"] = spread(s["draft_ms"] / s["n_rounds"] for s in st if s["n_rounds"])
            row["target_ms_per_round"] = spread(s["target_ms"] / s["n_rounds"] for s in st if s["n_rounds"])
            row["rounds_by_k"] = st[0].get("rounds_by_k")
            divs = [_first_divergence(b.token_ids, s.token_ids) for b, s in zip(base, rs, strict=True)]
            row["greedy_parity"] = all(d is None for d in divs)
            row["first_divergence"] = next((d for d in divs if d is not None), None)
        row["runs"] = [r.summary() for r in rs]
        out[mode] = row
    # Combined mode against its parts, per repetition (decode tokens/s ratios).
    comb, dr, ng = runs["ngram+draft"], runs["draft"], runs["ngram"]
    out["combined_over_best_part"] = spread(
        c.decode_tokens_per_s / max(d.decode_tokens_per_s, n.decode_tokens_per_s)
        for c, d, n in zip(comb, dr, ng, strict=True)
    )
    out["combined_over_draft"] = spread(
        c.decode_tokens_per_s / d.decode_tokens_per_s for c, d in zip(comb, dr, strict=True)
    )
    return out


def _med(s: dict[str, Any] | None) -> float | None:
    return None if s is None else s["median"]


def _fmt(s: dict[str, Any] | None, f: str = ".2f") -> str:
    if s is None:
        return "-"
    return f"{s['median']:{f}} [{s['min']:{f}}-{s['max']:{f}}]"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "fp16", "int4", "int8"])
    ap.add_argument("--sets", default="edit,copyless", help="comma-separated prompt sets of benches/prompts.json")
    ap.add_argument("--max-new-tokens", type=int, default=384, help="edit set (default 384)")
    ap.add_argument("--copyless-max-new-tokens", type=int, default=128, help="copyless set (default 128)")
    ap.add_argument("-k", "--num-speculative-tokens", dest="k", type=_k_arg, default="auto")
    ap.add_argument("--prompt-lookup-min", type=int, default=2)
    ap.add_argument("--prompt-lookup-max", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    modes = tuple(a.modes.split(","))
    if modes[0] != "target" or not set(modes) <= set(MODES):
        ap.error(f"--modes {a.modes!r}: expected 'target' first, then any of {MODES[1:]}")

    t_start = time.perf_counter()
    machine = _machine()
    target = resolve_model(a.target, a.dtype)
    draft = resolve_model(a.draft, a.dtype)
    sets = a.sets.split(",")
    prompts = [(s, p) for s in sets for p in load_prompts(set_name=s)]
    # One Decoder for every mode, target-only included (proposer "none", K = 0: the draft model is neither prefilled
    # nor run): ONNX Runtime sessions created later in a process decode faster than the first (see
    # specrt.bench.run_bench), so a separate target-only Decoder would be biased.
    decs = {"spec": specrt.Decoder(target, draft, max_seq_len=2048, intra_op_threads=a.threads)}
    spec = decs["spec"]
    n_prompt = {
        p.id: len(spec.encode(p.prompt, [dict(m) for m in p.messages] if p.messages else None)) for _, p in prompts
    }

    def one(mode: str, p: Any, max_new: int, seed: int) -> Run:
        if mode == "target":
            return _generate(
                decs["spec"],
                p,
                k=0,
                temperature=0.0,
                max_new_tokens=max_new,
                seed=seed,
                ignore_eos=False,
                proposer="none",
            )
        return _generate(
            decs["spec"],
            p,
            k=a.k,
            temperature=0.0,
            max_new_tokens=max_new,
            seed=seed,
            ignore_eos=False,
            proposer=mode,
            prompt_lookup_min=a.prompt_lookup_min,
            prompt_lookup_max=a.prompt_lookup_max,
        )

    # Warm-up: every mode once on the first prompt, few tokens.
    for mode in modes:
        one(mode, prompts[0][1], 8, 0)
    runs: dict[str, dict[str, list[Run]]] = {p.id: {m: [] for m in modes} for _, p in prompts}
    for r in range(a.repeats):
        for set_name, p in prompts:
            max_new = a.copyless_max_new_tokens if set_name == "copyless" else a.max_new_tokens
            order = list(modes[r % len(modes) :] + modes[: r % len(modes)])
            for mode in order:
                run = one(mode, p, max_new, r)
                runs[p.id][mode].append(run)
                print(
                    f"rep {r + 1}/{a.repeats} {p.id:22s} {mode:12s} {run.n_emitted:4d} tok "
                    f"{run.decode_tokens_per_s:6.2f} tok/s (prefill {run.prefill_ms:.0f} ms)",
                    file=sys.stderr,
                    flush=True,
                )
    rows = {}
    for set_name, p in prompts:
        rows[p.id] = {"set": set_name, "kind": p.kind, "n_prompt_tokens": n_prompt[p.id], **summarize(runs[p.id])}
    prompt_ids = {
        p.id: spec.encode(p.prompt, [dict(m) for m in p.messages] if p.messages else None) for _, p in prompts
    }
    del spec
    decs.clear()
    gc.collect()
    # Greedy divergences: the target's top-2 logit gap where the outputs part (one-row pass over the common prefix).
    # In int4 the one-row and multi-row MatMulNBits paths round differently, so near-ties can flip.
    oracle = None
    for pid, row in rows.items():
        for m in modes[1:]:
            i = row[m]["first_divergence"]
            if i is None:
                continue
            if oracle is None:
                from specrt import _specrt
                from specrt._ort import find_ort_library

                oracle = _specrt.OrtModel(str(target), ort_library=find_ort_library(), max_seq_len=4096)
            ref = runs[pid]["target"][0].token_ids
            logits = oracle.forward(np.asarray(prompt_ids[pid] + ref[:i], np.int64), 0, 1)[0]
            top = np.argsort(logits)[-2:][::-1]
            row[m]["divergence_top2_gap"] = float(logits[top[0]] - logits[top[1]])
            row[m]["divergence_top2"] = [int(top[0]), int(top[1])]
            print(
                f"{pid} {m}: first divergence at token {i}, target top-2 logit gap {row[m]['divergence_top2_gap']:.3f}"
            )

    print(f"\n{a.dtype} target {target.name}, draft {draft.name}, K = {a.k}, greedy, {a.repeats} repetitions")
    print("| prompt | set | L | target tok/s | " + " | ".join(f"{m} tok/s (x)" for m in modes[1:]) + " | parity |")
    print("|---" * (5 + len(modes) - 1) + "|")
    for pid, row in rows.items():
        cells = [pid, row["set"], str(row["n_prompt_tokens"]), _fmt(row["target"]["decode_tokens_per_s"])]
        cells += [f"{_fmt(row[m]['decode_tokens_per_s'])} ({_med(row[m]['speedup']):.2f}x)" for m in modes[1:]]
        div = [
            f"{m} @{row[m]['first_divergence']} gap {row[m].get('divergence_top2_gap', 0):.3f}"
            for m in modes[1:]
            if not row[m]["greedy_parity"]
        ]
        cells.append("yes" if not div else "; ".join(div))
        print("| " + " | ".join(cells) + " |")
    checks: dict[str, Any] = {}
    if set(MODES) <= set(modes):
        print(
            "\n| prompt | acc draft / ngram / both | E draft / ngram / both | ngram accepted/drafted (ngram, both) "
            "| both / best part | both / draft |"
        )
        print("|---|---|---|---|---|---|")
        for pid, row in rows.items():
            acc = " / ".join(f"{_med(row[m]['acceptance_rate']) or 0:.2f}" for m in MODES[1:])
            e = " / ".join(f"{_med(row[m]['mean_tokens_per_round']) or 0:.2f}" for m in MODES[1:])
            ng = ", ".join(
                f"{_med(row[m]['n_accepted_ngram']):.0f}/{_med(row[m]['n_drafted_ngram']):.0f}"
                for m in ("ngram", "ngram+draft")
            )
            print(
                f"| {pid} | {acc} | {e} | {ng} | {_fmt(row['combined_over_best_part'])} | "
                f"{_fmt(row['combined_over_draft'])} |"
            )
        for s in sets:
            ids = [pid for pid, row in rows.items() if row["set"] == s]
            checks[s] = {
                f"mean_speedup_{m}": statistics.fmean(_med(rows[i][m]["speedup"]) for i in ids) for m in modes[1:]
            } | {
                "min_combined_over_best_part": min(_med(rows[i]["combined_over_best_part"]) for i in ids),
                "min_combined_over_draft": min(_med(rows[i]["combined_over_draft"]) for i in ids),
            }
        print("\n" + json.dumps(checks, indent=2))
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(
            json.dumps(
                {
                    "command": " ".join(sys.argv),
                    "machine": machine | {"load_avg_end": list(os.getloadavg())},
                    "models": {"target": str(target), "draft": str(draft), "dtype": a.dtype},
                    "k": a.k,
                    "prompt_lookup": [a.prompt_lookup_min, a.prompt_lookup_max],
                    "repeats": a.repeats,
                    "max_new_tokens": {"edit": a.max_new_tokens, "copyless": a.copyless_max_new_tokens},
                    "prompts": rows,
                    "checks": checks,
                    "wall_s": time.perf_counter() - t_start,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
