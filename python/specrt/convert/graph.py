"""Build the specrt ONNX decoder graph (ARCHITECTURE.md "ONNX decoder contract") with ``onnx.helper``.

The weights never all sit in memory: :class:`ExternalDataWriter` appends each initializer to ``model.onnx.data`` as
soon as it is produced and hands back a small ``TensorProto`` that only points into that file. The graph proto itself
(a few hundred kB) is saved last.

Graph, per token position (fp32):

    Gather(token_embd) -> N x [RMSNorm -> packed QKV MatMul (+bias) -> GroupQueryAttention(do_rotary, shared KV)
    -> o MatMul -> +residual -> RMSNorm -> packed gate|up MatMul -> SiLU(gate) * up -> down MatMul -> +residual]
    -> RMSNorm -> Slice(last num_logits_to_keep positions) -> Gemm(transB=1, lm_head [vocab, hidden]) -> logits

GroupQueryAttention gets ``seqlens_k = ReduceSum(attention_mask) - 1`` (int32 ``[1]``) and
``total_sequence_length = attention_mask.shape[1]`` (int32 scalar); rotary positions come from them, so a chunk of
k tokens on top of n cached ones sits at positions n..n+k-1, and a rollback is just a shorter mask.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from specrt.convert.gguf_reader import ModelSpec

__all__ = ["IR_VERSION", "OPSET", "ExternalDataWriter", "build_decoder", "rope_cache"]

#: ONNX opset of the default domain (ReduceMean with an ``axes`` input needs 18; ORT 1.20 runs up to 21).
OPSET = 18
#: IR version 8 is the newest that every onnxruntime >= 1.14 loads; opset 18 is valid under it.
IR_VERSION = 8
_ALIGN_BIG = 4096  # page alignment lets onnxruntime memory-map large initializers
_ALIGN_SMALL = 64


class ExternalDataWriter:
    """Append initializers to one external-data file and return ``TensorProto`` s that reference it.

    Args:
        data_path: the ``model.onnx.data`` file to create (truncated if present).
        location: the name written into each tensor's ``external_data.location`` (relative to ``model.onnx``).

    Use as a context manager; every :meth:`add` writes immediately, so peak memory is one tensor.
    """

    def __init__(self, data_path: str | os.PathLike[str], location: str = "model.onnx.data") -> None:
        self.path = Path(data_path)
        self.location = location
        self._f = open(self.path, "wb")  # noqa: SIM115 - closed in close()/__exit__
        self.offset = 0

    def add(self, name: str, array: np.ndarray) -> TensorProto:
        """Write ``array`` (float32 or int64) and return an initializer named ``name`` pointing at it."""
        arr = np.ascontiguousarray(array)
        align = _ALIGN_BIG if arr.nbytes >= (1 << 16) else _ALIGN_SMALL
        pad = (-self.offset) % align
        if pad:
            self._f.write(b"\0" * pad)
            self.offset += pad
        self._f.write(memoryview(arr).cast("B"))
        t = TensorProto()
        t.name = name
        t.data_type = helper.np_dtype_to_tensor_dtype(arr.dtype)
        t.dims.extend(arr.shape)
        t.data_location = TensorProto.EXTERNAL
        for k, v in (("location", self.location), ("offset", str(self.offset)), ("length", str(arr.nbytes))):
            entry = t.external_data.add()
            entry.key, entry.value = k, v
        self.offset += arr.nbytes
        return t

    def close(self) -> None:
        """Flush and close the data file."""
        if not self._f.closed:
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()

    def __enter__(self) -> ExternalDataWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def rope_cache(theta: float, head_dim: int, max_positions: int) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin tables for half-split rotary embedding.

    Returns:
        ``(cos, sin)``, each float32 ``[max_positions, head_dim // 2]``: entry ``[p, i] = cos/sin(p * theta^(-2i/d))``
        (angles computed in float64, then rounded).
    """
    inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    angles = np.outer(np.arange(max_positions, dtype=np.float64), inv_freq)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


class _Builder:
    def __init__(self, writer: ExternalDataWriter) -> None:
        self.writer = writer
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[TensorProto] = []
        self._n = 0

    def weight(self, name: str, array: np.ndarray) -> str:
        self.inits.append(self.writer.add(name, array))
        return name

    def const(self, name: str, array: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def op(
        self, op_type: str, inputs: list[str], n_out: int = 1, name: str | None = None, **attrs: object
    ) -> list[str]:
        self._n += 1
        base = name or f"{op_type.lower()}_{self._n}"
        outs = [f"{base}/out{i}" for i in range(n_out)]
        domain = "com.microsoft" if op_type == "GroupQueryAttention" else ""
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=base, domain=domain, **attrs))
        return outs

    def op1(self, op_type: str, inputs: list[str], name: str | None = None, **attrs: object) -> str:
        return self.op(op_type, inputs, 1, name, **attrs)[0]

    def rms_norm(self, x: str, weight: str, eps: str, name: str) -> str:
        sq = self.op1("Mul", [x, x], name=f"{name}/sq")
        ms = self.op1("ReduceMean", [sq, "const_axes_last"], name=f"{name}/mean", keepdims=1)
        rs = self.op1("Sqrt", [self.op1("Add", [ms, eps], name=f"{name}/add_eps")], name=f"{name}/sqrt")
        return self.op1("Mul", [self.op1("Div", [x, rs], name=f"{name}/div"), weight], name=f"{name}/scale")


def build_decoder(
    spec: ModelSpec,
    get_weight: Callable[[str], np.ndarray],
    writer: ExternalDataWriter,
    *,
    max_positions: int | None = None,
    on_tensor: Callable[[str], None] | None = None,
    graph_name: str = "specrt_decoder",
) -> onnx.ModelProto:
    """Build the decoder ``ModelProto``; every weight is streamed to ``writer``.

    Args:
        spec: hyperparameters (:meth:`GGUFModel.spec`).
        get_weight: GGUF tensor name -> float32 array in ``[out, in]`` order with half-split Q/K rows
            (:meth:`GGUFModel.tensor`). Called once per tensor, in graph order.
        writer: where initializer bytes go.
        max_positions: rows of the cos/sin caches (defaults to ``spec.max_position_embeddings``); the runtime must
            never exceed it.
        on_tensor: called with each GGUF tensor name after it has been written (progress reporting).
        graph_name: the graph's name.

    Returns:
        The ``ModelProto`` (initializers reference ``writer``'s file; save it next to that file).
    """
    b = _Builder(writer)
    H, nh, kvh, hd = spec.hidden_size, spec.num_attention_heads, spec.num_kv_heads, spec.head_dim
    max_pos = int(max_positions or spec.max_position_embeddings)
    done = on_tensor or (lambda _name: None)

    def w(name: str) -> np.ndarray:
        return get_weight(name)

    # ----- inputs / outputs ------------------------------------------------------------------------------------
    kv_dims = [1, kvh, "max_sequence_length", hd]
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, "sequence_length"]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, "total_sequence_length"]),
        helper.make_tensor_value_info("num_logits_to_keep", TensorProto.INT64, []),
    ]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, "num_logits", spec.vocab_size])]
    for i in range(spec.num_layers):
        for kind in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(f"past_key_values.{i}.{kind}", TensorProto.FLOAT, kv_dims))
            outputs.append(helper.make_tensor_value_info(f"present.{i}.{kind}", TensorProto.FLOAT, kv_dims))
    b.const("num_logits_to_keep", np.array(0, dtype=np.int64))  # initializer default: keep all positions

    # ----- constants and attention bookkeeping ---------------------------------------------------------------
    b.const("const_axes_last", np.array([-1], dtype=np.int64))
    b.const("const_axes_1", np.array([1], dtype=np.int64))
    b.const("const_axes_0", np.array([0], dtype=np.int64))
    b.const("const_one_i64", np.array(1, dtype=np.int64))
    b.const("const_int64_max", np.array([np.iinfo(np.int64).max], dtype=np.int64))
    b.const("const_eps", np.array(spec.rms_norm_eps, dtype=np.float32))
    b.const("const_shape_2d", np.array([-1, H], dtype=np.int64))
    b.const("const_shape_logits", np.array([1, -1, spec.vocab_size], dtype=np.int64))
    total = b.op1("ReduceSum", ["attention_mask", "const_axes_1"], name="mask/sum", keepdims=0)  # [1] int64
    seqlens_k = b.op1("Cast", [b.op1("Sub", [total, "const_one_i64"], name="mask/minus_one")], name="seqlens_k", to=6)
    total_len = b.op1("Shape", ["attention_mask"], name="mask/shape", start=1, end=2)  # [1] int64
    total_len = b.op1("Squeeze", [total_len, "const_axes_0"], name="mask/total_scalar")
    total_len = b.op1("Cast", [total_len], name="total_sequence_length", to=6)  # int32 scalar
    cos, sin = rope_cache(spec.rope_theta, hd, max_pos)
    b.weight("rope_cos_cache", cos)
    b.weight("rope_sin_cache", sin)
    del cos, sin

    # ----- embedding ---------------------------------------------------------------------------------------------
    embed = w("token_embd.weight")  # [vocab, H]
    b.weight("token_embd.weight", embed)
    del embed
    done("token_embd.weight")
    h = b.op1("Gather", ["token_embd.weight", "input_ids"], name="embed", axis=0)  # [1, S, H]

    # ----- blocks ------------------------------------------------------------------------------------------------
    for i in range(spec.num_layers):
        p = f"blk.{i}"
        b.weight(f"{p}.attn_norm.weight", w(f"{p}.attn_norm.weight"))
        done(f"{p}.attn_norm.weight")
        x = b.rms_norm(h, f"{p}.attn_norm.weight", "const_eps", f"{p}/attn_norm")
        qkv_w = np.concatenate([w(f"{p}.attn_{n}.weight") for n in "qkv"], axis=0).T  # [H, (nh + 2 kvh) hd]
        b.weight(f"{p}.attn_qkv.weight", qkv_w)
        del qkv_w
        for n in "qkv":
            done(f"{p}.attn_{n}.weight")
        qkv = b.op1("MatMul", [x, f"{p}.attn_qkv.weight"], name=f"{p}/qkv")
        if spec.qkv_bias:
            bias = np.concatenate([w(f"{p}.attn_{n}.bias") for n in "qkv"])
            b.weight(f"{p}.attn_qkv.bias", bias)
            for n in "qkv":
                done(f"{p}.attn_{n}.bias")
            qkv = b.op1("Add", [qkv, f"{p}.attn_qkv.bias"], name=f"{p}/qkv_bias")
        attn = b.op(
            "GroupQueryAttention",
            [
                qkv,
                "",
                "",
                f"past_key_values.{i}.key",
                f"past_key_values.{i}.value",
                seqlens_k,
                total_len,
                "rope_cos_cache",
                "rope_sin_cache",
            ],
            n_out=3,
            name=f"{p}/attn",
            num_heads=nh,
            kv_num_heads=kvh,
            do_rotary=1,
            rotary_interleaved=0,
            scale=float(1.0 / np.sqrt(hd)),
        )
        # Rename the cache outputs to the contract's graph-output names.
        b.nodes[-1].output[1] = f"present.{i}.key"
        b.nodes[-1].output[2] = f"present.{i}.value"
        b.weight(f"{p}.attn_output.weight", w(f"{p}.attn_output.weight").T)
        done(f"{p}.attn_output.weight")
        h = b.op1("Add", [h, b.op1("MatMul", [attn[0], f"{p}.attn_output.weight"], name=f"{p}/o")], name=f"{p}/res1")

        b.weight(f"{p}.ffn_norm.weight", w(f"{p}.ffn_norm.weight"))
        done(f"{p}.ffn_norm.weight")
        x = b.rms_norm(h, f"{p}.ffn_norm.weight", "const_eps", f"{p}/ffn_norm")
        gu_w = np.concatenate([w(f"{p}.ffn_gate.weight"), w(f"{p}.ffn_up.weight")], axis=0).T  # [H, 2F]
        b.weight(f"{p}.ffn_gate_up.weight", gu_w)
        del gu_w
        done(f"{p}.ffn_gate.weight")
        done(f"{p}.ffn_up.weight")
        gu = b.op1("MatMul", [x, f"{p}.ffn_gate_up.weight"], name=f"{p}/gate_up")
        gate, up = b.op("Split", [gu], n_out=2, name=f"{p}/split", axis=-1, num_outputs=2)
        act = b.op1("Mul", [gate, b.op1("Sigmoid", [gate], name=f"{p}/sigmoid")], name=f"{p}/silu")
        act = b.op1("Mul", [act, up], name=f"{p}/swiglu")
        b.weight(f"{p}.ffn_down.weight", w(f"{p}.ffn_down.weight").T)
        done(f"{p}.ffn_down.weight")
        h = b.op1("Add", [h, b.op1("MatMul", [act, f"{p}.ffn_down.weight"], name=f"{p}/down")], name=f"{p}/res2")

    # ----- head --------------------------------------------------------------------------------------------------
    b.weight("output_norm.weight", w("output_norm.weight"))
    done("output_norm.weight")
    h = b.rms_norm(h, "output_norm.weight", "const_eps", "output_norm")
    # Keep the last num_logits_to_keep positions before the lm_head (0 -> starts = 0 -> all of them).
    starts = b.op1("Unsqueeze", [b.op1("Neg", ["num_logits_to_keep"], name="keep/neg"), "const_axes_0"], name="keep/s")
    h = b.op1("Slice", [h, starts, "const_int64_max", "const_axes_1"], name="keep/slice")
    h2 = b.op1("Reshape", [h, "const_shape_2d"], name="lm_head/flatten")
    if spec.tied_embeddings:
        head = "token_embd.weight"
    else:
        b.weight("output.weight", w("output.weight"))  # [vocab, H], used with transB=1: no transposed copy
        done("output.weight")
        head = "output.weight"
    logits2 = b.op1("Gemm", [h2, head], name="lm_head", transB=1)
    b.nodes.append(helper.make_node("Reshape", [logits2, "const_shape_logits"], ["logits"], name="logits/reshape"))

    graph = helper.make_graph(b.nodes, graph_name, inputs, outputs, initializer=b.inits)
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid("com.microsoft", 1)],
        producer_name="specrt.convert",
    )
    model.ir_version = IR_VERSION
    return model
