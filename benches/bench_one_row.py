"""Decode speed of one request on a decoder of either layout: the batched one (``max_batch`` > 1) at a given
``max_seq_len`` beside the single-stream one, in a fresh process. Prints one line: decode tokens/s and a hash of the
output's token ids (equal hashes: the same tokens).

    python benches/bench_one_row.py --max-batch 4 --max-seq-len 4096          # the batched layout (gguf-B)
    python benches/bench_one_row.py --max-batch 1                             # the single-stream layout (gguf)
    PYTHONPATH=/tmp/base_pkg python benches/bench_one_row.py --max-batch 4    # an older build, alternated
"""

from __future__ import annotations

import argparse
import time

from probe_load import PROMPT  # the palindrome prompt of RESULTS: one definition
from specrt import Decoder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--dtype", default="gguf")
    ap.add_argument("--max-batch", type=int, default=4)
    ap.add_argument("--max-seq-len", type=int, default=4096)
    ap.add_argument("--max-new-tokens", type=int, default=192)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    dec = Decoder(a.target, dtype=a.dtype, max_batch=a.max_batch, max_seq_len=a.max_seq_len, intra_op_threads=a.threads)
    dec.generate(PROMPT, max_new_tokens=8, temperature=0.0)  # warm-up
    t = time.perf_counter()
    out = dec.generate(
        PROMPT, max_new_tokens=a.max_new_tokens, temperature=0.0, num_speculative_tokens=0, ignore_eos=True
    )
    dt = time.perf_counter() - t
    print(
        f"max_batch {a.max_batch} max_seq_len {a.max_seq_len}: {len(out.token_ids) / dt:.2f} tokens/s "
        f"({len(out.token_ids)} tokens in {dt:.2f} s), token ids hash {hash(tuple(out.token_ids))}"
    )


if __name__ == "__main__":
    main()
