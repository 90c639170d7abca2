//! Matrices repacked once, at load, for the SIMD paths: output columns in groups of [`GROUP`], each 32-bit lane of a
//! 256-bit register holding four consecutive weights of one column, so one integer multiply-add (`vpdpbusd`) against
//! four broadcast activations advances eight columns at once (sixteen on 512-bit registers, two groups) and every
//! per-column step after it (sub-block scale, float scale, mins) is a vertical vector operation: no horizontal sum
//! anywhere, and each column's result is computed in [`crate::dot`]'s canonical order.
//!
//! The bytes are the GGUF's own codes and float16 scales, rearranged, not requantized (Q8_0's signed codes stored as
//! `q + 128`). Per group and block of a 32-long format: `d` (16 bytes, float16 per column), Q4_1's `m` (16), the
//! codes (128: `[l][4c + t]` as below with `j` = 0; Q8_0: 256, `[step i][4c + t]` = code `4i + t`), Q5_0's fifth
//! bits (32, as Q5_K's). Per group and super-block of a K-quant (`c` a column of the group, `t` in 0..4, `l` in 0..4,
//! `j` the 32-weight slice of the super-block):
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
use crate::ksuper::{decode, decode32, KBlock, KSuper};

/// Output columns per packed group (eight 32-bit lanes of a 256-bit register).
pub const GROUP: usize = 8;

/// Byte offsets of the parts of one group's super-block, and its size.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Layout {
    /// Weights per block (32, or 256 for the K-quants).
    pub block_len: usize,
    pub d: usize,
    pub dmin: usize,
    pub scales: usize,
    pub mins: usize,
    pub codes: usize,
    pub high: usize,
    pub size: usize,
}

/// The code offset of a 32-long format (weight = `d * (code - offset)` + Q4_1's `m`): 8 (Q4_0), 16 (Q5_0), 128
/// (Q8_0, whose signed codes are stored as `q + 128`), 0 (Q4_1 and the K-quants, which subtract their own).
pub(crate) fn block_offset(ty: GgmlType) -> i32 {
    match ty {
        GgmlType::Q4_0 => 8,
        GgmlType::Q5_0 => 16,
        GgmlType::Q8_0 => 128,
        _ => 0,
    }
}

/// The layout of `ty`'s blocks.
pub(crate) fn layout(ty: GgmlType) -> Layout {
    // the 32-long formats: d, Q4_1's m, the codes, Q5_0's fifth bits
    let b32 = |codes: usize, high: usize, size: usize| Layout {
        block_len: 32,
        d: 0,
        dmin: 16,
        scales: 0,
        mins: 0,
        codes,
        high,
        size,
    };
    match ty {
        GgmlType::Q4_0 => b32(16, 0, 144),
        GgmlType::Q4_1 => b32(32, 0, 160),
        GgmlType::Q5_0 => b32(16, 144, 176),
        GgmlType::Q8_0 => b32(16, 0, 272),
        GgmlType::Q4_K | GgmlType::Q5_K => Layout {
            block_len: 256,
            d: 0,
            dmin: 16,
            scales: 32,
            mins: 96,
            codes: 160,
            high: 1184,
            size: if ty == GgmlType::Q5_K { 1440 } else { 1184 },
        },
        GgmlType::Q6_K => Layout {
            block_len: 256,
            d: 0,
            dmin: 0,
            scales: 16,
            mins: 0,
            codes: 144,
            high: 1168,
            size: 1680,
        },
    }
}

/// A matrix `[N, K]` repacked in column groups: group `g`'s block `b` is
/// `data[(g * blocks + b) * layout.size..][..layout.size]`.
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
    /// Repack `w` on the calling thread.
    #[must_use]
    pub fn new(w: &QMatrix<'_>) -> Self {
        Self::new_threads(w, 1)
    }

    /// Repack `w` on `threads` scoped threads (the calling one included; 0 counts as 1), each writing a
    /// contiguous range of column groups. The bytes do not depend on `threads`.
    #[must_use]
    pub fn new_threads(w: &QMatrix<'_>, threads: usize) -> Self {
        let lay = layout(w.ty);
        let blocks = w.k / lay.block_len;
        let groups = w.n.div_ceil(GROUP);
        let group_bytes = blocks * lay.size;
        let mut data = vec![0u8; groups * group_bytes];
        let per_thread = groups.div_ceil(threads.clamp(1, groups.max(1))).max(1);
        let pack_range = |first: usize, out: &mut [u8]| {
            for (i, group) in out.chunks_exact_mut(group_bytes).enumerate() {
                pack_group(w, &lay, first + i, group);
            }
        };
        if group_bytes > 0 {
            std::thread::scope(|s| {
                let mut chunks = data.chunks_mut(per_thread * group_bytes).enumerate();
                let own = chunks.next();
                for (t, chunk) in chunks {
                    s.spawn(move || pack_range(t * per_thread, chunk));
                }
                if let Some((_, chunk)) = own {
                    pack_range(0, chunk);
                }
            });
        }
        Self {
            ty: w.ty,
            n: w.n,
            k: w.k,
            data,
        }
    }

    /// Column groups (`ceil(n / GROUP)`).
    #[must_use]
    pub fn groups(&self) -> usize {
        self.n.div_ceil(GROUP)
    }

    /// Blocks per column (`k / 32`, or `k / 256` for the K-quants).
    #[must_use]
    pub fn blocks(&self) -> usize {
        self.k / self.ty.block_len()
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

/// Group `g`'s blocks into `out` (one `lay.size` slice per block, zeroed).
fn pack_group(w: &QMatrix<'_>, lay: &Layout, g: usize, out: &mut [u8]) {
    let bb = w.ty.block_bytes();
    for (b, out) in out.chunks_exact_mut(lay.size).enumerate() {
        for c in 0..GROUP.min(w.n - g * GROUP) {
            let blk = &w.row(g * GROUP + c)[b * bb..(b + 1) * bb];
            if lay.block_len == SUPER_BLOCK {
                write_super(w.ty, lay, c, &decode(w.ty, blk), out);
            } else {
                write_block(w.ty, lay, c, &decode32(w.ty, blk), out);
            }
        }
    }
}

/// Column `c`'s 32 codes `codes` into a `[l][4c + t]` slice of 128 bytes (`codes_out`): low nibble code `4l + t`,
/// high nibble code `16 + 4l + t`; their bit 4 into `fifth` (`[4c + t]`, bit `l` and bit `4 + l`) for the 5-bit
/// formats, their bits 4-5 into `pairs` (`[p][4c + t]`, bits `2l, 2l + 1` of code `16p + 4l + t`) for Q6_K.
fn write_codes32(
    c: usize,
    codes: &[u8],
    codes_out: &mut [u8],
    fifth: Option<&mut [u8]>,
    pairs: Option<&mut [u8]>,
) {
    for l in 0..4 {
        for t in 0..4 {
            let (lo, hi) = (codes[4 * l + t], codes[16 + 4 * l + t]);
            codes_out[32 * l + 4 * c + t] = (lo & 0xF) | ((hi & 0xF) << 4);
        }
    }
    if let Some(f) = fifth {
        for l in 0..4 {
            for t in 0..4 {
                let (lo, hi) = (codes[4 * l + t], codes[16 + 4 * l + t]);
                f[4 * c + t] |= (((lo >> 4) & 1) << l) | (((hi >> 4) & 1) << (4 + l));
            }
        }
    }
    if let Some(p) = pairs {
        for l in 0..4 {
            for t in 0..4 {
                let (lo, hi) = (codes[4 * l + t], codes[16 + 4 * l + t]);
                p[4 * c + t] |= ((lo >> 4) & 3) << (2 * l);
                p[32 + 4 * c + t] |= ((hi >> 4) & 3) << (2 * l);
            }
        }
    }
}

/// Write column `c`'s super-block `k` into one group's super-block `out`.
fn write_super(ty: GgmlType, lay: &Layout, c: usize, k: &KSuper, out: &mut [u8]) {
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
        let (codes_out, high) = out[lay.codes..].split_at_mut(lay.high - lay.codes);
        let codes_out = &mut codes_out[128 * j..128 * (j + 1)];
        let codes = &k.codes[32 * j..32 * (j + 1)];
        match ty {
            GgmlType::Q5_K => write_codes32(
                c,
                codes,
                codes_out,
                Some(&mut high[32 * j..32 * (j + 1)]),
                None,
            ),
            GgmlType::Q6_K => write_codes32(
                c,
                codes,
                codes_out,
                None,
                Some(&mut high[64 * j..64 * (j + 1)]),
            ),
            _ => write_codes32(c, codes, codes_out, None, None),
        }
    }
}

/// Write column `c`'s block `k` (a 32-long format) into one group's block `out`.
fn write_block(ty: GgmlType, lay: &Layout, c: usize, k: &KBlock, out: &mut [u8]) {
    out[lay.d + 2 * c..lay.d + 2 * c + 2].copy_from_slice(&k.d.to_le_bytes());
    if let Some(m) = k.m {
        out[lay.dmin + 2 * c..lay.dmin + 2 * c + 2].copy_from_slice(&m.to_le_bytes());
    }
    match ty {
        GgmlType::Q8_0 => {
            // [step i][4c + t] = code 4i + t: one 32-byte load per four weights of eight columns
            for i in 0..8 {
                out[lay.codes + 32 * i + 4 * c..lay.codes + 32 * i + 4 * c + 4]
                    .copy_from_slice(&k.codes[4 * i..4 * i + 4]);
            }
        }
        GgmlType::Q5_0 => {
            let (codes_out, high) = out.split_at_mut(lay.high);
            write_codes32(
                c,
                &k.codes,
                &mut codes_out[lay.codes..lay.codes + 128],
                Some(&mut high[..32]),
                None,
            );
        }
        _ => write_codes32(
            c,
            &k.codes,
            &mut out[lay.codes..lay.codes + 128],
            None,
            None,
        ),
    }
}
