"""Load time, the first request's time and later decode speed of one decoder, in a fresh process.

What a user of ``specrt generate`` or a just-started ``specrt serve`` waits for: the seconds ``Decoder(...)`` takes,
then the seconds a first request of one new token takes (its prompt's prefill and anything the runtime does at a
session's first run), then decode tokens/s of three later requests of ``--max-new-tokens`` each. Prints one line.

    python benches/probe_load.py --label new --pair            # gguf 1.5B target + 0.5B draft, K = 4
    PYTHONPATH=/tmp/base_pkg python benches/probe_load.py --label base --pair   # an older build, alternated
"""

from __future__ import annotations

import argparse
import time

from specrt import Decoder

PROMPT = "Write a Python function that checks whether a string is a palindrome, with a docstring and tests."


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--label", default="")
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--pair", action="store_true", help="load the draft too and decode with K = 4 (else target-only)")
    ap.add_argument("--dtype", default="gguf")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    a = ap.parse_args()
    k = 4 if a.pair else 0
    t0 = time.perf_counter()
    d = Decoder(a.target, draft=a.draft if a.pair else None, dtype=a.dtype)
    load_s = time.perf_counter() - t0
    messages = [{"role": "user", "content": PROMPT}]
    t1 = time.perf_counter()
    d.generate(messages=messages, max_new_tokens=1, temperature=0, num_speculative_tokens=k)
    first_s = time.perf_counter() - t1
    speeds = []
    for _ in range(3):
        r = d.generate(messages=messages, max_new_tokens=a.max_new_tokens, temperature=0, num_speculative_tokens=k)
        speeds.append(round(r.stats.decode_tokens_per_s, 1))
    print(
        f"{a.label} {'pair K=4' if a.pair else 'target-only'}: load {load_s:.2f} s, first request (1 token) "
        f"{first_s:.2f} s, load + first {load_s + first_s:.2f} s; decode tokens/s of 3 later requests {speeds}"
    )


if __name__ == "__main__":
    main()
