//! Activations quantized to int8 once per pass and shared by every output column: per block of [`ACT_BLOCK`] values
//! ([`ActBlock`], for the 32-long weight formats, as llama.cpp's `block_q8_0` with a float32 scale) or per
//! super-block of [`SUPER_BLOCK`] values ([`ActSuper`], for the K-quants, as llama.cpp's `block_q8_K`).
//!
//! Each row is quantized on its own, so a row's blocks never depend on the other rows of the pass. The SIMD
//! kernel paths quantize on AVX2 ([`avx2`]), with the same float operations lane by lane: the codes, scales and
//! sums are the portable quantizer's bit for bit.

#[cfg(target_arch = "x86_64")]
mod avx2;

use crate::dot::KernelPath;
use crate::format::{ACT_BLOCK, SUPER_BLOCK};

/// Whether `path` quantizes with the AVX2 quantizers (every SIMD path runs on a CPU with AVX2).
fn simd(path: KernelPath) -> bool {
    cfg!(target_arch = "x86_64") && path != KernelPath::Portable && path.is_available()
}

/// One block of 32 activations: `x[i] ~= d * qs[i]`.
#[repr(C, align(32))]
#[derive(Debug, Clone, Copy)]
pub struct ActBlock {
    /// int8 codes, `round(x / d)` in `-127..=127`.
    pub qs: [i8; 32],
    /// Scale, `max |x| / 127` (0 for an all-zero block).
    pub d: f32,
    /// Sum of all 32 codes (the code offsets' and the float zero points' term).
    pub sum: i32,
}

impl Default for ActBlock {
    fn default() -> Self {
        Self {
            qs: [0; 32],
            d: 0.0,
            sum: 0,
        }
    }
}

/// Quantize `x` (`[m, k]` float32 row-major, `k` a multiple of 32) into `out` (`[m, k / 32]` blocks), resized, on
/// `path`'s quantizer (the same bits on every path).
///
/// # Panics
/// When `x.len() != m * k` or `k % 32 != 0` (callers check shapes first).
pub fn quantize_rows(x: &[f32], m: usize, k: usize, out: &mut Vec<ActBlock>, path: KernelPath) {
    assert!(
        k.is_multiple_of(ACT_BLOCK) && x.len() == m * k,
        "quantize_rows: shape mismatch"
    );
    out.clear();
    out.resize(m * k / ACT_BLOCK, ActBlock::default());
    if simd(path) {
        #[cfg(target_arch = "x86_64")]
        for (chunk, blk) in x.chunks_exact(ACT_BLOCK).zip(out.iter_mut()) {
            // SAFETY: a SIMD path is available, so the CPU has AVX2; chunks are 32 long
            unsafe { avx2::quantize_block(chunk, blk) };
        }
        return;
    }
    for (chunk, blk) in x.chunks_exact(ACT_BLOCK).zip(out.iter_mut()) {
        quantize_block(chunk, blk);
    }
}

/// `v` rounded half away from zero (llama.cpp's `roundf`) and clamped to `-127..=127`; NaN gives 0.
///
/// The same value as `v.round().clamp(-127.0, 127.0) as i8`, computed with a truncating conversion (one SSE2
/// instruction, which the compiler vectorizes) instead of `f32::round`, a libm call on x86-64 without SSE4.1.
#[inline]
pub fn code(v: f32) -> i8 {
    // clamp first: every value is then within +-127, where `c - trunc(c)` is exact; NaN stays NaN and converts to 0
    let c = v.clamp(-127.0, 127.0);
    let t = c as i32;
    let frac = c - t as f32;
    (t + i32::from(frac >= 0.5) - i32::from(frac <= -0.5)) as i8
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
    for (q, v) in blk.qs.iter_mut().zip(x) {
        *q = code(v * id);
        sum += i32::from(*q);
    }
    blk.d = d;
    blk.sum = sum;
}

/// One super-block of 256 activations: `x[i] ~= d * qs[i]` (the K-quants' activations).
#[repr(C, align(32))]
#[derive(Debug, Clone, Copy)]
pub struct ActSuper {
    /// int8 codes, `round(x / d)` in `-127..=127`.
    pub qs: [i8; 256],
    /// `sums16[k]` = sum of `qs[16k..16k + 16]` (the zero points' and code offsets' terms).
    pub sums16: [i16; 16],
    /// `32 * sums16[k]` as int32: Q6_K's code offset over sub-block `k`, broadcast by the packed kernels.
    pub offsets16: [i32; 16],
    /// The sums of the 32-long slices in int16 pairs, for the packed kernels' mins: `pairs32[i]` holds
    /// `sum(qs[64i..64i + 32])` in its low half and `sum(qs[64i + 32..64i + 64])` in its high half (each within
    /// 32 * 127, so exact in int16).
    pub pairs32: [i32; 4],
    /// Scale, `max |x| / 127` over the 256 values (0 for all zeros, NaN when one is not finite).
    pub d: f32,
}

impl Default for ActSuper {
    fn default() -> Self {
        Self {
            qs: [0; 256],
            sums16: [0; 16],
            offsets16: [0; 16],
            pairs32: [0; 4],
            d: 0.0,
        }
    }
}

/// Quantize `x` (`[m, k]` float32 row-major, `k` a multiple of 256) into `out` (`[m, k / 256]`), resized, on
/// `path`'s quantizer (the same bits on every path).
///
/// # Panics
/// When `x.len() != m * k` or `k % 256 != 0` (callers check shapes first).
pub fn quantize_rows_super(
    x: &[f32],
    m: usize,
    k: usize,
    out: &mut Vec<ActSuper>,
    path: KernelPath,
) {
    assert!(
        k.is_multiple_of(SUPER_BLOCK) && x.len() == m * k,
        "quantize_rows_super: shape mismatch"
    );
    out.clear();
    out.resize(m * k / SUPER_BLOCK, ActSuper::default());
    let fast = simd(path);
    for (chunk, blk) in x.chunks_exact(SUPER_BLOCK).zip(out.iter_mut()) {
        if fast {
            // SAFETY: a SIMD path is available, so the CPU has AVX2; chunks are 256 long
            #[cfg(target_arch = "x86_64")]
            unsafe {
                avx2::quantize_super(chunk, blk);
            }
        } else {
            quantize_super(chunk, blk);
        }
        derive_super_sums(blk);
    }
}

/// One super-block's codes, `d` and `sums16` (portable).
fn quantize_super(chunk: &[f32], blk: &mut ActSuper) {
    let amax = chunk.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let finite = chunk.iter().all(|v| v.is_finite());
    let d = if finite { amax / 127.0 } else { f32::NAN };
    let id = if d > 0.0 && finite { 1.0 / d } else { 0.0 };
    for (k16, sum) in blk.sums16.iter_mut().enumerate() {
        let mut s = 0i16;
        let span = 16 * k16..16 * k16 + 16;
        for (q, v) in blk.qs[span.clone()].iter_mut().zip(&chunk[span]) {
            *q = code(v * id);
            s += i16::from(*q);
        }
        *sum = s;
    }
    blk.d = d;
}

/// `offsets16` and `pairs32` from `sums16`.
fn derive_super_sums(blk: &mut ActSuper) {
    blk.offsets16 = blk.sums16.map(|v| 32 * i32::from(v));
    let s32 = |j: usize| blk.sums16[2 * j] + blk.sums16[2 * j + 1];
    blk.pairs32 = std::array::from_fn(|i| {
        i32::from(s32(2 * i) as u16) | (i32::from(s32(2 * i + 1) as u16) << 16)
    });
}
