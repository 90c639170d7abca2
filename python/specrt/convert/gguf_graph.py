"""The graph side of ``dtype="gguf"``: matrices as the GGUF's own blocks on specrt's ``ai.specrt`` operators.

``ai.specrt::GgufMatMul`` (inputs ``A`` float32 ``[..., K]``, ``B`` uint8 ``[N, row_bytes]``; attributes
``ggml_type``, ``K``, ``N``; output float32 ``[..., N]`` = ``A @ dequantize(B).T``, activations quantized to int8 per
block of the type's block length inside the kernel, 32 or 256 for the K types, as llama.cpp's Q8_0 / Q8_K: measured
against :func:`specrt.convert.reference_forward.int8_blocks`) and ``ai.specrt::GgufGather`` (inputs ``B`` uint8
``[V, row_bytes]``, ``indices`` int64 ``[...]``; attributes ``ggml_type``, ``K``; output float32 ``[..., K]`` =
``dequantize(B)[indices]``) are written in Rust and registered on every specrt session (``rust/specrt-ort``); a plain
``onnxruntime.InferenceSession`` does not know the domain. :func:`specrt.convert.graph.build_decoder` calls these
helpers for the weight kinds a :class:`~specrt.convert.weights.WeightPlan` stores as ``"gguf"``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from specrt.convert.gguf_reader import GGUFBlocks

__all__ = ["SPECRT_DOMAIN", "SPECRT_OPS", "gguf_linear", "gguf_matmul"]

#: Domain of specrt's own ONNX Runtime operators; a graph that uses them imports ``(SPECRT_DOMAIN, 1)``.
SPECRT_DOMAIN = "ai.specrt"
#: Op types of :data:`SPECRT_DOMAIN`.
SPECRT_OPS = frozenset({"GgufMatMul", "GgufGather"})


def gguf_matmul(b: Any, x: str, blocks: str, ggml_type: int, k: int, n: int, name: str) -> str:
    """Add ``ai.specrt::GgufMatMul`` to builder ``b``: ``x`` float32 ``[..., k]`` times the dequantized GGUF matrix
    ``[n, k]`` transposed -> float32 ``[..., n]`` (leading dims kept). ``blocks``: the name of a uint8
    ``[n, row_bytes]`` initializer, row ``i`` = output channel ``i``'s blocks of GGML type ``ggml_type`` as the GGUF
    stores them. Returns the output's name."""
    return b.op1("GgufMatMul", [x, blocks], name=name, ggml_type=int(ggml_type), K=int(k), N=int(n))


def gguf_linear(
    b: Any,
    x: str,
    parts: list[str],
    name: str,
    blocks: Callable[[str], GGUFBlocks],
    float_matmul: Callable[[str, list[str], str], str],
) -> str:
    """``x @ concat(parts).T`` on the GGUF's blocks, added to builder ``b``.

    Consecutive parts of one supported GGML type share one GgufMatMul (their block rows concatenated into one
    initializer ``{name}.gguf_blocks``); parts of different types (Q4_K_M's Q4_K q/k beside a Q6_K v) get one operator
    per run (``{name}.{run}``) and a ``Concat`` on the last axis (``{name}/concat``); a run of types the operators do
    not run (:attr:`GGUFBlocks.op_supported` false: F32, F16, Q5_1 ...) becomes ``float_matmul(x, run_parts, name)``.

    Args:
        b: the graph builder (``op1``, ``raw``).
        x: float32 ``[..., K]``.
        parts: GGUF names of the matrices, in output order (q, k, v / gate, up / one matrix).
        name: the node / initializer name.
        blocks: GGUF name -> :class:`GGUFBlocks` (Q/K rows un-permuted).
        float_matmul: the float32 MatMul of ``parts``' dequantized rows.

    Returns:
        The name of the float32 ``[..., sum of the parts' rows]`` output.

    Raises:
        ValueError: the parts have different input widths.
    """
    got = [blocks(p) for p in parts]
    if len({g.k for g in got}) != 1:
        raise ValueError(f"{name}: parts {parts} have different input widths {[g.k for g in got]}")
    runs: list[list[int]] = []
    for i, g in enumerate(got):
        prev = got[runs[-1][0]] if runs else None
        if prev is not None and (prev.op_supported, prev.ggml_type) == (g.op_supported, g.ggml_type):
            runs[-1].append(i)
        else:
            runs.append([i])
    outs = []
    for r, idx in enumerate(runs):
        sub = name if len(runs) == 1 else f"{name}.{r}"
        first = got[idx[0]]
        if not first.op_supported:
            outs.append(float_matmul(x, [parts[i] for i in idx], sub))
            continue
        data = first.data if len(idx) == 1 else np.concatenate([got[i].data for i in idx], axis=0)  # [n, row_bytes]
        outs.append(gguf_matmul(b, x, b.raw(f"{sub}.gguf_blocks", data), first.ggml_type, first.k, len(data), sub))
        del data
    del got
    return outs[0] if len(outs) == 1 else b.op1("Concat", outs, name=f"{name}/concat", axis=-1)
