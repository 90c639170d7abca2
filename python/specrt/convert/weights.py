"""How converted weights are stored: :class:`ExternalDataWriter` (each initializer appended to ``model.onnx.data`` as it
is made, never all in memory), :class:`WeightPlan` (the precision of each weight kind: float32 / float16,
block-quantized int4 / int8, per-channel int8 for the prefill graph, or the GGUF's own blocks) and
:func:`quantize_per_channel_int8`."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper

__all__ = [
    "FLOAT_DTYPES",
    "INT8_WEIGHT_MAX",
    "MATRIX_KINDS",
    "ExternalDataWriter",
    "WeightPlan",
    "quantize_per_channel_int8",
]

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
        """Write ``array`` (any numeric dtype ONNX knows) and return an initializer named ``name`` pointing at it."""
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


#: Attention forms of :func:`build_decoder`.


#: Matrix storage kinds and their MatMulNBits bit widths (``None``: no MatMulNBits). ``gguf``: the GGUF's own blocks,
#: bit for bit, run by specrt's ``ai.specrt::GgufMatMul`` / ``GgufGather`` (types outside
#: :data:`~specrt.convert.gguf_reader.GGUF_OP_TYPES` fall back to float32); it needs a GGUF source.
MATRIX_KINDS = {"float": None, "int4": 4, "int8": 8, "qint8": 8, "gguf": None}
FLOAT_DTYPES = {"fp32": (np.float32, TensorProto.FLOAT), "fp16": (np.float16, TensorProto.FLOAT16)}


@dataclass(frozen=True)
class WeightPlan:
    """How each kind of weight is stored.

    Attributes:
        dtype: ``"fp32"`` or ``"fp16"``: activations, KV cache, norm weights and float matrices.
        attn: q|k|v and o projections: ``"float"``, ``"int4"`` or ``"int8"`` (MatMulNBits, block 32 or the GGUF's
            exact block), ``"qint8"`` (DynamicQuantizeMatMul) or ``"gguf"`` (the GGUF's stored blocks on
            ``ai.specrt::GgufMatMul``).
        mlp: gate|up and down projections, same choices.
        down: the down projection when it differs from ``mlp`` (``None``: as ``mlp``): its input carries the
            largest activation outliers, which per-tensor int8 activations (``qint8``) lose.
        head: the lm_head, same choices.
        embed: the token embedding: ``"float"`` (Gather), ``"int4"`` / ``"int8"`` (GatherBlockQuantized) or
            ``"gguf"`` (``ai.specrt::GgufGather`` on the GGUF's blocks).
        accuracy_level: MatMulNBits ``accuracy_level``: 4 = int8 activations (the fast CPU path), 1 = fp32.
        block_size: block length of requantized matrices.
    """

    dtype: str = "fp32"
    attn: str = "float"
    mlp: str = "float"
    down: str | None = None
    head: str = "float"
    embed: str = "float"
    accuracy_level: int = 4
    block_size: int = 32

    def __post_init__(self) -> None:
        if self.dtype not in FLOAT_DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is invalid (expected one of: {', '.join(FLOAT_DTYPES)})")
        for kind in ("attn", "mlp", "down", "head", "embed"):
            value = getattr(self, kind)
            if value is None and kind == "down":
                continue
            if value not in MATRIX_KINDS:
                raise ValueError(f"{kind} storage {value!r} is invalid (expected one of: {', '.join(MATRIX_KINDS)})")
            if kind in ("embed", "head") and value == "qint8":
                raise ValueError(f"{kind} storage 'qint8' is invalid there (expected one of: float, int4, int8, gguf)")
            if value != "float" and self.dtype != "fp32":
                raise ValueError(f"quantized {kind} ({value}) needs dtype fp32 (float32 activations), got {self.dtype}")

    @property
    def uses_gguf_blocks(self) -> bool:
        """Whether any weight kind is stored as the GGUF's own blocks (``"gguf"``: needs a GGUF source)."""
        return any(getattr(self, k) == "gguf" for k in ("attn", "mlp", "down", "head", "embed"))

    @property
    def quantized(self) -> bool:
        """Whether any matrix is block-quantized."""
        return any(getattr(self, k) not in ("float", None) for k in ("attn", "mlp", "down", "head", "embed"))


#: Largest int8 weight magnitude of the prefill graph's matrices: 7 bits (ONNX Runtime's ``reduce_range``). On
#: x86 CPUs without VNNI (AVX-512 VNNI or AVX-VNNI), ONNX Runtime's uint8 x int8 kernels add pairs of products in
#: int16 (``vpmaddubsw``), which saturates for 8-bit weights (255 * 127 * 2 > 32767): measured on a 2-core AVX2-only
#: AMD EPYC, a tiny model's prefill logits were 28% off (relative RMS) and SmolLM2's agreed with the model on 28% of
#: top-1 tokens. With 7-bit weights the pair sum stays within int16 (255 * 63 * 2 = 32130) on every CPU.
INT8_WEIGHT_MAX = 63


def quantize_per_channel_int8(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 with one scale per output channel, as ``DynamicQuantizeMatMul`` takes it.

    Args:
        w: float ``[N, K]``.

    Returns:
        ``(q, scale)``: int8 ``[K, N]`` (transposed: the operator's B) and float32 ``[N]`` =
        ``max |w[n]| / INT8_WEIGHT_MAX`` (1 for an all-zero row), so that ``q.T * scale[:, None]`` is within
        ``scale / 2`` of ``w``.
    """
    amax = np.abs(w).max(axis=1).astype(np.float32)
    scale = np.where(amax > 0, amax / INT8_WEIGHT_MAX, 1.0).astype(np.float32)
    q = np.clip(np.rint(w / scale[:, None]), -INT8_WEIGHT_MAX, INT8_WEIGHT_MAX).astype(np.int8)
    return np.ascontiguousarray(q.T), scale
