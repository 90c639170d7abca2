//! Activations quantized to int8 per block of [`ACT_BLOCK`] values, once per pass and shared by every output
//! column (llama.cpp's `quantize_row_q8_0`, with a float32 scale and precomputed sums).
//!
//! Each row is quantized on its own, so a row's blocks never depend on the other rows of the pass.

use crate::format::ACT_BLOCK;

/// One block of 32 activations: `x[i] ~= d * qs[i]`.
#[repr(C, align(32))]
#[derive(Debug, Clone, Copy)]
pub struct ActBlock {
    /// int8 codes, `round(x / d)` in `-127..=127`.
    pub qs: [i8; 32],
    /// `lanes[j]` = sum of `qs[4j..4j + 4]`: the per-lane sums that remove a weight format's code offset.
    pub lanes: [i32; 8],
    /// Scale, `max |x| / 127` (0 for an all-zero block).
    pub d: f32,
    /// Sum of all 32 codes (the float zero points' term).
    pub sum: i32,
}

impl Default for ActBlock {
    fn default() -> Self {
        Self {
            qs: [0; 32],
            lanes: [0; 8],
            d: 0.0,
            sum: 0,
        }
    }
}

/// Quantize `x` (`[m, k]` float32 row-major, `k` a multiple of 32) into `out` (`[m, k / 32]` blocks), resized.
///
/// # Panics
/// When `x.len() != m * k` or `k % 32 != 0` (callers check shapes first).
pub fn quantize_rows(x: &[f32], m: usize, k: usize, out: &mut Vec<ActBlock>) {
    assert!(
        k % ACT_BLOCK == 0 && x.len() == m * k,
        "quantize_rows: shape mismatch"
    );
    out.clear();
    out.resize(m * k / ACT_BLOCK, ActBlock::default());
    for (chunk, blk) in x.chunks_exact(ACT_BLOCK).zip(out.iter_mut()) {
        quantize_block(chunk, blk);
    }
}

/// Quantize 32 values.
#[inline]
pub fn quantize_block(x: &[f32], blk: &mut ActBlock) {
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    // A NaN or infinite activation makes the block's scale NaN, so every output it reaches is NaN (the engine's
    // non-finite check then names it) instead of a finite value computed from codes of zero.
    let finite = x.iter().all(|v| v.is_finite());
    let d = if finite { amax / 127.0 } else { f32::NAN };
    let id = if d > 0.0 && finite { 1.0 / d } else { 0.0 };
    let mut sum = 0i32;
    for (j, lane) in blk.lanes.iter_mut().enumerate() {
        let mut s = 0i32;
        for i in 4 * j..4 * j + 4 {
            // round half away from zero, as llama.cpp's roundf; |x * id| <= 127 (+ rounding), clamped to be sure
            let q = (x[i] * id).round().clamp(-127.0, 127.0) as i8;
            blk.qs[i] = q;
            s += i32::from(q);
        }
        *lane = s;
        sum += s;
    }
    blk.d = d;
    blk.sum = sum;
}
