//! The portable path: the canonical orders of [`super`] in plain Rust (`f32::mul_add` is a fused multiply-add on
//! every target, in hardware or in software).

use super::reduce;
use crate::acts::{ActBlock, ActSuper};
use crate::format::{f16_at, GgmlType};
use crate::ksuper::{decode, KSuper};

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

/// The decoded super-blocks of `row` (a K-quant), in order, with `mutation` applied.
fn supers(ty: GgmlType, row: &[u8], mutation: Mutation) -> Vec<KSuper> {
    let mut out: Vec<KSuper> = row
        .chunks_exact(ty.block_bytes())
        .map(|blk| decode(ty, blk))
        .collect();
    match mutation {
        Mutation::None => {}
        Mutation::WrongScaleIndex => {
            for s in &mut out {
                let (sc, n) = (s.scales, s.sub_blocks());
                s.scales = std::array::from_fn(|k| if k < n { sc[(k + 1) % n] } else { 0 });
            }
        }
        Mutation::DroppedTail => {
            if let Some(last) = out.last_mut() {
                let zero = if last.has_offset() { 32 } else { 0 };
                last.codes[224..].fill(zero);
                if let Some((_, m)) = &mut last.mins {
                    m[7] = 0;
                }
            }
        }
    }
    out
}

/// [`super::tile_k`] in plain Rust, from the GGUF's rows (the SIMD paths compute from [`crate::Packed`]).
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
    let mut acc = [0.0f32; R];
    for (s, sup) in supers(ty, row, mutation).iter().enumerate() {
        let d = half::f16::from_bits(sup.d).to_f32();
        for r in 0..R {
            let a = &acts[r][s];
            let mut t = 0i32;
            for k in 0..sup.sub_blocks() {
                let span = k * sup.sub_len..(k + 1) * sup.sub_len;
                let mut sk: i32 = sup.codes[span.clone()]
                    .iter()
                    .zip(&a.qs[span])
                    .map(|(&q, &x)| i32::from(q) * i32::from(x))
                    .sum();
                if sup.has_offset() {
                    sk -= 32 * i32::from(a.sums16[k]);
                }
                t += sup.scales[k] * sk;
            }
            acc[r] = (d * a.d).mul_add(t as f32, acc[r]);
            if let Some((dmin, mins)) = &sup.mins {
                let dmin = half::f16::from_bits(*dmin).to_f32();
                let mi: i32 = (0..8)
                    .map(|j| {
                        mins[j] * (i32::from(a.sums16[2 * j]) + i32::from(a.sums16[2 * j + 1]))
                    })
                    .sum();
                acc[r] = (-(dmin * a.d)).mul_add(mi as f32, acc[r]);
            }
        }
    }
    *out = acc;
}
