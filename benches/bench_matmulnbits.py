"""Micro-benchmark of one com.microsoft::MatMulNBits per storage variant (bits, zero points, accuracy_level) vs fp32
MatMul on Qwen2.5-Coder-1.5B shapes: time (best of 3 x reps) and error. Usage: python benches/bench_matmulnbits.py
[qkv] [gate_up] [down] [head]. Figures: benches/RESULTS.md "int4 / fp16 conversion".
"""

import sys
import time

import numpy as np
import onnxruntime as ort  # its own CPU sessions only: no specrt session in this process (one ONNX Runtime per process)
from onnx import TensorProto, helper, numpy_helper

from specrt.convert.quant import pack_matmul_nbits, promote, quantize_rtn

rng = np.random.default_rng(0)


def one_node_model(node, inits, k, n):
    """A model of one node computing ``Y [1, M, n]`` from ``A [1, M, k]`` float32 with initializers ``inits``."""
    g = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [1, "M", k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, "M", n])],
        initializer=inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    return m


def model_nbits(bq, acc, with_zp=True):
    B, s, zp = pack_matmul_nbits(bq)
    N, K = bq.shape
    inits = [numpy_helper.from_array(B, "B"), numpy_helper.from_array(s, "s")]
    ins = ["A", "B", "s"]
    if with_zp:
        inits.append(numpy_helper.from_array(zp, "zp"))
        ins.append("zp")
    node = helper.make_node(
        "MatMulNBits",
        ins,
        ["Y"],
        domain="com.microsoft",
        K=K,
        N=N,
        bits=bq.bits,
        block_size=bq.block_size,
        accuracy_level=acc,
    )
    return one_node_model(node, inits, K, N)


def model_fp32(w):
    N, K = w.shape
    inits = [numpy_helper.from_array(np.ascontiguousarray(w.T), "W")]
    return one_node_model(helper.make_node("MatMul", ["A", "W"], ["Y"]), inits, K, N)


def sess(m):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.log_severity_level = 3
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])


def timeit(s, A, reps):
    s.run(None, {"A": A})
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        s.run(None, {"A": A})
        ts.append(time.perf_counter() - t)
    return np.median(ts) * 1e3


SHAPES = {"qkv": (2048, 1536), "gate_up": (17920, 1536), "down": (1536, 8960), "head": (151936, 1536)}


def main() -> None:
    which = sys.argv[1:] or list(SHAPES)
    for name in which:
        N, K = SHAPES[name]
        w = (rng.standard_normal((N, K)) * 0.02).astype(np.float32)
        q4 = quantize_rtn(w, 4, 32)
        q4s = quantize_rtn(w, 4, 32, symmetric=True)
        q4f = promote(q4, 4, 32, True)
        q8 = quantize_rtn(w, 8, 32)
        q8_16 = promote(q8, 8, 16, False)
        q8f = promote(q8, 8, 32, True)
        variants = {
            "fp32": (model_fp32(w), w),
            "4b u8zp acc4": (model_nbits(q4, 4), q4.dequantize()),
            "4b sym acc4": (model_nbits(q4s, 4, with_zp=False), q4s.dequantize()),
            "4b fzp acc4": (model_nbits(q4f, 4), q4f.dequantize()),
            "4b u8zp acc1": (model_nbits(q4, 1), q4.dequantize()),
            "4b fzp acc1": (model_nbits(q4f, 1), q4f.dequantize()),
            "8b u8zp acc4": (model_nbits(q8, 4), q8.dequantize()),
            "8b b16 acc4": (model_nbits(q8_16, 4), q8_16.dequantize()),
            "8b fzp acc4": (model_nbits(q8f, 4), q8f.dequantize()),
            "8b u8zp acc1": (model_nbits(q8, 1), q8.dequantize()),
        }
        sessions = {}
        for k, (m, deq) in variants.items():
            try:
                sessions[k] = (sess(m), deq)
            except Exception as e:  # noqa: PERF203 - one load per variant; the CPU kernel refuses some
                print(name, k, "LOAD FAIL", str(e)[:200])
        for M in (1, 5):
            A = rng.standard_normal((1, M, K)).astype(np.float32)
            reps = 40 if name != "head" else 10
            res = {}
            for _rnd in range(3):
                for k, (s, _deq) in sessions.items():
                    res.setdefault(k, []).append(timeit(s, A, reps))
            for k, (s, deq) in sessions.items():
                y = s.run(None, {"A": A})[0][0]
                ref_deq = A[0].astype(np.float64) @ deq.T.astype(np.float64)
                ref_w = A[0].astype(np.float64) @ w.T.astype(np.float64)
                e_kernel = np.abs(y - ref_deq).max() / np.abs(ref_w).max()
                e_total = np.abs(y - ref_w).max() / np.abs(ref_w).max()
                print(
                    f"{name:8s} M={M} {k:14s} {min(res[k]):8.3f} ms  "
                    f"kernel-err {e_kernel:.2e}  total-err {e_total:.2e}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
