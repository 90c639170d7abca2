"""NumPy forward pass of a GGUF decoder, the test oracle for the converted ONNX graph.

Deliberately written the way llama.cpp defines the models rather than the way the converter builds its graph: it
uses the tensors *as stored* (no Q/K un-permutation) with llama.cpp's RoPE mode for the architecture (``llama``:
interleaved pairs ``(2i, 2i+1)``; ``qwen2`` / ``qwen3``: half-split pairs ``(i, i + d/2)``), separate q/k/v and gate/up
projections, ``qwen3``'s per-head q/k RMSNorm on the ``[S, heads, head_dim]`` view, Llama 3.x's ``rope_freqs`` frequency
divisors read from the file, an explicit causal mask (banded to the last ``sliding_window`` positions when the spec
has a window: Hugging Face's ``sliding_window_overlay``, key j visible to query i iff ``i - window < j <= i``),
Gemma 3's layers as llama.cpp's ``gemma3`` graph runs them (embeddings times sqrt(hidden), norms after attention and
after the MLP, GELU with the tanh approximation, local layers windowed with their own rotary base, global layers
not), and float64 arithmetic. Agreement with the ONNX graph therefore checks the
un-permutation, the fused projections and the rotary setup, not just the plumbing. Phi-3's fused ``attn_qkv`` and
``ffn_up`` (gate | up) are split here from the stored matrices' products, its partial rotary (``rope.dimension_count``)
and longrope (``rope_factors_short`` / ``rope_factors_long`` by the context, ``rope.scaling.attn_factor`` on cos and
sin) read from the file as llama.cpp reads them.

Slow and memory-hungry by design (full recompute, no cache); fine for tiny models and for short prompts on
SmolLM2-135M.
"""

from __future__ import annotations

import numpy as np

from specrt.convert.families import ModelSpec
from specrt.convert.gguf_reader import GGUFModel

__all__ = ["ROPE_MODE", "int8_blocks", "reference_logits"]

#: llama.cpp's rotary layout per architecture (``llama_model_rope_type``): NORM = adjacent pairs, NEOX = halves.
ROPE_MODE = {"llama": "norm", "qwen2": "neox", "qwen3": "neox", "mistral": "norm", "phi3": "neox", "gemma3": "neox"}


def _rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU's tanh approximation (Hendrycks and Gimpel 2016; PyTorch ``gelu(approximate="tanh")``)."""
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def _rope(
    x: np.ndarray,
    positions: np.ndarray,
    theta: float,
    mode: str,
    factors: np.ndarray | None,
    n_rot: int | None = None,
    attn_factor: float = 1.0,
) -> np.ndarray:
    """Rotate ``x`` ``[S, heads, d]`` at ``positions`` ``[S]``; ``factors`` ``[n_rot/2]`` divide the frequencies
    (llama.cpp's ``rope_freqs`` / ``freq_factors``: Llama 3.x, Phi-3's longrope sets). As ``ggml_rope_ext``: only the
    first ``n_rot`` values of a head rotate (``rope.dimension_count``; the rest are copied) and cos / sin are
    multiplied by ``attn_factor`` (``mscale``)."""
    if n_rot is not None and n_rot < x.shape[-1]:
        rotated = _rope(x[..., :n_rot], positions, theta, mode, factors, None, attn_factor)
        return np.concatenate([rotated, x[..., n_rot:]], axis=-1)
    d = x.shape[-1]
    inv_freq = 1.0 / (theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
    if factors is not None:
        inv_freq = inv_freq / factors
    ang = positions[:, None].astype(np.float64) * inv_freq[None, :]  # [S, d/2]
    cos, sin = attn_factor * np.cos(ang)[:, None, :], attn_factor * np.sin(ang)[:, None, :]
    if mode == "norm":
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = a * cos - b * sin
        out[..., 1::2] = a * sin + b * cos
        return out
    a, b = x[..., : d // 2], x[..., d // 2 :]
    return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)


def _rope_setup(model: GGUFModel, arch: str, head_dim: int, context: int) -> tuple[np.ndarray | None, int, float]:
    """``(frequency divisors, n_rot, attn_factor)`` read from the file as llama.cpp reads them: ``rope_freqs`` or,
    for longrope, ``rope_factors_long`` when ``context`` exceeds ``rope.scaling.original_context_length`` (default
    the training context), else ``rope_factors_short`` (``llama_model::get_rope_factors`` with ``n_ctx_seq``)."""
    n_rot = int(model.get(f"{arch}.rope.dimension_count", head_dim))
    attn_factor = float(model.get(f"{arch}.rope.scaling.attn_factor", 1.0))
    factors = None
    if "rope_freqs.weight" in model.tensors:
        factors = model.raw_tensor("rope_freqs.weight").astype(np.float64)
    elif "rope_factors_long.weight" in model.tensors:
        original = int(model.get(f"{arch}.rope.scaling.original_context_length", model.get(f"{arch}.context_length")))
        name = "rope_factors_long.weight" if context > original else "rope_factors_short.weight"
        factors = model.raw_tensor(name).astype(np.float64)
    return factors, n_rot, attn_factor


def int8_blocks(x: np.ndarray, block: int = 32) -> np.ndarray:
    """``x`` (``[..., K]``, ``K`` a multiple of ``block``) as int8 per block of ``block`` values sees it: each block's
    values rounded to multiples of its scale ``d = max |x| / 127`` (half away from zero, as llama.cpp's
    ``quantize_row_q8_0`` / ``q8_K`` and the ``ai.specrt::GgufMatMul`` kernel), i.e. ``d * round(x / d)``; each value
    moves by at most ``d / 2``, 1/254 of its block's largest magnitude. Same shape and dtype."""
    b = x.reshape(*x.shape[:-1], -1, block)
    d = np.abs(b).max(axis=-1, keepdims=True) / 127.0
    scaled = np.divide(b, d, out=np.zeros_like(b), where=d > 0)
    return (np.sign(scaled) * np.floor(np.abs(scaled) + 0.5) * d).reshape(x.shape)


def reference_logits(
    model: GGUFModel,
    token_ids: list[int] | np.ndarray,
    spec: ModelSpec | None = None,
    context: int | None = None,
    *,
    int8_activations: bool = False,
) -> np.ndarray:
    """Logits of every position of ``token_ids`` (positions 0..S-1), computed from scratch in float64.

    Args:
        model: the opened GGUF.
        token_ids: ``S`` token ids.
        spec: hyperparameters (read from ``model`` when omitted).
        context: the context size the model runs with (llama.cpp's ``n_ctx``; specrt's ``max_positions``), which
            picks longrope's short or long factors; default ``spec.max_position_embeddings``.
        int8_activations: the input of every weight matrix of a type in
            :data:`~specrt.convert.gguf_reader.GGUF_OP_TYPES` (q/k/v, o, gate/up, down, head) through
            :func:`int8_blocks` first, per block of the matrix type's own block length (32; 256 for the K types, as
            llama.cpp's ``vec_dot_type`` Q8_0 / Q8_K): what ``dtype="gguf"``'s ``ai.specrt::GgufMatMul`` computes
            (the oracle of that form; float matrices and the embedding lookup are exact either way).

    Returns:
        float64 ``[S, vocab_size]``.
    """
    spec = spec or model.spec()
    ids = np.asarray(token_ids, dtype=np.int64)
    S, nh, kvh, hd = len(ids), spec.num_attention_heads, spec.num_kv_heads, spec.head_dim
    mode = ROPE_MODE[spec.architecture]
    pos = np.arange(S)

    def t(name: str) -> np.ndarray:
        return model.raw_tensor(name).astype(np.float64)

    def a(x: np.ndarray, name: str) -> np.ndarray:  # the input of weight matrix `name`
        import gguf

        from specrt.convert.gguf_reader import GGUF_OP_TYPES

        qtype = model.tensors[name].tensor_type
        if not int8_activations or qtype.name not in GGUF_OP_TYPES:
            return x
        return int8_blocks(x, gguf.GGML_QUANT_SIZES[qtype][0])

    # Read from the file as llama.cpp does (not from spec), so the reader's handling of it is checked too.
    factors, n_rot, attn_factor = _rope_setup(
        model, model.architecture, hd, spec.max_position_embeddings if context is None else context
    )
    embed = model.raw_tensor("token_embd.weight")
    h = embed[ids].astype(np.float64)  # [S, H]
    if spec.arch.embed_scale:
        h = h * np.sqrt(spec.hidden_size)
    for i in range(spec.num_layers):
        p = f"blk.{i}"
        # [S, S] additive mask: -inf where key j is after query i or, with a window, at or before i - window
        causal = np.triu(np.full((S, S), -np.inf), k=1)
        window = spec.layer_window(i, spec.sliding_window)
        if window is not None:
            causal += np.tril(np.full((S, S), -np.inf), k=-window)
        theta = spec.layer_rope_theta(i)
        x = _rms_norm(h, t(f"{p}.attn_norm.weight"), spec.rms_norm_eps)
        if f"{p}.attn_qkv.weight" in model.tensors:  # phi3: one fused matrix, rows q | k | v
            q, k, v = np.split(
                a(x, f"{p}.attn_qkv.weight") @ t(f"{p}.attn_qkv.weight").T, [nh * hd, (nh + kvh) * hd], axis=-1
            )
        else:
            q, k, v = (a(x, f"{p}.attn_{n}.weight") @ t(f"{p}.attn_{n}.weight").T for n in "qkv")
        if f"{p}.attn_q.bias" in model.tensors:
            q, k, v = q + t(f"{p}.attn_q.bias"), k + t(f"{p}.attn_k.bias"), v + t(f"{p}.attn_v.bias")
        q, k = q.reshape(S, nh, hd), k.reshape(S, kvh, hd)
        if spec.qk_norm:  # qwen3: RMSNorm of each head's q and k (weights [hd]) before rotary
            q = _rms_norm(q, t(f"{p}.attn_q_norm.weight"), spec.rms_norm_eps)
            k = _rms_norm(k, t(f"{p}.attn_k_norm.weight"), spec.rms_norm_eps)
        q = _rope(q, pos, theta, mode, factors, n_rot, attn_factor)
        k = _rope(k, pos, theta, mode, factors, n_rot, attn_factor)
        v = v.reshape(S, kvh, hd)
        group = nh // kvh
        out = np.empty((S, nh, hd))
        for head in range(nh):
            kv = head // group
            scores = q[:, head, :] @ k[:, kv, :].T * spec.scale + causal
            scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
            out[:, head, :] = (scores / scores.sum(axis=-1, keepdims=True)) @ v[:, kv, :]
        o = a(out.reshape(S, nh * hd), f"{p}.attn_output.weight") @ t(f"{p}.attn_output.weight").T
        if spec.arch.sandwich_norms:
            o = _rms_norm(o, t(f"{p}.post_attention_norm.weight"), spec.rms_norm_eps)
        h = h + o
        x = _rms_norm(h, t(f"{p}.ffn_norm.weight"), spec.rms_norm_eps)
        if f"{p}.ffn_gate.weight" in model.tensors:
            gate = a(x, f"{p}.ffn_gate.weight") @ t(f"{p}.ffn_gate.weight").T
            up = a(x, f"{p}.ffn_up.weight") @ t(f"{p}.ffn_up.weight").T
        else:  # phi3: ffn_up holds both halves, the gate first (llama.cpp's ggml_swiglu)
            gate, up = np.split(a(x, f"{p}.ffn_up.weight") @ t(f"{p}.ffn_up.weight").T, 2, axis=-1)
        act = _gelu_tanh(gate) if spec.arch.mlp_activation == "gelu_tanh" else gate / (1.0 + np.exp(-gate))
        o = a(act * up, f"{p}.ffn_down.weight") @ t(f"{p}.ffn_down.weight").T
        if spec.arch.sandwich_norms:
            o = _rms_norm(o, t(f"{p}.post_ffw_norm.weight"), spec.rms_norm_eps)
        h = h + o
    h = _rms_norm(h, t("output_norm.weight"), spec.rms_norm_eps)
    head_name = "token_embd.weight" if spec.tied_embeddings else "output.weight"
    head = embed if spec.tied_embeddings else model.raw_tensor("output.weight")
    return a(h, head_name) @ head.T.astype(np.float64)
