//! The portable path: the canonical orders of [`super`] in plain Rust (`f32::mul_add` is a fused multiply-add on
//! every target, in hardware or in software).

use crate::acts::{ActBlock, ActSuper};
use crate::format::GgmlType;
use crate::ksuper::{decode, decode32, KSuper};

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
            let k = decode32(ty, blk);
            Block {
                codes: k.codes.map(|c| (i32::from(c) - k.offset) as i8),
                ws: half::f16::from_bits(k.d).to_f32(),
                mw: k.m.map(|m| half::f16::from_bits(m).to_f32()),
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
    let mut acc = [0.0f32; R];
    for (b, blk) in blocks(ty, row, mutation).iter().enumerate() {
        for r in 0..R {
            let a = &acts[r][b];
            let s: i32 = blk
                .codes
                .iter()
                .zip(&a.qs)
                .map(|(&c, &x)| i32::from(c) * i32::from(x))
                .sum();
            acc[r] = (blk.ws * a.d).mul_add(s as f32, acc[r]);
            if let Some(mw) = blk.mw {
                acc[r] = (mw * a.d).mul_add(a.sum as f32, acc[r]);
            }
        }
    }
    *out = acc;
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
