//! K-quant matrices (Q4_K, Q5_K, Q6_K) repacked once, at load, for the SIMD paths: output columns in groups of
//! [`GROUP`], each 32-bit lane of a 256-bit register holding four consecutive weights of one column, so one
//! integer multiply-add (`vpdpbusd`) against four broadcast activations advances eight columns at once and every
//! per-column step after it (sub-block scale, float scale, mins) is a vertical vector operation: no horizontal sum
//! anywhere, and each column's result is computed in [`crate::dot`]'s canonical order.
//!
//! The bytes are the GGUF's own codes and float16 scales, rearranged, not requantized: per group and super-block
//! (`c` a column of the group, `t` in 0..4, `l` in 0..4, `j` the 32-weight slice of the super-block):
//!
//! | part | bytes | layout |
//! |---|---|---|
//! | `d` | 16 | float16 per column |
//! | `dmin` (Q4_K, Q5_K) | 16 | float16 per column |
//! | scales | 64 (Q6_K: 128) | `[sub-block][c]`, u8 (Q6_K: i8) |
//! | mins (Q4_K, Q5_K) | 64 | `[pair i][c][2]` u8: mins `2i`, `2i + 1` |
//! | codes | 1024 | `[j][l]` 32 bytes, byte `4c + t`: low nibble weight `32j + 4l + t`, high nibble `32j + 16 + 4l + t` |
//! | fifth bits (Q5_K) | 256 | `[j]` 32 bytes, byte `4c + t`: bit `l` of weight `32j + 4l + t`, bit `4 + l` of `32j + 16 + 4l + t` |
//! | high pairs (Q6_K) | 512 | `[j][p]` 32 bytes, byte `4c + t`: bits `2l, 2l + 1` = code bits 4-5 of weight `32j + 16p + 4l + t` |
//!
//! A last group with fewer than [`GROUP`] columns is padded with zero columns (never written to the output). The
//! packed matrix is as large as the GGUF's (Q4_K, Q5_K: 32 bytes more per group and super-block, 2.8%).

use crate::format::{GgmlType, QMatrix, SUPER_BLOCK};
use crate::ksuper::{decode, KSuper};

/// Output columns per packed group (eight 32-bit lanes of a 256-bit register).
pub const GROUP: usize = 8;

/// Byte offsets of the parts of one group's super-block, and its size.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Layout {
    pub d: usize,
    pub dmin: usize,
    pub scales: usize,
    pub mins: usize,
    pub codes: usize,
    pub high: usize,
    pub size: usize,
}

/// The layout of K-quant `ty` (None for the 32-long formats).
pub(crate) fn layout(ty: GgmlType) -> Option<Layout> {
    match ty {
        GgmlType::Q4_K | GgmlType::Q5_K => Some(Layout {
            d: 0,
            dmin: 16,
            scales: 32,
            mins: 96,
            codes: 160,
            high: 1184,
            size: if ty == GgmlType::Q5_K { 1440 } else { 1184 },
        }),
        GgmlType::Q6_K => Some(Layout {
            d: 0,
            dmin: 0,
            scales: 16,
            mins: 0,
            codes: 144,
            high: 1168,
            size: 1680,
        }),
        _ => None,
    }
}

/// A K-quant matrix `[N, K]` repacked in column groups: group `g`'s super-block `s` is
/// `data[(g * supers + s) * layout.size..][..layout.size]`.
#[derive(Debug, Clone)]
pub struct Packed {
    /// The block format.
    pub ty: GgmlType,
    /// Output columns (the matrix's rows), before padding.
    pub n: usize,
    /// Weights per column.
    pub k: usize,
    data: Vec<u8>,
}

impl Packed {
    /// Repack `w`; None when its type is not a K-quant (the 32-long formats run from the GGUF's rows).
    #[must_use]
    pub fn new(w: &QMatrix<'_>) -> Option<Self> {
        let lay = layout(w.ty)?;
        let supers = w.k / SUPER_BLOCK;
        let groups = w.n.div_ceil(GROUP);
        let mut data = vec![0u8; groups * supers * lay.size];
        let bb = w.ty.block_bytes();
        for g in 0..groups {
            for s in 0..supers {
                let cols: Vec<Option<KSuper>> = (0..GROUP)
                    .map(|c| {
                        let n = g * GROUP + c;
                        (n < w.n).then(|| decode(w.ty, &w.row(n)[s * bb..(s + 1) * bb]))
                    })
                    .collect();
                let at = (g * supers + s) * lay.size;
                write_super(w.ty, &lay, &cols, &mut data[at..at + lay.size]);
            }
        }
        Some(Self {
            ty: w.ty,
            n: w.n,
            k: w.k,
            data,
        })
    }

    /// Column groups (`ceil(n / GROUP)`).
    #[must_use]
    pub fn groups(&self) -> usize {
        self.n.div_ceil(GROUP)
    }

    /// Super-blocks per column (`k / 256`).
    #[must_use]
    pub fn supers(&self) -> usize {
        self.k / SUPER_BLOCK
    }

    /// Group `g`'s bytes, all its super-blocks.
    #[must_use]
    pub fn group(&self, g: usize) -> &[u8] {
        let size = self.data.len() / self.groups();
        &self.data[g * size..(g + 1) * size]
    }

    /// Bytes held.
    #[must_use]
    pub fn bytes(&self) -> usize {
        self.data.len()
    }
}

/// Write one group's super-block (`cols[c]` = column `c`'s decoded super-block, None for padding).
fn write_super(ty: GgmlType, lay: &Layout, cols: &[Option<KSuper>], out: &mut [u8]) {
    for (c, col) in cols.iter().enumerate() {
        let Some(k) = col else { continue };
        out[lay.d + 2 * c..lay.d + 2 * c + 2].copy_from_slice(&k.d.to_le_bytes());
        for sb in 0..k.sub_blocks() {
            // u8 for Q4_K / Q5_K (0..64), the i8's bits for Q6_K
            out[lay.scales + GROUP * sb + c] = k.scales[sb] as u8;
        }
        if let Some((dmin, mins)) = &k.mins {
            out[lay.dmin + 2 * c..lay.dmin + 2 * c + 2].copy_from_slice(&dmin.to_le_bytes());
            for (j, m) in mins.iter().enumerate() {
                out[lay.mins + 2 * GROUP * (j / 2) + 2 * c + j % 2] = *m as u8;
            }
        }
        for j in 0..8 {
            for l in 0..4 {
                for t in 0..4 {
                    let (lo, hi) = (32 * j + 4 * l + t, 32 * j + 16 + 4 * l + t);
                    let byte = 4 * c + t;
                    out[lay.codes + 128 * j + 32 * l + byte] =
                        (k.codes[lo] & 0xF) | ((k.codes[hi] & 0xF) << 4);
                    match ty {
                        GgmlType::Q5_K => {
                            let b = &mut out[lay.high + 32 * j + byte];
                            *b |= ((k.codes[lo] >> 4) & 1) << l;
                            *b |= ((k.codes[hi] >> 4) & 1) << (4 + l);
                        }
                        GgmlType::Q6_K => {
                            out[lay.high + 64 * j + byte] |= ((k.codes[lo] >> 4) & 3) << (2 * l);
                            out[lay.high + 64 * j + 32 + byte] |=
                                ((k.codes[hi] >> 4) & 3) << (2 * l);
                        }
                        _ => {}
                    }
                }
            }
        }
    }
}
