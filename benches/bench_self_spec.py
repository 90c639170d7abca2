"""Self-speculative decoding: a registry model drafting for itself with its first N layers (models.truncated).

For each depth N, one ``Decoder`` (the full model + its N-layer cut) decodes every prompt target-only
(``proposer="none"``, the same session) and speculatively (greedy, K fixed), alternating; reported per depth:
acceptance rate, mean tokens per round, tokens/s of both (mean over prompts) and their ratio, and whether greedy
output equals target-only output token for token.

Usage::

    python benches/bench_self_spec.py --model gemma-3-270m --layers 6,9,12 --k 4 --max-new-tokens 64
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
from pathlib import Path

import specrt
from specrt import models

#: Plain-text prompts (base models: continuations, no chat template).
PROMPTS = [
    "The history of the printing press begins in",
    'def binary_search(items, target):\n    """Return the index of target in the sorted list items, or -1."""\n',
    "A recipe for a simple tomato soup: first,",
    "In mathematics, a prime number is",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gemma-3-270m")
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--layers", default="6,9,12", help="comma-separated draft depths")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    target = models.pull(args.model, args.dtype, progress=False)
    rows = []
    for n in [int(x) for x in args.layers.split(",")]:
        draft = models.truncated(args.model, n, args.dtype, progress=False)
        dec = specrt.Decoder(target, draft, max_seq_len=512)
        kw = {"max_new_tokens": args.max_new_tokens, "temperature": 0, "ignore_eos": True}
        base, spec, same, accepted, drafted, rounds, new = [], [], [], 0, 0, 0, 0
        for prompt in PROMPTS:
            ref = dec.generate(prompt, proposer="none", **kw)
            got = dec.generate(prompt, num_speculative_tokens=args.k, **kw)
            base.append(ref.stats.decode_tokens_per_s)
            spec.append(got.stats.decode_tokens_per_s)
            same.append(list(got.token_ids) == list(ref.token_ids))
            accepted += got.stats.n_accepted
            drafted += got.stats.n_drafted
            rounds += got.stats.n_rounds
            new += len(got.token_ids)
        row = {
            "draft_layers": n,
            "acceptance": accepted / max(drafted, 1),
            "tokens_per_round": new / max(rounds, 1),
            "target_tok_s": statistics.mean(base),
            "spec_tok_s": statistics.mean(spec),
            "speedup": statistics.mean(spec) / statistics.mean(base),
            "greedy_equal": all(same),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
        del dec
    if args.json:
        meta = {"model": args.model, "dtype": args.dtype, "k": args.k, "max_new_tokens": args.max_new_tokens}
        meta["machine"] = platform.processor() or platform.machine()
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
