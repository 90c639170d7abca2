"""Suffix decoding on agent-like repeated requests (issue 55): the same tool prompt with small changes, and the same
code edit asked of slightly different versions of a file, sent one after another as an agent or an editor sends them.
Beside target-only, prompt lookup, the draft model and suffix decoding without a shared cache, in one run, each
request interleaved over every method.

Methods (greedy, ``logprobs=False``):
- ``target_only``: ``proposer="none"``;
- ``ngram``: prompt lookup, K = ``--k``;
- ``draft``: the draft model, K = ``--k``;
- ``suffix``: suffix decoding over the request's own text, K = ``--k``;
- ``suffix_shared``: suffix decoding with a cache of the earlier requests (``Decoder(..., suffix_cache_tokens=N)``,
  its own Decoder, so it sees only its own earlier requests);
- ``suffix+draft_shared``: the same, the draft model where nothing matches (another Decoder of its own).

Reported per scenario: decode tokens/s (emitted tokens over the rounds' time after prefill, summed over the
requests), the speedup over target-only in the same run, the first request apart from the rest (the cache is empty
for the first), mean tokens per round, and whether every output equals target-only's token for token.

Usage: python benches/bench_suffix.py [--target qwen2.5-coder-1.5b-instruct] [--draft qwen2.5-coder-0.5b-instruct]
[--dtype gguf] [--k 8] [--max-new-tokens 96] [--requests 6] [--threads 2] [--json out.json].
Figures: benches/RESULTS.md "Suffix decoding on repeated requests".
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

from specrt.generate import Decoder

TOOL_SYSTEM = (
    "You are an assistant that answers only with one JSON tool call and nothing else. Tools:\n"
    '- get_weather(city: string, date: string "YYYY-MM-DD", units: "metric" | "imperial")\n'
    '- book_table(restaurant: string, city: string, date: string "YYYY-MM-DD", time: string "HH:MM", people: int)\n'
    'Answer as {"tool": <name>, "arguments": {...}, "reason": <one sentence>}.'
)
CITIES = ["Lisbon", "Oslo", "Nairobi", "Lima", "Osaka", "Tbilisi", "Quebec", "Perth", "Bergen", "Cusco"]

CODE = """def summarize(records, field, threshold=0.5):
    totals = {}
    counts = {}
    for record in records:
        key = record["group"]
        value = record[field]
        if value is None or value < threshold:
            continue
        totals[key] = totals.get(key, 0.0) + value
        counts[key] = counts.get(key, 0) + 1
    result = []
    for key in sorted(totals):
        mean = totals[key] / counts[key]
        result.append({"group": key, "mean": round(mean, 3), "n": counts[key]})
    return result
"""
RENAMES = [
    ("records", "rows"),
    ("field", "column"),
    ("threshold", "cutoff"),
    ("totals", "sums"),
    ("result", "out"),
    ("summarize", "group_means"),
    ("counts", "sizes"),
    ("mean", "average"),
    ("value", "x"),
    ("key", "name"),
]


def scenarios(n: int) -> dict[str, list[list[dict[str, str]]]]:
    """Per scenario, ``n`` chat requests in the order they are sent."""
    tools = [
        [
            {"role": "system", "content": TOOL_SYSTEM},
            {"role": "user", "content": f"What will the weather be in {c} on 2026-12-{10 + i:02d}, in metric units?"},
        ]
        for i, c in enumerate(CITIES[:n])
    ]
    edits = []
    for old, new in RENAMES[:n]:
        code = CODE.replace(old, new)
        edits.append(
            [
                {
                    "role": "user",
                    "content": "Add type hints and a one-line docstring to this function; keep everything else as "
                    f"it is and answer with the whole function only.\n\n```python\n{code}```",
                }
            ]
        )
    return {"tool_calls": tools, "code_edits": edits}


METHODS = ("target_only", "ngram", "draft", "suffix", "suffix_shared", "suffix+draft_shared")


def settings(method: str, k: int) -> dict[str, Any]:
    proposer = {
        "target_only": "none",
        "ngram": "ngram",
        "draft": "draft",
        "suffix": "suffix",
        "suffix_shared": "suffix",
        "suffix+draft_shared": "suffix+draft",
    }[method]
    return {"proposer": proposer, "num_speculative_tokens": 0 if method == "target_only" else k}


def run(args: argparse.Namespace) -> dict[str, Any]:
    common = {"dtype": args.dtype, "intra_op_threads": args.threads, "max_seq_len": 2048}
    t0 = time.perf_counter()
    plain = Decoder(args.target, args.draft, **common)
    shared = {
        m: Decoder(args.target, args.draft, suffix_cache_tokens=args.cache_tokens, **common)
        for m in ("suffix_shared", "suffix+draft_shared")
    }
    load_s = time.perf_counter() - t0
    decoders = {m: shared.get(m, plain) for m in METHODS}
    base = {"max_new_tokens": args.max_new_tokens, "temperature": 0.0, "logprobs": False}
    # warm-up: one short generation per decoder and method (first runs pack weights, size arenas)
    for m in METHODS:
        decoders[m].generate(prompt="Hello", **base | {"max_new_tokens": 8}, **settings(m, args.k))
    out: dict[str, Any] = {}
    for name, requests in scenarios(args.requests).items():
        rows: dict[str, list[dict[str, Any]]] = {m: [] for m in METHODS}
        for msgs in requests:
            for m in METHODS:
                res = decoders[m].generate(messages=msgs, **base, **settings(m, args.k))
                s = res.stats
                rows[m].append(
                    {
                        "token_ids": list(res.token_ids),
                        "n_tokens": len(res.token_ids),
                        # the Rust side's decode time (draft + target + core ms after prefill), as Spec-Bench's
                        "decode_ms": len(res.token_ids) * 1e3 / s.decode_tokens_per_s if s.decode_tokens_per_s else 0.0,
                        "rounds": s.n_rounds,
                        "drafted": s.n_drafted,
                        "accepted": s.n_accepted,
                    }
                )
        out[name] = rows
    return {
        "command": "python benches/bench_suffix.py "
        + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "json"),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "load_s": load_s,
        "scenarios": out,
    }


def summarize(result: dict[str, Any]) -> str:
    lines = []
    for name, rows in result["scenarios"].items():
        ref = rows["target_only"]

        def tps(rs: list[dict[str, Any]]) -> float:
            ms = sum(r["decode_ms"] for r in rs)
            return sum(r["n_tokens"] for r in rs) / ms * 1e3 if ms > 0 else float("nan")

        lines.append(f"{name}: {len(ref)} requests")
        lines.append(
            f"  {'method':<22}{'tok/s':>8}{'speedup':>9}{'first':>8}{'rest':>8}{'E':>7}{'accept':>8}  outputs equal"
        )
        for m, rs in rows.items():
            first = tps(rs[:1]) / tps(ref[:1])
            rest = tps(rs[1:]) / tps(ref[1:]) if len(rs) > 1 else float("nan")
            rounds = sum(r["rounds"] for r in rs)
            e = sum(r["n_tokens"] for r in rs) / rounds if rounds else float("nan")
            drafted = sum(r["drafted"] for r in rs)
            acc = sum(r["accepted"] for r in rs) / drafted if drafted else float("nan")
            equal = sum(r["token_ids"] == q["token_ids"] for r, q in zip(rs, ref, strict=True))
            lines.append(
                f"  {m:<22}{tps(rs):>8.2f}{tps(rs) / tps(ref):>9.2f}{first:>8.2f}{rest:>8.2f}{e:>7.2f}{acc:>8.2f}"
                f"  {equal}/{len(rs)}"
            )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    p.add_argument("--dtype", default="gguf")
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--requests", type=int, default=6)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--cache-tokens", type=int, default=65536)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    result = run(args)
    print(summarize(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1))
        print(f"json: {args.json}")


if __name__ == "__main__":
    main()
