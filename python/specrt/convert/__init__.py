"""GGUF -> ONNX conversion for specrt (fp32, GroupQueryAttention with one shared KV buffer per layer).

Entry point: :func:`convert`. The output folder follows ARCHITECTURE.md ("ONNX decoder contract"):

=========================  ==========================================================================================
``model.onnx``             the graph (initializers point into ``model.onnx.data``)
``model.onnx.data``        fp32 weights, page-aligned
``tokenizer.json``         Hugging Face ``tokenizers`` file built from the GGUF metadata
``chat_template.jinja``    the GGUF's ``tokenizer.chat_template`` (absent if the GGUF has none)
``tokenizer_config.json``  special tokens and chat template for transformers' ``AutoTokenizer.from_pretrained``
``generation_config.json`` ``bos_token_id``, ``eos_token_id`` (a list with every end-of-turn id), ``pad_token_id``
``specrt_config.json``     shapes, ids and provenance the runtime needs (see :func:`convert`)
``NOTICE``                 where the weights came from and under which license
=========================  ==========================================================================================
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from specrt.convert.errors import (
    ConversionError,
    GGUFFormatError,
    OutputExistsError,
    TokenizerMetadataError,
    UnsupportedArchitectureError,
    UnsupportedModelError,
)
from specrt.convert.families import ARCH_INFO, ModelSpec, checked_sliding_window
from specrt.convert.gguf_reader import GGUFModel
from specrt.convert.graph import ATTENTION_FORMS, MIN_ONNXRUNTIME_WINDOW
from specrt.convert.hf_reader import HFFormatError, HFModel, hf_tokenizer, is_hf_folder
from specrt.convert.weights import INT8_WEIGHT_MAX, WeightPlan

__all__ = [
    "MIN_ONNXRUNTIME",
    "PREFILL_MIN_TOKENS",
    "PREFILL_PLAN",
    "SUPPORTED_ARCHITECTURES",
    "SUPPORTED_DTYPES",
    "ConversionError",
    "DiskSpaceError",
    "GGUFFormatError",
    "HFFormatError",
    "OutputExistsError",
    "TokenizerMetadataError",
    "UnsupportedArchitectureError",
    "UnsupportedModelError",
    "convert",
    "estimate_output_bytes",
    "gguf_fallbacks",
    "remove_stale_temporaries",
]

#: Oldest onnxruntime that runs the graphs (GroupQueryAttention with a past and several new tokens).
MIN_ONNXRUNTIME = "1.20"
SUPPORTED_ARCHITECTURES = tuple(sorted(ARCH_INFO))
#: ``fp32``: exact float32 (CPU reference). ``fp16``: float16 weights / activations / KV, float32 logits (CUDA).
#: ``int4``: block-quantized MatMulNBits weights with float32 activations (the fast CPU format; see
#: :data:`INT4_PLAN` and benches/RESULTS.md "int4 / fp16 conversion"). ``int8``: the same at 8 bits (slower,
#: close to fp32). ``gguf``: the GGUF's own quantized blocks, bit for bit (no requantization), on specrt's
#: ``ai.specrt::GgufMatMul`` / ``GgufGather`` operators with float32 activations (:data:`GGUF_PLAN`; GGUF sources
#: only; runs in specrt's own sessions only).
SUPPORTED_DTYPES = ("fp32", "fp16", "int4", "int8", "gguf")


class DiskSpaceError(ConversionError, OSError):
    """Not enough free disk space for the output (checked before anything is written)."""


def estimate_output_bytes(
    model: GGUFModel, spec: ModelSpec, max_positions: int | None = None, dtype: str = "fp32"
) -> int:
    """Upper bound of the bytes of ``model.onnx.data``: every tensor kept (blocks ``< spec.num_layers``) at 4 bytes
    (fp32), 2 bytes (fp16) or at most 1.25 bytes (int4: 8-bit codes + scales + zero points) per element, plus the
    two cos/sin caches. ``gguf``: the GGUF's own bytes of each tensor of a type the ``ai.specrt`` operators run
    (about the GGUF's size), 4 bytes per element of the others (dequantized to float32)."""
    from specrt.convert.gguf_reader import GGUF_OP_TYPES

    kept = [t for name, t in model.tensors.items() if _kept(name, spec.num_layers)]
    if dtype == "gguf":
        total = sum(
            int(t.n_bytes) if GGUF_OP_TYPES.get(_type_name(t.tensor_type)) is not None else 4 * int(t.n_elements)
            for t in kept
        )
    else:
        total = {"fp32": 4.0, "fp16": 2.0}.get(dtype, 1.25) * sum(int(t.n_elements) for t in kept)
    n_rope = (max_positions or spec.max_position_embeddings) * spec.head_dim
    return int(total + 4 * n_rope) + (1 << 20) * (spec.num_layers + 4)


def _type_name(tensor_type: Any) -> str:
    """A tensor type's name (``GGMLQuantizationType.Q4_K`` -> ``"Q4_K"``; a Hugging Face dtype string as it is)."""
    return str(getattr(tensor_type, "name", tensor_type))


def gguf_fallbacks(model: GGUFModel, spec: ModelSpec) -> dict[str, list[str]]:
    """The kept matrices that ``dtype="gguf"`` stores as float32 because the ``ai.specrt`` operators do not run
    their GGML type (not in :data:`~specrt.convert.gguf_reader.GGUF_OP_TYPES`).

    Returns:
        GGML type name -> the GGUF names of its 2-D tensors (sorted); empty when every matrix keeps its blocks.
    """
    from specrt.convert.gguf_reader import GGUF_OP_TYPES

    out: dict[str, list[str]] = {}
    for name, t in sorted(model.tensors.items()):
        kind = _type_name(t.tensor_type)
        if len(t.shape) == 2 and _kept(name, spec.num_layers) and kind not in GGUF_OP_TYPES:
            out.setdefault(kind, []).append(name)
    return out


def _rope_config(spec: ModelSpec, max_positions: int) -> dict[str, Any]:
    """specrt_config.json's rotary keys besides ``rope_theta``: ``rope_freq_factors`` (the divisors the graph uses:
    Llama 3.x's, or longrope's set for a graph of ``max_positions``), ``rotary_dim`` under partial rotary, and
    ``rope_scaling`` for longrope (which set, the switch, the attention factor)."""
    from specrt.convert.rope import longrope_choice

    factors = longrope_choice(
        spec.rope_freq_factors, spec.rope_long_freq_factors, spec.rope_original_context, max_positions
    )
    out: dict[str, Any] = {"rope_freq_factors": list(factors)} if factors else {}
    if spec.rotary_dim is not None:
        out["rotary_dim"] = spec.rotary_dim
    if spec.rope_long_freq_factors is not None:
        out["rope_scaling"] = {
            "rope_type": "longrope",
            "factors": "long" if factors == spec.rope_long_freq_factors else "short",
            "original_max_position_embeddings": spec.rope_original_context,
            "attention_factor": spec.rope_attn_factor,
        }
    return out


def _kept(tensor_name: str, num_layers: int) -> bool:
    """Whether GGUF tensor ``tensor_name`` belongs to the first ``num_layers`` blocks (or is not a block tensor)."""
    parts = tensor_name.split(".")
    return parts[0] != "blk" or int(parts[1]) < num_layers


def _progress(total: int, desc: str, unit: str, enabled: bool, unit_scale: bool = False) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, unit_scale=unit_scale, disable=not enabled, leave=False)


def _hash_with_progress(path: Path, enabled: bool) -> str:
    import hashlib

    h = hashlib.sha256()
    with (
        _progress(path.stat().st_size, f"sha256 {path.name}", "B", enabled, unit_scale=True) as bar,
        open(path, "rb") as f,
    ):
        while block := f.read(1 << 22):
            h.update(block)
            bar.update(len(block))
    return h.hexdigest()


def _hf_notice(model: HFModel, sha: str, provenance: str | None, dtype: str) -> str:
    lines = [
        "specrt model folder",
        "====================",
        "",
        f"Converted by specrt.convert from the Hugging Face folder {model.path.name} (SHA-256 of its config and "
        f"weight files: {sha}).",
        f"Model: {model.get('general.name')}",
        f"Architecture: {model.architecture}",
        "License: see the source folder (Hugging Face folders carry it in their README / LICENSE, not in the files "
        "read here).",
        "",
        *(_DTYPE_NOTES[dtype] if dtype != "fp32" else ["The weights were widened to float32 and written unchanged."]),
        "The weights remain under their upstream license; specrt's own code is Apache-2.0.",
    ]
    if provenance:
        lines += ["", provenance.rstrip()]
    return "\n".join(lines) + "\n"


def _notice(
    model: GGUFModel,
    src: Path,
    sha: str,
    provenance: str | None,
    dtype: str = "fp32",
    fallbacks: dict[str, list[str]] | None = None,
) -> str:
    lines = [
        "specrt model folder",
        "====================",
        "",
        f"Converted by specrt.convert from {src.name} (SHA-256 {sha}).",
        f"Model name (general.name): {model.get('general.name', 'unknown')}",
        f"Architecture: {model.architecture}",
        f"License declared in the GGUF (general.license): {model.get('general.license', 'none declared')}",
    ]
    keys = ("general.author", "general.organization", "general.url", "general.source.url", "general.repo_url")
    lines.extend(f"{key}: {model.get(key)}" for key in keys if model.has(key))
    lines += ["", *_DTYPE_NOTES[dtype]]
    if fallbacks:
        lines += [
            "Matrices of types the ai.specrt operators do not run were dequantized to float32 instead (float MatMul /",
            "Gather): "
            + "; ".join(
                f"{kind}: {len(names)} ({', '.join(names[:4])}{', ...' if len(names) > 4 else ''})"
                for kind, names in fallbacks.items()
            )
            + ".",
        ]
    lines += [
        "(Q/K projection rows of llama-family models are un-permuted back to the Hugging Face layout).",
        "The weights remain under their upstream license; specrt's own code is Apache-2.0.",
    ]
    if provenance:
        lines += ["", provenance.rstrip()]
    return "\n".join(lines) + "\n"


_DTYPE_NOTES = {
    "fp32": [
        "The weights were dequantized from the GGUF's quantized tensors to float32 and written unchanged otherwise"
    ],
    "fp16": ["The weights were dequantized from the GGUF's quantized tensors and rounded to float16"],
    "int4": [
        "Matrices are block-quantized for MatMulNBits: the GGUF's own codes where they map exactly, otherwise",
        "requantized to int4/int8 (round to nearest, block 32) from the dequantized weights",
    ],
}
_DTYPE_NOTES["int8"] = _DTYPE_NOTES["int4"]
_DTYPE_NOTES["gguf"] = [
    "Matrices and the token embedding are the GGUF's own quantized blocks, bit for bit: no dequantization, no",
    "requantization (Q4_K_M files stay Q4_K / Q6_K, Q4_1 stays Q4_1), run by specrt's ai.specrt::GgufMatMul /",
    "GgufGather operators (activations quantized to int8 per block of 32, of 256 for the K types, inside the kernel,",
    "as llama.cpp does);",
    "norm weights and biases are float32. The graph runs only in specrt's own ONNX Runtime sessions.",
]

#: Storage per weight kind for ``dtype="int4"`` (chosen from measured speed and logit error: benches/RESULTS.md).
INT4_PLAN = WeightPlan(dtype="fp32", attn="int4", mlp="int4", head="int4", embed="int8", accuracy_level=4)
#: Storage of the attention and MLP matrices in a model's prefill graph (``convert(..., prefill_graph=True)``): int8
#: with a scale per output channel on ONNX Runtime's integer GEMM (activations quantized per tensor per call); the
#: MLP's down projection, the head and the embedding keep the model's storage: the down projection's input carries
#: the largest activation outliers, and with it in int8 too SmolLM2's prefill graph agreed with the model's argmax
#: on 73% of positions (KL 0.60 nats) against 88% (KL 0.067) with it kept (benches/RESULTS.md, "Prefill graph").
PREFILL_PLAN = WeightPlan(dtype="fp32", attn="qint8", mlp="qint8")
#: Fewest new tokens per row for which a draft's pass runs on its prefill graph (measured on the Qwen2.5-Coder 0.5B
#: int4 draft, one row: 64.6 against 97.3 ms at 16 tokens, 65.4 against 70.1 ms at 8; benches/RESULTS.md).
PREFILL_MIN_TOKENS = 16
#: ``dtype="int8"``: every matrix at 8 bits (exact for Q8_0 / Q5_0 / Q6_K / Q4_0 sources, ~0.5% RMS otherwise).
INT8_PLAN = WeightPlan(dtype="fp32", attn="int8", mlp="int8", head="int8", embed="int8", accuracy_level=4)
#: ``dtype="gguf"``: every matrix and the embedding as the GGUF's own blocks (``ai.specrt::GgufMatMul`` /
#: ``GgufGather``), float32 activations and KV. With ``prefill_graph`` the prefill graph uses this plan too (the
#: kernel handles passes of many tokens; no int8 requantization).
GGUF_PLAN = WeightPlan(dtype="fp32", attn="gguf", mlp="gguf", head="gguf", embed="gguf")


def plan_for(dtype: str) -> WeightPlan:
    """The :class:`WeightPlan` of a ``dtype`` name (``fp32``, ``fp16``, ``int4``, ``int8``, ``gguf``).

    Raises:
        UnsupportedModelError: an unknown name (the message lists the supported ones).
    """
    if dtype == "fp32":
        return WeightPlan()
    if dtype == "fp16":
        return WeightPlan(dtype="fp16")
    if dtype == "int4":
        return INT4_PLAN
    if dtype == "int8":
        return INT8_PLAN
    if dtype == "gguf":
        return GGUF_PLAN
    raise UnsupportedModelError(f"dtype {dtype!r} is not supported; supported: {', '.join(SUPPORTED_DTYPES)}")


def _vocab_subset(
    subset: int | Sequence[int] | None,
    corpus: Sequence[str | os.PathLike[str]] | None,
    tokenizer: Any,
    tok_info: Any,
    vocab_size: int,
) -> tuple[np.ndarray | None, dict[str, Any]]:
    """The head rows of a pruned-vocabulary model (ascending ids) and how they were chosen."""
    if subset is None:
        return None, {}
    if isinstance(subset, int) and not isinstance(subset, bool):
        from specrt.convert.vocab_subset import frequent_token_ids

        missing = [str(f) for f in corpus or () if not Path(f).is_file()]
        if missing:
            raise UnsupportedModelError(f"vocab_corpus file not found: {', '.join(missing)}")
        always = [*tok_info.special_tokens.values(), *tok_info.eos_token_ids]
        if tok_info.bos_token_id is not None:
            always.append(tok_info.bos_token_id)
        try:
            ids, info = frequent_token_ids(tokenizer, subset, corpus, always=always, vocab_size=vocab_size)
        except ValueError as e:
            raise UnsupportedModelError(str(e)) from None
        return np.asarray(ids, dtype=np.int64), {"chosen_by": "corpus frequency", **info}
    ids = sorted({int(t) for t in subset})
    if not ids or ids[0] < 0 or ids[-1] >= vocab_size:
        raise UnsupportedModelError(
            f"vocab_subset ids must be non-empty and in 0 .. {vocab_size - 1} (got {len(ids)} ids, "
            f"range {ids[0] if ids else None} .. {ids[-1] if ids else None})"
        )
    return np.asarray(ids, dtype=np.int64), {"chosen_by": "given"}


def convert(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    dtype: str = "fp32",
    force: bool = False,
    max_positions: int | None = None,
    source_sha256: str | None = None,
    provenance: str | None = None,
    progress: bool = True,
    check: bool = True,
    num_layers: int | None = None,
    plan: WeightPlan | None = None,
    vocab_subset: int | Sequence[int] | None = None,
    vocab_corpus: Sequence[str | os.PathLike[str]] | None = None,
    attention: str = "gqa",
    prefill_graph: bool = False,
) -> Path:
    """Convert a GGUF file (``llama``, ``qwen2``, ``qwen3``) or a Hugging Face folder (those and ``mistral``) into a
    specrt ONNX model folder.

    The folder is written into a temporary sibling of ``out`` and renamed at the end, so an error (or Ctrl-C) leaves
    no half-written ``out``; the temporary siblings a killed conversion left (``kill -9``) are removed by the next
    (:func:`remove_stale_temporaries`). Peak memory is about twice the largest fp32 tensor (the embedding), not the
    model.

    Args:
        src: a ``.gguf`` file, or a Hugging Face folder: ``config.json``, ``model.safetensors`` (or shards with
            ``model.safetensors.index.json``), ``tokenizer.json``, optionally ``tokenizer_config.json`` (chat
            template) and ``generation_config.json`` (EOS ids, sampling defaults).
        out: the folder to create.
        dtype: ``"fp32"`` (exact), ``"fp16"`` (float16 weights, activations and KV cache, float32 logits: for CUDA)
            or ``"int4"`` (MatMulNBits block-quantized matrices, float32 activations and KV: for CPU; the storage per
            weight kind is :data:`INT4_PLAN`), ``"int8"`` (:data:`INT8_PLAN`) or ``"gguf"`` (the GGUF's own
            quantized blocks, bit for bit, on specrt's ``ai.specrt`` operators: :data:`GGUF_PLAN`; a GGUF source
            only; matrices of types the operators do not run are dequantized to float32 and listed in ``NOTICE``).
        force: replace ``out`` if it exists.
        max_positions: rows of the rotary cos/sin caches = the longest sequence the model accepts
            (default: the GGUF's ``context_length``).
        source_sha256: SHA-256 of ``src`` if already known (skips hashing the file again); for a folder, by
            default the SHA-256 of its files' hashes (:meth:`HFModel.files_sha256`).
        provenance: extra text for ``NOTICE`` (package names, hashes, upstream license).
        progress: show tqdm progress bars (hashing, dequantize + write).
        check: run ``onnx.checker`` on the result.
        num_layers: keep only the first ``num_layers`` decoder blocks (final norm and head as usual): a cheap
            self-draft sharing the tokenizer and the embedding. ``None`` keeps all of them.
        plan: override the storage per weight kind (experiments; ``dtype`` is then only recorded).
        vocab_subset: a pruned-vocabulary draft: the output layer scores only these token ids (a sequence), or the
            ``N`` most frequent ids of ``vocab_corpus`` plus every special token (an int; see
            :mod:`specrt.convert.vocab_subset`). Verification against a full target stays exactly lossless; the
            ids are written to ``vocab_subset.json``. ``None`` keeps the whole vocabulary.
        vocab_corpus: text files to count tokens in for an int ``vocab_subset`` (default: the Python standard
            library's sources and documentation topics).
        attention: ``"gqa"`` (default: the decoder contract of ARCHITECTURE.md, which specrt's runtime runs),
            ``"gqa-graph"`` (the same decoder with sequence lengths and logit positions as input tensors and a
            device-side ``argmax`` output: the form for CUDA graph capture; ARCHITECTURE.md "Graph form") or
            ``"batched"`` (rows of a batch on per-row caches, attention in standard ops; ARCHITECTURE.md "Batched
            rounds"; run with ``Decoder(max_batch > 1)``). ``"batched"`` needs float32 activations (fp32 or int4).
        prefill_graph: also write ``prefill.onnx`` (+ ``prefill.onnx.data``): the same decoder with its attention
            and MLP matrices in int8 with one scale per output channel, run by ONNX Runtime's integer GEMM
            (``DynamicQuantizeMatMul``; :data:`PREFILL_PLAN`), about 1.7x faster than the int4 kernel on a pass of
            hundreds of tokens on a CPU and no faster on a decode step. A *draft* model runs on it every pass whose
            longest row has at least ``prefill_min_tokens`` (:data:`PREFILL_MIN_TOKENS`) new tokens (a prompt's
            prefill, a catch-up): that changes its proposals slightly, never the output, which the target
            verifies. Needs float32 activations (not fp16) and attention ``"gqa"`` or ``"batched"`` (run on the CPU).
            With ``dtype="gguf"`` the prefill graph keeps the GGUF's blocks too (:data:`GGUF_PLAN`).

    Returns:
        ``Path(out)``.

    ``specrt_config.json`` holds: ``architecture``, ``hf_architecture``, ``vocab_size`` (logits width),
    ``tokenizer_vocab_size``, ``num_layers``, ``num_attention_heads``, ``num_kv_heads``, ``head_dim``,
    ``hidden_size``, ``intermediate_size``, ``max_position_embeddings``, ``rope_theta``, ``rope_freq_factors``
    (Llama 3.x only), ``sliding_window`` (int: each query attends that many positions, itself included, in every
    attention form; null: full causal attention), ``rms_norm_eps``, ``tied_embeddings``, ``dtype``, ``kv_dtype``
    (``float32`` / ``float16``), ``weights`` (the :class:`WeightPlan`: storage per weight kind), ``kv_layout``
    (``"shared_buffer"``), ``bos_token_id``, ``eos_token_ids``, ``pad_token_id``, ``add_bos_token``,
    ``special_tokens`` (content -> id), ``source``, ``source_sha256``, ``source_name``, ``min_onnxruntime``
    (:data:`MIN_ONNXRUNTIME`; with a sliding window :data:`~specrt.convert.graph.MIN_ONNXRUNTIME_WINDOW`, the first
    whose GroupQueryAttention counts the window as Hugging Face does), ``onnx_opset``, ``converter``; with
    ``num_layers`` also ``truncated_from`` (the source's block count); with ``vocab_subset`` also
    ``full_vocab_size`` and ``vocab_subset`` (the file name), ``vocab_size`` then being the subset's size; with
    ``prefill_graph`` also ``prefill_graph`` (the file name), ``prefill_min_tokens`` and ``prefill_weights`` (its
    :class:`WeightPlan`).

    Raises:
        UnsupportedModelError: ``dtype`` fp16 for a family whose activations exceed float16's range (gemma3),
            ``dtype`` gguf (or a plan with ``"gguf"`` storage) for a Hugging Face folder (no GGUF blocks to keep),
            ``dtype`` other than fp32, RoPE scaling other than Llama 3.x's, partial rotary,
            unknown quantization, ``num_layers`` outside ``1 .. block count``, a sliding window that is not a
            positive integer (:func:`~specrt.convert.gguf_reader.checked_sliding_window`).
        UnsupportedArchitectureError: an architecture not in ``ARCH_INFO`` (the message lists them).
        GGUFFormatError: ``src`` is missing, not a GGUF, truncated or lacks required tensors / keys.
        HFFormatError: a Hugging Face folder lacks a file or tensor, has a tensor of the wrong shape (named, with
            both shapes) or an unreadable file.
        TokenizerMetadataError: the tokenizer metadata is missing or of an unsupported kind.
        OutputExistsError: ``out`` exists and ``force`` is false.
        DiskSpaceError: the file system holding ``out`` has too little free space.
    """
    import onnx

    from specrt.convert.graph import OPSET, build_decoder
    from specrt.convert.tokenizer import build_tokenizer, hf_tokenizer_config
    from specrt.convert.weights import ExternalDataWriter

    src, out = Path(src), Path(out)
    plan = plan or plan_for(dtype)
    if attention not in ATTENTION_FORMS:
        raise UnsupportedModelError(
            f"attention {attention!r} is invalid (expected one of: {', '.join(repr(a) for a in ATTENTION_FORMS)})"
        )
    if attention == "batched" and plan.dtype != "fp32":
        raise UnsupportedModelError(
            f"attention 'batched' needs float32 activations (dtype fp32 or int4), got dtype {dtype!r}"
        )
    if prefill_graph and plan.dtype != "fp32":
        raise UnsupportedModelError(
            f"prefill_graph needs float32 activations (dtype fp32, int4, int8 or gguf), got dtype {dtype!r}"
        )
    if prefill_graph and attention == "gqa-graph":
        raise UnsupportedModelError(
            "prefill_graph is for the CPU forms (attention 'gqa' or 'batched'); the graph form 'gqa-graph' is for CUDA"
        )
    # The down projection keeps the model's own storage (PREFILL_PLAN's docs); GGUF blocks stay as they are.
    prefill_plan = (
        (
            plan
            if plan.uses_gguf_blocks
            else dataclasses.replace(plan, attn=PREFILL_PLAN.attn, mlp=PREFILL_PLAN.mlp, down=plan.down or plan.mlp)
        )
        if prefill_graph
        else None
    )
    if out.exists() and not force:
        raise OutputExistsError(f"{out} already exists (pass force=True / --force to replace it)")
    t0 = time.perf_counter()
    hf = is_hf_folder(src)
    if hf and plan.uses_gguf_blocks:
        raise UnsupportedModelError(
            f"dtype {dtype!r} keeps a GGUF's own quantized blocks, but {src} is a Hugging Face folder (convert the "
            "model's GGUF, or use fp32, fp16, int8 or int4)"
        )
    model: Any
    with HFModel(src) if hf else GGUFModel(src) as model:  # closes the GGUF's memory map on every path
        spec = model.spec()
        full_layers = spec.num_layers
        if plan.dtype == "fp16" and not spec.arch.float16_range:
            raise UnsupportedModelError(
                f"dtype fp16 is refused for {spec.architecture}: its activations exceed float16's range (float16 "
                "weights and activations gave NaN logits); use fp32, int8 or int4"
            )
        if spec.rope_dim != spec.head_dim and spec.rope_dim % 16 and attention != "batched":
            # GroupQueryAttention: "cos_cache dimension 1 must be <= head_size / 2 and a multiple of 8"
            raise UnsupportedModelError(
                f"partial rotary over {spec.rope_dim} of head_dim {spec.head_dim} values: ONNX Runtime's "
                f"GroupQueryAttention (attention {attention!r}) rotates multiples of 16 only; use attention 'batched'"
            )
        if num_layers is not None:
            if not 1 <= num_layers <= full_layers:
                raise UnsupportedModelError(
                    f"num_layers {num_layers} is invalid (expected 1 <= num_layers <= {full_layers}, the model's block "
                    "count)"
                )
            spec = dataclasses.replace(spec, num_layers=num_layers)
        gen_defaults: dict[str, Any] = {}
        if hf:
            tokenizer, tok_info, gen_defaults = hf_tokenizer(model)
        else:
            tokenizer, tok_info = build_tokenizer(model)
        if tok_info.vocab_size > spec.vocab_size:
            raise GGUFFormatError(
                f"{src}: the tokenizer has {tok_info.vocab_size} tokens but the embedding only {spec.vocab_size} rows"
            )
        if max_positions is not None and max_positions < 1:
            raise UnsupportedModelError(f"max_positions must be positive, got {max_positions}")
        head_rows, subset_info = _vocab_subset(vocab_subset, vocab_corpus, tokenizer, tok_info, spec.vocab_size)

        out.parent.mkdir(parents=True, exist_ok=True)
        need = estimate_output_bytes(model, spec, max_positions, dtype)
        free = shutil.disk_usage(out.parent).free
        if free < need:
            raise DiskSpaceError(
                f"not enough disk space in {out.parent}: the model needs about {need / 2**30:.2f} GiB, "
                f"{free / 2**30:.2f} GiB free"
            )
        sha = source_sha256 or (model.files_sha256() if hf else _hash_with_progress(src, progress))
        if num_layers is not None:
            note = f"Layer-truncated: only the first {num_layers} of {full_layers} decoder blocks were kept."
            provenance = f"{note}\n\n{provenance}" if provenance else note

        for kind in ("tmp", "old"):
            remove_stale_temporaries(out.parent, f".{out.name}.{kind}-")
        tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            tensor_names = {n for n in model.tensors if _kept(n, spec.num_layers)}

            def write_graph(stem: str, graph_plan: WeightPlan, name: str, bar: Any = None) -> None:
                with ExternalDataWriter(tmp / f"{stem}.onnx.data", location=f"{stem}.onnx.data") as writer:
                    proto = build_decoder(
                        spec,
                        lambda name: model.tensor(name, spec),
                        writer,
                        max_positions=max_positions,
                        on_tensor=None if bar is None else (lambda _name: bar.update(1)),
                        graph_name=name,
                        plan=graph_plan,
                        get_quant=lambda name, bits: model.block_quant(name, bits, spec, plan.block_size),
                        head_rows=head_rows,
                        attention=attention,
                        get_blocks=None if hf else (lambda name: model.gguf_blocks(name, spec)),
                    )
                onnx.save_model(proto, str(tmp / f"{stem}.onnx"))
                del proto
                if check:
                    onnx.checker.check_model(str(tmp / f"{stem}.onnx"))

            graph_name = str(model.get("general.name", "specrt_decoder"))
            with _progress(len(tensor_names), f"dequantize+write {src.name}", "tensor", progress) as bar:
                write_graph("model", plan, graph_name, bar)
            if prefill_plan is not None:
                write_graph("prefill", prefill_plan, f"{graph_name} (prefill)")

            tokenizer.save(str(tmp / "tokenizer.json"))
            if tok_info.chat_template:
                (tmp / "chat_template.jinja").write_text(tok_info.chat_template, encoding="utf-8")
            tok_config = hf_tokenizer_config(
                tokenizer,
                bos_token_id=tok_info.bos_token_id,
                eos_token_ids=tok_info.eos_token_ids,
                pad_token_id=tok_info.pad_token_id,
                chat_template=tok_info.chat_template,
                model_max_length=int(max_positions or spec.max_position_embeddings),
            )
            (tmp / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2) + "\n", encoding="utf-8")
            gen = {
                "bos_token_id": tok_info.bos_token_id,
                "eos_token_id": tok_info.eos_token_ids,
                "pad_token_id": tok_info.pad_token_id,
                **gen_defaults,
            }
            (tmp / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n", encoding="utf-8")
            config_window = checked_sliding_window(
                spec.sliding_window, int(max_positions or spec.max_position_embeddings), "sliding_window"
            )
            config: dict[str, Any] = {
                "architecture": spec.architecture,
                "hf_architecture": spec.arch.hf_architecture,
                "vocab_size": spec.vocab_size if head_rows is None else len(head_rows),
                "tokenizer_vocab_size": tok_info.vocab_size,
                "num_layers": spec.num_layers,
                "num_attention_heads": spec.num_attention_heads,
                "num_kv_heads": spec.num_kv_heads,
                "head_dim": spec.head_dim,
                "hidden_size": spec.hidden_size,
                "intermediate_size": spec.intermediate_size,
                "max_position_embeddings": int(max_positions or spec.max_position_embeddings),
                "rope_theta": spec.rope_theta,
                **_rope_config(spec, int(max_positions or spec.max_position_embeddings)),
                "sliding_window": config_window,
                "rms_norm_eps": spec.rms_norm_eps,
                "tied_embeddings": spec.tied_embeddings,
                "dtype": dtype,
                "kv_dtype": "float16" if plan.dtype == "fp16" else "float32",
                "weights": dataclasses.asdict(plan),
                "kv_layout": "batched_rows" if attention == "batched" else "shared_buffer",
                "attention": attention,
                "bos_token_id": tok_info.bos_token_id,
                "eos_token_ids": tok_info.eos_token_ids,
                "pad_token_id": tok_info.pad_token_id,
                "add_bos_token": tok_info.add_bos_token,
                "special_tokens": tok_info.special_tokens,
                "source": src.name,
                "source_sha256": sha,
                "source_name": model.get("general.name"),
                "min_onnxruntime": MIN_ONNXRUNTIME if config_window is None else MIN_ONNXRUNTIME_WINDOW,
                "onnx_opset": OPSET,
                "converter": "specrt.convert",
                **({"truncated_from": full_layers} if num_layers is not None else {}),
                **(
                    {"full_vocab_size": spec.vocab_size, "vocab_subset": "vocab_subset.json"}
                    if head_rows is not None
                    else {}
                ),
                **(
                    {
                        "prefill_graph": "prefill.onnx",
                        "prefill_min_tokens": PREFILL_MIN_TOKENS,
                        "prefill_weights": dataclasses.asdict(prefill_plan),
                        "prefill_int8_weight_max": INT8_WEIGHT_MAX,
                    }
                    if prefill_graph
                    else {}
                ),
                "conversion_seconds": round(time.perf_counter() - t0, 1),
            }
            (tmp / "specrt_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
            if head_rows is not None:
                subset_doc = {"token_ids": [int(t) for t in head_rows], **subset_info}
                (tmp / "vocab_subset.json").write_text(json.dumps(subset_doc) + "\n", encoding="utf-8")
            (tmp / "NOTICE").write_text(
                (
                    _hf_notice(model, sha, provenance, dtype)
                    if hf
                    else _notice(
                        model,
                        src,
                        sha,
                        provenance,
                        dtype,
                        gguf_fallbacks(model, spec) if plan.uses_gguf_blocks else None,
                    )
                ),
                encoding="utf-8",
            )

            if out.exists():  # force=True: move the old folder aside first so the swap is quick
                old = out.parent / f".{out.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
                out.rename(old)
                shutil.rmtree(old, ignore_errors=True)
            tmp.rename(out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return out


def remove_stale_temporaries(parent: Path, prefix: str) -> list[Path]:
    """Remove what a killed process left under ``parent``: the entries named ``<prefix><pid>-...`` whose process is
    gone (a conversion's or a download's temporary folder, whose own cleanup never ran after ``kill -9``), and those
    named ``<prefix>...`` without a process id (left by versions that did not write one). Entries of running processes
    are kept, so two conversions into one cache do not remove each other's work.

    Args:
        parent: the folder holding the temporaries (it may not exist).
        prefix: the start of their names, e.g. ``".fp32.tmp-"`` or ``".dl-"``.

    Returns:
        The paths removed.
    """
    removed: list[Path] = []
    if not parent.is_dir():
        return removed
    for path in parent.iterdir():
        if not path.name.startswith(prefix):
            continue
        pid = path.name[len(prefix) :].split("-", 1)[0]
        if pid.isdigit() and _process_alive(int(pid)):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed.append(path)
    return removed


def _process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (a zombie counts: it is gone once its parent reaps it)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
