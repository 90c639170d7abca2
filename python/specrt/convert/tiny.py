"""Write tiny random-weight GGUF decoders (llama, qwen2, qwen3, mistral, phi3 or gemma3 layout) for tests: a few
hundred kB, written in milliseconds, with a small byte-level BPE tokenizer and a ChatML template in the metadata.

The weights are random, so llama.cpp's Q/K permutation of ``llama`` files is simply "how these bytes are meant to be
read": the reference forward pass reads them with llama.cpp's interleaved rotary, the converter un-permutes them.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

__all__ = ["CHATML_TEMPLATE", "MISTRAL_TEMPLATE", "tiny_vocab", "write_hf_folder", "write_tiny_gguf"]

CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
    "'\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

#: Mistral 7B Instruct v0.1's ``[INST]`` template (the tiny SentencePiece models' chat template).
MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] "
    "+ ' [/INST]' }}{% else %}{{ message['content'] + eos_token + ' ' }}{% endif %}{% endfor %}"
)


def _bytes_to_unicode() -> list[str]:
    """GPT-2's reversible byte -> printable character map, as a list indexed by byte value."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]


def tiny_vocab() -> tuple[list[str], list[int], list[str]]:
    """A 265-token byte-level BPE vocabulary: 256 byte tokens, 5 merges, 3 control tokens, 1 user-defined token.

    Returns:
        ``(tokens, token_types, merges)`` in GGUF form (llama.cpp token types, merges as ``"a b"``).
    """
    tokens = _bytes_to_unicode()
    merges = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a"]
    tokens += ["Ġt", "he", "Ġthe", "in", "Ġa"]
    types = [1] * len(tokens)
    tokens += ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>"]
    types += [3, 3, 3, 4]
    return tokens, types, merges


def _random_kquant(rng: np.random.Generator, rows: int, cols: int, qtype: str) -> np.ndarray:
    """Random but well-formed Q4_K / Q5_K / Q6_K blocks (finite scales), as the uint8 byte array GGUF stores
    (``[rows, cols / 256 * block_bytes]``; gguf-py cannot quantize the K types, so their bytes are drawn)."""
    if cols % 256:
        raise ValueError(f"{qtype} needs rows whose length is a multiple of 256, got {cols}")
    nblk = cols // 256
    if qtype == "Q4_K":
        blk = rng.integers(0, 256, size=(rows, nblk, 144), dtype=np.uint8)
        blk[..., 0:2] = np.frombuffer(np.float16(0.002).tobytes(), np.uint8)  # d
        blk[..., 2:4] = np.frombuffer(np.float16(0.001).tobytes(), np.uint8)  # dmin
    elif qtype == "Q5_K":  # d, dmin, scales[12], qh[32], qs[128]
        blk = rng.integers(0, 256, size=(rows, nblk, 176), dtype=np.uint8)
        blk[..., 0:2] = np.frombuffer(np.float16(0.001).tobytes(), np.uint8)  # d
        blk[..., 2:4] = np.frombuffer(np.float16(0.0005).tobytes(), np.uint8)  # dmin
    elif qtype == "Q6_K":
        blk = rng.integers(0, 256, size=(rows, nblk, 210), dtype=np.uint8)
        blk[..., 192:208] = rng.integers(-8, 8, size=(rows, nblk, 16), dtype=np.int8).view(np.uint8)  # scales
        blk[..., 208:210] = np.frombuffer(np.float16(0.0005).tobytes(), np.uint8)  # d
    else:  # pragma: no cover
        raise ValueError(qtype)
    return blk.reshape(rows, nblk * blk.shape[-1])


def write_tiny_gguf(
    path: str | os.PathLike[str],
    *,
    arch: str = "llama",
    n_layers: int = 2,
    hidden: int = 64,
    n_heads: int = 4,
    n_kv_heads: int = 2,
    ffn: int = 128,
    context: int = 256,
    rope_theta: float = 10000.0,
    tied: bool = True,
    qkv_bias: bool | None = None,
    matrix_type: str = "Q8_0",
    embed_type: str = "F32",
    with_tokenizer: bool = True,
    rope_scaling: str | None = None,
    seed: int = 0,
    pad_rows: int = 0,
    head_dim: int | None = None,
    rope_scaling_llama3: dict[str, float] | None = None,
    sliding_window: int | None = None,
    spm_vocab: tuple[list[str], list[float], list[int]] | None = None,
    rotary_dim: int | None = None,
    longrope: dict | None = None,
    bpe_vocab: tuple[list[str], list[int], list[str]] | None = None,
    sliding_window_pattern: int | None = None,
    rope_local_theta: float | None = None,
    matrix_types: dict[str, str] | None = None,
) -> Path:
    """Write a random-weight decoder GGUF.

    Args:
        path: file to create.
        arch: ``general.architecture`` (any string; unsupported ones let tests check the error), or ``mistral``:
            written as llama.cpp writes Mistral, a ``llama`` file (permuted q/k rows) named ``tiny-random-mistral``
            (:func:`write_hf_folder` makes it a ``MistralForCausalLM`` folder).
        n_layers, hidden, n_heads, n_kv_heads, ffn: sizes (``hidden`` divisible by ``n_heads``; multiples of 32 for
            32-element quant blocks, of 256 for ``Q4_K`` / ``Q6_K``).
        context: ``{arch}.context_length``.
        rope_theta: rotary base.
        tied: omit ``output.weight`` (lm_head = token embedding).
        qkv_bias: write q/k/v biases (default: ``arch == "qwen2"``).
        matrix_type: GGML type of projection matrices: F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (quantized by gguf-py
            from random floats), Q4_K, Q5_K, Q6_K (random well-formed blocks).
        embed_type: GGML type of ``token_embd`` / ``output``.
        with_tokenizer: write the tokenizer metadata and chat template.
        rope_scaling: value of ``{arch}.rope.scaling.type`` (e.g. ``"yarn"``), or None for no key.
        seed: RNG seed.
        pad_rows: extra rows of the token embedding and output head beyond the tokenizer's ids (padding no token maps
            to, as Qwen2.5 7B's 152064 rows over a 151665-id tokenizer). Random, from a generator of their own, so
            every other weight is that of ``pad_rows=0`` with the same seed.
        head_dim: per-head width (``{arch}.attention.key_length`` / ``value_length`` are written when it differs from
            ``hidden // n_heads``); default: ``2 * hidden // n_heads`` for ``qwen3`` (Qwen3's head_dim is its own,
            e.g. 128 over a 1024 / 16 = 64 split in Qwen3-0.6B), else ``hidden // n_heads``. ``qwen3`` files also
            get the per-head q/k norms (``blk.N.attn_q_norm.weight`` / ``attn_k_norm.weight``, non-trivial weights).
        rope_scaling_llama3: a Hugging Face ``rope_scaling`` of type ``llama3`` (keys ``factor``,
            ``low_freq_factor``, ``high_freq_factor``, ``original_max_position_embeddings``): written as llama.cpp's
            converter writes Llama 3.x, a float32 ``rope_freqs.weight`` ``[head_dim / 2]`` of frequency divisors
            (:func:`specrt.convert.rope.llama3_freq_factors`) and no ``rope.scaling`` keys.
        sliding_window: each query attends the last ``sliding_window`` positions (``{arch}.attention.sliding_window``;
            :attr:`specrt.convert.families.ModelSpec.sliding_window`), or None for full attention.
        spm_vocab: a SentencePiece vocabulary ``(pieces, scores, llama.cpp token types)`` by id, written as llama.cpp
            writes Llama 2 / Mistral tokenizers (``tokenizer.ggml.model = llama``, ids 0 / 1 / 2 = unknown / BOS /
            EOS, ``add_bos_token``, the ``[INST]`` chat template of :data:`MISTRAL_TEMPLATE`) instead of the byte-level
            BPE vocabulary of :func:`tiny_vocab`; the embedding has one row per piece.
        sliding_window_pattern: ``{arch}.attention.sliding_window_pattern`` (``gemma3``: every p-th layer global).
        rope_local_theta: ``{arch}.rope.freq_base_swa`` (``gemma3``: the local layers' rotary base).
        matrix_types: GGML types of single matrices, overriding ``matrix_type``: keyed by a tensor's name without
            ``.weight`` (``"blk.1.ffn_down"``) or by its part in every layer (``"attn_v"``), as llama.cpp's Q4_K_M
            keeps some ``attn_v`` / ``ffn_down`` matrices in Q6_K.

    ``gemma3`` files have Gemma 3's tensors: per-head q/k norms, ``post_attention_norm`` / ``post_ffw_norm`` (the
    norms stored as llama.cpp stores them, ``1 + w``: weights ~ 1).

        rotary_dim: ``{arch}.rope.dimension_count`` when it differs from ``head_dim`` (partial rotary, ``phi3``).
        longrope: a Hugging Face longrope scaling: ``short_factor`` / ``long_factor`` (``[rotary width / 2]``
            lists) and ``original_max_position_embeddings``, written as llama.cpp's converter writes Phi-3.5:
            float32 ``rope_factors_short.weight`` / ``rope_factors_long.weight``,
            ``{arch}.rope.scaling.original_context_length`` and ``{arch}.rope.scaling.attn_factor``
            (:func:`specrt.convert.rope.longrope_attention_factor` of ``context``).

        bpe_vocab: a byte-level BPE vocabulary ``(tokens, llama.cpp token types, merges "a b")`` instead of
            :func:`tiny_vocab`'s, its last three tokens BOS / EOS / a user-defined one and the fourth from the end the
            pad (as :func:`tiny_vocab`'s); the embedding has one row per token.

    ``phi3`` files store q/k/v as one ``attn_qkv`` matrix and gate/up as one ``ffn_up`` ``[2 ffn, hidden]`` (the
    gate's rows first), as llama.cpp's converter writes Phi-3.

    Returns:
        ``Path(path)``.
    """
    import gguf
    from gguf.quants import quantize

    rng = np.random.default_rng(seed)
    tokens, types, merges = bpe_vocab or (tiny_vocab() if spm_vocab is None else (spm_vocab[0], spm_vocab[2], []))
    vocab = len(tokens)
    qk_norm = arch in ("qwen3", "gemma3")
    sandwich = arch == "gemma3"
    if head_dim is None:
        head_dim = (2 if arch == "qwen3" else 1) * hidden // n_heads
    if qkv_bias is None:
        qkv_bias = arch == "qwen2"
    path = Path(path)
    family, arch = arch, "llama" if arch == "mistral" else arch
    w = gguf.GGUFWriter(str(path), arch)
    # phi3: named as Phi-3.5-mini with a SentencePiece vocabulary (as Phi-3.5's), else as Phi-4-mini (byte-level BPE):
    # llama.cpp's loader sets attributes on the pieces "</s>", "<unk>", "<s>" and "<|endoftext|>" of a model whose name
    # says "phi3" / "phi-3" (a byte-level vocabulary has none)
    name = f"tiny-random-{family}"
    if family == "phi3":
        name = "tiny-random-phi-3.5-mini" if spm_vocab is not None else "tiny-random-phi-4-mini"
    w.add_name(name)
    w.add_license("apache-2.0")
    w.add_block_count(n_layers)
    w.add_context_length(context)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(n_heads)
    w.add_head_count_kv(n_kv_heads)
    if head_dim != hidden // n_heads:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_rope_freq_base(rope_theta)
    if sliding_window is not None:
        w.add_sliding_window(sliding_window)
    if rotary_dim is not None:
        w.add_rope_dimension_count(rotary_dim)
    if longrope is not None:
        from specrt.convert.rope import longrope_attention_factor

        original = int(longrope["original_max_position_embeddings"])
        w.add_rope_scaling_orig_ctx_len(original)
        w.add_rope_scaling_attn_factors(longrope_attention_factor(context, original))
    if sliding_window_pattern is not None:
        w.add_uint32(f"{arch}.attention.sliding_window_pattern", sliding_window_pattern)
    if rope_local_theta is not None:
        w.add_float32(f"{arch}.rope.freq_base_swa", rope_local_theta)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab + pad_rows)
    if rope_scaling is not None:
        w.add_string(f"{arch}.rope.scaling.type", rope_scaling)
        w.add_float32(f"{arch}.rope.scaling.factor", 4.0)
    if with_tokenizer and spm_vocab is not None:
        w.add_tokenizer_model("llama")
        w.add_token_list(tokens)
        w.add_token_scores([float(x) for x in spm_vocab[1]])
        w.add_token_types(types)
        w.add_unk_token_id(0)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_add_bos_token(True)
        w.add_add_eos_token(False)
        w.add_chat_template(MISTRAL_TEMPLATE)
    elif with_tokenizer:
        w.add_tokenizer_model("gpt2")
        # phi3 as Phi-4-mini's GGUF (o200k's split)
        w.add_tokenizer_pre({"qwen2": "qwen2", "qwen3": "qwen2", "phi3": "gpt-4o"}.get(arch, "smollm"))
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges)
        w.add_bos_token_id(vocab - 3)
        w.add_eos_token_id(vocab - 2)
        w.add_pad_token_id(vocab - 4)
        w.add_add_bos_token(False)
        w.add_chat_template(CHATML_TEMPLATE)

    pad_rng = np.random.default_rng([seed, pad_rows])

    def draw(rows: int, cols: int, scale: float) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * scale).astype(np.float32)

    def put(name: str, x: np.ndarray, qtype: str) -> None:
        if qtype == "F32":
            w.add_tensor(name, x)
        elif qtype == "F16":
            w.add_tensor(name, x.astype(np.float16))
        elif qtype in ("Q4_K", "Q5_K", "Q6_K"):
            raise ValueError(f"fused phi3 matrices need a matrix_type other than {qtype}")
        else:
            q = gguf.GGMLQuantizationType[qtype]
            w.add_tensor(name, quantize(x, q), raw_dtype=q)

    def mat(name: str, rows: int, cols: int, qtype: str, scale: float, pad: bool = False) -> None:
        if name.startswith("blk.") and matrix_types:
            stem = name.removesuffix(".weight")
            qtype = matrix_types.get(stem, matrix_types.get(stem.split(".", 2)[2], qtype))
        if qtype in ("Q4_K", "Q5_K", "Q6_K"):
            if pad and pad_rows:
                raise ValueError(f"pad_rows needs an embed_type other than {qtype}")
            w.add_tensor(name, _random_kquant(rng, rows, cols, qtype), raw_dtype=gguf.GGMLQuantizationType[qtype])
            return
        x = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
        if pad and pad_rows:
            x = np.concatenate([x, pad_rng.standard_normal((pad_rows, cols)) * scale]).astype(np.float32)
        if qtype == "F32":
            w.add_tensor(name, x)
        elif qtype == "F16":
            w.add_tensor(name, x.astype(np.float16))
        else:
            q = gguf.GGMLQuantizationType[qtype]
            w.add_tensor(name, quantize(x, q), raw_dtype=q)

    def vec(name: str, n: int, mean: float, scale: float) -> None:
        w.add_tensor(name, (mean + rng.standard_normal(n) * scale).astype(np.float32))

    # Gemma scales the embeddings by sqrt(hidden): smaller rows keep the scaled residual from drowning the layers
    mat("token_embd.weight", vocab, hidden, embed_type, 0.1 if sandwich else 1.0, pad=True)
    for i in range(n_layers):
        p = f"blk.{i}"
        vec(f"{p}.attn_norm.weight", hidden, 1.0, 0.1)
        if arch == "phi3":  # rows q | k | v in one matrix
            rows = (n_heads * head_dim, n_kv_heads * head_dim, n_kv_heads * head_dim)
            put(f"{p}.attn_qkv.weight", np.concatenate([draw(r, hidden, 0.3) for r in rows]), matrix_type)
        else:
            mat(f"{p}.attn_q.weight", n_heads * head_dim, hidden, matrix_type, 0.3)
            mat(f"{p}.attn_k.weight", n_kv_heads * head_dim, hidden, matrix_type, 0.3)
            mat(f"{p}.attn_v.weight", n_kv_heads * head_dim, hidden, matrix_type, 0.3)
        if qkv_bias:
            vec(f"{p}.attn_q.bias", n_heads * head_dim, 0.0, 0.5)
            vec(f"{p}.attn_k.bias", n_kv_heads * head_dim, 0.0, 0.5)
            vec(f"{p}.attn_v.bias", n_kv_heads * head_dim, 0.0, 0.5)
        if qk_norm:
            vec(f"{p}.attn_q_norm.weight", head_dim, 1.0, 0.3)
            vec(f"{p}.attn_k_norm.weight", head_dim, 1.0, 0.3)
        mat(f"{p}.attn_output.weight", hidden, n_heads * head_dim, matrix_type, 0.2)
        if sandwich:
            vec(f"{p}.post_attention_norm.weight", hidden, 1.0, 0.3)
        vec(f"{p}.ffn_norm.weight", hidden, 1.0, 0.1)
        if arch == "phi3":  # gate | up in one matrix, the gate first
            put(f"{p}.ffn_up.weight", np.concatenate([draw(ffn, hidden, 0.2), draw(ffn, hidden, 0.2)]), matrix_type)
        else:
            mat(f"{p}.ffn_gate.weight", ffn, hidden, matrix_type, 0.2)
            mat(f"{p}.ffn_up.weight", ffn, hidden, matrix_type, 0.2)
        mat(f"{p}.ffn_down.weight", hidden, ffn, matrix_type, 0.2)
        if sandwich:
            vec(f"{p}.post_ffw_norm.weight", hidden, 1.0, 0.3)
    vec("output_norm.weight", hidden, 1.0, 0.1)
    if rope_scaling_llama3 is not None:
        from specrt.convert.rope import rope_scaling_factors

        factors = rope_scaling_factors({"rope_type": "llama3", **rope_scaling_llama3}, rope_theta, head_dim)
        w.add_tensor("rope_freqs.weight", np.asarray(factors, dtype=np.float32))
    if longrope is not None:
        for kind in ("short", "long"):
            w.add_tensor(f"rope_factors_{kind}.weight", np.asarray(longrope[f"{kind}_factor"], dtype=np.float32))
    if not tied:
        mat("output.weight", vocab, hidden, embed_type, 0.5, pad=True)
    try:  # write_header_to_file opens the file: close it on every path
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
    finally:
        w.close()
    return path


def write_hf_folder(
    gguf_path: str | os.PathLike[str],
    folder: str | os.PathLike[str],
    *,
    shards: int = 1,
    dtype: str = "F32",
    drop: tuple[str, ...] = (),
    generation_config: dict | None = None,
    rope_scaling: dict | None = None,
    model_type: str | None = None,
) -> Path:
    """Write the weights of a (tiny) GGUF as a Hugging Face model folder, for tests of the safetensors input.

    Tensors are written dequantized, with llama Q/K rows un-permuted (the Hugging Face layout), so converting the
    folder must give the same model as converting the GGUF.

    Args:
        gguf_path: the GGUF (e.g. from :func:`write_tiny_gguf`).
        folder: the folder to create (``config.json``, ``model.safetensors`` or shards +
            ``model.safetensors.index.json``, ``tokenizer.json``, ``tokenizer_config.json``,
            ``generation_config.json``).
        shards: number of safetensors files (> 1 writes an index).
        dtype: ``"F32"``, ``"F16"`` or ``"BF16"`` (bfloat16 written by hand: numpy has no such dtype).
        drop: Hugging Face tensor names to leave out (error tests).
        generation_config: contents of ``generation_config.json`` (default: EOS ids, ``do_sample`` with
            temperature 0.7 / top_p 0.8).
        rope_scaling: ``config.json``'s ``rope_scaling`` (e.g. ``{"rope_type": "llama3", "factor": 8.0, ...}``);
            required when the GGUF carries ``rope_freqs.weight`` (the factors it implies must equal the file's).
        model_type: ``config.json``'s ``model_type`` (a key of ``ARCH_INFO``). Default: the GGUF's architecture, but
            ``mistral`` for a ``tiny-random-mistral`` file (:func:`write_tiny_gguf`'s ``arch="mistral"``) or any
            ``llama`` file with a sliding window. A family with a window (``mistral``) gets ``sliding_window``.

    Returns:
        ``Path(folder)``.

    Raises:
        ValueError: ``rope_scaling`` missing for, or disagreeing with, the GGUF's ``rope_freqs.weight``; a GGUF with
            a sliding window written as a family without one.
    """
    import json
    import struct

    from specrt.convert.families import ARCH_INFO
    from specrt.convert.gguf_reader import GGUFModel
    from specrt.convert.hf_reader import _GLOBAL_NAMES, layer_names
    from specrt.convert.tokenizer import build_tokenizer

    with GGUFModel(gguf_path) as model:
        spec = model.spec()
        tensors: dict[str, np.ndarray] = {}
        from specrt.convert.rope import rope_scaling_factors

        implied: np.ndarray | None
        stored: tuple[float, ...] | None
        if rope_scaling and rope_scaling.get("rope_type") == "longrope":  # the file's sets are the config's
            implied = np.asarray([*rope_scaling["short_factor"], *rope_scaling["long_factor"]], dtype=np.float64)
            stored = spec.rope_freq_factors
            if spec.rope_long_freq_factors is not None and stored is not None:
                stored = (*stored, *spec.rope_long_freq_factors)
        else:
            implied = rope_scaling_factors(rope_scaling, spec.rope_theta, spec.head_dim)
            stored = spec.rope_freq_factors
        if (implied is None) != (stored is None) or (
            stored is not None and not np.allclose(implied, stored, rtol=1e-6, atol=0)
        ):
            raise ValueError(f"rope_scaling {rope_scaling!r} does not give the GGUF's rope_freqs.weight")
        for name in model.tensors:
            if name.startswith("rope_f"):  # rope_freqs / rope_factors_*: config.json's rope_scaling carries them
                continue
            if name in _GLOBAL_NAMES:
                hf = _GLOBAL_NAMES[name]
            else:
                _, i, rest = name.split(".", 2)
                hf = f"model.layers.{i}.{layer_names(spec.architecture)[rest]}"
            if hf not in drop:  # fused phi3 matrices as stored (tensor() would hand out a part)
                tensors[hf] = model.raw_tensor(name) if spec.arch.fused else model.tensor(name, spec)
        tok, info = build_tokenizer(model)
        if model_type is None:
            mistral = model.get("general.name") == "tiny-random-mistral" or spec.sliding_window is not None
            model_type = "mistral" if spec.architecture == "llama" and mistral else spec.architecture
    arch = ARCH_INFO[model_type]
    if spec.sliding_window is not None and not arch.sliding_window:
        raise ValueError(f"the GGUF has a sliding window, which a {model_type!r} folder cannot carry")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    names = sorted(tensors)
    per = -(-len(names) // shards)
    weight_map = {}
    for s in range(shards):
        part = names[s * per : (s + 1) * per]
        fname = "model.safetensors" if shards == 1 else f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        header: dict = {"__metadata__": {"format": "pt"}}
        blobs, off = [], 0
        for n in part:
            x = tensors[n]
            if dtype == "BF16":
                raw = (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()
            else:
                raw = x.astype(np.float16 if dtype == "F16" else np.float32).tobytes()
            header[n] = {"dtype": dtype, "shape": list(x.shape), "data_offsets": [off, off + len(raw)]}
            blobs.append(raw)
            off += len(raw)
            weight_map[n] = fname
        h = json.dumps(header).encode()
        h += b" " * (-len(h) % 8)
        (folder / fname).write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    if shards > 1:
        index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    config = {
        "architectures": [arch.hf_architecture],
        "model_type": model_type,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "num_hidden_layers": spec.num_layers,
        "head_dim": spec.head_dim,
        "max_position_embeddings": spec.max_position_embeddings,
        "rms_norm_eps": spec.rms_norm_eps,
        "rope_theta": spec.rope_theta,
        "rope_scaling": rope_scaling,
        "vocab_size": spec.vocab_size,
        "tie_word_embeddings": spec.tied_embeddings,
        "torch_dtype": {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}[dtype],
        **({"sliding_window": spec.sliding_window} if arch.sliding_window else {}),
        **({"partial_rotary_factor": spec.rope_dim / spec.head_dim} if spec.rotary_dim is not None else {}),
        **(
            {"original_max_position_embeddings": spec.rope_original_context}
            if spec.rope_original_context is not None
            else {}
        ),
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    tok.save(str(folder / "tokenizer.json"))

    def name(i: int | None) -> str | None:
        return None if i is None else tok.id_to_token(i)

    tok_cfg = {
        "add_bos_token": info.add_bos_token,
        "eos_token": name(info.eos_token_ids[0]),
        "pad_token": name(info.pad_token_id),
        "chat_template": info.chat_template,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2))
    gen = generation_config
    if gen is None:
        gen = {"eos_token_id": info.eos_token_ids, "do_sample": True, "temperature": 0.7, "top_p": 0.8}
    (folder / "generation_config.json").write_text(json.dumps(gen, indent=2))
    return folder
