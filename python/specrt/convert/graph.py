"""Build the specrt ONNX decoder graph (ARCHITECTURE.md "ONNX decoder contract") with ``onnx.helper``.

The weights never all sit in memory: :class:`ExternalDataWriter` appends each initializer to ``model.onnx.data`` as
soon as it is produced and hands back a small ``TensorProto`` that only points into that file. The graph proto itself
(a few hundred kB) is saved last.

Graph, per token position:

    Gather(token_embd) -> RMSNorm -> N x [packed QKV MatMul (+bias) (-> Split, per-head q/k RMSNorm: qwen3)
    -> GroupQueryAttention(do_rotary, shared KV, local_window_size with a sliding window)
    -> o MatMul -> SkipSimplifiedLayerNormalization (+residual, RMSNorm) -> packed gate|up MatMul
    -> SiLU(gate) * up -> down MatMul -> SkipSimplifiedLayerNormalization (+residual, next RMSNorm)]
    -> Slice(last num_logits_to_keep positions) -> lm_head -> logits (float32)

A :class:`WeightPlan` picks the precision: ``fp32`` (everything float32), ``fp16`` (float16 weights, activations and
KV cache, the residual sum and RMSNorm statistics of ``SkipSimplifiedLayerNormalization`` in float32, logits cast to
float32 in the graph: the CUDA form), or block-quantized matrices per kind (``com.microsoft::MatMulNBits`` for
attention, MLP and head, ``com.microsoft::GatherBlockQuantized`` for the embedding) with float32 activations (the
fast CPU form), or the GGUF's own blocks, bit for bit (``gguf``: specrt's ``ai.specrt::GgufMatMul`` for attention,
MLP and head, ``ai.specrt::GgufGather`` for the embedding, registered on every specrt session; see
:mod:`specrt.convert.gguf_graph`).

GroupQueryAttention gets ``seqlens_k = ReduceSum(attention_mask) - 1`` (int32 ``[1]``) and
``total_sequence_length = attention_mask.shape[1]`` (int32 scalar); rotary positions come from them, so a chunk of
k tokens on top of n cached ones sits at positions n..n+k-1, and a rollback is just a shorter mask.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from specrt.convert.families import ModelSpec, checked_sliding_window
from specrt.convert.gguf_graph import SPECRT_DOMAIN, SPECRT_OPS, gguf_linear, gguf_matmul
from specrt.convert.gguf_reader import GGUFBlocks
from specrt.convert.quant import BlockQuant, concat_rows, pack_matmul_nbits, quantize_rtn
from specrt.convert.rope import longrope_choice, rope_cache
from specrt.convert.weights import (
    FLOAT_DTYPES,
    MATRIX_KINDS,
    ExternalDataWriter,
    WeightPlan,
    quantize_per_channel_int8,
)

__all__ = [
    "ATTENTION_FORMS",
    "IR_VERSION",
    "MIN_ONNXRUNTIME_WINDOW",
    "OPSET",
    "SPECRT_DOMAIN",
    "build_decoder",
]

#: ONNX opset of the default domain (ReduceMean with an ``axes`` input needs 18; ORT 1.20 runs up to 21).
OPSET = 18
#: IR version 8 is the newest that every onnxruntime >= 1.14 loads; opset 18 is valid under it.
IR_VERSION = 8
#: Oldest onnxruntime that runs a sliding-window model's GroupQueryAttention forms right: 1.24 made
#: ``local_window_size`` w admit w keys, the query's own included (microsoft/onnxruntime#25927, "Fix Local Attention
#: off by 1 bug"); 1.20-1.23 admit w + 1 (measured on the CPU wheels 1.20.1, 1.22.0 and 1.23.2 against 1.24.1 and
#: 1.32.0: tests/convert/test_mistral.py pins the installed one).
MIN_ONNXRUNTIME_WINDOW = "1.24"
ATTENTION_FORMS = ("gqa", "gqa-graph", "batched")
_CONTRIB_OPS = {
    "GroupQueryAttention",
    "MatMulNBits",
    "GatherBlockQuantized",
    "SkipSimplifiedLayerNormalization",
    "DynamicQuantizeMatMul",
    "FastGelu",
}


#: Matrix storage kinds of a :class:`WeightPlan` and their bit widths (``None``: a float matrix). ``qint8``: int8
#: weights with one symmetric scale per output channel, run by ``DynamicQuantizeMatMul`` (activations quantized to
#: uint8 per call, one scale per tensor; ONNX Runtime's integer GEMM): matrices only, not the embedding.
class _Builder:
    def __init__(self, writer: ExternalDataWriter, float_dtype: type = np.float32) -> None:
        self.writer = writer
        self.ft = float_dtype
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[TensorProto] = []
        self._consts: set[str] = set()
        self._n = 0
        #: ``(rotary_dim, head_dim - rotary_dim)`` under partial rotary (Phi-4-mini), else None.
        self.partial_rotary: tuple[int, int] | None = None

    def weight(self, name: str, array: np.ndarray) -> str:
        """Write a float initializer in the graph's float dtype."""
        self.inits.append(self.writer.add(name, np.asarray(array).astype(self.ft, copy=False)))
        return name

    def raw(self, name: str, array: np.ndarray) -> str:
        """Write an initializer as it is (quantized codes, zero points)."""
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
        domain = "com.microsoft" if op_type in _CONTRIB_OPS else (SPECRT_DOMAIN if op_type in SPECRT_OPS else "")
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=base, domain=domain, **attrs))
        return outs

    def op1(self, op_type: str, inputs: list[str], name: str | None = None, **attrs: object) -> str:
        return self.op(op_type, inputs, 1, name, **attrs)[0]

    def rms_norm(self, x: str, weight: str, eps: str, name: str) -> str:
        sq = self.op1("Mul", [x, x], name=f"{name}/sq")
        ms = self.op1("ReduceMean", [sq, "const_axes_last"], name=f"{name}/mean", keepdims=1)
        rs = self.op1("Sqrt", [self.op1("Add", [ms, eps], name=f"{name}/add_eps")], name=f"{name}/sqrt")
        return self.op1("Mul", [self.op1("Div", [x, rs], name=f"{name}/div"), weight], name=f"{name}/scale")

    def const_once(self, name: str, array: np.ndarray) -> str:
        """:meth:`const` unless an initializer ``name`` exists already (constants shared by layers)."""
        if name not in self._consts:
            self._consts.add(name)
            self.const(name, array)
        return name

    def head_norm(self, x: str, weight: str, n_heads: int, hd: int, eps: float, name: str) -> str:
        """Per-head RMSNorm (Qwen3's q / k norm) of ``x`` ``[1, S, n_heads hd]`` over each head's ``hd`` values, times
        ``weight`` ``[hd]``: ``x`` viewed ``[S, n_heads, hd]`` through ``SkipSimplifiedLayerNormalization`` with a
        zero skip (the fused kernel: float32 statistics whatever the dtype; the plain ``SimplifiedLayerNormalization``
        is no registered ONNX op, which ``onnx.checker`` refuses), then viewed back."""
        heads = self.const_once(f"const_shape_heads_{n_heads}_{hd}", np.array([-1, n_heads, hd], dtype=np.int64))
        flat = self.const_once(f"const_shape_flat_{n_heads}_{hd}", np.array([1, -1, n_heads * hd], dtype=np.int64))
        zeros = self.const_once(f"const_zero_skip_{n_heads}_{hd}", np.zeros((1, n_heads, hd), dtype=self.ft))
        x3 = self.op1("Reshape", [x, heads], name=f"{name}/heads")
        y = self.op1("SkipSimplifiedLayerNormalization", [x3, zeros, weight], name=name, epsilon=float(eps))
        return self.op1("Reshape", [y, flat], name=f"{name}/flat")

    def skip_rms_norm(self, x: str, residual: str, weight: str, eps: float, name: str) -> tuple[str, str]:
        """``(RMSNorm(x + residual) * weight, x + residual)``; statistics in float32 whatever the dtype."""
        outs = self.op(
            "SkipSimplifiedLayerNormalization", [x, residual, weight], n_out=4, name=name, epsilon=float(eps)
        )
        self.nodes[-1].output[1] = ""  # mean / inv_std_var: not needed
        self.nodes[-1].output[2] = ""
        return outs[0], outs[3]

    def batched_masks(
        self, first_past_kt: str, group: int, window: int | None = None, rope_caches: tuple[str, ...] = ("rope",)
    ) -> dict[str, str]:
        """Masks shared by every layer of the batched contract: ``past`` ``[B, 1, 1, L]`` (0 where the cache position
        is below the row's ``past_lengths``, -inf beyond), ``causal`` ``[group S, S]`` (0 on and below the diagonal of
        each of the ``group`` stacked ``[S, S]`` blocks: the query rows of a KV head's group, folded), the split sizes
        ``[L, S]`` of the joint softmax, and cos / sin at each token's position ``[B, 1, S, hd / 2]`` (keys) and
        ``[B, 1, 1, S, hd / 2]`` (queries).

        With a sliding ``window`` (:attr:`ModelSpec.sliding_window`) both masks also hide every key at a position
        ``<= positions[b, s] - window`` from query s of row b: ``past`` becomes ``[B, 1, group S, L]`` (cache slot j
        holds position j) and ``causal`` ``[B, 1, group S, S]`` (new key s' sits at ``positions[b, s']``). A query
        always sees its own key, so no softmax row is all -inf (pads included: their positions repeat a real one).
        ``past_full`` / ``causal_full`` are the masks without the window (the global layers of an interleaved model).

        ``rope_caches``: the prefixes of the cos / sin caches to gather (``rope``: ``cos_q`` ...; any other prefix
        ``x``: ``cos_q_x`` ...)."""
        self.const("const_zero_f", np.array(0.0, dtype=self.ft))
        self.const("const_neg_inf", np.array(-np.inf, dtype=self.ft))
        self.const("const_zero_i64", np.array(0, dtype=np.int64))
        self.const("const_axes_2", np.array([2], dtype=np.int64))
        self.const("const_axes_12", np.array([1, 2], dtype=np.int64))
        cap = self.op1("Shape", [first_past_kt], name="batch/cap", start=3, end=4)  # [1]: L
        cap_s = self.op1("Squeeze", [cap, "const_axes_0"], name="batch/cap_scalar")
        arange = self.op1("Range", ["const_zero_i64", cap_s, "const_one_i64"], name="batch/arange")  # [L]
        lens = self.op1("Unsqueeze", ["past_lengths", "const_axes_last"], name="batch/lens")  # [B, 1]
        valid = self.op1("Less", [arange, lens], name="batch/valid")  # [B, L]
        past = self.op1("Where", [valid, "const_zero_f", "const_neg_inf"], name="batch/past_mask2")
        past = self.op1("Unsqueeze", [past, "const_axes_12"], name="batch/past_mask")  # [B, 1, 1, L]
        seq = self.op1("Shape", ["input_ids"], name="batch/seq", start=1, end=2)  # [1]: S
        ones = self.op1(
            "ConstantOfShape", [seq], name="batch/ones", value=helper.make_tensor("one", TensorProto.FLOAT, [1], [1])
        )
        col = self.op1("Unsqueeze", [ones, "const_axes_last"], name="batch/col")  # [S, 1]
        row = self.op1("Unsqueeze", [ones, "const_axes_0"], name="batch/row")  # [1, S]
        tril = self.op1("Trilu", [self.op1("Mul", [col, row], name="batch/square")], name="batch/tril", upper=0)
        tril = self.op1("Cast", [tril], name="batch/tril_bool", to=TensorProto.BOOL)
        causal = self.op1("Where", [tril, "const_zero_f", "const_neg_inf"], name="batch/causal1")
        self.const("const_causal_repeats", np.array([group, 1], dtype=np.int64))
        causal = self.op1("Tile", [causal, "const_causal_repeats"], name="batch/causal")  # [group S, S]
        out = {"past_full": past, "causal_full": causal}
        if window is not None:
            past, causal = self._window_masks(arange, past, causal, group, window)
        out |= {"past": past, "causal": causal}
        out["split"] = self.op1("Concat", [cap, seq], name="batch/split_sizes", axis=0)
        for prefix in rope_caches:
            tail = "" if prefix == "rope" else f"_{prefix}"
            for name in ("cos", "sin"):
                g = self.op1("Gather", [f"{prefix}_{name}_cache", "positions"], name=f"batch/{prefix}_{name}", axis=0)
                k = out[f"{name}_k{tail}"] = self.op1(
                    "Unsqueeze", [g, "const_axes_1"], name=f"batch/{prefix}_{name}_k"
                )  # [B, 1, S, hd/2]
                out[f"{name}_q{tail}"] = self.op1("Unsqueeze", [k, "const_axes_2"], name=f"batch/{prefix}_{name}_q")
        return out

    def _window_masks(self, arange: str, past: str, causal: str, group: int, window: int) -> tuple[str, str]:
        """:meth:`batched_masks`' ``past`` and ``causal`` with the sliding window added (its docstring)."""
        self.const("const_window", np.array(window, dtype=np.int64))
        self.const("const_window_repeats", np.array([1, 1, group, 1], dtype=np.int64))
        # [B, S, 1]: the last position outside query s's window
        outside = self.op1("Sub", ["positions", "const_window"], name="batch/window_outside")
        outside = self.op1("Unsqueeze", [outside, "const_axes_last"], name="batch/window_outside3")
        key_positions = {
            "past": arange,  # [L]: cache slot j holds position j
            "new": self.op1("Unsqueeze", ["positions", "const_axes_1"], name="batch/window_new_pos"),  # [B, 1, S]
        }
        added = {}
        for part, keys in key_positions.items():
            inside = self.op1("Greater", [keys, outside], name=f"batch/window_{part}_in")  # [B, S, L] / [B, S, S]
            mask = self.op1("Where", [inside, "const_zero_f", "const_neg_inf"], name=f"batch/window_{part}_mask")
            mask = self.op1("Unsqueeze", [mask, "const_axes_1"], name=f"batch/window_{part}_4d")  # [B, 1, S, *]
            added[part] = self.op1("Tile", [mask, "const_window_repeats"], name=f"batch/window_{part}")  # [B,1,gS,*]
        past = self.op1("Add", [past, added["past"]], name="batch/past_window")  # [B, 1, group S, L]
        causal = self.op1("Add", [causal, added["new"]], name="batch/causal_window")  # [B, 1, group S, S]
        return past, causal

    def _rotary(self, x: str, cos: str, sin: str, name: str) -> str:
        """Half-split rotary embedding of ``x`` (last axis ``hd``) with ``cos`` / ``sin`` broadcast to it; under
        :attr:`partial_rotary` only the first ``rotary_dim`` values rotate (pairs ``(i, i + rotary_dim / 2)``), the
        rest pass unchanged (transformers' ``apply_rotary_pos_emb`` with ``q_pass``; llama.cpp's ``n_rot``)."""
        if self.partial_rotary is not None:
            sizes = self.const_once(
                f"const_split_rotary_{self.partial_rotary[0]}", np.array(self.partial_rotary, dtype=np.int64)
            )
            rot, keep = self.op("Split", [x, sizes], n_out=2, name=f"{name}/partial", axis=-1)
            self.partial_rotary, saved = None, self.partial_rotary
            try:
                rot = self._rotary(rot, cos, sin, name)
            finally:
                self.partial_rotary = saved
            return self.op1("Concat", [rot, keep], name=f"{name}/partial_out", axis=-1)
        lo, hi = self.op("Split", [x], n_out=2, name=f"{name}/halves", axis=-1, num_outputs=2)
        a = self.op1(
            "Sub",
            [self.op1("Mul", [lo, cos], name=f"{name}/lc"), self.op1("Mul", [hi, sin], name=f"{name}/hs")],
            name=f"{name}/lo",
        )
        c = self.op1(
            "Add",
            [self.op1("Mul", [hi, cos], name=f"{name}/hc"), self.op1("Mul", [lo, sin], name=f"{name}/ls")],
            name=f"{name}/hi",
        )
        return self.op1("Concat", [a, c], name=f"{name}/out", axis=-1)

    def split_qkv(self, qkv: str, nh: int, kvh: int, hd: int, name: str) -> list[str]:
        """``qkv`` ``[..., (nh + 2 kvh) hd]`` -> q ``[..., nh hd]``, k and v ``[..., kvh hd]``."""
        sizes = self.const_once(
            f"const_split_qkv_{nh}_{kvh}_{hd}", np.array([nh * hd, kvh * hd, kvh * hd], dtype=np.int64)
        )
        return self.op("Split", [qkv, sizes], n_out=3, name=name, axis=-1)

    def masked_attention(
        self,
        qkv: str,
        layer: int,
        nh: int,
        kvh: int,
        hd: int,
        masks: dict[str, str],
        qk_norm: tuple[str, str] | None = None,
        scale: float | None = None,
    ) -> str:
        """Attention of the batched contract for ``qkv`` ``[B, S, (nh + 2 kvh) hd]``: each query attends to its row's
        cached keys (``past_key_values.{layer}.key_t`` ``[B, kvh, hd, L]``, read in place, masked beyond the row's
        length) and causally to the S new keys, one softmax over both parts. Writes the graph outputs
        ``new.{layer}.key`` (after rotary) and ``new.{layer}.value``, ``[B, kvh, S, hd]``; returns ``[B, S, nh hd]``.
        ``qk_norm``: the q and k norm weights ``[hd]`` (Qwen3), applied per head after the split, before rotary
        (RMSNorm in standard ops with ``const_eps``: this form is float32 only). ``masks``: those of
        :meth:`batched_masks` this layer uses under the names ``past``, ``causal``, ``split``, ``cos_q``, ``sin_q``,
        ``cos_k``, ``sin_k``. ``scale``: the factor of q . k (default ``1 / sqrt(hd)``).
        """
        p = f"blk.{layer}/mattn"
        g = nh // kvh
        if "const_shape_q5" not in self._consts:
            self.const_once("const_shape_q5", np.array([0, 0, kvh, g, hd], dtype=np.int64))
            self.const_once("const_shape_kv4", np.array([0, 0, kvh, hd], dtype=np.int64))
            self.const_once("const_shape_attn", np.array([0, 0, nh * hd], dtype=np.int64))
            self.const_once("const_shape_fold", np.array([0, 0, -1, hd], dtype=np.int64))
            self.const_once("const_shape_unfold", np.array([0, 0, g, -1, hd], dtype=np.int64))
            self.const_once("const_scale", np.array(1.0 / np.sqrt(hd) if scale is None else scale, dtype=self.ft))
        q, k, v = self.split_qkv(qkv, nh, kvh, hd, f"{p}/split")
        q = self.op1("Reshape", [q, "const_shape_q5"], name=f"{p}/q5")  # [B, S, kvh, g, hd]
        k = self.op1("Reshape", [k, "const_shape_kv4"], name=f"{p}/k4")  # [B, S, kvh, hd]
        if qk_norm is not None:
            q = self.rms_norm(q, qk_norm[0], "const_eps", f"{p}/q_norm")
            k = self.rms_norm(k, qk_norm[1], "const_eps", f"{p}/k_norm")
        q = self.op1("Transpose", [q], name=f"{p}/qt", perm=[0, 2, 3, 1, 4])  # [B, kvh, g, S, hd]
        k = self.op1("Transpose", [k], name=f"{p}/kt", perm=[0, 2, 1, 3])  # [B, kvh, S, hd]
        v = self.op1("Reshape", [v, "const_shape_kv4"], name=f"{p}/v4")
        self.nodes.append(helper.make_node("Transpose", [v], [f"new.{layer}.value"], name=f"{p}/vt", perm=[0, 2, 1, 3]))
        v = f"new.{layer}.value"
        q = self._rotary(q, masks["cos_q"], masks["sin_q"], f"{p}/rope_q")
        k_rot = self._rotary(k, masks["cos_k"], masks["sin_k"], f"{p}/rope_k")
        self.nodes.append(helper.make_node("Identity", [k_rot], [f"new.{layer}.key"], name=f"{p}/new_key"))
        q = self.op1("Mul", [q, "const_scale"], name=f"{p}/q_scaled")
        # A KV head's g query heads fold into its rows: one [g S, hd] x [hd, L] product per (row, KV head) instead of
        # g broadcast [S, hd] x [hd, L] products (fewer, larger kernel calls; measured in benches/RESULTS.md).
        q = self.op1("Reshape", [q, "const_shape_fold"], name=f"{p}/q_fold")  # [B, kvh, g S, hd]
        s_past = self.op1(
            "Add",
            [self.op1("MatMul", [q, f"past_key_values.{layer}.key_t"], name=f"{p}/s_past0"), masks["past"]],
            name=f"{p}/s_past",
        )  # [B, kvh, g S, L]
        kt_new = self.op1("Transpose", [f"new.{layer}.key"], name=f"{p}/kt_new", perm=[0, 1, 3, 2])  # [B, kvh, hd, S]
        s_new = self.op1(
            "Add", [self.op1("MatMul", [q, kt_new], name=f"{p}/s_new0"), masks["causal"]], name=f"{p}/s_new"
        )  # [B, kvh, g S, S]
        probs = self.op1(
            "Softmax", [self.op1("Concat", [s_past, s_new], name=f"{p}/scores", axis=-1)], name=f"{p}/probs", axis=-1
        )
        p_past, p_new = self.op("Split", [probs, masks["split"]], n_out=2, name=f"{p}/psplit", axis=-1)
        o = self.op1(
            "Add",
            [
                self.op1("MatMul", [p_past, f"past_key_values.{layer}.value"], name=f"{p}/o_past"),
                self.op1("MatMul", [p_new, v], name=f"{p}/o_new"),
            ],
            name=f"{p}/o",
        )  # [B, kvh, g S, hd]
        o = self.op1("Reshape", [o, "const_shape_unfold"], name=f"{p}/o_unfold")  # [B, kvh, g, S, hd]
        o = self.op1("Transpose", [o], name=f"{p}/ot", perm=[0, 3, 1, 2, 4])  # [B, S, kvh, g, hd]
        return self.op1("Reshape", [o, "const_shape_attn"], name=f"{p}/attn")

    def dynamic_quantize_matmul(self, x: str, w: np.ndarray, name: str) -> str:
        """``x @ w.T`` with ``w`` float ``[N, K]`` stored as int8 ``[K, N]`` with one symmetric scale per output
        channel (``max |w[n]| / INT8_WEIGHT_MAX``); ONNX Runtime quantizes ``x`` to uint8 per call (one scale per
        tensor)."""
        qt, scale = quantize_per_channel_int8(w)
        ins = [
            x,
            self.raw(f"{name}.qweight", qt),
            self.raw(f"{name}.scale", scale),
            self.raw(f"{name}.zero_point", np.zeros(w.shape[0], dtype=np.int8)),
        ]
        return self.op1("DynamicQuantizeMatMul", ins, name=name)

    def matmul_nbits(self, x: str, bq: BlockQuant, name: str, accuracy_level: int) -> str:
        """``x @ W.T`` for a block-quantized ``W`` ``[N, K]``; ``x`` float32 ``[..., K]`` -> ``[..., N]``."""
        b, scales, zp = pack_matmul_nbits(bq)
        n, k = bq.shape
        ins = [x, self.raw(f"{name}.qweight", b), self.raw(f"{name}.scales", scales)]
        ins.append(self.raw(f"{name}.zero_points", zp))
        return self.op1(
            "MatMulNBits",
            ins,
            name=name,
            K=k,
            N=n,
            bits=bq.bits,
            block_size=bq.block_size,
            accuracy_level=accuracy_level,
        )


def build_decoder(
    spec: ModelSpec,
    get_weight: Callable[[str], np.ndarray],
    writer: ExternalDataWriter,
    *,
    max_positions: int | None = None,
    on_tensor: Callable[[str], None] | None = None,
    graph_name: str = "specrt_decoder",
    plan: WeightPlan | None = None,
    get_quant: Callable[[str, int], BlockQuant] | None = None,
    head_rows: np.ndarray | None = None,
    attention: str = "gqa",
    get_blocks: Callable[[str], GGUFBlocks] | None = None,
) -> onnx.ModelProto:
    """Build the decoder ``ModelProto``; every weight is streamed to ``writer``.

    Args:
        spec: hyperparameters (:meth:`GGUFModel.spec`).
        get_weight: GGUF tensor name -> float32 array in ``[out, in]`` order with half-split Q/K rows
            (:meth:`GGUFModel.tensor`). Called once per float tensor, in graph order.
        writer: where initializer bytes go.
        max_positions: rows of the cos/sin caches (defaults to ``spec.max_position_embeddings``); the runtime must
            never exceed it.
        on_tensor: called with each GGUF tensor name after it has been written (progress reporting).
        graph_name: the graph's name.
        plan: precision per weight kind (default: all float32).
        get_quant: GGUF tensor name, bits -> :class:`BlockQuant` ``[out, in]`` (half-split Q/K rows) for the
            quantized kinds of ``plan``; default: round-to-nearest of ``get_weight(name)`` at ``plan.block_size``.
        head_rows: ``[N]`` ascending token ids: a pruned-vocabulary head that scores only these ids (logits
            ``[1, n, N]`` in this order; quantized heads are rounded to nearest from the float rows); ``None`` = all.
        attention: ``"gqa"`` (the contract of ARCHITECTURE.md: batch 1, GroupQueryAttention on a shared past/present
            buffer), ``"gqa-graph"`` (the same decoder with ``seqlens_k`` ``[1]`` int32, ``total_sequence_length``
            ``[]`` int32 and ``logits_index`` ``[n]`` int64 as inputs instead of ``attention_mask`` and
            ``num_logits_to_keep``, and an ``argmax`` ``[1, n]`` int64 output: the form CUDA graph capture needs)
            or ``"batched"`` (rows of a batch, each on its own cache; see :data:`BATCHED_CONTRACT`; needs float32
            activations).
        get_blocks: GGUF tensor name -> :class:`~specrt.convert.gguf_reader.GGUFBlocks` (the stored blocks, Q/K rows
            un-permuted: :meth:`GGUFModel.gguf_blocks`), for the kinds of ``plan`` stored as ``"gguf"``. Such a
            matrix becomes an ``ai.specrt::GgufMatMul`` on a uint8 ``[N, row_bytes]`` initializer of the file's bytes
            (the parts of a packed matrix, q|k|v or gate|up, concatenated by rows; parts of different types, as
            Q4_K_M's Q4_K / Q6_K, one operator per run joined by a ``Concat``: :func:`gguf_linear`), the embedding
            an ``ai.specrt::GgufGather``, a tied head the embedding's initializer (written once), a pruned head a row
            subset of the blocks. Types the operators do not run (not in
            :data:`~specrt.convert.gguf_reader.GGUF_OP_TYPES`) fall back to float32 MatMul / Gather / Gemm.

    Returns:
        The ``ModelProto`` (initializers reference ``writer``'s file; save it next to that file). It imports the
        ``ai.specrt`` domain (opset 1) when it uses specrt's operators.

    Raises:
        ValueError: an unknown ``attention``, ``"batched"`` without float32 activations, or a ``"gguf"`` plan
            without ``get_blocks``.
    """
    plan = plan or WeightPlan()
    ft, ft_proto = FLOAT_DTYPES[plan.dtype]
    b = _Builder(writer, ft)
    H, nh, kvh, hd = spec.hidden_size, spec.num_attention_heads, spec.num_kv_heads, spec.head_dim
    max_pos = int(max_positions or spec.max_position_embeddings)
    done = on_tensor or (lambda _name: None)

    def w(name: str) -> np.ndarray:
        return get_weight(name)

    def quant(name: str, bits: int) -> BlockQuant:
        if get_quant is not None:
            return get_quant(name, bits)
        return quantize_rtn(get_weight(name), bits, plan.block_size)

    if plan.uses_gguf_blocks and get_blocks is None:
        raise ValueError("a plan with 'gguf' storage needs get_blocks (the GGUF's stored blocks: a GGUF source)")

    def blocks(name: str) -> GGUFBlocks:
        assert get_blocks is not None
        return get_blocks(name)

    def float_matmul(x: str, parts: list[str], name: str) -> str:
        mat = np.concatenate([w(p) for p in parts], axis=0).T  # [in, out]
        b.weight(f"{name}.weight", mat)
        del mat
        return b.op1("MatMul", [x, f"{name}.weight"], name=name)

    def linear(x: str, parts: list[str], kind: str, name: str) -> str:
        """``x @ concat(parts).T``: a float MatMul, a MatMulNBits, a DynamicQuantizeMatMul or GgufMatMuls, per the
        plan's storage for ``kind``."""
        storage = getattr(plan, kind) or plan.mlp  # down: None = as mlp
        bits = MATRIX_KINDS[storage]
        if storage == "gguf":
            out = gguf_linear(b, x, parts, name, blocks, float_matmul)
        elif storage == "qint8":
            mat = np.concatenate([w(p) for p in parts], axis=0)  # [out, in]
            out = b.dynamic_quantize_matmul(x, mat, name)
            del mat
        elif bits is None:
            out = float_matmul(x, parts, name)
        else:
            bq = concat_rows([quant(p, bits) for p in parts])
            out = b.matmul_nbits(x, bq, name, plan.accuracy_level)
            del bq
        for p in parts:
            done(p)
        return out

    # ----- inputs / outputs ------------------------------------------------------------------------------------
    if attention not in ATTENTION_FORMS:
        raise ValueError(f"attention {attention!r} is invalid (expected one of: {', '.join(ATTENTION_FORMS)})")
    batched = attention == "batched"
    graph_form = attention == "gqa-graph"
    if batched and plan.dtype != "fp32":
        raise ValueError(f"attention 'batched' needs float32 activations (dtype fp32 or int4), got {plan.dtype}")
    n_out = spec.vocab_size if head_rows is None else len(head_rows)  # logits width
    if batched:
        inputs = [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
            helper.make_tensor_value_info("positions", TensorProto.INT64, ["batch_size", "sequence_length"]),
            helper.make_tensor_value_info("past_lengths", TensorProto.INT64, ["batch_size"]),
            helper.make_tensor_value_info("num_logits_to_keep", TensorProto.INT64, []),
        ]
        outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch_size", "num_logits", n_out])]
        for i in range(spec.num_layers):
            k_dims = ["batch_size", kvh, hd, "max_sequence_length"]
            v_dims = ["batch_size", kvh, "max_sequence_length", hd]
            new_dims = ["batch_size", kvh, "sequence_length", hd]
            inputs.append(helper.make_tensor_value_info(f"past_key_values.{i}.key_t", ft_proto, k_dims))
            inputs.append(helper.make_tensor_value_info(f"past_key_values.{i}.value", ft_proto, v_dims))
            outputs.append(helper.make_tensor_value_info(f"new.{i}.key", ft_proto, new_dims))
            outputs.append(helper.make_tensor_value_info(f"new.{i}.value", ft_proto, new_dims))
    else:
        kv_dims = [1, kvh, "max_sequence_length", hd]
        if graph_form:
            # Every per-call value is a tensor the runtime writes (no shape-derived values, no host-side nodes),
            # so each step shape can run from fixed device addresses (CUDA graph capture and replay).
            inputs = [
                helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, "sequence_length"]),
                helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [1]),
                helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, []),
                helper.make_tensor_value_info("logits_index", TensorProto.INT64, ["num_logits"]),
            ]
        else:
            inputs = [
                helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, "sequence_length"]),
                helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, "total_sequence_length"]),
                helper.make_tensor_value_info("num_logits_to_keep", TensorProto.INT64, []),
            ]
        outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, "num_logits", n_out])]
        if graph_form:
            outputs.append(helper.make_tensor_value_info("argmax", TensorProto.INT64, [1, "num_logits"]))
        for i in range(spec.num_layers):
            for kind in ("key", "value"):
                inputs.append(helper.make_tensor_value_info(f"past_key_values.{i}.{kind}", ft_proto, kv_dims))
                outputs.append(helper.make_tensor_value_info(f"present.{i}.{kind}", ft_proto, kv_dims))
    if not graph_form:
        b.const("num_logits_to_keep", np.array(0, dtype=np.int64))  # initializer default: keep all positions

    # ----- constants and attention bookkeeping ---------------------------------------------------------------
    b.const("const_axes_last", np.array([-1], dtype=np.int64))
    b.const("const_axes_1", np.array([1], dtype=np.int64))
    b.const("const_axes_0", np.array([0], dtype=np.int64))
    b.const("const_one_i64", np.array(1, dtype=np.int64))
    b.const("const_int64_max", np.array([np.iinfo(np.int64).max], dtype=np.int64))
    b.const("const_eps", np.array(spec.rms_norm_eps, dtype=ft))
    b.const("const_shape_2d", np.array([-1, H], dtype=np.int64))
    b.const("const_shape_logits", np.array([1, -1, n_out], dtype=np.int64))
    # The sliding window, None where it spans every position the caches hold (full causal attention).
    window = checked_sliding_window(spec.sliding_window, max_pos, "ModelSpec.sliding_window")
    # Interleaved local / global layers with a rotary base of their own on the local layers (Gemma 3)
    local_rope = any(spec.layer_rope_theta(i) != spec.rope_theta for i in range(spec.num_layers))
    if batched:
        caches = ("rope", "rope_local") if local_rope else ("rope",)
        masks = b.batched_masks("past_key_values.0.key_t", nh // kvh, window, caches)
    elif graph_form:
        seqlens_k, total_len = "seqlens_k", "total_sequence_length"
    else:
        total = b.op1("ReduceSum", ["attention_mask", "const_axes_1"], name="mask/sum", keepdims=0)  # [1] int64
        seqlens_k = b.op1(
            "Cast", [b.op1("Sub", [total, "const_one_i64"], name="mask/minus_one")], name="seqlens_k", to=6
        )
        total_len = b.op1("Shape", ["attention_mask"], name="mask/shape", start=1, end=2)  # [1] int64
        total_len = b.op1("Squeeze", [total_len, "const_axes_0"], name="mask/total_scalar")
        total_len = b.op1("Cast", [total_len], name="total_sequence_length", to=6)  # int32 scalar
    # Partial rotary (Phi-4-mini): caches [max_pos, rotary_dim / 2]; GroupQueryAttention rotates the first
    # rotary_dim values of each head by their width, _rotary likewise. longrope: one set of factors per graph.
    if spec.rope_dim != hd:
        b.partial_rotary = (spec.rope_dim, hd - spec.rope_dim)
    factors = longrope_choice(spec.rope_freq_factors, spec.rope_long_freq_factors, spec.rope_original_context, max_pos)
    cos, sin = rope_cache(spec.rope_theta, spec.rope_dim, max_pos, factors, spec.rope_attn_factor)
    b.weight("rope_cos_cache", cos)
    b.weight("rope_sin_cache", sin)
    if local_rope:
        assert spec.rope_local_theta is not None
        cos, sin = rope_cache(spec.rope_local_theta, hd, max_pos, spec.rope_freq_factors)
        b.weight("rope_local_cos_cache", cos)
        b.weight("rope_local_sin_cache", sin)
    del cos, sin

    # ----- embedding ---------------------------------------------------------------------------------------------
    # The embedding's GGUF type id and width when its blocks are the GgufGather's initializer (a tied gguf head reuses
    # that initializer); a type the operators do not run falls back to a float32 Gather.
    embed_gguf: tuple[int, int] | None = None
    embed_kind = plan.embed
    if embed_kind == "gguf":
        eb = blocks("token_embd.weight")
        if eb.op_supported:
            b.raw("token_embd.gguf_blocks", eb.data)  # [vocab, row_bytes] uint8
            embed_gguf = (eb.ggml_type, eb.k)
            h = b.op1(  # [1, S, H] ([B, S, H] batched)
                "GgufGather", ["token_embd.gguf_blocks", "input_ids"], name="embed", ggml_type=eb.ggml_type, K=eb.k
            )
        else:
            embed_kind = "float"
        del eb
    embed_bits = MATRIX_KINDS[embed_kind]
    if embed_gguf is not None:
        pass  # written above
    elif embed_bits is None:
        b.weight("token_embd.weight", w("token_embd.weight"))  # [vocab, H]
        h = b.op1("Gather", ["token_embd.weight", "input_ids"], name="embed", axis=0)  # [1, S, H]
    else:
        bq = quant("token_embd.weight", embed_bits)
        packed, scales, zp = pack_matmul_nbits(bq)  # the same bytes as MatMulNBits' B, viewed [vocab, H * bits / 8]
        n_blocks = bq.scales.shape[1]
        h = b.op1(
            "GatherBlockQuantized",
            [
                b.raw("token_embd.qweight", packed.reshape(spec.vocab_size, -1)),
                "input_ids",
                b.raw("token_embd.scales", scales.reshape(spec.vocab_size, n_blocks)),
                b.raw("token_embd.zero_points", zp.reshape(spec.vocab_size, -1)),
            ],
            name="embed",
            bits=bq.bits,
            block_size=bq.block_size,
            gather_axis=0,
            quantize_axis=1,
        )
        del bq, packed, scales, zp
    done("token_embd.weight")
    if spec.arch.embed_scale:  # Gemma: the embeddings times sqrt(hidden_size)
        b.const("const_embed_scale", np.array(np.sqrt(H), dtype=ft))
        h = b.op1("Mul", [h, "const_embed_scale"], name="embed/scale")

    def post_norm(x: str, name: str, tag: str) -> str:
        """RMSNorm of a branch's output before the residual add (Gemma's post-attention / post-MLP norms)."""
        b.weight(name, w(name))
        done(name)
        if batched:  # float32 only
            return b.rms_norm(x, name, "const_eps", tag)
        return b.head_norm(x, name, 1, H, spec.rms_norm_eps, tag)  # float32 statistics in every dtype

    # ----- blocks ------------------------------------------------------------------------------------------------
    # The residual stream: layer 0 normalizes the embedding; afterwards every RMSNorm is fused with the residual
    # add before it (SkipSimplifiedLayerNormalization returns both the normalized sum and the sum).
    residual = h
    branch: str | None = None  # output of the previous attention / MLP branch, not yet added to `residual`
    for i in range(spec.num_layers):
        p = f"blk.{i}"
        b.weight(f"{p}.attn_norm.weight", w(f"{p}.attn_norm.weight"))
        done(f"{p}.attn_norm.weight")
        if branch is None:
            x = b.rms_norm(residual, f"{p}.attn_norm.weight", "const_eps", f"{p}/attn_norm")
        else:
            x, residual = b.skip_rms_norm(
                branch, residual, f"{p}.attn_norm.weight", spec.rms_norm_eps, f"{p}/attn_norm"
            )
        qkv = linear(x, [f"{p}.attn_{n}.weight" for n in "qkv"], "attn", f"{p}.attn_qkv")
        if spec.qkv_bias:
            bias = np.concatenate([w(f"{p}.attn_{n}.bias") for n in "qkv"])
            b.weight(f"{p}.attn_qkv.bias", bias)
            for n in "qkv":
                done(f"{p}.attn_{n}.bias")
            qkv = b.op1("Add", [qkv, f"{p}.attn_qkv.bias"], name=f"{p}/qkv_bias")
        norms = None
        if spec.qk_norm:  # Qwen3: per-head RMSNorm of q and k after the projections, before rotary
            norms = (f"{p}.attn_q_norm.weight", f"{p}.attn_k_norm.weight")
            for n in norms:
                b.weight(n, w(n))
                done(n)
        layer_window = spec.layer_window(i, window)
        rope = "rope_local" if local_rope and spec.layer_rope_theta(i) != spec.rope_theta else "rope"
        if batched:
            tail = "" if rope == "rope" else "_rope_local"
            layer_masks = {
                "past": masks["past" if layer_window is not None else "past_full"],
                "causal": masks["causal" if layer_window is not None else "causal_full"],
                "split": masks["split"],
                **{f"{n}_{qk}": masks[f"{n}_{qk}{tail}"] for n in ("cos", "sin") for qk in "qk"},
            }
            attn = [b.masked_attention(qkv, i, nh, kvh, hd, layer_masks, norms, spec.scale)]
        else:
            qkv_in = [qkv, "", ""]  # packed: GroupQueryAttention splits it
            if norms is not None:  # normed q and k reach GroupQueryAttention unpacked
                q, k, v = b.split_qkv(qkv, nh, kvh, hd, f"{p}/qkv_split")
                q = b.head_norm(q, norms[0], nh, hd, spec.rms_norm_eps, f"{p}/q_norm")
                k = b.head_norm(k, norms[1], kvh, hd, spec.rms_norm_eps, f"{p}/k_norm")
                qkv_in = [q, k, v]
            attn = b.op(
                "GroupQueryAttention",
                [
                    *qkv_in,
                    f"past_key_values.{i}.key",
                    f"past_key_values.{i}.value",
                    seqlens_k,
                    total_len,
                    f"{rope}_cos_cache",
                    f"{rope}_sin_cache",
                ],
                n_out=3,
                name=f"{p}/attn",
                num_heads=nh,
                kv_num_heads=kvh,
                do_rotary=1,
                rotary_interleaved=0,
                scale=spec.scale,
                # Since ONNX Runtime 1.24 (microsoft/onnxruntime#25927) a window w admits w keys, the query's own
                # included, as Hugging Face's sliding_window; 1.20-1.23 admit w + 1 (MIN_ONNXRUNTIME_WINDOW).
                **({} if layer_window is None else {"local_window_size": layer_window}),
            )
            # Rename the cache outputs to the contract's graph-output names.
            b.nodes[-1].output[1] = f"present.{i}.key"
            b.nodes[-1].output[2] = f"present.{i}.value"
        branch = linear(attn[0], [f"{p}.attn_output.weight"], "attn", f"{p}.attn_output")
        if spec.arch.sandwich_norms:
            branch = post_norm(branch, f"{p}.post_attention_norm.weight", f"{p}/post_attention_norm")

        b.weight(f"{p}.ffn_norm.weight", w(f"{p}.ffn_norm.weight"))
        done(f"{p}.ffn_norm.weight")
        x, residual = b.skip_rms_norm(branch, residual, f"{p}.ffn_norm.weight", spec.rms_norm_eps, f"{p}/ffn_norm")
        gu = linear(x, [f"{p}.ffn_gate.weight", f"{p}.ffn_up.weight"], "mlp", f"{p}.ffn_gate_up")
        gate, up = b.op("Split", [gu], n_out=2, name=f"{p}/split", axis=-1, num_outputs=2)
        if spec.arch.mlp_activation == "gelu_tanh":  # FastGelu: GELU's tanh approximation, float32 kernel on the CPU
            g32 = gate if plan.dtype == "fp32" else b.op1("Cast", [gate], name=f"{p}/gate32", to=TensorProto.FLOAT)
            act = b.op1("FastGelu", [g32], name=f"{p}/gelu")
            if plan.dtype != "fp32":
                act = b.op1("Cast", [act], name=f"{p}/gelu16", to=ft_proto)
        else:
            act = b.op1("Mul", [gate, b.op1("Sigmoid", [gate], name=f"{p}/sigmoid")], name=f"{p}/silu")
        act = b.op1("Mul", [act, up], name=f"{p}/gated")
        branch = linear(act, [f"{p}.ffn_down.weight"], "down", f"{p}.ffn_down")
        if spec.arch.sandwich_norms:
            branch = post_norm(branch, f"{p}.post_ffw_norm.weight", f"{p}/post_ffw_norm")

    # ----- head --------------------------------------------------------------------------------------------------
    b.weight("output_norm.weight", w("output_norm.weight"))
    done("output_norm.weight")
    assert branch is not None
    h, _ = b.skip_rms_norm(branch, residual, "output_norm.weight", spec.rms_norm_eps, "output_norm")
    if graph_form:
        # The positions whose logits are wanted, as a tensor (a device gather: nothing computed on the host).
        h = b.op1("Gather", [h, "logits_index"], name="keep/gather", axis=1)
    else:
        # Keep the last num_logits_to_keep positions before the lm_head (0 -> starts = 0 -> all of them).
        starts = b.op1(
            "Unsqueeze", [b.op1("Neg", ["num_logits_to_keep"], name="keep/neg"), "const_axes_0"], name="keep/s"
        )
        h = b.op1("Slice", [h, starts, "const_int64_max", "const_axes_1"], name="keep/slice")
    head_name = "token_embd.weight" if spec.tied_embeddings else "output.weight"
    head_kind = plan.head
    head_blocks: GGUFBlocks | None = None  # the head's blocks when not the embedding's initializer
    head_gguf = embed_gguf if spec.tied_embeddings else None  # (type id, width) of a gguf head
    if head_kind == "gguf" and (head_gguf is None or head_rows is not None):
        head_blocks = blocks(head_name)
        head_gguf = (head_blocks.ggml_type, head_blocks.k) if head_blocks.op_supported else None
    if head_kind == "gguf" and head_gguf is None:
        head_kind, head_blocks = "float", None  # a type the operators do not run: a float32 Gemm
    head_shares_embed = spec.tied_embeddings and head_kind == "float" and embed_kind == "float"
    head_bits = MATRIX_KINDS[head_kind]
    if head_rows is not None and head_kind != "gguf":
        sub = np.ascontiguousarray(w(head_name)[head_rows])  # [N, H]
    if head_kind == "gguf":  # GgufMatMul keeps the [1, n, H] -> [1, n, vocab] shape ([B, n, H] -> [B, n, vocab])
        assert head_gguf is not None
        if head_blocks is None:
            head_init = "token_embd.gguf_blocks"  # tied: the embedding's initializer, its bytes written once
        elif head_rows is not None:  # a pruned head: a row subset of the blocks, [N, row_bytes]
            head_init = b.raw("lm_head_subset.gguf_blocks", np.ascontiguousarray(head_blocks.data[head_rows]))
        else:
            head_init = b.raw(
                "output.gguf_blocks" if not spec.tied_embeddings else "lm_head.gguf_blocks", head_blocks.data
            )
        del head_blocks
        gguf_matmul(b, h, head_init, head_gguf[0], head_gguf[1], n_out, "lm_head")
        b.nodes[-1].output[0] = "logits"
    elif head_bits is not None:  # MatMulNBits keeps the [1, n, H] -> [1, n, vocab] shape
        bq = quant(head_name, head_bits) if head_rows is None else quantize_rtn(sub, head_bits, plan.block_size)
        logits = b.matmul_nbits(h, bq, "lm_head", plan.accuracy_level)
        del bq
        b.nodes[-1].output[0] = "logits"
    else:
        # [vocab, H], used with transB=1: no transposed copy. Tied: the embedding itself unless it was quantized.
        head = (
            "token_embd.weight"
            if head_shares_embed
            else ("output.weight" if not spec.tied_embeddings else "lm_head.weight")
        )
        if head_rows is not None:
            head = "lm_head_subset.weight"
            b.weight(head, sub)
        elif not head_shares_embed:
            b.weight(head, w(head_name))
        h2 = b.op1("Reshape", [h, "const_shape_2d"], name="lm_head/flatten")
        logits2 = b.op1("Gemm", [h2, head], name="lm_head", transB=1)
        shape_logits = "const_shape_logits"
        if batched:  # [batch_size, n, vocab]: the leading dims of h, then the width
            lead = b.op1("Shape", [h], name="logits/lead", start=0, end=2)
            b.const("const_width", np.array([n_out], dtype=np.int64))
            shape_logits = b.op1("Concat", [lead, "const_width"], name="logits/shape", axis=0)
        if plan.dtype == "fp32":
            b.nodes.append(helper.make_node("Reshape", [logits2, shape_logits], ["logits"], name="logits/reshape"))
        else:
            logits = b.op1("Reshape", [logits2, "const_shape_logits"], name="logits/reshape")
            b.nodes.append(helper.make_node("Cast", [logits], ["logits"], name="logits/cast", to=TensorProto.FLOAT))
    if graph_form:
        # Greedy decoding reads only these ids: [1, n] int64, the first maximum of each row (ONNX ArgMax keeps the
        # first index on ties, as specrt's sampler does).
        b.nodes.append(helper.make_node("ArgMax", ["logits"], ["argmax"], name="argmax", axis=-1, keepdims=0))
    if not spec.tied_embeddings:
        done("output.weight")

    graph = helper.make_graph(b.nodes, graph_name, inputs, outputs, initializer=b.inits)
    opsets = [helper.make_opsetid("", OPSET), helper.make_opsetid("com.microsoft", 1)]
    if any(n.domain == SPECRT_DOMAIN for n in b.nodes):
        opsets.append(helper.make_opsetid(SPECRT_DOMAIN, 1))
    model = helper.make_model(graph, opset_imports=opsets, producer_name="specrt.convert")
    model.ir_version = IR_VERSION
    return model
