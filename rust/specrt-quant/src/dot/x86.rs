//! The x86-64 paths: the canonical order of [`super`] on 256-bit registers. Both paths share the weight decoding
//! and the float steps; they differ only in how the exact integer lanes are formed: AVX2 multiplies bytes into
//! int16 pairs (`vpmaddubsw`, which cannot saturate here: codes are at most 63, or |q| <= 128 for Q8_0 against
//! |x| <= 127, so a pair stays within 2 * 128 * 127 < 32767) and adds pairs (`vpmaddwd`); AVX-512 VNNI does both
//! in one instruction (`vpdpbusd`). The code is written once, in a macro, and compiled for each feature set.
#![allow(clippy::cast_ptr_alignment)] // unaligned loads (loadu) only

use core::arch::x86_64::{
    __m256i, _mm256_dpbusd_epi32, _mm256_madd_epi16, _mm256_maddubs_epi16, _mm256_set1_epi16,
    _mm256_setzero_si256,
};

/// Lanes `j` = sum of `w[4j..4j + 4] * x[4j..4j + 4]` (`w` unsigned, `x` signed bytes), AVX2.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn lanes_avx2(w: __m256i, x: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1))
}

/// The same lanes with AVX-512 VNNI (`vpdpbusd` on a 256-bit register).
#[target_feature(enable = "avx2,avx512f,avx512vl,avx512vnni")]
#[inline]
unsafe fn lanes_vnni(w: __m256i, x: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, x)
}

macro_rules! x86_path {
    ($name:ident, $features:literal, $lanes:ident) => {
        pub(crate) mod $name {
            use core::arch::x86_64::*;

            use super::$lanes as lanes;
            use crate::acts::ActBlock;
            use crate::dot::reduce;
            use crate::format::{scale_min_k4, GgmlType};

            /// f16 at `p` (unaligned) as f32, exact (F16C).
            #[target_feature(enable = $features)]
            #[inline]
            unsafe fn f16(p: *const u8) -> f32 {
                let h = u16::from_le_bytes([*p, *p.add(1)]);
                _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(h))))
            }

            /// 32 bytes from `p`, unaligned.
            #[target_feature(enable = $features)]
            #[inline]
            unsafe fn load32(p: *const u8) -> __m256i {
                _mm256_loadu_si256(p.cast())
            }

            /// 16 packed nibbles at `p` -> 32 codes: low nibbles are elements 0..16, high nibbles 16..32.
            #[target_feature(enable = $features)]
            #[inline]
            unsafe fn nibbles16(p: *const u8) -> __m256i {
                let q = _mm_loadu_si128(p.cast());
                let m = _mm_set1_epi8(0x0F);
                _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m), _mm_and_si128(q, m))
            }

            /// Byte `i` = 0xFF where bit `i` of `bits` is set, else 0.
            #[target_feature(enable = $features)]
            #[inline]
            unsafe fn bytes_from_bits(bits: u32) -> __m256i {
                let shuffle = _mm256_setr_epi64x(
                    0x0000_0000_0000_0000,
                    0x0101_0101_0101_0101,
                    0x0202_0202_0202_0202,
                    0x0303_0303_0303_0303,
                );
                let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(bits as i32), shuffle);
                let others = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe_u64 as i64);
                _mm256_cmpeq_epi8(_mm256_or_si256(bytes, others), _mm256_set1_epi64x(-1))
            }

            /// Steps 1-4 for block `b` of the `R` rows: codes `w` (unsigned; `sign` = the signed weights for Q8_0,
            /// whose sign moves onto the activations), code offset `1 << shift` (`shift` 0 = none), lane weight
            /// scales `ws`, zero-point weight `mw`.
            #[target_feature(enable = $features)]
            #[inline]
            #[allow(clippy::too_many_arguments)]
            unsafe fn step<const R: usize>(
                acc: &mut [[__m256; 2]; R],
                macc: &mut [f32; R],
                acts: &[&[ActBlock]; R],
                b: usize,
                w: __m256i,
                sign: Option<__m256i>,
                shift: i32,
                ws: __m256,
                mw: Option<f32>,
            ) {
                for r in 0..R {
                    let a = acts[r].get_unchecked(b);
                    let mut x = _mm256_load_si256(a.qs.as_ptr().cast());
                    if let Some(s) = sign {
                        x = _mm256_sign_epi8(x, s);
                    }
                    let mut l = lanes(w, x);
                    if shift > 0 {
                        let sums = _mm256_load_si256(a.lanes.as_ptr().cast());
                        l = _mm256_sub_epi32(l, _mm256_sll_epi32(sums, _mm_cvtsi32_si128(shift)));
                    }
                    let s = _mm256_mul_ps(ws, _mm256_set1_ps(a.d));
                    let slot = &mut acc[r][b & 1];
                    *slot = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(l), *slot);
                    if let Some(mw) = mw {
                        macc[r] = (mw * a.d).mul_add(a.sum as f32, macc[r]);
                    }
                }
            }

            /// [`crate::dot::tile`] on this path.
            ///
            /// # Safety
            /// As [`crate::dot::tile`]; the CPU has this path's features.
            #[target_feature(enable = $features)]
            pub(crate) unsafe fn tile<const R: usize>(
                ty: GgmlType,
                row: &[u8],
                acts: [&[ActBlock]; R],
                out: &mut [f32; R],
            ) {
                let mut acc = [[_mm256_setzero_ps(); 2]; R];
                let mut macc = [0.0f32; R];
                let nb = acts[0].len();
                let p = row.as_ptr();
                let m4 = _mm256_set1_epi8(0x0F);
                match ty {
                    GgmlType::Q4_0 | GgmlType::Q4_1 => {
                        let (bb, qs, shift) = if ty == GgmlType::Q4_0 {
                            (18, 2, 3)
                        } else {
                            (20, 4, 0)
                        };
                        for b in 0..nb {
                            let blk = p.add(b * bb);
                            let d = f16(blk);
                            let mw = if ty == GgmlType::Q4_1 {
                                Some(f16(blk.add(2)))
                            } else {
                                None
                            };
                            let w = nibbles16(blk.add(qs));
                            step(
                                &mut acc,
                                &mut macc,
                                &acts,
                                b,
                                w,
                                None,
                                shift,
                                _mm256_set1_ps(d),
                                mw,
                            );
                        }
                    }
                    GgmlType::Q5_0 => {
                        for b in 0..nb {
                            let blk = p.add(b * 22);
                            let d = f16(blk);
                            let qh = u32::from_le_bytes([
                                *blk.add(2),
                                *blk.add(3),
                                *blk.add(4),
                                *blk.add(5),
                            ]);
                            let high =
                                _mm256_and_si256(bytes_from_bits(qh), _mm256_set1_epi8(0x10));
                            let w = _mm256_or_si256(nibbles16(blk.add(6)), high);
                            step(
                                &mut acc,
                                &mut macc,
                                &acts,
                                b,
                                w,
                                None,
                                4,
                                _mm256_set1_ps(d),
                                None,
                            );
                        }
                    }
                    GgmlType::Q8_0 => {
                        for b in 0..nb {
                            let blk = p.add(b * 34);
                            let d = f16(blk);
                            let q = load32(blk.add(2));
                            let w = _mm256_abs_epi8(q);
                            step(
                                &mut acc,
                                &mut macc,
                                &acts,
                                b,
                                w,
                                Some(q),
                                0,
                                _mm256_set1_ps(d),
                                None,
                            );
                        }
                    }
                    GgmlType::Q4_K | GgmlType::Q5_K => {
                        let five = ty == GgmlType::Q5_K;
                        let (bb, qs) = if five { (176, 48) } else { (144, 16) };
                        for sb in 0..nb / 8 {
                            let blk = p.add(sb * bb);
                            let (d, dmin) = (f16(blk), f16(blk.add(2)));
                            let scales = std::slice::from_raw_parts(blk.add(4), 12);
                            let qh = if five {
                                load32(blk.add(16))
                            } else {
                                _mm256_setzero_si256()
                            };
                            for j in 0..8 {
                                let (sc, m) = scale_min_k4(j, scales);
                                let q = load32(blk.add(qs + 32 * (j / 2)));
                                let mut w = if j % 2 == 0 {
                                    _mm256_and_si256(q, m4)
                                } else {
                                    _mm256_and_si256(_mm256_srli_epi16(q, 4), m4)
                                };
                                if five {
                                    let bit = _mm256_and_si256(
                                        _mm256_srl_epi16(qh, _mm_cvtsi32_si128(j as i32)),
                                        _mm256_set1_epi8(1),
                                    );
                                    w = _mm256_or_si256(w, _mm256_slli_epi16(bit, 4));
                                }
                                let ws = _mm256_set1_ps(d * f32::from(sc));
                                let mw = Some(-(dmin * f32::from(m)));
                                step(&mut acc, &mut macc, &acts, sb * 8 + j, w, None, 0, ws, mw);
                            }
                        }
                    }
                    GgmlType::Q6_K => {
                        let m2 = _mm256_set1_epi8(3);
                        for sb in 0..nb / 8 {
                            let blk = p.add(sb * 210);
                            let d = f16(blk.add(208));
                            for half in 0..2 {
                                let ql_a = load32(blk.add(64 * half));
                                let ql_b = load32(blk.add(64 * half + 32));
                                let qh = load32(blk.add(128 + 32 * half));
                                let sc = blk.add(192 + 8 * half);
                                for t in 0..4 {
                                    let lo = match t {
                                        0 => _mm256_and_si256(ql_a, m4),
                                        1 => _mm256_and_si256(ql_b, m4),
                                        2 => _mm256_and_si256(_mm256_srli_epi16(ql_a, 4), m4),
                                        _ => _mm256_and_si256(_mm256_srli_epi16(ql_b, 4), m4),
                                    };
                                    let hi = _mm256_and_si256(
                                        _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * t as i32)),
                                        m2,
                                    );
                                    let w = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
                                    let ws_lo = d * f32::from(*sc.add(2 * t) as i8);
                                    let ws_hi = d * f32::from(*sc.add(2 * t + 1) as i8);
                                    let ws =
                                        _mm256_set_m128(_mm_set1_ps(ws_hi), _mm_set1_ps(ws_lo));
                                    step(
                                        &mut acc,
                                        &mut macc,
                                        &acts,
                                        sb * 8 + half * 4 + t,
                                        w,
                                        None,
                                        5,
                                        ws,
                                        None,
                                    );
                                }
                            }
                        }
                    }
                }
                for r in 0..R {
                    let mut lanes16 = [0.0f32; 16];
                    _mm256_storeu_ps(lanes16.as_mut_ptr(), acc[r][0]);
                    _mm256_storeu_ps(lanes16.as_mut_ptr().add(8), acc[r][1]);
                    out[r] = reduce(&lanes16, macc[r]);
                }
            }
        }
    };
}

x86_path!(avx2, "avx2,fma,f16c", lanes_avx2);
x86_path!(
    vnni,
    "avx2,fma,f16c,avx512f,avx512vl,avx512vnni",
    lanes_vnni
);
