"""Two or more drafts of the same target at B = 4, end to end, in one process: plain batched decoding and fixed-K
speculation with each draft, interleaved per repeat (the paired ratios compare the same minutes).

    python benches/compare_drafts_batch.py --repeats 3 DRAFT_FOLDER [DRAFT_FOLDER ...]

Target: the Qwen2.5-Coder 1.5B fp32 batched folder; the four peers.md prompts at once, greedy, 128 tokens each (the
setup of ``bench_batch.py``, whose ``run_batch`` it uses). Prints per repeat the plain wall time and, per draft, its
wall time, ratio, acceptance, draft and target ms per round, and how many outputs equal plain decoding. Used in
benches/RESULTS.md ("Prefill graph").
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_batch
import specrt
from specrt import models
from specrt.bench.prompts import load_prompts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("drafts", nargs="+", type=Path, help="converted draft folders (batched layout)")
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    target = models.pull(a.target, attention="batched")
    prompts = load_prompts(set_name="peers")
    reqs = [{**p.generate_kwargs(), "max_new_tokens": 128, "temperature": 0} for p in prompts[:4]]
    decs = [specrt.Decoder(target, d, max_batch=4, max_seq_len=640) for d in a.drafts]
    for d in decs:
        d.generate(**reqs[0], num_speculative_tokens=a.k)  # warm-up
    for rep in range(a.repeats):
        plain = bench_batch.run_batch(decs[0], [{**q, "num_speculative_tokens": 0} for q in reqs])
        line = [f"repeat {rep}: plain {plain['wall_s']:.2f} s"]
        for folder, dec in zip(a.drafts, decs, strict=True):
            r = bench_batch.run_batch(dec, [{**q, "num_speculative_tokens": a.k} for q in reqs])
            same = sum(x == y for x, y in zip(r["outputs"], plain["outputs"], strict=True))
            line.append(
                f"{folder.name}: {r['wall_s']:.2f} s ({plain['wall_s'] / r['wall_s']:.3f}x, acceptance "
                f"{r['acceptance_rate']:.3f}, draft {r['draft_ms_per_round']:.0f} + target "
                f"{r['target_ms_per_round']:.0f} ms per round, {same}/{len(reqs)} equal to plain)"
            )
        print(" | ".join(line), flush=True)


if __name__ == "__main__":
    main()
