"""The GGUF-block matmul operator (``ai.specrt::GgufMatMul``) beside the operator it replaces
(``com.microsoft::MatMulNBits``, int4 block 32, accuracy_level 4: the int4 form's) and fp32 ``MatMul``, on
Qwen2.5-Coder-1.5B's matrix shapes, in one process on specrt's own ONNX Runtime sessions (``_specrt.GraphSession``:
no second ONNX Runtime). Random weights: Q4_K blocks (the target's Q4_K_M mix is mostly Q4_K) and the same matrix
requantized for MatMulNBits. Reports the median of interleaved repeats in ms per call for each M (rows of the pass)
and the ratio of 5 rows to 1.

Usage: python benches/bench_gguf_matmul.py [--shapes qkv,o,gate_up,down,head] [--ms 1,2,3,5,8,17] [--repeats 7]
[--threads 2] [--json out.json]. Figures: benches/RESULTS.md "The GGUF-block operator, measured".
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from specrt import _specrt
from specrt._ort import find_ort_library
from specrt.convert.quant import pack_matmul_nbits, quantize_rtn

SHAPES = {  # name: (N, K) of Qwen2.5-Coder-1.5B
    "qkv": (2048, 1536),
    "o": (1536, 1536),
    "gate_up": (17920, 1536),
    "down": (1536, 8960),
    "head": (151936, 1536),
}
Q4_K = 12


def random_q4k(n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """``[n, k / 256 * 144]`` uint8 Q4_K blocks with random codes and float16 scales."""
    data = rng.integers(0, 256, size=(n, k // 256, 144), dtype=np.uint8)
    for off in (0, 2):
        data[:, :, off : off + 2] = (
            (rng.random((n, k // 256)) * 0.01).astype(np.float16).view(np.uint8).reshape(n, k // 256, 2)
        )
    return data.reshape(n, -1)


def save(node: onnx.NodeProto, inits: list, k: int, n: int, path: Path) -> Path:
    g = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [1, "M", k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, "M", n])],
        initializer=inits,
    )
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1), helper.make_opsetid("ai.specrt", 1)]
    m = helper.make_model(g, opset_imports=opsets)
    m.ir_version = 8
    onnx.save(m, path, save_as_external_data=True, location=path.name + ".data")
    return path


def models(name: str, tmp: Path, rng: np.random.Generator) -> dict[str, Path]:
    n, k = SHAPES[name]
    blocks = random_q4k(n, k, rng)
    out = {}
    node = helper.make_node("GgufMatMul", ["A", "B"], ["Y"], domain="ai.specrt", ggml_type=Q4_K, K=k, N=n)
    out["GgufMatMul Q4_K"] = save(node, [numpy_helper.from_array(blocks, "B")], k, n, tmp / f"{name}_gguf.onnx")
    w = _specrt.gguf_dequantize(blocks, Q4_K, k)  # [n, k]
    bq = quantize_rtn(w, 4, 32)
    b, s, zp = pack_matmul_nbits(bq)
    node = helper.make_node(
        "MatMulNBits",
        ["A", "B", "s", "zp"],
        ["Y"],
        domain="com.microsoft",
        K=k,
        N=n,
        bits=4,
        block_size=32,
        accuracy_level=4,
    )
    inits = [numpy_helper.from_array(b, "B"), numpy_helper.from_array(s, "s"), numpy_helper.from_array(zp, "zp")]
    out["MatMulNBits int4"] = save(node, inits, k, n, tmp / f"{name}_nbits.onnx")
    if name != "head":  # fp32 head: 0.93 GB, skipped
        node = helper.make_node("MatMul", ["A", "W"], ["Y"])
        out["MatMul fp32"] = save(
            node, [numpy_helper.from_array(np.ascontiguousarray(w.T), "W")], k, n, tmp / f"{name}_fp32.onnx"
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="qkv,o,gate_up,down,head")
    ap.add_argument("--ms", default="1,2,3,5,8,17")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    ms = [int(v) for v in args.ms.split(",")]
    rng = np.random.default_rng(0)
    lib = str(find_ort_library())
    results = {
        "machine": platform.processor() or platform.machine(),
        "threads": args.threads,
        "kernel_paths": _specrt.gguf_kernel_paths(),
        "shapes": {},
    }
    print(f"kernel paths here: {_specrt.gguf_kernel_paths()} (the operator runs the last); threads {args.threads}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.shapes.split(","):
            paths = models(name, Path(tmp), rng)
            sessions = {op: _specrt.GraphSession(str(p), lib, intra_op_threads=args.threads) for op, p in paths.items()}
            k = SHAPES[name][1]
            times: dict[str, dict[int, list[float]]] = {op: {m: [] for m in ms} for op in sessions}
            xs = {m: rng.standard_normal((1, m, k)).astype(np.float32) for m in ms}
            for s in sessions.values():  # warm-up
                for m in ms:
                    s.run({"A": xs[m]})
            for _ in range(args.repeats):  # interleaved: every operator and M in each repeat
                for m in ms:
                    for op, s in sessions.items():
                        reps = max(1, int(20 / (1 + m / 4)))
                        t0 = time.perf_counter()
                        for _ in range(reps):
                            s.run({"A": xs[m]})
                        times[op][m].append((time.perf_counter() - t0) / reps * 1e3)
            n = SHAPES[name][0]
            print(f"\n{name} [N={n}, K={k}]: median ms per call (min-max over {args.repeats} repeats)")
            print("  " + "operator".ljust(18) + "".join(f"M={m}".rjust(20) for m in ms) + "   M=5 / M=1")
            results["shapes"][name] = {}
            for op in sessions:
                med = {m: float(np.median(times[op][m])) for m in ms}
                cells = "".join(f"{med[m]:.3f} ({min(times[op][m]):.3f}-{max(times[op][m]):.3f})".rjust(20) for m in ms)
                ratio = med[5] / med[1] if 5 in med and 1 in med else float("nan")
                print("  " + op.ljust(18) + cells + f"   {ratio:.2f}")
                results["shapes"][name][op] = {"median_ms": med, "all_ms": times[op], "m5_over_m1": ratio}
            del sessions
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
