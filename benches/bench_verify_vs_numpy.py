"""Time one verification round: Rust (specrt._specrt.verify) vs the NumPy reference (specrt.reference_sampling.verify).

Same inputs as the criterion bench in spirit: N(0, 2) logits with a 5-token head boosted +16..+12, draft = target +
N(0, 0.5), T = 1, top_p = 0.9, k = 4, vocab = 151936; plus greedy. Reports the median over repeats.
Usage: python benches/bench_verify_vs_numpy.py [--vocab 151936] [--k 4] [--repeats 30]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import specrt._specrt as rs
from specrt import reference_sampling as ref


def logits(rows: int, vocab: int, g: np.random.Generator) -> np.ndarray:
    # [rows, vocab] float32
    x = (g.standard_normal((rows, vocab)) * 2).astype(np.float32)
    for r in range(rows):
        x[r, g.integers(0, vocab, 5)] += np.arange(16, 11, -1, dtype=np.float32)
    return x


def median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=30)
    a = ap.parse_args()
    g = np.random.default_rng(0)
    target = logits(a.k + 1, a.vocab, g)
    p = ref.Params(top_p=0.9)
    q = np.zeros((a.k, a.vocab), np.float32)
    d = []
    rng = rs.Rng(1)
    for i in range(a.k):
        t, q[i] = rs.sample_draft(target[i] + 0.5 * g.standard_normal(a.vocab).astype(np.float32), rng=rng, top_p=0.9)
        d.append(t)
    seeds = iter(range(10**9))
    rust = median_ms(lambda: rs.verify(target, q, d, seed=next(seeds), top_p=0.9), a.repeats)
    numpy = median_ms(
        lambda: ref.verify(target, q, d, p, ref.numpy_generator(*ref.pcg_state_from_seed(next(seeds)))), a.repeats
    )
    greedy_d = [int(np.argmax(target[i])) for i in range(a.k)]
    rust_g = median_ms(lambda: rs.verify(target, None, greedy_d, temperature=0.0), a.repeats)
    numpy_g = median_ms(lambda: ref.verify(target, None, greedy_d, ref.Params(temperature=0.0), None), a.repeats)
    print(f"k={a.k} vocab={a.vocab} T=1 top_p=0.9: rust {rust:.3f} ms, numpy {numpy:.3f} ms, ratio {numpy / rust:.1f}x")
    ratio_g = numpy_g / rust_g
    print(f"k={a.k} vocab={a.vocab} greedy:        rust {rust_g:.3f} ms, numpy {numpy_g:.3f} ms, ratio {ratio_g:.1f}x")


if __name__ == "__main__":
    main()
