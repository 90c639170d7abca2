//! The activation quantizers of [`super`] on AVX2: the same float operations lane by lane (`|x|`'s maximum, the
//! product with the inverse scale, the truncating conversion and the half-away-from-zero correction of
//! [`super::code`]), so every code, scale and sum equals the portable quantizer's bit for bit (the crate's tests
//! compare them on random, halfway, zero and non-finite activations).

use core::arch::x86_64::*;

use super::{ActBlock, ActSuper};

/// The largest `|x|` of `x` (`x.len()` a multiple of 8) and whether every value is finite.
///
/// The maximum is taken on the bit patterns of `|x|`, which order as the floats do for finite values and lie at or
/// above infinity's for the non-finite ones, so one integer maximum answers both.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn abs_max(x: &[f32]) -> (f32, bool) {
    let mask = _mm256_set1_epi32(0x7FFF_FFFF);
    let mut m = _mm256_setzero_si256();
    for c in x.chunks_exact(8) {
        let bits = _mm256_loadu_si256(c.as_ptr().cast());
        m = _mm256_max_epi32(m, _mm256_and_si256(bits, mask));
    }
    let h = _mm_max_epi32(_mm256_castsi256_si128(m), _mm256_extracti128_si256::<1>(m));
    let h = _mm_max_epi32(h, _mm_shuffle_epi32::<0b0100_1110>(h));
    let h = _mm_max_epi32(h, _mm_shuffle_epi32::<0b1011_0001>(h));
    let bits = _mm_cvtsi128_si32(h) as u32;
    (f32::from_bits(bits), bits < 0x7F80_0000)
}

/// Eight codes `code(x[i] * id)` as int32 lanes ([`super::code`] lane by lane; `x * id` finite).
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn codes8(x: *const f32, id: __m256) -> __m256i {
    let c = _mm256_mul_ps(_mm256_loadu_ps(x), id);
    let c = _mm256_min_ps(
        _mm256_max_ps(c, _mm256_set1_ps(-127.0)),
        _mm256_set1_ps(127.0),
    );
    let t = _mm256_cvttps_epi32(c);
    let frac = _mm256_sub_ps(c, _mm256_cvtepi32_ps(t));
    // the masks are -1 where true: t + (frac >= 0.5) - (frac <= -0.5)
    let up = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GE_OQ>(frac, _mm256_set1_ps(0.5)));
    let down = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_LE_OQ>(frac, _mm256_set1_ps(-0.5)));
    _mm256_add_epi32(_mm256_sub_epi32(t, up), down)
}

/// The 32 codes of `x[..32]` as bytes in order, stored at `q`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn codes32(x: *const f32, id: __m256, q: *mut i8) -> __m256i {
    let a = codes8(x, id);
    let b = codes8(x.add(8), id);
    let c = codes8(x.add(16), id);
    let d = codes8(x.add(24), id);
    // within -127..=127, so the saturating packs are exact; they interleave 128-bit lanes, the permute restores order
    let packed = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
    let v = _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(q.cast(), v);
    v
}

/// The sums of the 32 signed bytes of `v` as int32 over bytes 0-15 and 16-31 (exact).
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn half_sums(v: __m256i) -> (i32, i32) {
    // unsigned ones times signed codes: int16 pairs, then int32 sums of four bytes; lanes 0-3 hold bytes 0-15
    let s = _mm256_madd_epi16(
        _mm256_maddubs_epi16(_mm256_set1_epi8(1), v),
        _mm256_set1_epi16(1),
    );
    let s = _mm256_hadd_epi32(s, s);
    let s = _mm256_hadd_epi32(s, s);
    (_mm256_extract_epi32::<0>(s), _mm256_extract_epi32::<4>(s))
}

/// [`super::quantize_block`] on AVX2.
///
/// # Safety
/// The CPU has AVX2; `x.len() == 32`.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn quantize_block(x: &[f32], blk: &mut ActBlock) {
    let (amax, finite) = abs_max(x);
    if !finite {
        // the portable quantizer's codes are all 0 here (x * 0 is 0 or NaN, and NaN converts to 0)
        *blk = ActBlock {
            d: f32::NAN,
            ..ActBlock::default()
        };
        return;
    }
    let d = amax / 127.0;
    let id = if d > 0.0 { 1.0 / d } else { 0.0 };
    let v = codes32(x.as_ptr(), _mm256_set1_ps(id), blk.qs.as_mut_ptr());
    let (lo, hi) = half_sums(v);
    blk.d = d;
    blk.sum = lo + hi;
}

/// One super-block of [`super::quantize_rows_super`] on AVX2: codes, `d` and `sums16` (the caller derives the rest).
///
/// # Safety
/// The CPU has AVX2; `x.len() == 256`.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn quantize_super(x: &[f32], blk: &mut ActSuper) {
    let (amax, finite) = abs_max(x);
    if !finite {
        blk.qs = [0; 256];
        blk.sums16 = [0; 16];
        blk.d = f32::NAN;
        return;
    }
    let d = amax / 127.0;
    let id = _mm256_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
    for j in 0..8 {
        let v = codes32(x.as_ptr().add(32 * j), id, blk.qs.as_mut_ptr().add(32 * j));
        let (lo, hi) = half_sums(v);
        // each within 16 * 127: exact in int16
        blk.sums16[2 * j] = lo as i16;
        blk.sums16[2 * j + 1] = hi as i16;
    }
    blk.d = d;
}
