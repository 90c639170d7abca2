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
un-permutation, the fused projections and the rotary setup, not just the plumbing.

Slow and memory-hungry by design (full recompute, no cache); fine for tiny models and for short prompts on
SmolLM2-135M.
"""

from __future__ import annotations

import numpy as np

from specrt.convert.gguf_reader import GGUFModel, ModelSpec

__all__ = ["ROPE_MODE", "reference_logits"]

#: llama.cpp's rotary layout per architecture (``llama_model_rope_type``): NORM = adjacent pairs, NEOX = halves.
ROPE_MODE = {"llama": "norm", "qwen2": "neox", "qwen3": "neox", "mistral": "norm", "gemma3": "neox"}


def _rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU's tanh approximation (Hendrycks and Gimpel 2016; PyTorch ``gelu(approximate="tanh")``)."""
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def _rope(x: np.ndarray, positions: np.ndarray, theta: float, mode: str, factors: np.ndarray | None) -> np.ndarray:
    """Rotate ``x`` ``[S, heads, d]`` at ``positions`` ``[S]``; ``factors`` ``[d/2]`` divide the frequencies
    (llama.cpp's ``rope_freqs`` / ``freq_factors``, Llama 3.x)."""
    d = x.shape[-1]
    inv_freq = 1.0 / (theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
    if factors is not None:
        inv_freq = inv_freq / factors
    ang = positions[:, None].astype(np.float64) * inv_freq[None, :]  # [S, d/2]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    if mode == "norm":
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = a * cos - b * sin
        out[..., 1::2] = a * sin + b * cos
        return out
    a, b = x[..., : d // 2], x[..., d // 2 :]
    return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)


def reference_logits(model: GGUFModel, token_ids: list[int] | np.ndarray, spec: ModelSpec | None = None) -> np.ndarray:
    """Logits of every position of ``token_ids`` (positions 0..S-1), computed from scratch in float64.

    Args:
        model: the opened GGUF.
        token_ids: ``S`` token ids.
        spec: hyperparameters (read from ``model`` when omitted).

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

    # Read from the file as llama.cpp does (not from spec), so the reader's handling of it is checked too.
    factors = t("rope_freqs.weight") if "rope_freqs.weight" in model.tensors else None
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
        q, k, v = (x @ t(f"{p}.attn_{n}.weight").T for n in "qkv")
        if f"{p}.attn_q.bias" in model.tensors:
            q, k, v = q + t(f"{p}.attn_q.bias"), k + t(f"{p}.attn_k.bias"), v + t(f"{p}.attn_v.bias")
        q, k = q.reshape(S, nh, hd), k.reshape(S, kvh, hd)
        if spec.qk_norm:  # qwen3: RMSNorm of each head's q and k (weights [hd]) before rotary
            q = _rms_norm(q, t(f"{p}.attn_q_norm.weight"), spec.rms_norm_eps)
            k = _rms_norm(k, t(f"{p}.attn_k_norm.weight"), spec.rms_norm_eps)
        q = _rope(q, pos, theta, mode, factors)
        k = _rope(k, pos, theta, mode, factors)
        v = v.reshape(S, kvh, hd)
        group = nh // kvh
        out = np.empty((S, nh, hd))
        for head in range(nh):
            kv = head // group
            scores = q[:, head, :] @ k[:, kv, :].T * spec.scale + causal
            scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
            out[:, head, :] = (scores / scores.sum(axis=-1, keepdims=True)) @ v[:, kv, :]
        o = out.reshape(S, nh * hd) @ t(f"{p}.attn_output.weight").T
        if spec.arch.sandwich_norms:
            o = _rms_norm(o, t(f"{p}.post_attention_norm.weight"), spec.rms_norm_eps)
        h = h + o
        x = _rms_norm(h, t(f"{p}.ffn_norm.weight"), spec.rms_norm_eps)
        gate, up = x @ t(f"{p}.ffn_gate.weight").T, x @ t(f"{p}.ffn_up.weight").T
        act = _gelu_tanh(gate) if spec.arch.mlp_activation == "gelu_tanh" else gate / (1.0 + np.exp(-gate))
        o = (act * up) @ t(f"{p}.ffn_down.weight").T
        if spec.arch.sandwich_norms:
            o = _rms_norm(o, t(f"{p}.post_ffw_norm.weight"), spec.rms_norm_eps)
        h = h + o
    h = _rms_norm(h, t("output_norm.weight"), spec.rms_norm_eps)
    head = embed if spec.tied_embeddings else model.raw_tensor("output.weight")
    return h @ head.T.astype(np.float64)
