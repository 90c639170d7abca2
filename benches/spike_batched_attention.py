"""Spike for batched speculative decoding (issue: many requests at once): how to run B rows x (K + 1) new tokens on
top of per-row KV caches in one ONNX Runtime pass, measured on one decoder layer in the real shapes.

    python benches/spike_batched_attention.py                     # Qwen2.5-Coder-1.5B layer shapes, fp32, CPU
    python benches/spike_batched_attention.py --rows 1,2,4,8 --new 5 --past 512 --json benches/out/spike.json

The obstacle: GroupQueryAttention refuses batch > 1 when more than one new token meets a past cache (checked here:
the error text is recorded). Candidates, each one full decoder layer (packed QKV MatMul + bias, attention, O MatMul,
RMSNorm, gate|up MatMul, SiLU, down MatMul), random fp32 weights shared by all graphs:

- ``gqa_per_row``: today's verification pass, GroupQueryAttention at batch 1 with S = K + 1 new tokens, run once per
  row (B passes: the weights are read B times).
- ``gqa_batch_decode``: GroupQueryAttention at batch B with one new token per row (allowed): what batched draft
  steps or plain batched decoding cost.
- ``masked_batched``: one pass over [B, S] with attention in standard ops: queries attend to the row's past keys
  (a [B, kv_heads, head_dim, max_len] cache stored transposed, read in place, masked beyond each row's length) and
  causally to the S new keys, one softmax over both parts; the new K / V come out as [B, kv_heads, S, head_dim] for
  the runtime to write at each row's offset. Rotary embedding from per-token positions (row length + j).

Checks that ``masked_batched`` gives each row the output ``gqa_per_row`` gives it (max abs difference), then times
each variant (median of ``--repeats`` runs, variants interleaved) and prints ms per layer pass and the batched /
per-row ratio. One layer of 28: the head and embedding are the same for every variant and left out.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort  # its own CPU sessions only: no specrt session in this process (one ONNX Runtime per process)
from onnx import TensorProto, helper, numpy_helper

F = TensorProto.FLOAT


class Shapes:
    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, ffn: int, max_len: int) -> None:
        self.H, self.nh, self.kvh, self.hd, self.ffn, self.L = hidden, heads, kv_heads, head_dim, ffn, max_len
        self.g = heads // kv_heads
        self.qkv = (heads + 2 * kv_heads) * head_dim


def weights(s: Shapes, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def m(a: int, b: int) -> np.ndarray:
        return (rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32)

    ang = np.outer(np.arange(s.L), 1.0 / 1e6 ** (np.arange(0, s.hd, 2) / s.hd))
    return {
        "w_qkv": m(s.H, s.qkv),
        "b_qkv": (0.1 * rng.standard_normal(s.qkv)).astype(np.float32),
        "w_o": m(s.nh * s.hd, s.H),
        "norm": np.ones(s.H, np.float32),
        "w_gu": m(s.H, 2 * s.ffn),
        "w_down": m(s.ffn, s.H),
        "cos": np.cos(ang).astype(np.float32),
        "sin": np.sin(ang).astype(np.float32),
    }


def _mlp_tail(nodes: list, attn: str, x: str) -> None:
    """O projection, residual, RMSNorm, SwiGLU MLP, residual -> "y"."""
    nodes += [
        helper.make_node("MatMul", [attn, "w_o"], ["o"]),
        helper.make_node("Add", ["o", x], ["h1"]),
        helper.make_node("RMSNormalization", ["h1", "norm"], ["n1"], axis=-1, epsilon=1e-6),
        helper.make_node("MatMul", ["n1", "w_gu"], ["gu"]),
        helper.make_node("Split", ["gu"], ["gate", "up"], axis=-1, num_outputs=2),
        helper.make_node("Sigmoid", ["gate"], ["sg"]),
        helper.make_node("Mul", ["gate", "sg"], ["silu"]),
        helper.make_node("Mul", ["silu", "up"], ["act"]),
        helper.make_node("MatMul", ["act", "w_down"], ["down"]),
        helper.make_node("Add", ["down", "h1"], ["y"]),
    ]


def _model(nodes: list, inputs: list, outputs: list, w: dict[str, np.ndarray], names: list[str]) -> bytes:
    inits = [numpy_helper.from_array(w[n], n) for n in names]
    g = helper.make_graph(nodes, "layer", inputs, outputs, initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 23), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 10
    return m.SerializeToString()


def gqa_graph(s: Shapes, w: dict[str, np.ndarray]) -> bytes:
    """x [B, S, H], past/present [B, kvh, L, hd] (shared buffer), seqlens_k [B], total_sequence_length []."""
    nodes = [
        helper.make_node("MatMul", ["x", "w_qkv"], ["qkv0"]),
        helper.make_node("Add", ["qkv0", "b_qkv"], ["qkv"]),
        helper.make_node(
            "GroupQueryAttention",
            ["qkv", "", "", "past_key", "past_value", "seqlens_k", "total_sequence_length", "cos", "sin"],
            ["attn", "present_key", "present_value"],
            domain="com.microsoft",
            num_heads=s.nh,
            kv_num_heads=s.kvh,
            do_rotary=1,
            scale=float(1 / np.sqrt(s.hd)),
        ),
    ]
    _mlp_tail(nodes, "attn", "x")
    kv = ["B", s.kvh, s.L, s.hd]
    inputs = [
        helper.make_tensor_value_info("x", F, ["B", "S", s.H]),
        helper.make_tensor_value_info("past_key", F, kv),
        helper.make_tensor_value_info("past_value", F, kv),
        helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["B"]),
        helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, []),
    ]
    outputs = [
        helper.make_tensor_value_info("y", F, ["B", "S", s.H]),
        helper.make_tensor_value_info("present_key", F, kv),
        helper.make_tensor_value_info("present_value", F, kv),
    ]
    return _model(nodes, inputs, outputs, w, ["w_qkv", "b_qkv", "w_o", "norm", "w_gu", "w_down", "cos", "sin"])


def masked_graph(s: Shapes, w: dict[str, np.ndarray]) -> bytes:
    """x [B, S, H], positions [B, S] int64, past_len [B] int64, past_kt [B, kvh, hd, L] (K transposed),
    past_v [B, kvh, L, hd] -> y, new_k [B, kvh, S, hd] (rotated), new_v [B, kvh, S, hd]."""
    c = {
        "shape_q": np.array([0, 0, s.kvh, s.g, s.hd], np.int64),
        "shape_kv": np.array([0, 0, s.kvh, s.hd], np.int64),
        "shape_out": np.array([0, 0, s.nh * s.hd], np.int64),
        "ax_last": np.array([-1], np.int64),
        "ax_12": np.array([1, 2], np.int64),
        "ax_2": np.array([2], np.int64),
        "ax_1": np.array([1], np.int64),
        "ax_0": np.array([0], np.int64),
        "half": np.array([s.hd // 2, s.hd // 2], np.int64),
        "scale": np.array(1 / np.sqrt(s.hd), np.float32),
        "arange_L": np.arange(s.L, dtype=np.int64),
        "neg_inf": np.array(-np.inf, np.float32),
        "zero": np.array(0.0, np.float32),
        "split_qkv": np.array([s.nh * s.hd, s.kvh * s.hd, s.kvh * s.hd], np.int64),
        "split_L_const": np.array([s.L], np.int64),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w_qkv"], ["qkv0"]),
        helper.make_node("Add", ["qkv0", "b_qkv"], ["qkv"]),
        helper.make_node("Split", ["qkv", "split_qkv"], ["q2", "k2", "v2"], axis=-1),
        helper.make_node("Reshape", ["q2", "shape_q"], ["q5"]),  # [B, S, kvh, g, hd]
        helper.make_node("Transpose", ["q5"], ["q"], perm=[0, 2, 3, 1, 4]),  # [B, kvh, g, S, hd]
        helper.make_node("Reshape", ["k2", "shape_kv"], ["k4"]),
        helper.make_node("Transpose", ["k4"], ["k"], perm=[0, 2, 1, 3]),  # [B, kvh, S, hd]
        helper.make_node("Reshape", ["v2", "shape_kv"], ["v4"]),
        helper.make_node("Transpose", ["v4"], ["new_v"], perm=[0, 2, 1, 3]),
        # Rotary (half split): cos/sin at each token's position, [B, 1, S, hd/2].
        helper.make_node("Gather", ["cos", "positions"], ["cos_bs"], axis=0),
        helper.make_node("Gather", ["sin", "positions"], ["sin_bs"], axis=0),
        helper.make_node("Unsqueeze", ["cos_bs", "ax_1"], ["cos4"]),
        helper.make_node("Unsqueeze", ["sin_bs", "ax_1"], ["sin4"]),
        helper.make_node("Unsqueeze", ["cos4", "ax_2"], ["cos5"]),
        helper.make_node("Unsqueeze", ["sin4", "ax_2"], ["sin5"]),
    ]

    def rotary(src: str, dst: str, cos: str, sin: str) -> None:
        nodes.extend(
            [
                helper.make_node("Split", [src, "half"], [f"{dst}_a", f"{dst}_b"], axis=-1),
                helper.make_node("Mul", [f"{dst}_a", cos], [f"{dst}_ac"]),
                helper.make_node("Mul", [f"{dst}_b", sin], [f"{dst}_bs"]),
                helper.make_node("Sub", [f"{dst}_ac", f"{dst}_bs"], [f"{dst}_lo"]),
                helper.make_node("Mul", [f"{dst}_b", cos], [f"{dst}_bc"]),
                helper.make_node("Mul", [f"{dst}_a", sin], [f"{dst}_as"]),
                helper.make_node("Add", [f"{dst}_bc", f"{dst}_as"], [f"{dst}_hi"]),
                helper.make_node("Concat", [f"{dst}_lo", f"{dst}_hi"], [dst], axis=-1),
            ]
        )

    rotary("q", "q_rot", "cos5", "sin5")
    rotary("k", "new_k", "cos4", "sin4")
    nodes += [
        helper.make_node("Mul", ["q_rot", "scale"], ["qs"]),
        # Past part: [B, kvh, g, S, hd] x [B, kvh, 1, hd, L] -> [B, kvh, g, S, L], masked beyond each row's length.
        helper.make_node("Unsqueeze", ["past_kt", "ax_2"], ["pkt5"]),
        helper.make_node("MatMul", ["qs", "pkt5"], ["s_past0"]),
        helper.make_node("Unsqueeze", ["past_len", "ax_last"], ["plen2"]),  # [B, 1]
        helper.make_node("Less", ["arange_L", "plen2"], ["valid"]),  # [B, L]
        helper.make_node("Where", ["valid", "zero", "neg_inf"], ["mask_past2"]),
        helper.make_node("Unsqueeze", ["mask_past2", "ax_12"], ["mask_past4"]),  # [B, 1, 1, L]
        helper.make_node("Unsqueeze", ["mask_past4", "ax_2"], ["mask_past5"]),  # [B, 1, 1, 1, L]
        helper.make_node("Add", ["s_past0", "mask_past5"], ["s_past"]),
        # New part: causal among the S new tokens.
        helper.make_node("Unsqueeze", ["new_k", "ax_2"], ["nk5"]),
        helper.make_node("Transpose", ["nk5"], ["nkt5"], perm=[0, 1, 2, 4, 3]),
        helper.make_node("MatMul", ["qs", "nkt5"], ["s_new0"]),  # [B, kvh, g, S, S]
        helper.make_node("Shape", ["x"], ["S1"], start=1, end=2),
        helper.make_node("ConstantOfShape", ["S1"], ["ones_s"], value=helper.make_tensor("v", F, [1], [1.0])),
        helper.make_node("Unsqueeze", ["ones_s", "ax_last"], ["col"]),
        helper.make_node("Unsqueeze", ["ones_s", "ax_0"], ["row"]),
        helper.make_node("Mul", ["col", "row"], ["ones_ss"]),
        helper.make_node("Trilu", ["ones_ss"], ["tril"], upper=0),
        helper.make_node("Cast", ["tril"], ["tril_b"], to=TensorProto.BOOL),
        helper.make_node("Where", ["tril_b", "zero", "neg_inf"], ["causal"]),
        helper.make_node("Add", ["s_new0", "causal"], ["s_new"]),
        helper.make_node("Concat", ["s_past", "s_new"], ["scores"], axis=-1),
        helper.make_node("Softmax", ["scores"], ["probs"], axis=-1),
        helper.make_node("Concat", ["split_L_const", "S1"], ["split_sizes"], axis=0),
        helper.make_node("Split", ["probs", "split_sizes"], ["p_past", "p_new"], axis=-1),
        helper.make_node("Unsqueeze", ["past_v", "ax_2"], ["pv5"]),
        helper.make_node("MatMul", ["p_past", "pv5"], ["o_past"]),
        helper.make_node("Unsqueeze", ["new_v", "ax_2"], ["nv5"]),
        helper.make_node("MatMul", ["p_new", "nv5"], ["o_new"]),
        helper.make_node("Add", ["o_past", "o_new"], ["o5"]),  # [B, kvh, g, S, hd]
        helper.make_node("Transpose", ["o5"], ["o5t"], perm=[0, 3, 1, 2, 4]),
        helper.make_node("Reshape", ["o5t", "shape_out"], ["attn"]),
    ]
    _mlp_tail(nodes, "attn", "x")
    w = {**w, **c}
    inputs = [
        helper.make_tensor_value_info("x", F, ["B", "S", s.H]),
        helper.make_tensor_value_info("positions", TensorProto.INT64, ["B", "S"]),
        helper.make_tensor_value_info("past_len", TensorProto.INT64, ["B"]),
        helper.make_tensor_value_info("past_kt", F, ["B", s.kvh, s.hd, s.L]),
        helper.make_tensor_value_info("past_v", F, ["B", s.kvh, s.L, s.hd]),
    ]
    outputs = [
        helper.make_tensor_value_info("y", F, ["B", "S", s.H]),
        helper.make_tensor_value_info("new_k", F, ["B", s.kvh, "S", s.hd]),
        helper.make_tensor_value_info("new_v", F, ["B", s.kvh, "S", s.hd]),
    ]
    names = ["w_qkv", "b_qkv", "w_o", "norm", "w_gu", "w_down", "cos", "sin", *c]
    return _model(nodes, inputs, outputs, w, names)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="1,2,4,8", help="B values (default 1,2,4,8)")
    ap.add_argument("--new", type=int, default=5, help="new tokens per row, K + 1 (default 5)")
    ap.add_argument("--past", type=int, default=512, help="cached tokens per row (default 512)")
    ap.add_argument("--max-len", type=int, default=1024, help="cache capacity per row (default 1024)")
    ap.add_argument("--repeats", type=int, default=15, help="timed runs per variant and B (default 15)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    s = Shapes(1536, 12, 2, 128, 8960, a.max_len)  # Qwen2.5-Coder-1.5B
    w = weights(s)
    so = ort.SessionOptions()
    so.intra_op_num_threads = a.threads
    so.log_severity_level = 3
    gqa = ort.InferenceSession(gqa_graph(s, w), so, providers=["CPUExecutionProvider"])
    masked = ort.InferenceSession(masked_graph(s, w), so, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    S, P = a.new, a.past
    report: dict = {"shapes": vars(s), "new_tokens": S, "past": P, "rows": {}}

    # The obstacle, as ONNX Runtime states it.
    try:
        gqa.run(
            None,
            {
                "x": np.zeros((2, S, s.H), np.float32),
                "past_key": np.zeros((2, s.kvh, s.L, s.hd), np.float32),
                "past_value": np.zeros((2, s.kvh, s.L, s.hd), np.float32),
                "seqlens_k": np.full(2, P + S - 1, np.int32),
                "total_sequence_length": np.array(P + S, np.int32),
            },
        )
        report["gqa_batch_multi_token"] = "accepted"
    except Exception as e:
        report["gqa_batch_multi_token"] = str(e).split("Status Message: ")[-1].strip()
    print("GQA, batch 2, S > 1 with past:", report["gqa_batch_multi_token"])

    for B in [int(x) for x in a.rows.split(",")]:
        past = [P - 7 * b for b in range(B)]  # ragged lengths
        x = rng.standard_normal((B, S, s.H)).astype(np.float32)
        x1 = rng.standard_normal((B, 1, s.H)).astype(np.float32)
        pk = rng.standard_normal((B, s.kvh, s.L, s.hd)).astype(np.float32)
        pv = rng.standard_normal((B, s.kvh, s.L, s.hd)).astype(np.float32)
        pkt = np.ascontiguousarray(pk.transpose(0, 1, 3, 2))

        def per_row(b: int, x=x, pk=pk, pv=pv, past=past) -> list[np.ndarray]:
            feeds = {
                "x": x[b : b + 1],
                "past_key": pk[b : b + 1].copy(),
                "past_value": pv[b : b + 1].copy(),
                "seqlens_k": np.array([past[b] + S - 1], np.int32),
                "total_sequence_length": np.array(past[b] + S, np.int32),
            }
            return gqa.run(None, feeds)

        feeds_m = {
            "x": x,
            "positions": np.array([[past[b] + j for j in range(S)] for b in range(B)], np.int64),
            "past_len": np.array(past, np.int64),
            "past_kt": pkt,
            "past_v": pv,
        }
        feeds_d = {
            "x": x1,
            "past_key": pk,
            "past_value": pv,
            "seqlens_k": np.array(past, np.int32),
            "total_sequence_length": np.array(max(past) + 1, np.int32),
        }
        y_m, new_k, new_v = masked.run(None, feeds_m)
        diffs = []
        for b in range(B):
            y_r, pres_k, pres_v = per_row(b)
            diffs.append(float(np.abs(y_m[b] - y_r[0]).max()))
            diffs.append(float(np.abs(new_k[b] - pres_k[0, :, past[b] : past[b] + S]).max()))
            diffs.append(float(np.abs(new_v[b] - pres_v[0, :, past[b] : past[b] + S]).max()))
        times: dict[str, list[float]] = {"gqa_per_row": [], "masked_batched": [], "gqa_batch_decode": []}
        for _ in range(a.repeats):
            t0 = time.perf_counter()
            for b in range(B):
                per_row(b)
            times["gqa_per_row"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            masked.run(None, feeds_m)
            times["masked_batched"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            gqa.run(None, feeds_d)
            times["gqa_batch_decode"].append(time.perf_counter() - t0)
        ms = {k: 1e3 * statistics.median(v) for k, v in times.items()}
        row = {
            "max_abs_diff": max(diffs),
            "ms": ms,
            "batched_over_per_row": ms["masked_batched"] / ms["gqa_per_row"],
            "batched_over_decode": ms["masked_batched"] / ms["gqa_batch_decode"],
        }
        report["rows"][B] = row
        print(
            f"B={B}: per-row GQA {ms['gqa_per_row']:.2f} ms, masked batched {ms['masked_batched']:.2f} ms "
            f"({row['batched_over_per_row']:.2f}x), batched decode (S=1) {ms['gqa_batch_decode']:.2f} ms; "
            f"max |diff| {row['max_abs_diff']:.2e}",
            flush=True,
        )
    report["machine"] = f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()}"
    report["onnxruntime"] = ort.__version__
    report["command"] = "python benches/spike_batched_attention.py " + " ".join(
        f"--{k.replace('_', '-')}={v}" for k, v in vars(a).items() if v is not None
    )
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
