//! Dequantization of GGUF rows to float32, with ggml's formulas and evaluation order (`ggml-quants.c`
//! `dequantize_row_*`): the embedding lookup (`GgufGather`) and the reference of this crate's tests.

use crate::format::{f16_at, scale_min_k4, GgmlType};

/// Dequantize one row: `blocks` holds `out.len() / ty.block_len()` blocks of type `ty`; `out` gets the weights.
///
/// # Panics
/// When `out.len()` is not a multiple of the block length or `blocks` is shorter than those blocks (callers check
/// shapes first: [`crate::QMatrix::new`]).
pub fn dequantize_row(ty: GgmlType, blocks: &[u8], out: &mut [f32]) {
    let bl = ty.block_len();
    let bb = ty.block_bytes();
    assert!(
        out.len().is_multiple_of(bl) && blocks.len() >= out.len() / bl * bb,
        "dequantize_row: shape mismatch"
    );
    for (blk, y) in blocks.chunks_exact(bb).zip(out.chunks_exact_mut(bl)) {
        match ty {
            GgmlType::Q4_0 => {
                let d = f16_at(blk);
                let qs = &blk[2..18];
                for j in 0..16 {
                    y[j] = f32::from(i16::from(qs[j] & 0xF) as i8 - 8) * d;
                    y[j + 16] = f32::from(i16::from(qs[j] >> 4) as i8 - 8) * d;
                }
            }
            GgmlType::Q4_1 => {
                let (d, m) = (f16_at(blk), f16_at(&blk[2..]));
                let qs = &blk[4..20];
                for j in 0..16 {
                    y[j] = f32::from(qs[j] & 0xF) * d + m;
                    y[j + 16] = f32::from(qs[j] >> 4) * d + m;
                }
            }
            GgmlType::Q5_0 => {
                let d = f16_at(blk);
                let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
                let qs = &blk[6..22];
                for j in 0..16 {
                    let h0 = ((qh >> j) << 4) & 0x10;
                    let h1 = (qh >> (j + 12)) & 0x10;
                    y[j] = f32::from(((u32::from(qs[j] & 0xF) | h0) as i16 - 16) as i8) * d;
                    y[j + 16] = f32::from(((u32::from(qs[j] >> 4) | h1) as i16 - 16) as i8) * d;
                }
            }
            GgmlType::Q8_0 => {
                let d = f16_at(blk);
                for j in 0..32 {
                    y[j] = f32::from(blk[2 + j] as i8) * d;
                }
            }
            GgmlType::Q4_K | GgmlType::Q5_K => {
                let (d, dmin) = (f16_at(blk), f16_at(&blk[2..]));
                let scales = &blk[4..16];
                let (qh, qs) = if ty == GgmlType::Q5_K {
                    (Some(&blk[16..48]), &blk[48..176])
                } else {
                    (None, &blk[16..144])
                };
                for sub in 0..8 {
                    let (sc, m) = scale_min_k4(sub, scales);
                    let d1 = d * f32::from(sc);
                    let m1 = dmin * f32::from(m);
                    let ql = &qs[32 * (sub / 2)..32 * (sub / 2) + 32];
                    for l in 0..32 {
                        let mut q = if sub % 2 == 0 {
                            ql[l] & 0xF
                        } else {
                            ql[l] >> 4
                        };
                        if let Some(qh) = qh {
                            q |= ((qh[l] >> sub) & 1) << 4;
                        }
                        y[32 * sub + l] = d1 * f32::from(q) - m1;
                    }
                }
            }
            GgmlType::Q6_K => {
                let d = f16_at(&blk[208..]);
                for half in 0..2 {
                    let ql = &blk[64 * half..64 * half + 64];
                    let qh = &blk[128 + 32 * half..128 + 32 * half + 32];
                    let sc = &blk[192 + 8 * half..192 + 8 * half + 8];
                    let yh = &mut y[128 * half..128 * half + 128];
                    for l in 0..32 {
                        let is = l / 16;
                        let q = q6k_codes(ql, qh, l);
                        for t in 0..4 {
                            yh[l + 32 * t] =
                                d * f32::from(sc[is + 2 * t] as i8) * f32::from(q[t] as i8 - 32);
                        }
                    }
                }
            }
        }
    }
}

/// The four 6-bit codes (0..64) at position `l` (0..32) of the four 32-long runs of a Q6_K half super-block.
#[inline]
pub(crate) fn q6k_codes(ql: &[u8], qh: &[u8], l: usize) -> [u8; 4] {
    [
        (ql[l] & 0xF) | ((qh[l] & 3) << 4),
        (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4),
        (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4),
        (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4),
    ]
}
