//! The portable path: the canonical order of [`super`] in plain Rust (`f32::mul_add` is a fused multiply-add on
//! every target, in hardware or in software).

use super::reduce;
use crate::acts::ActBlock;
use crate::dequant::q6k_codes;
use crate::format::{f16_at, scale_min_k4, GgmlType};

/// One 32-long weight block in the canonical terms: codes after the offset, lane-half scales, zero-point weight.
struct Block {
    codes: [i8; 32],
    /// `ws` of lanes 0..4 and 4..8.
    ws: [f32; 2],
    /// `mw`, for the formats with float zero points.
    mw: Option<f32>,
}

/// A deliberate bug, for the tests that must catch one (the portable path with [`Mutation::None`] is the real one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(test), allow(dead_code))] // the bugs are constructed by the tests only
pub(crate) enum Mutation {
    /// The real kernel.
    None,
    /// Sub-block scales read one index off (K-quants: the next sub-block's; others: the next block's `d`).
    WrongScaleIndex,
    /// The row's last 32-long block left out of the sum.
    DroppedTail,
}

/// The canonical terms of every 32-long block of `row`, in order.
fn blocks(ty: GgmlType, row: &[u8], mutation: Mutation) -> Vec<Block> {
    let mut out = Vec::with_capacity(row.len() / ty.block_bytes() * ty.block_len() / 32);
    for blk in row.chunks_exact(ty.block_bytes()) {
        match ty {
            GgmlType::Q4_0 | GgmlType::Q4_1 => {
                let d = f16_at(blk);
                let (qs, mw, off) = if ty == GgmlType::Q4_0 {
                    (&blk[2..18], None, 8)
                } else {
                    (&blk[4..20], Some(f16_at(&blk[2..])), 0)
                };
                let codes = std::array::from_fn(|e| {
                    let q = if e < 16 { qs[e] & 0xF } else { qs[e - 16] >> 4 };
                    q as i8 - off
                });
                out.push(Block {
                    codes,
                    ws: [d, d],
                    mw,
                });
            }
            GgmlType::Q5_0 => {
                let d = f16_at(blk);
                let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
                let qs = &blk[6..22];
                let codes = std::array::from_fn(|e| {
                    let lo = if e < 16 { qs[e] & 0xF } else { qs[e - 16] >> 4 };
                    (lo | ((((qh >> e) & 1) as u8) << 4)) as i8 - 16
                });
                out.push(Block {
                    codes,
                    ws: [d, d],
                    mw: None,
                });
            }
            GgmlType::Q8_0 => {
                let d = f16_at(blk);
                out.push(Block {
                    codes: std::array::from_fn(|e| blk[2 + e] as i8),
                    ws: [d, d],
                    mw: None,
                });
            }
            GgmlType::Q4_K | GgmlType::Q5_K => {
                let (d, dmin) = (f16_at(blk), f16_at(&blk[2..]));
                let scales = &blk[4..16];
                let (qh, qs) = if ty == GgmlType::Q5_K {
                    (Some(&blk[16..48]), &blk[48..176])
                } else {
                    (None, &blk[16..144])
                };
                for j in 0..8 {
                    let (sc, m) = scale_min_k4(j, scales);
                    let ql = &qs[32 * (j / 2)..32 * (j / 2) + 32];
                    let codes = std::array::from_fn(|l| {
                        let mut q = if j % 2 == 0 { ql[l] & 0xF } else { ql[l] >> 4 };
                        if let Some(qh) = qh {
                            q |= ((qh[l] >> j) & 1) << 4;
                        }
                        q as i8
                    });
                    let ws = d * f32::from(sc);
                    out.push(Block {
                        codes,
                        ws: [ws, ws],
                        mw: Some(-(dmin * f32::from(m))),
                    });
                }
            }
            GgmlType::Q6_K => {
                let d = f16_at(&blk[208..]);
                for half in 0..2 {
                    let ql = &blk[64 * half..64 * half + 64];
                    let qh = &blk[128 + 32 * half..128 + 32 * half + 32];
                    let sc = &blk[192 + 8 * half..192 + 8 * half + 8];
                    let all: [[u8; 4]; 32] = std::array::from_fn(|l| q6k_codes(ql, qh, l));
                    for t in 0..4 {
                        let codes = std::array::from_fn(|l| all[l][t] as i8 - 32);
                        let ws = [
                            d * f32::from(sc[2 * t] as i8),
                            d * f32::from(sc[2 * t + 1] as i8),
                        ];
                        out.push(Block {
                            codes,
                            ws,
                            mw: None,
                        });
                    }
                }
            }
        }
    }
    match mutation {
        Mutation::None => {}
        Mutation::WrongScaleIndex => {
            let ws: Vec<[f32; 2]> = out.iter().map(|b| b.ws).collect();
            for (i, b) in out.iter_mut().enumerate() {
                b.ws = ws[(i + 1) % ws.len()];
            }
        }
        Mutation::DroppedTail => {
            if let Some(last) = out.last_mut() {
                last.codes = [0; 32];
                last.mw = None;
            }
        }
    }
    out
}

/// [`super::tile`] in plain Rust.
pub(crate) fn tile<const R: usize>(
    ty: GgmlType,
    row: &[u8],
    acts: [&[ActBlock]; R],
    out: &mut [f32; R],
) {
    tile_with(Mutation::None, ty, row, acts, out);
}

/// [`tile`] with a deliberate bug ([`Mutation`]).
pub(crate) fn tile_with<const R: usize>(
    mutation: Mutation,
    ty: GgmlType,
    row: &[u8],
    acts: [&[ActBlock]; R],
    out: &mut [f32; R],
) {
    let mut acc = [[0.0f32; 16]; R];
    let mut macc = [0.0f32; R];
    for (b, blk) in blocks(ty, row, mutation).iter().enumerate() {
        for r in 0..R {
            let a = &acts[r][b];
            for j in 0..8 {
                let lane: i32 = (4 * j..4 * j + 4)
                    .map(|e| i32::from(blk.codes[e]) * i32::from(a.qs[e]))
                    .sum();
                let s = blk.ws[j / 4] * a.d;
                let slot = &mut acc[r][(b % 2) * 8 + j];
                *slot = s.mul_add(lane as f32, *slot);
            }
            if let Some(mw) = blk.mw {
                macc[r] = (mw * a.d).mul_add(a.sum as f32, macc[r]);
            }
        }
    }
    for r in 0..R {
        out[r] = reduce(&acc[r], macc[r]);
    }
}
