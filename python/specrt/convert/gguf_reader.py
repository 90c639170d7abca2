"""Read a GGUF file: hyperparameters, tokenizer metadata and dequantized fp32 tensors.

GGUF stores a matrix with its dims listed fastest-first (``ne0`` = input features), so the numpy array the ``gguf``
package gives is ``[out, in]``, the same orientation as a PyTorch ``nn.Linear.weight``. :meth:`GGUFModel.tensor`
returns exactly that, as float32, one tensor at a time, so the caller never holds more than the tensor it is writing.

:class:`GGUFModel` memory-maps the file (the ``gguf`` package's ``np.memmap``) and owns that map: use it as a context
manager (``with GGUFModel(path) as model:``) or call :meth:`GGUFModel.close`. Every array it returns is a copy that
owns its memory, so it stays valid after the map is closed.

llama.cpp's converter permutes the rows of the Q and K projections of ``llama`` models so its interleaved ("NORM")
rotary embedding can be used; :meth:`GGUFModel.tensor` undoes that permutation (``unpermute_qk=True``) so that every
architecture uses the half-split ("rotate_half", NEOX) rotary of ONNX Runtime's ``GroupQueryAttention`` with
``rotary_interleaved=0``.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specrt.convert.errors import GGUFFormatError, UnsupportedArchitectureError, UnsupportedModelError
from specrt.convert.families import (
    ARCH_INFO,
    DEFAULT_ROPE_LOCAL_THETA,
    GGUF_ARCHITECTURES,
    ArchInfo,
    ModelSpec,
    checked_sliding_window,
    fused_rows,
)
from specrt.convert.quant import BlockQuant

__all__ = ["GGUF_OP_TYPES", "GGUFBlocks", "GGUFModel", "GGUFTensorInfo", "file_sha256"]

#: GGML type name -> type id of the block formats specrt's ``ai.specrt`` operators (``GgufMatMul``, ``GgufGather``)
#: compute on directly (the ids of ggml's ``enum ggml_type``, gguf-py's ``GGMLQuantizationType``). A matrix of any
#: other type (F32, F16, BF16, Q5_1, Q2_K, Q3_K, IQ*) is dequantized to float32 under ``dtype="gguf"``.
GGUF_OP_TYPES = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}


@dataclass(frozen=True)
class GGUFBlocks:
    """A matrix's stored GGUF bytes, one row of blocks per output channel (:meth:`GGUFModel.gguf_blocks`).

    Attributes:
        data: uint8 ``[N, row_bytes]``: row ``n`` = output channel ``n``'s blocks in ggml order, exactly the file's
            bytes (rows reordered for llama.cpp's Q/K permutation, sliced for fused tensors); owns its memory.
        ggml_type: the GGML type id (``GGMLQuantizationType`` value: Q4_0 = 2 ... Q6_K = 14, F32 = 0, F16 = 1).
        type_name: the type's name (``"Q4_K"``).
        k: input features (the row's logical width).
    """

    data: np.ndarray
    ggml_type: int
    type_name: str
    k: int

    @property
    def n(self) -> int:
        """Output features (rows)."""
        return int(self.data.shape[0])

    @property
    def op_supported(self) -> bool:
        """Whether the ``ai.specrt`` operators run this type (:data:`GGUF_OP_TYPES`)."""
        return GGUF_OP_TYPES.get(self.type_name) == self.ggml_type


@dataclass(frozen=True)
class GGUFTensorInfo:
    """Where and how one GGUF tensor is stored (no data: read it through the open :class:`GGUFModel`).

    Attributes:
        name: GGUF tensor name, e.g. ``blk.0.attn_q.weight``.
        tensor_type: its ``gguf.GGMLQuantizationType`` (``F32``, ``Q8_0`` ...).
        shape: dims in GGUF order, fastest first (``shape[0]`` = ``ne0`` = input features of a matrix).
        n_elements: number of (logical) elements.
        n_bytes: bytes of its data in the file.
        data_offset: byte offset of its data in the file.
    """

    name: str
    tensor_type: Any
    shape: tuple[int, ...]
    n_elements: int
    n_bytes: int
    data_offset: int


def file_sha256(path: str | os.PathLike[str], chunk: int = 1 << 22) -> str:
    """SHA-256 of a file as lowercase hex, read in 4 MiB chunks (constant memory)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _field_value(field: Any) -> Any:
    """Decode a ``gguf.ReaderField`` into a Python value (str, int, float, bool or list of them)."""
    import gguf

    types = field.types
    if not types:
        return None
    if types[0] == gguf.GGUFValueType.ARRAY:
        if len(types) > 1 and types[1] == gguf.GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8", errors="replace") for i in field.data]
        return [field.parts[i].tolist()[0] for i in field.data]
    if types[0] == gguf.GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8", errors="replace")
    return field.parts[field.data[0]].tolist()[0]


class GGUFModel:
    """A GGUF file opened for conversion (memory-mapped: tensors are read lazily).

    Owns the memory map until :meth:`close`; use it as a context manager::

        with GGUFModel("model.gguf") as model:
            w = model.tensor("blk.0.attn_q.weight")  # float32 [out, in], owns its memory

    Args:
        path: the ``.gguf`` file.

    Attributes:
        path: the file.
        tensors: GGUF tensor name -> :class:`GGUFTensorInfo` (type, shape, sizes; no data).

    Raises:
        GGUFFormatError: the file is missing, not a GGUF, truncated or otherwise unreadable (nothing stays open).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        import gguf

        self.path = Path(path)
        self._reader: Any = None
        self._stored: dict[str, Any] = {}  # name -> gguf ReaderTensor (its .data views the memory map)
        self._fields: dict[str, Any] = {}
        self.tensors: dict[str, GGUFTensorInfo] = {}
        if not self.path.is_file():
            raise GGUFFormatError(f"{self.path}: no such GGUF file")
        size = self.path.stat().st_size
        with open(self.path, "rb") as f:
            magic = f.read(4)
        if magic != b"GGUF":
            raise GGUFFormatError(f"{self.path}: not a GGUF file (magic {magic!r}, expected b'GGUF')")
        error = None
        try:
            self._reader = gguf.GGUFReader(self.path, "r")
        except Exception as e:  # the gguf package raises ValueError, IndexError, struct/numpy errors alike
            error = f"{self.path}: corrupt or truncated GGUF ({type(e).__name__}: {e})"
        if error is not None:
            # Raised outside the except block so that the exception no longer references the half-built reader's
            # frames: its memory map is released now, not at some later garbage collection.
            raise GGUFFormatError(error)
        self._stored = {t.name: t for t in self._reader.tensors}
        truncated = [(n, int(t.data_offset) + int(t.n_bytes)) for n, t in self._stored.items()]
        truncated = [(n, end) for n, end in truncated if end > size]
        if truncated:
            self.close()
            name, end = truncated[0]
            raise GGUFFormatError(
                f"{self.path}: truncated GGUF: tensor {name!r} ends at byte {end} but the file has {size} bytes"
            )
        self.tensors = {
            n: GGUFTensorInfo(
                name=n,
                tensor_type=t.tensor_type,
                shape=tuple(int(d) for d in t.shape),
                n_elements=int(t.n_elements),
                n_bytes=int(t.n_bytes),
                data_offset=int(t.data_offset),
            )
            for n, t in self._stored.items()
        }

    # ----- lifetime -----------------------------------------------------------------------------------------
    def close(self) -> None:
        """Release the memory map and its file descriptor (idempotent).

        Afterwards :attr:`tensors` still lists the tensors, but reading metadata or tensor data raises
        ``ValueError``; arrays returned earlier own their memory and stay valid.
        """
        reader, self._reader = self._reader, None
        self._stored = {}
        if reader is None:
            return
        # The gguf package opens the file with np.memmap, which closes the file object at once and keeps an
        # mmap.mmap (holding its own duplicate of the descriptor) alive for as long as any array views it. Only the
        # reader holds such views (every array handed out is a copy) and it has no reference cycles, so dropping it
        # unmaps the file here and now. The map is deliberately not closed with ``data._mmap.close()``: numpy does
        # not keep a buffer export on the map, so that call succeeds under live views (a traceback frame can hold
        # one) and reading them afterwards is a segfault; if such a view exists, the map goes when it goes.
        del reader

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has been called."""
        return self._reader is None

    def __enter__(self) -> GGUFModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _open_reader(self) -> Any:
        """The ``gguf.GGUFReader``; raises ``ValueError`` once closed (as file objects do)."""
        if self._reader is None:
            raise ValueError(f"{self.path}: I/O operation on a closed GGUFModel")
        return self._reader

    def _stored_tensor(self, name: str) -> Any:
        """The ``gguf`` ReaderTensor ``name`` (its ``.data`` views the memory map: never hand it out)."""
        self._open_reader()
        t = self._stored.get(name)
        if t is None:
            raise GGUFFormatError(f"{self.path}: tensor {name!r} is missing")
        return t

    # ----- metadata -----------------------------------------------------------------------------------------
    def has(self, key: str) -> bool:
        """Whether metadata key ``key`` is present."""
        return key in self._open_reader().fields

    def get(self, key: str, default: Any = None) -> Any:
        """The decoded value of metadata key ``key`` (``default`` when absent)."""
        fields = self._open_reader().fields
        if key not in fields:
            return default
        if key not in self._fields:
            try:
                # _field_value copies (bytes / tolist): nothing cached here views the memory map
                self._fields[key] = _field_value(fields[key])
            except Exception as e:
                raise GGUFFormatError(f"{self.path}: cannot decode metadata key {key!r}: {e}") from None
        return self._fields[key]

    def require(self, key: str) -> Any:
        """The value of metadata key ``key``.

        Raises:
            GGUFFormatError: the key is absent.
        """
        if key not in self._open_reader().fields:
            raise GGUFFormatError(f"{self.path}: required metadata key {key!r} is missing")
        return self.get(key)

    @property
    def architecture(self) -> str:
        """``general.architecture`` (e.g. ``llama``, ``qwen2``)."""
        return str(self.require("general.architecture"))

    def spec(self) -> ModelSpec:
        """Read and check the hyperparameters.

        Raises:
            UnsupportedArchitectureError: the architecture is not in :data:`ARCH_INFO`.
            UnsupportedModelError: RoPE scaling by ``rope.scaling.type`` (linear, YaRN ...), partial rotary, a
                ``{arch}.attention.sliding_window`` below 1, or another unimplemented feature (Llama 3.x's
                ``rope_freqs.weight`` is supported).

        A ``{arch}.attention.sliding_window`` key (llama.cpp's name for the window of Gemma 2/3 and Cohere 2) is
        honoured in every family (:attr:`ModelSpec.sliding_window`). llama.cpp's own converter writes none for
        Mistral's ``llama`` files (Mistral 7B v0.1's 4096-position window is dropped there, and llama.cpp's ``llama``
        graph would ignore the key); specrt's tiny test models carry it.
            GGUFFormatError: required keys or tensors are missing, or ``rope_freqs.weight`` is misshapen.
        """
        arch = self.architecture
        if arch not in GGUF_ARCHITECTURES:
            raise UnsupportedArchitectureError(arch, list(GGUF_ARCHITECTURES))
        scaling = self.get(f"{arch}.rope.scaling.type")
        if scaling not in (None, "none", ""):
            raise UnsupportedModelError(
                f"RoPE scaling {scaling!r} ({arch}.rope.scaling.type) is not implemented; only unscaled RoPE models "
                "can be converted"
            )
        factor = self.get(f"{arch}.rope.scaling.factor")
        if factor not in (None, 0.0, 1.0):
            raise UnsupportedModelError(f"RoPE scaling factor {factor} ({arch}.rope.scaling.factor) is not implemented")
        n_heads = int(self.require(f"{arch}.attention.head_count"))
        hidden = int(self.require(f"{arch}.embedding_length"))
        head_dim = int(self.get(f"{arch}.attention.key_length", hidden // n_heads))
        rot = int(self.get(f"{arch}.rope.dimension_count", head_dim))
        partial_ok = ARCH_INFO[arch].partial_rotary and 0 < rot < head_dim and rot % 2 == 0
        if rot != head_dim and not partial_ok:
            raise UnsupportedModelError(
                f"partial rotary ({arch}.rope.dimension_count {rot} != head_dim {head_dim}) is not implemented for "
                f"{arch} (phi3 only, an even width below head_dim)"
            )
        freq_factors = None
        if "rope_freqs.weight" in self.tensors:  # Llama 3.x frequency scaling (llama.cpp's freq_factors)
            info = self.tensors["rope_freqs.weight"]
            if info.shape != (head_dim // 2,):
                raise GGUFFormatError(
                    f"{self.path}: tensor 'rope_freqs.weight' has shape {list(info.shape)}, expected [{head_dim // 2}]"
                )
            factors = self.raw_tensor("rope_freqs.weight")
            if not np.all(np.isfinite(factors)) or not np.all(factors > 0):
                raise GGUFFormatError(f"{self.path}: tensor 'rope_freqs.weight' has a factor <= 0 or not finite")
            freq_factors = tuple(float(f) for f in factors)
        long_factors, original, attn_factor = self._longrope(arch, rot, freq_factors is not None)
        if long_factors is not None:
            freq_factors, long_factors = long_factors
        if "token_embd.weight" not in self.tensors:
            raise GGUFFormatError(f"{self.path}: tensor 'token_embd.weight' is missing")
        vocab = int(self.tensors["token_embd.weight"].shape[1])
        n_layers = int(self.require(f"{arch}.block_count"))
        ffn = int(self.require(f"{arch}.feed_forward_length"))
        n_kv = int(self.get(f"{arch}.attention.head_count_kv", n_heads))
        max_pos = int(self.require(f"{arch}.context_length"))
        window_key = f"{arch}.attention.sliding_window"
        window = checked_sliding_window(self.get(window_key), max_pos, window_key)
        info = ARCH_INFO[arch]
        pattern, local_theta = self._local_layers(arch, info)
        softcap = self.get(f"{arch}.final_logit_softcapping")
        if softcap not in (None, 0.0):
            raise UnsupportedModelError(
                f"final logit soft-capping ({arch}.final_logit_softcapping = {softcap}) is not implemented"
            )
        if self.get(f"{arch}.attention.logit_softcapping") not in (None, 0.0):
            raise UnsupportedModelError(
                f"attention logit soft-capping ({arch}.attention.logit_softcapping) is not implemented"
            )
        for i in range(n_layers):
            for part in ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm"):
                if f"blk.{i}.{part}.weight" not in self.tensors and not self._fused_stored(i, part, arch):
                    raise GGUFFormatError(f"{self.path}: tensor 'blk.{i}.{part}.weight' is missing")
            for part in ("attn_q_norm", "attn_k_norm") if ARCH_INFO[arch].qk_norm else ():
                t = self.tensors.get(f"blk.{i}.{part}.weight")
                if t is None or t.shape != (head_dim,):
                    found = "missing" if t is None else f"of shape {list(t.shape)}"
                    raise GGUFFormatError(
                        f"{self.path}: tensor 'blk.{i}.{part}.weight' is {found} (a {arch} q/k norm needs [{head_dim}])"
                    )
            for part in ("post_attention_norm", "post_ffw_norm") if info.sandwich_norms else ():
                if f"blk.{i}.{part}.weight" not in self.tensors:
                    raise GGUFFormatError(f"{self.path}: tensor 'blk.{i}.{part}.weight' is missing")
            self._check_fused(i, arch, n_heads * head_dim + 2 * n_kv * head_dim, hidden, ffn)
            for part in ("ffn_gate", "ffn_up", "ffn_down"):
                if f"blk.{i}.{part}.weight" not in self.tensors and not self._fused_stored(i, part, arch):
                    raise UnsupportedModelError(
                        f"tensor 'blk.{i}.{part}.weight' is missing (mixture-of-experts or non-SwiGLU MLPs are not "
                        "supported)"
                    )
        return ModelSpec(
            architecture=arch,
            num_layers=n_layers,
            hidden_size=hidden,
            intermediate_size=ffn,
            num_attention_heads=n_heads,
            num_kv_heads=n_kv,
            head_dim=head_dim,
            vocab_size=vocab,
            rms_norm_eps=float(self.require(f"{arch}.attention.layer_norm_rms_epsilon")),
            rope_theta=float(self.get(f"{arch}.rope.freq_base", 10000.0)),
            max_position_embeddings=max_pos,
            tied_embeddings="output.weight" not in self.tensors,
            qkv_bias="blk.0.attn_q.bias" in self.tensors,
            qk_norm=ARCH_INFO[arch].qk_norm,
            rope_freq_factors=freq_factors,
            sliding_window=window,
            rotary_dim=rot if rot != head_dim else None,
            rope_long_freq_factors=long_factors,
            rope_original_context=original,
            rope_attn_factor=attn_factor,
            local_layers_pattern=pattern,
            rope_local_theta=local_theta,
            # llama.cpp's gemma3 graph: 1 / sqrt(hidden / heads) for the 62-layer 27B model (gemma_pytorch's
            # query_pre_attn_scalar), 1 / sqrt(head_dim) otherwise
            attention_scale=float((hidden / n_heads) ** -0.5) if arch == "gemma3" and n_layers == 62 else None,
        )

    def _local_layers(self, arch: str, info: ArchInfo) -> tuple[int | None, float | None]:
        """``(local_layers_pattern, rope_local_theta)`` of :class:`ModelSpec` as llama.cpp reads them: a family with
        interleaved layers that has a positive ``{arch}.attention.sliding_window`` takes the pattern from
        ``{arch}.attention.sliding_window_pattern`` (default: the family's) and the local base from
        ``{arch}.rope.freq_base_swa`` (default :data:`DEFAULT_ROPE_LOCAL_THETA`)."""
        raw_window = self.get(f"{arch}.attention.sliding_window")
        if info.local_layers_pattern is None or not raw_window:
            return None, None
        key = f"{arch}.attention.sliding_window_pattern"
        pattern = self.get(key, info.local_layers_pattern)
        if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1:
            raise UnsupportedModelError(
                f"a sliding-window layer pattern other than a positive integer ({key} = {pattern!r}) is not supported"
            )
        return pattern, float(self.get(f"{arch}.rope.freq_base_swa", DEFAULT_ROPE_LOCAL_THETA))

    def _fused_stored(self, i: int, part: str, arch: str) -> bool:
        """Whether layer ``i``'s ``part`` (``attn_q`` ... ``ffn_up``) is stored fused (:func:`fused_rows`)."""
        if not ARCH_INFO[arch].fused:
            return False
        if part in ("attn_q", "attn_k", "attn_v"):
            return f"blk.{i}.attn_qkv.weight" in self.tensors
        return part in ("ffn_gate", "ffn_up") and f"blk.{i}.ffn_up.weight" in self.tensors

    def _check_fused(self, i: int, arch: str, qkv_rows: int, hidden: int, ffn: int) -> None:
        """The shapes of layer ``i``'s fused tensors: ``attn_qkv`` ``[(nh + 2 kvh) hd, H]``, and ``ffn_up``
        ``[2F, H]`` when no ``ffn_gate`` is stored (numpy order; GGUF lists them fastest first)."""
        if not ARCH_INFO[arch].fused:
            return
        want = {f"blk.{i}.attn_qkv.weight": (hidden, qkv_rows)}
        if f"blk.{i}.ffn_gate.weight" not in self.tensors:
            want[f"blk.{i}.ffn_up.weight"] = (hidden, 2 * ffn)
        for name, shape in want.items():
            t = self.tensors.get(name)
            if t is not None and t.shape != shape:
                raise GGUFFormatError(
                    f"{self.path}: tensor {name!r} has shape {list(t.shape)}, expected {list(shape)} "
                    "(fused; GGUF order)"
                )

    def _longrope(
        self, arch: str, rot: int, has_rope_freqs: bool
    ) -> tuple[tuple[tuple[float, ...], tuple[float, ...]] | None, int | None, float]:
        """longrope as llama.cpp's converter writes it (``rope_factors_short.weight`` / ``rope_factors_long.weight``
        ``[rot / 2]``, ``{arch}.rope.scaling.original_context_length``, ``{arch}.rope.scaling.attn_factor``):
        ``((short, long) or None, original context or None, attention factor)``."""
        names = ("rope_factors_short.weight", "rope_factors_long.weight")
        present = [n in self.tensors for n in names]
        attn_key = f"{arch}.rope.scaling.attn_factor"
        attn = float(self.get(attn_key, 1.0))
        if not attn > 0:
            raise GGUFFormatError(f"{self.path}: {attn_key} must be positive, got {attn}")
        if not any(present):
            return None, None, attn
        if not all(present) or has_rope_freqs:
            raise GGUFFormatError(
                f"{self.path}: longrope needs both 'rope_factors_short.weight' and 'rope_factors_long.weight' and no "
                "'rope_freqs.weight'"
            )
        factors = []
        for name in names:
            if self.tensors[name].shape != (rot // 2,):
                raise GGUFFormatError(
                    f"{self.path}: tensor {name!r} has shape {list(self.tensors[name].shape)}, expected [{rot // 2}]"
                )
            f = self.raw_tensor(name)
            if not np.all(np.isfinite(f)) or not np.all(f > 0):
                raise GGUFFormatError(f"{self.path}: tensor {name!r} has a factor <= 0 or not finite")
            factors.append(tuple(float(x) for x in f))
        original = int(self.require(f"{arch}.rope.scaling.original_context_length"))
        return (factors[0], factors[1]), original, attn

    # ----- tensors ------------------------------------------------------------------------------------------
    def raw_tensor(self, name: str) -> np.ndarray:
        """Dequantize tensor ``name`` exactly as stored (no Q/K un-permutation).

        Returns:
            float32 array in numpy order: ``[out, in]`` for matrices, ``[n]`` for vectors; a copy that owns its
            memory (valid after :meth:`close`).

        Raises:
            GGUFFormatError: no such tensor, or its data cannot be decoded.
            UnsupportedModelError: a quantization type the ``gguf`` package cannot dequantize.
            ValueError: the model is closed.
        """
        import gguf
        from gguf.quants import dequantize

        t = self._stored_tensor(name)
        shape = tuple(int(d) for d in reversed(t.shape))
        qtype = t.tensor_type
        try:
            if qtype == gguf.GGMLQuantizationType.F32:
                out = np.array(t.data, dtype=np.float32)  # a copy: np.asarray would view the memory map
            elif qtype == gguf.GGMLQuantizationType.F16:
                out = np.asarray(t.data).view(np.float16).astype(np.float32)
            else:
                out = dequantize(np.asarray(t.data), qtype).astype(np.float32, copy=False)
        except NotImplementedError:
            raise UnsupportedModelError(
                f"tensor {name!r} uses quantization {qtype.name}, which the gguf package cannot dequantize"
            ) from None
        except (ValueError, IndexError, OSError) as e:
            raise GGUFFormatError(f"{self.path}: cannot decode tensor {name!r} ({qtype.name}): {e}") from None
        if np.may_share_memory(out, t.data):  # never hand out a view of the map: close() unmaps it
            out = out.copy()
        return out.reshape(shape)

    def tensor(self, name: str, spec: ModelSpec | None = None, *, unpermute_qk: bool = True) -> np.ndarray:
        """Dequantize tensor ``name`` to float32, undoing llama.cpp's Q/K row permutation for ``llama`` models.

        Args:
            name: GGUF tensor name, e.g. ``blk.0.attn_q.weight``.
            spec: the model's :class:`ModelSpec` (read from the file when omitted).
            unpermute_qk: restore the half-split rotary layout of Q/K weights and biases.

        Returns:
            float32 ``[out, in]`` (matrices) or ``[n]`` (vectors).
        """
        if name not in self.tensors or name.endswith(".ffn_up.weight"):
            src = fused_rows(name, spec or self.spec(), self.tensors)
            if src is not None:
                return np.ascontiguousarray(self.raw_tensor(src[0])[src[1]])
        w = self.raw_tensor(name)
        if unpermute_qk and (".attn_q." in name or ".attn_k." in name):
            spec = spec or self.spec()
            if spec.arch.qk_permuted:
                n = spec.num_attention_heads if ".attn_q." in name else spec.num_kv_heads
                w = unpermute_rows(w, n)
        return w

    def gguf_blocks(self, name: str, spec: ModelSpec | None = None) -> GGUFBlocks:
        """Matrix ``name``'s stored blocks, bit for bit, for the ``ai.specrt`` operators (``dtype="gguf"``).

        Blocks run along the input axis, so each output channel's row of blocks is independent: llama.cpp's Q/K row
        permutation of ``llama`` models is undone by moving whole rows (:func:`unpermute_rows` on the bytes), and a
        part of a fused tensor (:func:`~specrt.convert.families.fused_rows`) is a slice of its rows. Nothing is
        dequantized or requantized.

        Args:
            name: GGUF tensor name of a matrix ``[out, in]`` (or an unfused part name of a fused family).
            spec: the model's :class:`ModelSpec` (read from the file when omitted).

        Returns:
            :class:`GGUFBlocks`: uint8 ``[out, row_bytes]`` (a copy, never a view of the memory map), the GGML type
            id and name, the input width. F32 / F16 tensors come back as their raw bytes too (the caller decides
            whether the operators take the type: :attr:`GGUFBlocks.op_supported`).

        Raises:
            GGUFFormatError: no such tensor, or it is not a 2-D matrix whose bytes split into its rows.
            ValueError: the model is closed.
        """
        spec = spec or self.spec()
        src = fused_rows(name, spec, self.tensors)
        stored, rows = (name, None) if src is None else src
        t = self._stored_tensor(stored)
        if len(t.shape) != 2:
            raise GGUFFormatError(f"{self.path}: tensor {stored!r} is not a matrix (shape {list(t.shape)})")
        n_out, n_in = int(t.shape[1]), int(t.shape[0])
        raw = np.asarray(t.data).view(np.uint8)
        if raw.size != int(t.n_bytes) or raw.size % n_out:
            raise GGUFFormatError(
                f"{self.path}: tensor {stored!r} has {raw.size} bytes, which do not split into its {n_out} rows"
            )
        data = np.array(raw.reshape(n_out, -1))  # a copy: the map is closed with the model
        if rows is not None:
            data = np.ascontiguousarray(data[rows])
        elif (".attn_q." in name or ".attn_k." in name) and spec.arch.qk_permuted:
            data = unpermute_rows(data, spec.num_attention_heads if ".attn_q." in name else spec.num_kv_heads)
        qtype = t.tensor_type
        return GGUFBlocks(data=data, ggml_type=int(qtype), type_name=qtype.name, k=n_in)

    def block_quant(self, name: str, bits: int, spec: ModelSpec | None = None, block_size: int = 32) -> BlockQuant:
        """Tensor ``name`` as a block-quantized matrix for MatMulNBits / GatherBlockQuantized, Q/K rows un-permuted.

        Exact (the GGUF's own codes, scales and zero points) when the GGUF type maps to ``bits`` or fewer with
        integer zero points (Q4_0 at 4 bits; Q4_0, Q5_0, Q6_K, Q8_0 at 8 bits: see :mod:`specrt.convert.quant`).
        Otherwise the dequantized float32 weights are requantized (round-to-nearest, asymmetric, ``block_size``):
        the CPU MatMulNBits kernels have no fast path for float zero points (Q4_1, Q4_K, Q5_1, Q5_K) - measured
        100-400x slower, see benches/RESULTS.md - and no 8-bit kernel with them at all.

        Args:
            name: GGUF tensor name of a matrix ``[out, in]``.
            bits: 4 or 8.
            spec: the model's :class:`ModelSpec` (read from the file when omitted).
            block_size: block length for requantized tensors.

        Returns:
            ``BlockQuant`` of shape ``[out, in]``.
        """
        spec = spec or self.spec()
        src = fused_rows(name, spec, self.tensors)
        if src is not None:  # a part of a fused matrix: its rows (blocks run along the input axis)
            whole = self._block_quant_stored(src[0], bits, spec, block_size)
            rows = src[1]
            return BlockQuant(whole.q[rows], whole.scales[rows], whole.zero_points[rows], whole.bits, whole.block_size)
        return self._block_quant_stored(name, bits, spec, block_size)

    def _block_quant_stored(self, name: str, bits: int, spec: ModelSpec, block_size: int) -> BlockQuant:
        """:meth:`block_quant` of a tensor as stored (Q/K rows un-permuted)."""
        from specrt.convert.quant import EXACT_GGUF_TYPES, from_gguf_blocks, promote, quantize_rtn

        t = self._stored_tensor(name)
        qtype = t.tensor_type.name
        exact = None
        if qtype in EXACT_GGUF_TYPES and EXACT_GGUF_TYPES[qtype][0] <= bits:
            n_out, n_in = int(t.shape[1]), int(t.shape[0])
            # np.array copies the stored blocks, so the BlockQuant never views the memory map
            exact = from_gguf_blocks(np.array(t.data).reshape(n_out, -1), qtype, n_in)
        if exact is None or exact.float_zero_points:
            fused = fused_rows(name, spec, self.tensors) is not None  # the stored whole, not its part
            return quantize_rtn(self.raw_tensor(name) if fused else self.tensor(name, spec), bits, block_size)
        bq = promote(exact, bits, exact.block_size, False)
        if (".attn_q." in name or ".attn_k." in name) and spec.arch.qk_permuted:
            n = spec.num_attention_heads if ".attn_q." in name else spec.num_kv_heads
            bq = BlockQuant(
                unpermute_rows(bq.q, n),
                unpermute_rows(bq.scales, n),
                unpermute_rows(bq.zero_points, n),
                bq.bits,
                bq.block_size,
            )
        return bq


def unpermute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's ``permute`` of Q/K rows.

    llama.cpp turns each head's half-split pairs ``(i, i + d/2)`` into adjacent rows ``(2i, 2i + 1)``; this maps them
    back. ``w`` is ``[n_head * d, in]`` (weights) or ``[n_head * d]`` (biases); returns the same shape.
    """
    rows = w.shape[0]
    d = rows // n_head
    rest = w.shape[1:]
    return np.ascontiguousarray(w.reshape(n_head, d // 2, 2, *rest).swapaxes(1, 2).reshape(rows, *rest))
