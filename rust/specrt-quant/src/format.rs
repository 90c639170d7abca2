//! The GGUF block formats the kernel reads, as ggml lays them out (ggml `ggml-common.h`): one row of a matrix is
//! `K / block_len` blocks, stored back to back; a matrix `[N, K]` is `N` such rows (row `n` = output channel `n`).

use specrt_core::{Result, SpecError};

/// A GGUF quantization type the kernel computes on, with ggml's type id as the discriminant.
#[allow(non_camel_case_types)] // ggml's names
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    /// 32 weights: f16 `d`, 16 bytes of 4-bit codes; `w = (q - 8) * d`. 18 bytes.
    Q4_0 = 2,
    /// 32 weights: f16 `d`, f16 `m`, 16 bytes of 4-bit codes; `w = q * d + m`. 20 bytes.
    Q4_1 = 3,
    /// 32 weights: f16 `d`, 32 high bits, 16 bytes of low nibbles; `w = (q - 16) * d`. 22 bytes.
    Q5_0 = 6,
    /// 32 weights: f16 `d`, 32 int8 codes; `w = q * d`. 34 bytes.
    Q8_0 = 8,
    /// 256 weights: f16 `d`, f16 `dmin`, 12 bytes of 6-bit scales and mins (8 sub-blocks of 32), 128 bytes of
    /// 4-bit codes; `w = d * sc * q - dmin * m`. 144 bytes.
    Q4_K = 12,
    /// 256 weights: as Q4_K plus 32 bytes of fifth bits; `w = d * sc * q - dmin * m`, `q` in 0..32. 176 bytes.
    Q5_K = 13,
    /// 256 weights: 128 bytes of low nibbles, 64 bytes of high 2-bit pairs, 16 int8 scales (sub-blocks of 16),
    /// f16 `d`; `w = d * sc * (q - 32)`. 210 bytes.
    Q6_K = 14,
}

/// Every type the kernel supports, in ggml id order.
pub const SUPPORTED_TYPES: [GgmlType; 7] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// Activation block length: activations are quantized to int8 per run of 32 values (every supported weight block
/// is 32 long or a super-block of 32-long / 16-long sub-blocks).
pub const ACT_BLOCK: usize = 32;

/// Super-block length of the K-quants (Q4_K, Q5_K, Q6_K), and of their activations' blocks.
pub const SUPER_BLOCK: usize = 256;

impl GgmlType {
    /// The type of ggml id `id`.
    ///
    /// # Errors
    /// `SpecError::Setting { field: "ggml_type" }` naming the supported ids when `id` is not one of them.
    pub fn from_id(id: i64) -> Result<Self> {
        SUPPORTED_TYPES
            .iter()
            .copied()
            .find(|t| *t as i64 == id)
            .ok_or_else(|| SpecError::Setting {
                field: "ggml_type".into(),
                message: format!(
                    "ggml_type {id} is not supported by the GGUF matmul (expected one of: {})",
                    SUPPORTED_TYPES
                        .iter()
                        .map(|t| format!("{} ({})", *t as i64, t.name()))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            })
    }

    /// ggml's name of the type (`"Q4_K"`).
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q5_0 => "Q5_0",
            Self::Q8_0 => "Q8_0",
            Self::Q4_K => "Q4_K",
            Self::Q5_K => "Q5_K",
            Self::Q6_K => "Q6_K",
        }
    }

    /// Weights per block (32, or 256 for the K-quants).
    #[must_use]
    pub fn block_len(self) -> usize {
        match self {
            Self::Q4_0 | Self::Q4_1 | Self::Q5_0 | Self::Q8_0 => 32,
            Self::Q4_K | Self::Q5_K | Self::Q6_K => 256,
        }
    }

    /// Bytes per block.
    #[must_use]
    pub fn block_bytes(self) -> usize {
        match self {
            Self::Q4_0 => 18,
            Self::Q4_1 => 20,
            Self::Q5_0 => 22,
            Self::Q8_0 => 34,
            Self::Q4_K => 144,
            Self::Q5_K => 176,
            Self::Q6_K => 210,
        }
    }

    /// Bytes of one row of `k` weights.
    ///
    /// # Errors
    /// `SpecError::Setting { field: "K" }` when `k` is zero or not a multiple of [`Self::block_len`].
    pub fn row_bytes(self, k: usize) -> Result<usize> {
        if k == 0 || !k.is_multiple_of(self.block_len()) {
            return Err(SpecError::Setting {
                field: "K".into(),
                message: format!(
                    "K = {k} is invalid for {} (expected a positive multiple of its block length {})",
                    self.name(),
                    self.block_len()
                ),
            });
        }
        Ok(k / self.block_len() * self.block_bytes())
    }
}

/// A matrix `[N, K]` in one GGUF block format, borrowed: row `n` is `data[n * row_bytes..(n + 1) * row_bytes]`.
#[derive(Debug, Clone, Copy)]
pub struct QMatrix<'a> {
    /// The block format.
    pub ty: GgmlType,
    /// Output features (rows).
    pub n: usize,
    /// Input features (weights per row).
    pub k: usize,
    /// `[n * row_bytes]` bytes.
    pub data: &'a [u8],
}

impl<'a> QMatrix<'a> {
    /// A checked view of `data` as `[n, k]` weights of type `ty`.
    ///
    /// # Errors
    /// `SpecError::Setting` naming `K` (not a multiple of the block length) or `Shape` when `data` does not hold
    /// exactly `n` rows.
    pub fn new(ty: GgmlType, n: usize, k: usize, data: &'a [u8]) -> Result<Self> {
        let row = ty.row_bytes(k)?;
        if n == 0 || data.len() != n * row {
            return Err(SpecError::Shape(format!(
                "{} matrix [N = {n}, K = {k}] needs {} bytes ({row} per row), got {}",
                ty.name(),
                n * row,
                data.len()
            )));
        }
        Ok(Self { ty, n, k, data })
    }

    /// Bytes of one row.
    #[must_use]
    pub fn row_bytes(&self) -> usize {
        self.k / self.ty.block_len() * self.ty.block_bytes()
    }

    /// Row `n`'s bytes.
    #[must_use]
    pub fn row(&self, n: usize) -> &'a [u8] {
        let rb = self.row_bytes();
        &self.data[n * rb..(n + 1) * rb]
    }
}

/// f16 little-endian at `b[0..2]` as f32.
#[inline]
pub(crate) fn f16_at(b: &[u8]) -> f32 {
    half::f16::from_le_bytes([b[0], b[1]]).to_f32()
}

/// The eight 6-bit scales and eight 6-bit mins of a Q4_K / Q5_K super-block from its 12 scale bytes, all at once:
/// bytes 0..4 hold scales 0..4 (low 6 bits) and the top 2 bits of scales 4..8; bytes 4..8 the same for the mins;
/// bytes 8..12 the low 4 bits of scales 4..8 (low nibbles) and of mins 4..8 (high nibbles). Equal to
/// [`scale_min_k4`] for every `j` (tested).
#[inline]
pub(crate) fn scales_mins_k4(q: &[u8]) -> ([u8; 8], [u8; 8]) {
    let word = |i: usize| u32::from_le_bytes([q[4 * i], q[4 * i + 1], q[4 * i + 2], q[4 * i + 3]]);
    let (w0, w1, w2) = (word(0), word(1), word(2));
    let sc_lo = w0 & 0x3f3f_3f3f;
    let sc_hi = (w2 & 0x0f0f_0f0f) | (((w0 >> 6) & 0x0303_0303) << 4);
    let mn_lo = w1 & 0x3f3f_3f3f;
    let mn_hi = ((w2 >> 4) & 0x0f0f_0f0f) | (((w1 >> 6) & 0x0303_0303) << 4);
    let join = |a: u32, b: u32| {
        let (a, b) = (a.to_le_bytes(), b.to_le_bytes());
        [a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]]
    };
    (join(sc_lo, sc_hi), join(mn_lo, mn_hi))
}

/// The 6-bit scale and min of sub-block `j` (0..8) of a Q4_K / Q5_K super-block's 12 scale bytes (ggml
/// `get_scale_min_k4`).
#[inline]
pub(crate) fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}
