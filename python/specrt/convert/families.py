"""The converter's family table: what each decoder architecture has (:class:`ArchInfo`, :data:`ARCH_INFO`: biases, q/k
norms, fused projections, windows, norms, activations, ...) and the one description of a model both readers fill
(:class:`ModelSpec`), with the checks they share (:func:`checked_sliding_window`, :func:`fused_rows`)."""

from __future__ import annotations

import math
from collections.abc import Container
from dataclasses import dataclass

from specrt.convert.errors import UnsupportedModelError

__all__ = [
    "ARCH_INFO",
    "DEFAULT_ROPE_LOCAL_THETA",
    "GGUF_ARCHITECTURES",
    "GGUF_ONLY",
    "ArchInfo",
    "ModelSpec",
    "checked_sliding_window",
    "fused_rows",
]


@dataclass(frozen=True)
class ArchInfo:
    """What distinguishes one supported decoder family from another.

    Attributes:
        name: the GGUF ``general.architecture`` value.
        qk_permuted: llama.cpp stores the Q/K projection rows permuted for its interleaved rotary.
        qkv_bias: the family normally has biases on q/k/v (they are used whenever present either way).
        hf_architecture: the Hugging Face class name, for the NOTICE and config.
        qk_norm: every layer has a per-head RMSNorm on q and on k (weights ``[head_dim]``, GGUF
            ``blk.N.attn_q_norm.weight`` / ``attn_k_norm.weight``), applied after the projections and before rotary.
        in_gguf: llama.cpp writes the family's GGUFs under this ``general.architecture``. False for ``mistral``,
            which llama.cpp writes as ``llama`` (a GGUF naming ``mistral`` is refused as llama.cpp refuses it).
        sliding_window: the Hugging Face ``config.json`` key ``sliding_window`` (int or null) is read: each query
            attends only the last ``sliding_window`` positions (:attr:`ModelSpec.sliding_window`).
        sandwich_norms: every layer also normalizes the attention and the MLP outputs before adding them to the
            residual (GGUF ``blk.N.post_attention_norm.weight`` / ``post_ffw_norm.weight``: Gemma 2 / 3).
        mlp_activation: the gate's activation: ``"silu"`` (SwiGLU) or ``"gelu_tanh"`` (GeGLU with the tanh
            approximation of GELU, Hugging Face ``gelu_pytorch_tanh``: Gemma).
        embed_scale: the token embeddings are multiplied by ``sqrt(hidden_size)`` (Gemma).
        norm_offset: a Hugging Face folder's RMSNorm weights are used as ``norm_offset + w`` (Gemma's ``1 + w``);
            llama.cpp's converter stores the sum in the GGUF (``Gemma3Model.norm_shift``), so GGUF weights are used as
            stored.
        local_layers_pattern: with a sliding window, layer i attends globally (full causal attention, rotary base
            ``rope_theta``) when ``i % p == p - 1`` and through the window (rotary base ``rope_local_theta``)
            otherwise, ``p`` being this default of ``{arch}.attention.sliding_window_pattern`` (llama.cpp's
            ``load_swa_pattern``; Gemma 3: 6). None: every layer uses the window and ``rope_theta``.
        float16_range: the family's activations stay within float16's range, so ``dtype="fp16"`` converts; False
            refuses it (Gemma 3: Gemma-3-270M's fp16 graph gave NaN logits, benches/RESULTS.md).
        fused: the q/k/v projections are stored as one matrix (GGUF ``blk.N.attn_qkv.weight``, Hugging Face
            ``self_attn.qkv_proj.weight``; rows q, k, v) and gate/up as one (GGUF ``blk.N.ffn_up.weight``, Hugging
            Face ``mlp.gate_up_proj.weight``; ``[2F, H]``, the gate's rows first: llama.cpp's ``ggml_swiglu`` and
            transformers' ``Phi3MLP`` both take the first half as the gate). The readers hand the parts out under
            the unfused names (:func:`fused_rows`).
        partial_rotary: only the first ``rotary_dim`` of each head's ``head_dim`` values are rotated (GGUF
            ``rope.dimension_count``; Hugging Face ``partial_rotary_factor``).
    """

    name: str
    qk_permuted: bool
    qkv_bias: bool
    hf_architecture: str
    qk_norm: bool = False
    in_gguf: bool = True
    sliding_window: bool = False
    fused: bool = False
    partial_rotary: bool = False
    sandwich_norms: bool = False
    mlp_activation: str = "silu"
    embed_scale: bool = False
    norm_offset: float = 0.0
    local_layers_pattern: int | None = None
    float16_range: bool = True


#: Supported architectures. A new llama-like family is one row here (plus any extra tensors in graph.py).
ARCH_INFO: dict[str, ArchInfo] = {
    "llama": ArchInfo("llama", qk_permuted=True, qkv_bias=False, hf_architecture="LlamaForCausalLM"),
    "qwen2": ArchInfo("qwen2", qk_permuted=False, qkv_bias=True, hf_architecture="Qwen2ForCausalLM"),
    # Qwen3: the qwen2 decoder without q/k/v biases, with q/k norms and a head_dim of its own (attention.key_length).
    "qwen3": ArchInfo("qwen3", qk_permuted=False, qkv_bias=False, hf_architecture="Qwen3ForCausalLM", qk_norm=True),
    # Mistral: the llama decoder with config.json's head_dim (Mistral NeMo: 128 over 5120 / 32 = 160) and an optional
    # sliding window (Mistral 7B v0.1: 4096). Hugging Face folders only: its GGUFs say "llama" (q/k rows permuted).
    "mistral": ArchInfo(
        "mistral",
        qk_permuted=True,
        qkv_bias=False,
        hf_architecture="MistralForCausalLM",
        in_gguf=False,
        sliding_window=True,
    ),
    # Phi-3 / Phi-3.5 / Phi-4-mini: the llama decoder (half-split rotary, no permutation) with fused qkv and gate/up
    # projections, longrope scaling (Phi-3.5, Phi-4-mini) and partial rotary (Phi-4-mini: 0.75).
    "phi3": ArchInfo(
        "phi3",
        qk_permuted=False,
        qkv_bias=False,
        hf_architecture="Phi3ForCausalLM",
        sliding_window=True,
        fused=True,
        partial_rotary=True,
    ),
    # Gemma 3 (text): q/k norms, four norms per layer, GeGLU, embeddings scaled by sqrt(hidden), interleaved local
    # (sliding-window, rotary base 10000) and global layers (every 6th), tied embeddings. NEOX rotary, unpermuted.
    "gemma3": ArchInfo(
        "gemma3",
        qk_permuted=False,
        qkv_bias=False,
        hf_architecture="Gemma3ForCausalLM",
        qk_norm=True,
        sliding_window=True,
        sandwich_norms=True,
        mlp_activation="gelu_tanh",
        embed_scale=True,
        norm_offset=1.0,
        local_layers_pattern=6,
        float16_range=False,
    ),
}
#: Families whose Hugging Face folders the converter refuses (``config.json`` ``model_type`` -> why), before any work.
GGUF_ONLY = {
    "gemma3": "Gemma 3 Hugging Face folders (model_type gemma3) are not supported yet (the norms' 1 + w, "
    "query_pre_attn_scalar and the layer pattern are not read from config.json); convert its GGUF instead",
}
#: llama.cpp's rotary base of the sliding-window layers when ``{arch}.rope.freq_base_swa`` is absent
#: (``llama_hparams::rope_freq_base_train_swa``; Hugging Face Gemma 3's ``rope_local_base_freq``).
DEFAULT_ROPE_LOCAL_THETA = 10000.0
#: The ``general.architecture`` values a GGUF may have.
GGUF_ARCHITECTURES = tuple(sorted(name for name, info in ARCH_INFO.items() if info.in_gguf))


def checked_sliding_window(value: object, max_positions: int, field: str) -> int | None:
    """The sliding window of :attr:`ModelSpec.sliding_window` from a config value.

    Args:
        value: the window in positions as the source gives it (``None`` = full attention).
        max_positions: the model's trained context (``max_position_embeddings``).
        field: where ``value`` was read (for the message), e.g. ``config.json sliding_window``.

    Returns:
        ``value`` as an int, or None when it is None or ``>= max_positions`` (then no query ever has a key outside
        its window: full causal attention).

    Raises:
        UnsupportedModelError: ``value`` is not a positive integer.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UnsupportedModelError(
            f"sliding-window attention ({field}) must be a positive integer or null, got {value!r}"
        )
    return None if value >= max_positions else value


@dataclass(frozen=True)
class ModelSpec:
    """Hyperparameters of a decoder-only transformer read from GGUF metadata.

    Attributes:
        architecture: a key of :data:`ARCH_INFO` (``llama``, ``qwen2``, ``qwen3``, ``mistral``, ``phi3``, ``gemma3``).
        num_layers: transformer blocks.
        hidden_size: model width H.
        intermediate_size: SwiGLU width F.
        num_attention_heads: query heads.
        num_kv_heads: key/value heads (GQA groups).
        head_dim: per-head width; ``num_attention_heads * head_dim`` is the q projection width.
        vocab_size: rows of the token embedding (= logits width).
        rms_norm_eps: epsilon of every RMSNorm.
        rope_theta: rotary base frequency.
        max_position_embeddings: trained context length (size of the cos/sin caches).
        tied_embeddings: the lm_head reuses the token embedding (no ``output.weight``).
        qkv_bias: q/k/v projections have biases.
        qk_norm: per-head RMSNorm of q and k before rotary (``blk.N.attn_q_norm.weight`` / ``attn_k_norm.weight``,
            ``[head_dim]``, epsilon ``rms_norm_eps``).
        rope_freq_factors: Llama 3.x's rotary frequency divisors, float ``[head_dim / 2]`` (GGUF
            ``rope_freqs.weight``; Hugging Face ``rope_scaling`` of type ``llama3``: :mod:`specrt.convert.rope`), or
            None for plain RoPE.
        sliding_window: the query at position i attends the keys at positions j with ``i - sliding_window < j <= i``
            (``sliding_window`` keys, itself included: Hugging Face Mistral's ``sliding_window`` and llama.cpp's
            ``attention.sliding_window``); None: every earlier key (full causal attention). Never
            ``>= max_position_embeddings`` (:func:`checked_sliding_window`).
        local_layers_pattern: interleaved local and global layers (:attr:`ArchInfo.local_layers_pattern`): layer i
            is global iff ``i % local_layers_pattern == local_layers_pattern - 1``; None: all layers alike.
        rope_local_theta: the rotary base of the local layers (with ``local_layers_pattern``).
        attention_scale: the factor of q . k (None: ``1 / sqrt(head_dim)``; Gemma 3 27B: ``1 / sqrt(hidden /
            heads)``, Hugging Face ``query_pre_attn_scalar ** -0.5``).
        rotary_dim: the rotated width of each head (its first ``rotary_dim`` values; even, ``<= head_dim``), or
            None for all of ``head_dim``.
        rope_long_freq_factors: longrope's long divisors ``[rotary_dim / 2]`` (then :attr:`rope_freq_factors` holds
            the short ones; :func:`specrt.convert.rope.longrope_choice` picks per graph), or None.
        rope_original_context: longrope's ``original_max_position_embeddings`` (the switch), or None.
        rope_attn_factor: multiplies the rotary cos and sin (longrope's attention factor; 1 otherwise).
    """

    architecture: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tied_embeddings: bool
    qkv_bias: bool
    qk_norm: bool = False
    rope_freq_factors: tuple[float, ...] | None = None
    sliding_window: int | None = None
    rotary_dim: int | None = None
    rope_long_freq_factors: tuple[float, ...] | None = None
    rope_original_context: int | None = None
    rope_attn_factor: float = 1.0
    local_layers_pattern: int | None = None
    rope_local_theta: float | None = None
    attention_scale: float | None = None

    @property
    def arch(self) -> ArchInfo:
        """The :class:`ArchInfo` row of this architecture."""
        return ARCH_INFO[self.architecture]

    def is_global_layer(self, i: int) -> bool:
        """Whether layer ``i`` attends globally with ``rope_theta`` in a model of interleaved local and global layers
        (:attr:`local_layers_pattern`); False for every layer of other models."""
        p = self.local_layers_pattern
        return p is not None and i % p == p - 1

    def layer_window(self, i: int, window: int | None) -> int | None:
        """The sliding window of layer ``i`` given the model's effective ``window`` (None on global layers)."""
        return None if self.is_global_layer(i) else window

    def layer_rope_theta(self, i: int) -> float:
        """The rotary base of layer ``i``: ``rope_local_theta`` on the local layers of an interleaved model."""
        if self.local_layers_pattern is None or self.is_global_layer(i) or self.rope_local_theta is None:
            return self.rope_theta
        return self.rope_local_theta

    @property
    def scale(self) -> float:
        """The attention scale (:attr:`attention_scale`, default ``1 / sqrt(head_dim)``)."""
        return self.attention_scale if self.attention_scale is not None else 1.0 / math.sqrt(self.head_dim)

    @property
    def rope_dim(self) -> int:
        """The rotated width of each head: :attr:`rotary_dim`, or :attr:`head_dim` without partial rotary."""
        return self.head_dim if self.rotary_dim is None else self.rotary_dim


def fused_rows(name: str, spec: ModelSpec, stored: Container[str]) -> tuple[str, slice] | None:
    """Where an unfused tensor of a family with fused projections (:attr:`ArchInfo.fused`) lives.

    Args:
        name: a GGUF name the converter asks for (``blk.N.attn_q.weight`` ... ``blk.N.ffn_gate.weight``).
        spec: the model's hyperparameters.
        stored: the names the source stores.

    Returns:
        ``("blk.N.attn_qkv.weight", rows)`` for ``attn_q`` / ``attn_k`` / ``attn_v`` (rows ``[0, nh hd)``,
        ``[nh hd, (nh + kvh) hd)``, ``[(nh + kvh) hd, (nh + 2 kvh) hd)``) when ``attn_qkv`` is stored;
        ``("blk.N.ffn_up.weight", rows)`` for ``ffn_gate`` (``[0, F)``) and ``ffn_up`` (``[F, 2F)``) when no
        ``ffn_gate`` is stored; None for every other tensor or family.
    """
    if not spec.arch.fused or not name.startswith("blk."):
        return None
    _, i, part = name.split(".", 2)
    q, kv, f = spec.num_attention_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim, spec.intermediate_size
    qkv = {"attn_q.weight": slice(0, q), "attn_k.weight": slice(q, q + kv), "attn_v.weight": slice(q + kv, q + 2 * kv)}
    if part in qkv and f"blk.{i}.attn_qkv.weight" in stored:
        return f"blk.{i}.attn_qkv.weight", qkv[part]
    gate_up = {"ffn_gate.weight": slice(0, f), "ffn_up.weight": slice(f, 2 * f)}
    if part in gate_up and f"blk.{i}.ffn_gate.weight" not in stored:
        return f"blk.{i}.ffn_up.weight", gate_up[part]
    return None
