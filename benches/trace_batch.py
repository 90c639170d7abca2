"""Where a batched run's time goes, round by round: plain batched decoding and fixed-K speculation, interleaved.

    python benches/trace_batch.py --batch-size 4 --draft-dtype int4 --k 4 --repeats 2

The setup of ``benches/bench_batch.py`` (Qwen2.5-Coder 1.5B fp32 target, the 0.5B draft, batched layout, the
peers.md prompts, greedy, 128 tokens, requests submitted at once to a ``Scheduler``), with every batched round
timed (``Scheduler._step``, wrapped). Prints per mode and repeat: the wall time, the rounds, the time inside rounds
and between them, the first five rounds (the ones in which the prompts prefill), and after them, per number of rows
in the batch, the rounds, seconds and tokens emitted (the ragged end: rows that finish early leave a smaller batch).
``--auto`` traces auto K instead of ``--k``; ``--dump`` prints every round (ms, rows, tokens). Used in
benches/RESULTS.md ("Batched rounds ... where B = 4 stops").
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_batch
import specrt
from specrt import models
from specrt.bench.prompts import load_prompts
from specrt.scheduler import Scheduler


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--draft-dtype", default="int4", choices=["fp32", "int4"])
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--auto", action="store_true", help="trace auto K (num_speculative_tokens='auto') instead of --k")
    ap.add_argument("--dump", action="store_true", help="print every round")
    a = ap.parse_args()
    target = models.pull(a.target, attention="batched")
    draft = models.pull(a.draft, a.draft_dtype, attention="batched", prefill_graph=a.draft_dtype == "int4")
    prompts = load_prompts(set_name="peers")
    dec = specrt.Decoder(target, draft, max_batch=a.batch_size, max_seq_len=640)
    reqs = [
        {**prompts[i % len(prompts)].generate_kwargs(), "max_new_tokens": a.max_new_tokens, "temperature": 0}
        for i in range(a.batch_size)
    ]
    dec.generate(**reqs[0], num_speculative_tokens=a.k)  # warm-up
    log: list[tuple[float, float, int, int]] = []  # (start, seconds, rows, tokens emitted)
    step = Scheduler._step

    def timed(self: Scheduler, batch: object, rows: dict) -> None:
        handles = [h for h, _ in rows.values()]
        n0 = sum(len(h._tokens) for h in handles)
        t = time.perf_counter()
        step(self, batch, rows)
        dt = time.perf_counter() - t
        log.append((t, dt, len(handles), sum(len(h._tokens) for h in handles) - n0))

    Scheduler._step = timed  # type: ignore[method-assign]
    for rep in range(a.repeats):
        for k in (0, "auto" if a.auto else a.k):
            log.clear()
            r = bench_batch.run_batch(dec, [{**q, "num_speculative_tokens": k} for q in reqs])
            inside = sum(e[1] for e in log)
            between = sum(log[i + 1][0] - (log[i][0] + log[i][1]) for i in range(len(log) - 1))
            print(
                f"repeat {rep} K={k}: wall {r['wall_s']:.2f} s, {len(log)} rounds, in rounds {inside:.2f} s, "
                f"between {between:.2f} s, first 5 rounds {sum(e[1] for e in log[:5]):.2f} s",
                flush=True,
            )
            # Per batch size after the first five rounds: rounds, seconds, tokens emitted.
            for n in sorted({e[2] for e in log[5:]}, reverse=True):
                sel = [e for e in log[5:] if e[2] == n]
                secs = sum(e[1] for e in sel)
                toks = sum(e[3] for e in sel)
                print(
                    f"    {n} rows: {len(sel)} rounds, {secs:.2f} s, {toks} tokens, "
                    f"{1000 * secs / len(sel):.0f} ms/round, {toks / secs:.2f} tok/s",
                    flush=True,
                )
            if a.dump:
                print("    rounds (ms, rows, tokens):", [(round(1000 * e[1]), e[2], e[3]) for e in log], flush=True)


if __name__ == "__main__":
    main()
