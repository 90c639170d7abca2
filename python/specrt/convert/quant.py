"""Block quantization for ``com.microsoft::MatMulNBits``: exact GGUF block mapping, round-to-nearest requantization
and packing, in NumPy.

A block-quantized weight matrix ``W`` (``[N, K]`` = ``[out, in]``, the orientation of GGUF tensors and of
``nn.Linear.weight``) is stored as integer codes, one scale and one zero point per block of ``block_size``
consecutive input features::

    W[n, k] = (q[n, k] - zero_point[n, k // block_size]) * scale[n, k // block_size]

which is exactly MatMulNBits' dequantization (ORT ``docs/ContribOperators.md``). :class:`BlockQuant` holds that form
unpacked; :func:`pack_matmul_nbits` turns it into the operator's inputs.

Exact mapping (:func:`from_gguf_blocks`): every GGUF type whose blocks are "integer codes times a per-block scale
(minus a per-block offset)" maps without error:

========  ==============================================  =====================================================
GGUF      GGUF value                                      MatMulNBits form
========  ==============================================  =====================================================
Q4_0      ``(q - 8) d``, 32 per block                     4 bits, block 32, zero point 8 (uint8)
Q4_1      ``q d + m``                                     4 bits, block 32, float zero point ``-m / d``
Q4_K      ``d sc q - dmin m`` per 32-sub-block            4 bits, block 32, float zero point ``dmin m / (d sc)``
Q5_0      ``(q - 16) d``, q 5 bits                        8 bits, block 32, zero point 16 (uint8)
Q5_1      ``q d + m``, q 5 bits                           8 bits, block 32, float zero point
Q5_K      like Q4_K with 5-bit codes                      8 bits, block 32, float zero point
Q6_K      ``d sc (q - 32)`` per 16-sub-block, q 6 bits    8 bits, block 16, zero point 32 (uint8)
Q8_0      ``q d``, q int8                                 8 bits, block 32, zero point 128 (uint8, q + 128)
========  ==============================================  =====================================================

A zero scale (an all-zero block) gets zero point 0 / code 0, which is still exact.

Requantization (:func:`quantize_rtn`): round-to-nearest int4 (or int8) of float32 weights per block, asymmetric
(min/max, uint8 zero point) or symmetric (absmax, zero point ``2^(bits-1)``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = [
    "EXACT_GGUF_TYPES",
    "BlockQuant",
    "concat_rows",
    "from_gguf_blocks",
    "pack_matmul_nbits",
    "promote",
    "quantize_rtn",
]


@dataclass
class BlockQuant:
    """A block-quantized ``[N, K]`` matrix in unpacked form.

    Attributes:
        q: uint8 ``[N, K]`` codes in ``0 .. 2**bits - 1``.
        scales: float32 ``[N, K // block_size]``.
        zero_points: uint8 ``[N, K // block_size]`` (integer zero points, ``< 2**bits``) or float32 of the same
            shape (float zero points: MatMulNBits accepts them with the scales' type).
        bits: 4 or 8.
        block_size: a power of two >= 16 dividing ``K``.
    """

    q: np.ndarray
    scales: np.ndarray
    zero_points: np.ndarray
    bits: int
    block_size: int

    @property
    def shape(self) -> tuple[int, int]:
        """``(N, K)``."""
        return (int(self.q.shape[0]), int(self.q.shape[1]))

    @property
    def float_zero_points(self) -> bool:
        """Whether the zero points are float (not uint8)."""
        return self.zero_points.dtype != np.uint8

    def dequantize(self) -> np.ndarray:
        """float32 ``[N, K]``: ``(q - zero_point) * scale`` per block, computed the way the operator does (float32)."""
        n, k = self.shape
        nb = k // self.block_size
        q = self.q.reshape(n, nb, self.block_size).astype(np.float32)
        zp = self.zero_points.astype(np.float32)[:, :, None]
        return ((q - zp) * self.scales[:, :, None]).reshape(n, k)


# ----- exact GGUF mapping -------------------------------------------------------------------------------------
#: GGUF types :func:`from_gguf_blocks` maps exactly, with their (bits, block_size).
EXACT_GGUF_TYPES = {
    "Q4_0": (4, 32),
    "Q4_1": (4, 32),
    "Q4_K": (4, 32),
    "Q5_0": (8, 32),
    "Q5_1": (8, 32),
    "Q5_K": (8, 32),
    "Q6_K": (8, 16),
    "Q8_0": (8, 32),
}


def _f16(b: np.ndarray) -> np.ndarray:
    """``[..., 2]`` uint8 -> ``[...]`` float32 (little-endian half)."""
    return np.ascontiguousarray(b).view(np.float16)[..., 0].astype(np.float32)


def _nibbles(qs: np.ndarray, half: int) -> np.ndarray:
    """``[..., half]`` uint8 -> ``[..., 2 * half]``: the low nibbles first, then the high nibbles (GGUF's order)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _k_scale_min(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K 12-byte packed 6-bit scales and mins ``[nb, 12]`` -> two uint8 ``[nb, 8]``."""
    s = scales.reshape(-1, 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc, mn


def _safe_div(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    out = np.zeros_like(num, dtype=np.float32)
    np.divide(num, den, out=out, where=den != 0)
    return out


def from_gguf_blocks(raw: np.ndarray, qtype: str, n_cols: int) -> BlockQuant | None:
    """Decompose a GGUF quantized matrix into codes, scales and zero points without changing any value.

    Args:
        raw: uint8 ``[N, bytes_per_row]``: the tensor's blocks as stored (``GGUFReader`` tensor data).
        qtype: the GGUF type name (``"Q4_K"`` ...).
        n_cols: ``K``, the logical row length.

    Returns:
        A :class:`BlockQuant` whose :meth:`~BlockQuant.dequantize` equals llama.cpp's dequantization (to float32
        rounding of ``scale * (q - zp)`` vs ``d * q + m``: a few ulp), or ``None`` for types not in
        :data:`EXACT_GGUF_TYPES`.
    """
    if qtype not in EXACT_GGUF_TYPES:
        return None
    bits, block = EXACT_GGUF_TYPES[qtype]
    n = raw.shape[0]
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    if qtype in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"):
        bpb = {"Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24, "Q8_0": 34}[qtype]
        b = raw.reshape(n, n_cols // 32, bpb)
        d = _f16(b[..., 0:2, None].reshape(n, -1, 2))
        if qtype == "Q8_0":
            q = (b[..., 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
            zp = np.full(d.shape, 128, np.uint8)
        elif qtype == "Q4_0":
            q = _nibbles(b[..., 2:], 16)
            zp = np.full(d.shape, 8, np.uint8)
        elif qtype == "Q4_1":
            m = _f16(b[..., 2:4])
            q = _nibbles(b[..., 4:], 16)
            zp = _safe_div(-m, d)
        else:  # Q5_0 / Q5_1: 4 bytes of high bits, then the nibbles
            off = 2 if qtype == "Q5_0" else 4
            qh = np.ascontiguousarray(b[..., off : off + 4]).view(np.uint32)[..., 0]
            high = ((qh[..., None] >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)
            q = _nibbles(b[..., off + 4 :], 16) | (high << 4)
            zp = np.full(d.shape, 16, np.uint8) if qtype == "Q5_0" else _safe_div(-_f16(b[..., 2:4]), d)
        scales = d
    elif qtype in ("Q4_K", "Q5_K"):
        bpb = 144 if qtype == "Q4_K" else 176
        b = raw.reshape(n * (n_cols // 256), bpb)
        d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
        sc, mn = _k_scale_min(b[:, 4:16])
        scales = d[:, None] * sc.astype(np.float32)  # [nb, 8]
        offs = dmin[:, None] * mn.astype(np.float32)
        if qtype == "Q4_K":
            qs = b[:, 16:].reshape(-1, 4, 32)  # 4 chunks of 32 bytes: sub-blocks 2j (low), 2j + 1 (high)
            q = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(-1, 8, 32)
        else:
            qh = b[:, 16:48]  # [nb, 32]: bit j of byte i is the high bit of element i of sub-block j
            qs = b[:, 48:].reshape(-1, 4, 32)
            q = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(-1, 8, 32)
            high = (qh[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1
            q = q | (high << 4)
        zp = _safe_div(offs, scales)
        scales, zp, q = scales.reshape(n, -1), zp.reshape(n, -1), q.reshape(n, n_cols)
    else:  # Q6_K
        b = raw.reshape(n * (n_cols // 256), 210)
        ql, qh = b[:, :128].reshape(-1, 2, 64), b[:, 128:192].reshape(-1, 2, 32)
        sc = b[:, 192:208].view(np.int8).astype(np.float32)
        d = _f16(b[:, 208:210])
        low = np.concatenate([ql & 0x0F, ql >> 4], axis=-1).reshape(-1, 2, 4, 32)  # [nb, half, quarter, 32]
        high = ((qh[:, :, None, :] >> (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]) & 3).astype(np.uint8)
        q = (low | (high << 4)).reshape(n, n_cols)
        scales = (d[:, None] * sc).reshape(n, -1)
        zp = np.full(scales.shape, 32, np.uint8)
    q = q.reshape(n, n_cols).astype(np.uint8)
    scales = scales.reshape(n, -1).astype(np.float32)
    zp = zp.reshape(n, -1)
    zero = scales == 0
    if zero.any():  # an all-zero block: any code works; make it 0 - 0
        if zp.dtype == np.uint8:
            q = q.copy()
            q.reshape(n, -1, block)[zero] = zp[zero][:, None]
        else:
            zp = np.where(zero, 0.0, zp).astype(np.float32)
            q = q.copy()
            q.reshape(n, -1, block)[zero] = 0
    return BlockQuant(q, scales, zp if zp.dtype == np.uint8 else zp.astype(np.float32), bits, block)


# ----- requantization -----------------------------------------------------------------------------------------
_RTN_ROWS = 8192


def quantize_rtn(w: np.ndarray, bits: int = 4, block_size: int = 32, *, symmetric: bool = False) -> BlockQuant:
    """Round-to-nearest block quantization of float weights.

    Args:
        w: float ``[N, K]`` (``K`` a multiple of ``block_size``).
        bits: 4 or 8.
        block_size: power of two >= 16.
        symmetric: absmax scaling with the fixed zero point ``2**(bits-1)`` (codes ``1 .. 2**bits - 1``) instead of
            min/max scaling with a per-block uint8 zero point.

    Returns:
        The :class:`BlockQuant` (uint8 zero points).

    Raises:
        ValueError: ``K`` not a multiple of ``block_size``, or unsupported ``bits``.
    """
    if bits not in (4, 8):
        raise ValueError(f"bits {bits} is not supported (expected 4 or 8)")
    n, k = w.shape
    if k % block_size:
        raise ValueError(f"row length {k} is not a multiple of block_size {block_size}")
    if n > _RTN_ROWS:  # bound the temporaries (a few float32 copies of the rows being quantized)
        parts = [
            quantize_rtn(w[i : i + _RTN_ROWS], bits, block_size, symmetric=symmetric) for i in range(0, n, _RTN_ROWS)
        ]
        return BlockQuant(
            np.concatenate([p.q for p in parts]),
            np.concatenate([p.scales for p in parts]),
            np.concatenate([p.zero_points for p in parts]),
            bits,
            block_size,
        )
    qmax = (1 << bits) - 1
    x = w.astype(np.float32).reshape(n, k // block_size, block_size)
    if symmetric:
        mid = 1 << (bits - 1)
        amax = np.abs(x).max(axis=-1)
        scales = amax / (mid - 1)
        zp = np.full(scales.shape, mid, np.uint8)
        q = np.clip(np.rint(_safe_div(x, scales[..., None])) + mid, 0, qmax)
    else:
        lo = np.minimum(x.min(axis=-1), 0.0)
        hi = np.maximum(x.max(axis=-1), 0.0)
        scales = (hi - lo) / qmax
        zp_f = np.clip(np.rint(_safe_div(-lo, scales)), 0, qmax)
        zp = zp_f.astype(np.uint8)
        q = np.clip(np.rint(_safe_div(x, scales[..., None])) + zp_f[..., None], 0, qmax)
    return BlockQuant(q.astype(np.uint8).reshape(n, k), scales.astype(np.float32), zp, bits, block_size)


# ----- format changes -----------------------------------------------------------------------------------------
def promote(bq: BlockQuant, bits: int, block_size: int, float_zero_points: bool) -> BlockQuant:
    """The same matrix in a wider format (never loses anything): more bits, a smaller block, float zero points.

    Raises:
        ValueError: the target format is narrower than ``bq``'s.
    """
    if bits < bq.bits or block_size > bq.block_size or (bq.float_zero_points and not float_zero_points):
        raise ValueError(
            f"cannot promote ({bq.bits} bits, block {bq.block_size}, float zp {bq.float_zero_points}) to "
            f"({bits} bits, block {block_size}, float zp {float_zero_points}) without loss"
        )
    rep = bq.block_size // block_size
    scales = np.repeat(bq.scales, rep, axis=1)
    zp = np.repeat(bq.zero_points, rep, axis=1)
    if float_zero_points:
        zp = zp.astype(np.float32)
    return BlockQuant(bq.q, scales, zp, bits, block_size)


def concat_rows(parts: list[BlockQuant]) -> BlockQuant:
    """Stack matrices along ``N`` (fused q|k|v or gate|up), promoting them to their widest common format."""
    bits = max(p.bits for p in parts)
    block = min(p.block_size for p in parts)
    fzp = any(p.float_zero_points for p in parts)
    parts = [promote(p, bits, block, fzp) for p in parts]
    return BlockQuant(
        np.concatenate([p.q for p in parts]),
        np.concatenate([p.scales for p in parts]),
        np.concatenate([p.zero_points for p in parts]),
        bits,
        block,
    )


def pack_matmul_nbits(bq: BlockQuant) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """MatMulNBits inputs ``B``, ``scales``, ``zero_points`` for ``bq``.

    Returns:
        ``B`` uint8 ``[N, k_blocks, block_size * bits / 8]`` (4 bits: element ``2i`` in the low nibble of byte
        ``i``); ``scales`` float32 ``[N * k_blocks]``; ``zero_points`` uint8 ``[N * ceil(k_blocks * bits / 8)]``
        (4 bits: two per byte, low nibble first, each row padded to a whole byte) or float32 ``[N * k_blocks]``.
    """
    n, k = bq.shape
    nb = k // bq.block_size
    if bq.bits == 4:
        q = bq.q.reshape(n, nb, bq.block_size // 2, 2)
        b = (q[..., 0] | (q[..., 1] << 4)).astype(np.uint8)
    else:
        b = bq.q.reshape(n, nb, bq.block_size)
    scales = bq.scales.reshape(-1).astype(np.float32)
    if bq.float_zero_points:
        zp = bq.zero_points.reshape(-1).astype(np.float32)
    elif bq.bits == 4:
        z = bq.zero_points
        if nb % 2:
            z = np.concatenate([z, np.zeros((n, 1), np.uint8)], axis=1)
        zp = (z[:, 0::2] | (z[:, 1::2] << 4)).astype(np.uint8).reshape(-1)
    else:
        zp = bq.zero_points.reshape(-1).astype(np.uint8)
    return np.ascontiguousarray(b), scales, np.ascontiguousarray(zp)
