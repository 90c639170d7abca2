//! The AVX2 path (x86-64 without VNNI: AMD Zen 2 / Zen 3, Intel before Ice Lake): the canonical orders of [`super`]
//! on 256-bit registers, over [`crate::packed`] groups of eight columns.
//!
//! Without `vpdpbusd`, a multiply of unsigned weight bytes by signed activation bytes yields int16 pairs
//! (`vpmaddubsw`), and widening them to int32 (`vpmaddwd`) costs a second multiply. This path widens as late as the
//! format's code range allows: the int16 pair sums of several steps are added in int16 first, and the one widening
//! `vpmaddwd` multiplies by the sub-block's scale at the same time (both int16 halves of a lane hold the scale), so
//! the sub-block scale costs no `vpmulld`. Every partial sum is an exact integer that cannot overflow (the bounds
//! below, with activations `|x| <= 127`), so the results equal the portable path's bit for bit.
//!
//! | codes | max pair `2 * c * 127` | steps added in int16 |
//! |---|---|---|
//! | 4-bit (Q4_0, Q4_1, Q4_K) | 3,810 | 8 (30,480) |
//! | 5-bit (Q5_0, Q5_K) | 7,874 | 4 (31,496) |
//! | 6-bit (Q6_K) | 16,002 | 2 (32,004) |
//! | Q8_0 (`|q| <= 128`) | 32,512 | 1 |
#![allow(clippy::cast_ptr_alignment)] // unaligned loads (loadu) only

use core::arch::x86_64::*;

use crate::acts::{ActBlock, ActSuper};
use crate::format::GgmlType;
use crate::packed::{block_offset, layout, GROUP};

/// 32 bytes from `p`, unaligned.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn load32(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p.cast())
}

/// Four activation bytes at `x` broadcast to every lane.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn bcast4(x: *const u8) -> __m256i {
    _mm256_set1_epi32(x.cast::<i32>().read_unaligned())
}

/// The int16 pair sums of `w[i]` (unsigned codes) against the four activation bytes at `x + 4 i`, added in int16:
/// lane-half `h` of column `c` = sum over `i` of `w[i]`'s bytes `4c + 2h`, `4c + 2h + 1` times the activations.
/// The caller keeps `w.len()` within the table of the module's doc.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn pairs16(w: &[__m256i], x: *const u8) -> __m256i {
    let mut s = _mm256_maddubs_epi16(w[0], bcast4(x));
    // indices, not iterator adapters: those are not always inlined into `target_feature` functions, and a call
    // passes the vectors through memory with a `vzeroupper`
    #[allow(clippy::needless_range_loop)]
    for i in 1..w.len() {
        s = _mm256_add_epi16(s, _mm256_maddubs_epi16(w[i], bcast4(x.add(4 * i))));
    }
    s
}

/// Int32 lanes `v` (each within int16) as `v` in both int16 halves of the lane, the multiplier for `vpmaddwd`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn both_halves(v: __m256i) -> __m256i {
    _mm256_blend_epi16::<0xAA>(v, _mm256_slli_epi32::<16>(v))
}

/// Eight bytes at `p` (one per column) as int32 lanes: zero-extended, or sign-extended when `signed`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn bytes_i32(p: *const u8, signed: bool) -> __m256i {
    let v = _mm_loadl_epi64(p.cast());
    if signed {
        _mm256_cvtepi8_epi32(v)
    } else {
        _mm256_cvtepu8_epi32(v)
    }
}

/// Bit 4 of the codes of step `l` (low nibbles) and `l + 4` (high nibbles) from a fifth-bit plane `h`
/// (byte `4c + t`: bit `l`, bit `4 + l`), each at bit 4 of its byte.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn fifth_bits(h: __m256i, l: usize) -> (__m256i, __m256i) {
    let b_lo = _mm256_and_si256(h, _mm256_set1_epi8(1 << l));
    let b_hi = _mm256_and_si256(h, _mm256_set1_epi8(0x10 << l));
    // one bit per byte moved within its byte: no mask needed after the shift
    match l {
        0 => (_mm256_slli_epi16(b_lo, 4), b_hi),
        1 => (_mm256_slli_epi16(b_lo, 3), _mm256_srli_epi16(b_hi, 1)),
        2 => (_mm256_slli_epi16(b_lo, 2), _mm256_srli_epi16(b_hi, 2)),
        _ => (_mm256_slli_epi16(b_lo, 1), _mm256_srli_epi16(b_hi, 3)),
    }
}

/// The eight code vectors of one 32-weight slice (`codes`: its four 32-byte steps; `fifth`: Q5's fifth-bit plane
/// of the slice, or null): `w[l]` the low nibbles of step `l` (weights `4l + t`), `w[4 + l]` the high nibbles
/// (weights `16 + 4l + t`), so the activations of `w[i]` are the four bytes at `4 i` of the slice.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn nibbles(codes: *const u8, fifth: *const u8) -> [__m256i; 8] {
    let m4 = _mm256_set1_epi8(0x0F);
    let mut w = [_mm256_setzero_si256(); 8];
    for l in 0..4 {
        let q = load32(codes.add(32 * l));
        w[l] = _mm256_and_si256(q, m4);
        w[4 + l] = _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4);
        if !fifth.is_null() {
            let (b_lo, b_hi) = fifth_bits(load32(fifth), l);
            w[l] = _mm256_or_si256(w[l], b_lo);
            w[4 + l] = _mm256_or_si256(w[4 + l], b_hi);
        }
    }
    w
}

/// The mins' integer `M` of eight columns: `sum_i mins[i] * pairs[i]` in int16 pairs (`mins[i]`: per column the
/// mins `2i`, `2i + 1`; `pairs[i]`: the activations' two slice sums). Plain indices, not iterator adapters: those
/// are not inlined here and pass the vectors through memory with a `vzeroupper` per call.
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) unsafe fn mins_dot(mins: &[__m256i; 4], pairs: &[i32; 4]) -> __m256i {
    let a = _mm256_madd_epi16(mins[0], _mm256_set1_epi32(pairs[0]));
    let b = _mm256_madd_epi16(mins[1], _mm256_set1_epi32(pairs[1]));
    let c = _mm256_madd_epi16(mins[2], _mm256_set1_epi32(pairs[2]));
    let d = _mm256_madd_epi16(mins[3], _mm256_set1_epi32(pairs[3]));
    _mm256_add_epi32(_mm256_add_epi32(a, b), _mm256_add_epi32(c, d))
}

/// How many blocks ahead the kernels prefetch the weights: a verification pass computes long enough on each block
/// that the hardware prefetcher, which stops at every 4 KiB page, leaves the next page's first lines late.
const PREFETCH_SUPERS: usize = 4;

/// Prefetch the `size` bytes `ahead` blocks of `size` after `p` into every cache level. A hint: addresses past the
/// matrix's end are harmless (a prefetch never faults).
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn prefetch_ahead(p: *const u8, size: usize, ahead: usize) {
    let q = p.wrapping_add(ahead * size);
    let mut at = 0;
    while at < size {
        _mm_prefetch::<_MM_HINT_T0>(q.wrapping_add(at).cast());
        at += 64;
    }
}

/// [`crate::dot::group_b`] on this path.
///
/// # Safety
/// As [`crate::dot::group_b`]; the CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn group_b<const R: usize>(
    ty: GgmlType,
    group: &[u8],
    acts: [&[ActBlock]; R],
    out: &mut [[f32; GROUP]; R],
) {
    let lay = layout(ty);
    // Q8_0's sums here are of the signed codes already
    let offset = if ty == GgmlType::Q8_0 {
        0
    } else {
        block_offset(ty)
    };
    let ones = _mm256_set1_epi16(1);
    let flip = _mm256_set1_epi8(i8::MIN);
    let mut acc = [_mm256_setzero_ps(); R];
    for b in 0..acts[0].len() {
        let p = group.as_ptr().add(b * lay.size);
        if b % 4 == 0 {
            // blocks are 144-272 bytes: four at a time, about as many bytes ahead as the K-quant kernel
            let ahead = PREFETCH_SUPERS * layout(GgmlType::Q4_K).size / (4 * lay.size) + 1;
            prefetch_ahead(p, 4 * lay.size, ahead);
        }
        let codes = p.add(lay.codes);
        let x: [*const u8; R] =
            std::array::from_fn(|r| acts[r].get_unchecked(b).qs.as_ptr().cast());
        let mut sum = [_mm256_setzero_si256(); R];
        match ty {
            GgmlType::Q8_0 => {
                // the signed codes back (stored + 128), their magnitudes against the activations with their signs:
                // one step per widening (a pair reaches 2 * 128 * 127)
                for i in 0..8 {
                    let q = _mm256_xor_si256(load32(codes.add(32 * i)), flip);
                    let w = _mm256_abs_epi8(q);
                    for r in 0..R {
                        let xs = _mm256_sign_epi8(bcast4(x[r].add(4 * i)), q);
                        sum[r] = _mm256_add_epi32(
                            sum[r],
                            _mm256_madd_epi16(_mm256_maddubs_epi16(w, xs), ones),
                        );
                    }
                }
            }
            GgmlType::Q5_0 => {
                let w = nibbles(codes, p.add(lay.high));
                for r in 0..R {
                    let lo = _mm256_madd_epi16(pairs16(&w[..4], x[r]), ones);
                    let hi = _mm256_madd_epi16(pairs16(&w[4..], x[r].add(16)), ones);
                    sum[r] = _mm256_add_epi32(lo, hi);
                }
            }
            _ => {
                let w = nibbles(codes, std::ptr::null());
                for r in 0..R {
                    sum[r] = _mm256_madd_epi16(pairs16(&w, x[r]), ones);
                }
            }
        }
        let d = _mm256_cvtph_ps(_mm_loadu_si128(p.add(lay.d).cast()));
        for r in 0..R {
            let a = acts[r].get_unchecked(b);
            let mut s = sum[r];
            if offset != 0 {
                s = _mm256_sub_epi32(s, _mm256_set1_epi32(offset * a.sum));
            }
            let xd = _mm256_set1_ps(a.d);
            acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(d, xd), _mm256_cvtepi32_ps(s), acc[r]);
            if ty == GgmlType::Q4_1 {
                let m = _mm256_cvtph_ps(_mm_loadu_si128(p.add(lay.dmin).cast()));
                acc[r] =
                    _mm256_fmadd_ps(_mm256_mul_ps(m, xd), _mm256_set1_ps(a.sum as f32), acc[r]);
            }
        }
    }
    for r in 0..R {
        _mm256_storeu_ps(out[r].as_mut_ptr(), acc[r]);
    }
}

/// [`crate::dot::group_k`] on this path: per 32-weight slice `j`, `T += sc * S` for its sub-blocks, each a few
/// int16 pair sums widened by one `vpmaddwd` against the scale; Q6_K's code offset (`32 * sc_k * x.sums16[k]`,
/// summed over the super-block's sixteen sub-blocks in int32 pairs) is taken from `T` once per super-block.
///
/// # Safety
/// As [`crate::dot::group_k`]; the CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn group_k<const R: usize>(
    ty: GgmlType,
    group: &[u8],
    acts: [&[ActSuper]; R],
    out: &mut [[f32; GROUP]; R],
) {
    let lay = layout(ty);
    let mut acc = [_mm256_setzero_ps(); R];
    let m30 = _mm256_set1_epi8(0x30);
    for s in 0..acts[0].len() {
        let p = group.as_ptr().add(s * lay.size);
        prefetch_ahead(p, lay.size, PREFETCH_SUPERS);
        let codes = p.add(lay.codes);
        let high = p.add(lay.high);
        let scales = p.add(lay.scales);
        let x: [*const u8; R] =
            std::array::from_fn(|r| acts[r].get_unchecked(s).qs.as_ptr().cast());
        let mut t = [_mm256_setzero_si256(); R];
        for j in 0..8 {
            let codes = codes.add(128 * j);
            match ty {
                GgmlType::Q4_K => {
                    let w = nibbles(codes, std::ptr::null());
                    let sc = both_halves(bytes_i32(scales.add(GROUP * j), false));
                    for r in 0..R {
                        let sj = pairs16(&w, x[r].add(32 * j));
                        t[r] = _mm256_add_epi32(t[r], _mm256_madd_epi16(sj, sc));
                    }
                }
                GgmlType::Q5_K => {
                    let w = nibbles(codes, high.add(32 * j));
                    let sc = both_halves(bytes_i32(scales.add(GROUP * j), false));
                    for r in 0..R {
                        let xj = x[r].add(32 * j);
                        let lo = _mm256_madd_epi16(pairs16(&w[..4], xj), sc);
                        let hi = _mm256_madd_epi16(pairs16(&w[4..], xj.add(16)), sc);
                        t[r] = _mm256_add_epi32(t[r], _mm256_add_epi32(lo, hi));
                    }
                }
                _ => {
                    // Q6_K: bits 2l, 2l + 1 of the high pairs' bytes to bits 4, 5 of the codes
                    let mut w = nibbles(codes, std::ptr::null());
                    let h_lo = load32(high.add(64 * j));
                    let h_hi = load32(high.add(64 * j + 32));
                    for l in 0..4 {
                        let at45 = |h: __m256i| match l {
                            0 => _mm256_slli_epi16::<4>(h),
                            1 => _mm256_slli_epi16::<2>(h),
                            2 => h,
                            _ => _mm256_srli_epi16::<2>(h),
                        };
                        w[l] = _mm256_or_si256(w[l], _mm256_and_si256(at45(h_lo), m30));
                        w[4 + l] = _mm256_or_si256(w[4 + l], _mm256_and_si256(at45(h_hi), m30));
                    }
                    let sc_lo = both_halves(bytes_i32(scales.add(GROUP * 2 * j), true));
                    let sc_hi = both_halves(bytes_i32(scales.add(GROUP * (2 * j + 1)), true));
                    for r in 0..R {
                        let xj = x[r].add(32 * j);
                        let a = _mm256_madd_epi16(pairs16(&w[..2], xj), sc_lo);
                        let b = _mm256_madd_epi16(pairs16(&w[2..4], xj.add(8)), sc_lo);
                        let c = _mm256_madd_epi16(pairs16(&w[4..6], xj.add(16)), sc_hi);
                        let e = _mm256_madd_epi16(pairs16(&w[6..], xj.add(24)), sc_hi);
                        t[r] = _mm256_add_epi32(
                            t[r],
                            _mm256_add_epi32(_mm256_add_epi32(a, b), _mm256_add_epi32(c, e)),
                        );
                    }
                }
            }
        }
        let d = _mm256_cvtph_ps(_mm_loadu_si128(p.add(lay.d).cast()));
        if ty == GgmlType::Q6_K {
            // lane c of pair j: scales 2j, 2j + 1 of column c as int16 halves, against x.sums16[2j], [2j + 1]
            let sc_pairs: [__m256i; 8] = std::array::from_fn(|j| {
                let a = bytes_i32(scales.add(GROUP * 2 * j), true);
                let b = bytes_i32(scales.add(GROUP * (2 * j + 1)), true);
                _mm256_blend_epi16::<0xAA>(a, _mm256_slli_epi32::<16>(b))
            });
            for r in 0..R {
                let a = acts[r].get_unchecked(s);
                let sums = a.sums16.as_ptr().cast::<i32>();
                let mut off = _mm256_setzero_si256();
                #[allow(clippy::needless_range_loop)] // indices: see pairs16
                for j in 0..8 {
                    off = _mm256_add_epi32(
                        off,
                        _mm256_madd_epi16(
                            sc_pairs[j],
                            _mm256_set1_epi32(sums.add(j).read_unaligned()),
                        ),
                    );
                }
                let tr = _mm256_sub_epi32(t[r], _mm256_slli_epi32::<5>(off));
                let xd = _mm256_set1_ps(a.d);
                acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(d, xd), _mm256_cvtepi32_ps(tr), acc[r]);
            }
        } else {
            let dmin = _mm256_cvtph_ps(_mm_loadu_si128(p.add(lay.dmin).cast()));
            let mins: [__m256i; 4] = std::array::from_fn(|i| {
                _mm256_cvtepu8_epi16(_mm_loadu_si128(p.add(lay.mins + 2 * GROUP * i).cast()))
            });
            for r in 0..R {
                let a = acts[r].get_unchecked(s);
                let mi = mins_dot(&mins, &a.pairs32);
                let xd = _mm256_set1_ps(a.d);
                acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(d, xd), _mm256_cvtepi32_ps(t[r]), acc[r]);
                acc[r] = _mm256_fnmadd_ps(_mm256_mul_ps(dmin, xd), _mm256_cvtepi32_ps(mi), acc[r]);
            }
        }
    }
    for r in 0..R {
        _mm256_storeu_ps(out[r].as_mut_ptr(), acc[r]);
    }
}
