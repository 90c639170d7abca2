//! The portable path: the canonical orders of [`super`] in plain Rust (`f32::mul_add` is a fused multiply-add on
//! every target, in hardware or in software).

use super::{reduce, reduce8};
use crate::acts::{ActBlock, ActSuper};
use crate::dequant::q6k_codes;
use crate::format::{f16_at, scales_mins_k4, GgmlType};

/// A deliberate bug, for the tests that must catch one (the portable path with [`Mutation::None`] is the real one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(test), allow(dead_code))] // the bugs are constructed by the tests only
pub(crate) enum Mutation {
    /// The real kernel.
    None,
    /// A scale read one index off: the next block's `d` (32-long formats), the next sub-block's scale (K-quants).
    WrongScaleIndex,
    /// The row's last 32 weights left out of the sum.
    DroppedTail,
}

/// One 32-long block of a 32-long format in the canonical terms: codes after the offset, scale, zero point.
struct Block {
    codes: [i8; 32],
    ws: f32,
    /// `mw` (Q4_1's `m`).
    mw: Option<f32>,
}

/// The canonical terms of every block of `row` (a 32-long format), in order.
fn blocks(ty: GgmlType, row: &[u8], mutation: Mutation) -> Vec<Block> {
    let mut out: Vec<Block> = row
        .chunks_exact(ty.block_bytes())
        .map(|blk| {
            let d = f16_at(blk);
            match ty {
                GgmlType::Q4_0 | GgmlType::Q4_1 => {
                    let (qs, mw, off) = if ty == GgmlType::Q4_0 {
                        (&blk[2..18], None, 8)
                    } else {
                        (&blk[4..20], Some(f16_at(&blk[2..])), 0)
                    };
                    let codes = std::array::from_fn(|e| {
                        let q = if e < 16 { qs[e] & 0xF } else { qs[e - 16] >> 4 };
                        q as i8 - off
                    });
                    Block { codes, ws: d, mw }
                }
                GgmlType::Q5_0 => {
                    let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
                    let qs = &blk[6..22];
                    let codes = std::array::from_fn(|e| {
                        let lo = if e < 16 { qs[e] & 0xF } else { qs[e - 16] >> 4 };
                        (lo | ((((qh >> e) & 1) as u8) << 4)) as i8 - 16
                    });
                    Block {
                        codes,
                        ws: d,
                        mw: None,
                    }
                }
                GgmlType::Q8_0 => Block {
                    codes: std::array::from_fn(|e| blk[2 + e] as i8),
                    ws: d,
                    mw: None,
                },
                GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => {
                    unreachable!("K-quants go through tile_k")
                }
            }
        })
        .collect();
    match mutation {
        Mutation::None => {}
        Mutation::WrongScaleIndex => {
            let ws: Vec<f32> = out.iter().map(|b| b.ws).collect();
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
                let s = blk.ws * a.d;
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

/// One 256-long super-block of a K-quant in the canonical terms: per weight its unsigned code and its integer
/// sub-block scale; `d`; `dmin` with the eight integer mins for Q4_K / Q5_K; Q6_K's sixteen sub-block scales (its
/// code offset of 32).
struct Super {
    codes: [u8; 256],
    scales: [i32; 256],
    d: f32,
    mins: Option<(f32, [i32; 8])>,
    offset_scales: Option<[i32; 16]>,
}

/// The canonical terms of every super-block of `row` (a K-quant), in order.
fn supers(ty: GgmlType, row: &[u8], mutation: Mutation) -> Vec<Super> {
    let mut out: Vec<Super> = row
        .chunks_exact(ty.block_bytes())
        .map(|blk| match ty {
            GgmlType::Q4_K | GgmlType::Q5_K => {
                let (sc, mn) = scales_mins_k4(&blk[4..16]);
                let (qh, qs) = if ty == GgmlType::Q5_K {
                    (Some(&blk[16..48]), &blk[48..176])
                } else {
                    (None, &blk[16..144])
                };
                let codes = std::array::from_fn(|e| {
                    let (j, l) = (e / 32, e % 32);
                    let ql = qs[32 * (j / 2) + l];
                    let mut q = if j % 2 == 0 { ql & 0xF } else { ql >> 4 };
                    if let Some(qh) = qh {
                        q |= ((qh[l] >> j) & 1) << 4;
                    }
                    q
                });
                let scales = std::array::from_fn(|e| i32::from(sc[e / 32]));
                let mins = Some((f16_at(&blk[2..]), std::array::from_fn(|j| i32::from(mn[j]))));
                Super {
                    codes,
                    scales,
                    d: f16_at(blk),
                    mins,
                    offset_scales: None,
                }
            }
            GgmlType::Q6_K => {
                let mut codes = [0u8; 256];
                for half in 0..2 {
                    let ql = &blk[64 * half..64 * half + 64];
                    let qh = &blk[128 + 32 * half..128 + 32 * half + 32];
                    for l in 0..32 {
                        for (t, q) in q6k_codes(ql, qh, l).into_iter().enumerate() {
                            codes[128 * half + 32 * t + l] = q;
                        }
                    }
                }
                let sc16: [i32; 16] = std::array::from_fn(|k| i32::from(blk[192 + k] as i8));
                Super {
                    codes,
                    scales: std::array::from_fn(|e| sc16[e / 16]),
                    d: f16_at(&blk[208..]),
                    mins: None,
                    offset_scales: Some(sc16),
                }
            }
            _ => unreachable!("32-long formats go through tile"),
        })
        .collect();
    match mutation {
        Mutation::None => {}
        Mutation::WrongScaleIndex => {
            for s in &mut out {
                let sc = s.scales;
                s.scales = std::array::from_fn(|e| sc[(e + 32) % 256]);
            }
        }
        Mutation::DroppedTail => {
            if let Some(last) = out.last_mut() {
                last.codes[224..].fill(0);
                if let Some((_, m)) = &mut last.mins {
                    m[7] = 0;
                }
            }
        }
    }
    out
}

/// [`super::tile_k`] in plain Rust.
pub(crate) fn tile_k<const R: usize>(
    ty: GgmlType,
    row: &[u8],
    acts: [&[ActSuper]; R],
    out: &mut [f32; R],
) {
    tile_k_with(Mutation::None, ty, row, acts, out);
}

/// [`tile_k`] with a deliberate bug ([`Mutation`]).
pub(crate) fn tile_k_with<const R: usize>(
    mutation: Mutation,
    ty: GgmlType,
    row: &[u8],
    acts: [&[ActSuper]; R],
    out: &mut [f32; R],
) {
    let mut acc = [[0.0f32; 8]; R];
    let mut macc = [[0.0f32; 8]; R];
    for (s, sup) in supers(ty, row, mutation).iter().enumerate() {
        for r in 0..R {
            let a = &acts[r][s];
            let mut t = [0i32; 8];
            for e in 0..256 {
                t[(e % 32) / 4] += sup.scales[e] * i32::from(sup.codes[e]) * i32::from(a.qs[e]);
            }
            let sums = |k: usize| i32::from(a.sums16[k]);
            if let Some(sc16) = &sup.offset_scales {
                for (j, tj) in t.iter_mut().enumerate() {
                    *tj -= 32 * (sc16[2 * j] * sums(2 * j) + sc16[2 * j + 1] * sums(2 * j + 1));
                }
            }
            for j in 0..8 {
                acc[r][j] = (sup.d * a.d).mul_add(t[j] as f32, acc[r][j]);
            }
            if let Some((dmin, mins)) = &sup.mins {
                for j in 0..8 {
                    let m = mins[j] * (sums(2 * j) + sums(2 * j + 1));
                    macc[r][j] = (dmin * a.d).mul_add(m as f32, macc[r][j]);
                }
            }
        }
    }
    for r in 0..R {
        out[r] = reduce8(&acc[r]) - reduce8(&macc[r]);
    }
}
