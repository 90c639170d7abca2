"""Throughput of batched rounds: speculative vs plain batched decoding at batch sizes 1, 2, 4, 8, in the same run.

    python benches/bench_batch.py                                   # Qwen2.5-Coder 1.5B + 0.5B fp32, greedy
    python benches/bench_batch.py --batch-sizes 4 --json benches/out/batch.json

For each batch size B, B requests (the four peers.md prompts, repeated for B = 8) are submitted at once to a
:class:`specrt.Scheduler` on ``Decoder(max_batch=B)`` (batched layout), greedy, ``max_new_tokens`` each; the
aggregate throughput is the total of emitted tokens over the wall time from submission to the last result (prefill
included, as a service sees it). Modes: plain batched decoding (``num_speculative_tokens=0``: one target pass per
round, one token per row), fixed K and auto K (K chosen per round for the batch from costs measured at that batch
size). The ratio speculative / plain at each B is the speedup; the crossover is the first B where it drops below 1.
Greedy outputs of every mode are checked equal to plain decoding's (a near-tie divergence is reported, not hidden).

A second figure, the decode aggregate, takes the target's prompt prefill out of the wall time of every mode: tokens
over (wall - the plain runs' summed ``stats.prefill_ms``, median over repeats), the same target prefill work in every
mode. The draft's own prefill or catch-up stays in (it is a cost of speculating).

With ``--repeats N`` the modes run interleaved N times; a speedup is the median over repeats of plain wall / mode
wall in the same repeat (min and max beside it), as single runs on a shared machine move by 10-20%.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

import specrt
from specrt import models
from specrt.bench.prompts import load_prompts
from specrt.scheduler import Scheduler


def run_batch(dec: specrt.Decoder, reqs: list[dict[str, Any]]) -> dict[str, Any]:
    """Submit every request at once; wait for all. Returns tokens, wall time and per-request outputs."""
    t0 = time.perf_counter()
    with Scheduler(dec, max_queue=len(reqs) + 1) as sched:
        handles = [sched.submit(**r) for r in reqs]
        results = [h.result() for h in handles]
    wall = time.perf_counter() - t0
    n = sum(len(r.token_ids) for r in results)
    drafted = sum(r.stats.n_drafted for r in results)
    # Model time per round of the shared passes (every row's Stats hold the batch's pass times; the longest-running
    # row saw the most full rounds).
    longest = max(results, key=lambda r: r.stats.n_rounds).stats
    accepted = sum(r.stats.n_accepted for r in results)
    return {
        "prefill_s": sum(r.stats.prefill_ms for r in results) / 1000,
        "wall_s": wall,
        "tokens": n,
        "tokens_per_s": n / wall,
        "acceptance_rate": accepted / drafted if drafted else None,
        "mean_tokens_per_round": n / max(1, sum(r.stats.n_rounds for r in results)),
        "draft_ms_per_round": longest.draft_ms / max(1, longest.n_rounds),
        "target_ms_per_round": longest.target_ms / max(1, longest.n_rounds),
        "outputs": [r.token_ids for r in results],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--batch-sizes", default="1,2,4,8")
    ap.add_argument("--k", default="4", help="fixed K of the speculative modes, comma-separated; '' = none (default 4)")
    ap.add_argument("--no-auto", action="store_true", help="skip the auto-K mode")
    ap.add_argument(
        "--ngram", action="store_true", help="also run auto K with prompt lookup first (proposer 'ngram+draft')"
    )
    ap.add_argument("--draft-vocab", type=int, default=None, help="use the pruned draft with this many token ids")
    ap.add_argument("--draft-dtype", default="fp32", choices=["fp32", "int4"], help="weights of the draft model")
    ap.add_argument(
        "--no-draft-prefill-graph",
        action="store_true",
        help="an int4 draft without its int8 prefill graph (by default it has one, as Decoder(draft_dtype='int4'))",
    )
    ap.add_argument(
        "--draft-folder", type=Path, default=None, help="a converted draft folder (batched layout) instead of --draft"
    )
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--max-seq-len", type=int, default=640, help="per-row capacity (prompt c is 387 tokens)")
    ap.add_argument("--repeats", type=int, default=1, help="runs of every mode, interleaved (default 1)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    target = models.pull(args.target, attention="batched")
    if args.draft_folder:
        draft = args.draft_folder
    elif args.draft_vocab:
        draft = models.pruned(args.draft, args.draft_vocab, args.draft_dtype, attention="batched")
    else:
        draft = models.pull(
            args.draft,
            args.draft_dtype,
            attention="batched",
            prefill_graph=args.draft_dtype == "int4" and not args.no_draft_prefill_graph,
        )
    prompts = load_prompts(set_name="peers")
    modes: list[tuple[str, dict[str, Any]]] = [
        ("plain", {"num_speculative_tokens": 0}),
        *[(f"K={k}", {"num_speculative_tokens": int(k)}) for k in args.k.split(",") if k],
    ]
    if not args.no_auto:
        modes.append(("auto", {"num_speculative_tokens": "auto"}))
    if args.ngram:
        modes.append(("auto+ngram", {"num_speculative_tokens": "auto", "proposer": "ngram+draft"}))
    rows = []
    for b in [int(x) for x in args.batch_sizes.split(",")]:
        dec = specrt.Decoder(target, draft, max_batch=b, max_seq_len=args.max_seq_len)
        reqs = [
            {**prompts[i % len(prompts)].generate_kwargs(), "max_new_tokens": args.max_new_tokens, "temperature": 0}
            for i in range(b)
        ]
        # Warm-up (arena growth, first-touch pages).
        dec.generate(**reqs[0], num_speculative_tokens=4)
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in modes}
        for _ in range(args.repeats):  # modes interleaved, so each repeat's ratios compare the same minutes
            for name, settings in modes:
                runs[name].append(run_batch(dec, [{**q, **settings} for q in reqs]))
        plain_runs = runs["plain"]
        plain_prefill = statistics.median(r["prefill_s"] for r in plain_runs)
        for name, _ in modes:
            rs = runs[name]
            wall = statistics.median(x["wall_s"] for x in rs)
            r = min(rs, key=lambda x: abs(x["wall_s"] - wall))
            paired = [p["wall_s"] / x["wall_s"] for p, x in zip(plain_runs, rs, strict=True)]
            paired_decode = [
                (p["wall_s"] - plain_prefill) / (x["wall_s"] - plain_prefill)
                for p, x in zip(plain_runs, rs, strict=True)
            ]
            same = [
                a == p
                for x, px in zip(rs, plain_runs, strict=True)
                for a, p in zip(x["outputs"], px["outputs"], strict=True)
            ]
            row = {
                "batch_size": b,
                "mode": name,
                "repeats": len(rs),
                "tokens": r["tokens"],
                "wall_s": [round(x["wall_s"], 2) for x in rs],
                "tokens_per_s": round(r["tokens"] / wall, 2),
                # Median over repeats of (plain wall / this wall) in the same repeat; min and max beside it.
                "speedup_vs_plain": round(statistics.median(paired), 3),
                "speedup_range": [round(min(paired), 3), round(max(paired), 3)],
                "prefill_s": round(statistics.median(x["prefill_s"] for x in rs), 2),
                "decode_tokens_per_s": round(r["tokens"] / (wall - plain_prefill), 2),
                "decode_speedup_vs_plain": round(statistics.median(paired_decode), 3),
                "acceptance_rate": r["acceptance_rate"],
                "mean_tokens_per_round": round(r["mean_tokens_per_round"], 2),
                "outputs_equal_plain": f"{sum(same)}/{len(same)}",
                "draft_ms_per_round": round(r["draft_ms_per_round"], 1),
                "target_ms_per_round": round(r["target_ms_per_round"], 1),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
        del dec
    report = {
        "command": "python " + " ".join(sys.argv),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
        "target": str(target),
        "draft": str(draft),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "rows": rows,
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
