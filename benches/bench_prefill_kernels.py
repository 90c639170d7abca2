"""The matrix kernels a draft's prefill graph chooses between, on the Qwen2.5-Coder 0.5B shapes: fp32 MatMul,
MatMulNBits (4 and 8 bits, blocks of 32 and 128, int8 activations) and DynamicQuantizeMatMul (int8 weights with a
scale per output channel, uint8 activations per tensor), at M = 1, 4 and 256 rows, random weights. The weights of one
matrix stay in cache across repeats, so these are compute figures (a decode step is bound by reading the weights).

    python benches/bench_prefill_kernels.py

Prints ms per matrix (best of 2 x reps) and the totals over the 24 layers (the head apart). Figures: benches/RESULTS.md
"Prefill graph".
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from specrt.convert.quant import quantize_rtn
from specrt.convert.weights import quantize_per_channel_int8

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_matmulnbits import (  # the operator builders of the MatMulNBits bench
    model_fp32,
    model_nbits,
    one_node_model,
    sess,
)

rng = np.random.default_rng(0)
# name: (N, K, matrices per model) of the 0.5B (hidden 896, 14 heads / 2 KV heads of 64, FFN 4864).
SHAPES = {"qkv": (1152, 896, 24), "o": (896, 896, 24), "gate_up": (9728, 896, 24), "down": (896, 4864, 24)}
SHAPES["head"] = (151936, 896, 1)


def nbits(w: np.ndarray, bits: int, block: int) -> onnx.ModelProto:
    return model_nbits(quantize_rtn(w, bits, block), 4)


def qint8(w: np.ndarray) -> onnx.ModelProto:
    """DynamicQuantizeMatMul, stored as ``specrt convert``'s ``qint8`` kind stores it."""
    n, k = w.shape
    q, scale = quantize_per_channel_int8(w)
    inits = [
        numpy_helper.from_array(q, "B"),
        numpy_helper.from_array(scale, "s"),
        numpy_helper.from_array(np.zeros(n, np.int8), "zp"),
    ]
    node = helper.make_node("DynamicQuantizeMatMul", ["A", "B", "s", "zp"], ["Y"], domain="com.microsoft")
    return one_node_model(node, inits, k, n)


def main() -> None:
    totals: dict[tuple[int, str], float] = {}
    for name, (n, k, count) in SHAPES.items():
        w = (rng.standard_normal((n, k)) * 0.02).astype(np.float32)
        variants = {
            "fp32": model_fp32(w),
            "int4 b32": nbits(w, 4, 32),
            "int4 b128": nbits(w, 4, 128),
            "int8 b32": nbits(w, 8, 32),
            "int8 b128": nbits(w, 8, 128),
            "qint8": qint8(w),
        }
        sessions = {v: sess(m) for v, m in variants.items()}
        for rows in (1, 4) if name == "head" else (1, 4, 256):
            a = rng.standard_normal((1, rows, k)).astype(np.float32)
            reps = 4 if rows == 256 else 8 if name == "head" else 30
            line = []
            for v, session in sessions.items():
                session.run(None, {"A": a})
                best = float("inf")
                for _ in range(2):
                    t = time.perf_counter()
                    for _ in range(reps):
                        session.run(None, {"A": a})
                    best = min(best, (time.perf_counter() - t) / reps * 1e3)
                if name != "head":
                    totals[(rows, v)] = totals.get((rows, v), 0.0) + best * count
                line.append(f"{v} {best:.3f}")
            print(f"{name:8s} M={rows:<4d} " + "  ".join(line), flush=True)
    print("24 layers (ms per pass, head apart):")
    for rows in (1, 4, 256):
        print(f"  M={rows:<4d} " + "  ".join(f"{v} {totals[(rows, v)]:.1f}" for v in variants))


if __name__ == "__main__":
    main()
