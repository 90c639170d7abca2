"""A draft whose tokenizer differs from the target's (issue 55): token-level intersection against target-only, in one
run, greedy and T = 1, every prompt interleaved over every method, several repeats.

Default pair: Gemma-3-270M (fp32; its 262,144-token SentencePiece vocabulary has no same-tokenizer draft in the
registry) drafted by SmolLM2-135M-Instruct (int4; 49,152-token byte-level BPE). ``--target
qwen2.5-coder-1.5b-instruct`` runs the same with a target that has a sibling (the 0.5B), for comparison.

Methods (``logprobs=False``): ``target_only`` (no draft), ``K=k`` for each ``--k`` (the draft, that K each round),
``auto_k`` (the draft, ``num_speculative_tokens="auto"``: K in 0..8 chosen each round by the cost model from the
request's measured acceptance and costs). Reported per temperature: decode tokens/s (emitted tokens over the rounds'
time after prefill, summed over prompts), speedup over target-only of the same repeat (median and range over
repeats), acceptance rate, mean tokens per round, and, greedy, whether every output equals target-only's. T = 1 uses
seed = the prompt's index, the same for every method (the outputs then differ between methods: each is a sample of
the target's distribution).

Usage: python benches/bench_cross_vocab.py [--target gemma-3-270m] [--draft smollm2-135m-instruct] [--dtype fp32]
[--draft-dtype int4] [--k 1,2,3] [--max-new-tokens 64] [--repeats 3] [--threads 2] [--json out.json].
Figures: benches/RESULTS.md "A draft of another tokenizer".
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

from specrt.generate import Decoder

PROMPTS = [
    "The capital of France is Paris. The capital of Germany is",
    "Once upon a time, in a small village by the sea, there lived",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "Photosynthesis is the process by which plants",
    "Here is a list of the planets of the solar system, in order from the Sun:\n1.",
    "Question: What is 12 times 7?\nAnswer:",
]


def methods(ks: list[int]) -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = [("target_only", {"proposer": "none", "num_speculative_tokens": 0})]
    out += [(f"K={k}", {"proposer": "draft", "num_speculative_tokens": k}) for k in ks]
    out.append(("auto_k", {"proposer": "draft", "num_speculative_tokens": "auto"}))
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    ks = [int(k) for k in args.k.split(",")]
    common = {"dtype": args.dtype, "intra_op_threads": args.threads, "max_seq_len": 1024}
    t0 = time.perf_counter()
    dec = Decoder(args.target, args.draft, draft_dtype=args.draft_dtype, **common)
    load_s = time.perf_counter() - t0
    ms = methods(ks)
    for _, s in ms:  # warm-up: first runs size arenas and pack weights
        dec.generate(PROMPTS[0], max_new_tokens=8, temperature=0.0, **s)
    rows: list[dict[str, Any]] = []
    for rep in range(args.repeats):
        for temperature in (0.0, 1.0):
            for i, prompt in enumerate(PROMPTS):
                for name, s in ms:
                    res = dec.generate(
                        prompt,
                        max_new_tokens=args.max_new_tokens,
                        temperature=temperature,
                        seed=i,
                        ignore_eos=True,
                        logprobs=False,
                        **s,
                    )
                    st = res.stats
                    rows.append(
                        {
                            "repeat": rep,
                            "temperature": temperature,
                            "prompt": i,
                            "method": name,
                            "token_ids": list(res.token_ids),
                            "n_tokens": len(res.token_ids),
                            "decode_ms": len(res.token_ids) * 1e3 / st.decode_tokens_per_s
                            if st.decode_tokens_per_s
                            else 0.0,
                            "rounds": st.n_rounds,
                            "drafted": st.n_drafted,
                            "accepted": st.n_accepted,
                        }
                    )
    return {
        "command": "python benches/bench_cross_vocab.py "
        + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "json" and v is not None),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "draft_vocabulary": dec.draft_vocabulary,
        "load_s": load_s,
        "rows": rows,
    }


def summarize(result: dict[str, Any]) -> str:
    rows = result["rows"]
    v = result["draft_vocabulary"]
    lines = [f"draft vocabulary: {v}"]
    names = list(dict.fromkeys(r["method"] for r in rows))
    repeats = sorted({r["repeat"] for r in rows})
    for temperature in (0.0, 1.0):
        sel = [r for r in rows if r["temperature"] == temperature]

        def tps(method: str, rep: int | None = None, rs: list[dict[str, Any]] = sel) -> float:
            pick = [r for r in rs if r["method"] == method and (rep is None or r["repeat"] == rep)]
            ms = sum(r["decode_ms"] for r in pick)
            return sum(r["n_tokens"] for r in pick) / ms * 1e3 if ms > 0 else float("nan")

        lines.append(f"T = {temperature:g}: {len(PROMPTS)} prompts x {len(repeats)} repeats")
        lines.append(f"  {'method':<12}{'tok/s':>8}{'speedup (median, range)':>26}{'accept':>8}{'E':>6}  outputs equal")
        for m in names:
            ratios = [tps(m, rep) / tps("target_only", rep) for rep in repeats]
            pick = [r for r in sel if r["method"] == m]
            drafted = sum(r["drafted"] for r in pick)
            acc = sum(r["accepted"] for r in pick) / drafted if drafted else float("nan")
            rounds = sum(r["rounds"] for r in pick)
            e = sum(r["n_tokens"] for r in pick) / rounds if rounds else float("nan")
            if temperature == 0.0:
                ref = {(r["repeat"], r["prompt"]): r["token_ids"] for r in sel if r["method"] == "target_only"}
                equal = sum(r["token_ids"] == ref[(r["repeat"], r["prompt"])] for r in pick)
                eq = f"{equal}/{len(pick)}"
            else:
                eq = "-"
            lines.append(
                f"  {m:<12}{tps(m):>8.2f}{statistics.median(ratios):>12.2f} ({min(ratios):.2f}-{max(ratios):.2f})"
                f"{acc:>8.2f}{e:>6.2f}  {eq}"
            )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="gemma-3-270m")
    p.add_argument("--draft", default="smollm2-135m-instruct")
    p.add_argument("--dtype", default="fp32")
    p.add_argument("--draft-dtype", default="int4")
    p.add_argument("--k", default="1,2,3", help="comma-separated K values")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    result = run(args)
    print(summarize(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1))
        print(f"json: {args.json}")


if __name__ == "__main__":
    main()
