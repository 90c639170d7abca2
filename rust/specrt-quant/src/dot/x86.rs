//! The x86-64 paths: the canonical order of [`super`] on 256-bit registers. Both paths share the weight decoding
//! and the float steps; they differ only in how the exact integer lanes are formed: AVX2 multiplies bytes into
//! int16 pairs (`vpmaddubsw`, which cannot saturate here: codes are at most 63, or |q| <= 128 for Q8_0 against
//! |x| <= 127, so a pair stays within 2 * 128 * 127 < 32767) and adds pairs (`vpmaddwd`); AVX-512 VNNI does both
//! in one instruction (`vpdpbusd`). The code is written once, in a macro, and compiled for each feature set.
#![allow(clippy::cast_ptr_alignment)] // unaligned loads (loadu) only

use core::arch::x86_64::*;

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

/// `acc + (lanes of w * x, each pair of products times the int16 scale of its position)`, AVX2: the K-quants'
/// integer step (`vpmaddubsw` pairs stay within 2 * 63 * 127, times a scale of at most 128: exact in int32).
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn scaled_avx2(acc: __m256i, w: __m256i, x: __m256i, scale: __m256i) -> __m256i {
    _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), scale))
}

/// The same with AVX-512 VNNI (`vpdpwssd` adds the scaled pairs into `acc` in one instruction).
#[target_feature(enable = "avx2,avx512f,avx512vl,avx512vnni")]
#[inline]
unsafe fn scaled_vnni(acc: __m256i, w: __m256i, x: __m256i, scale: __m256i) -> __m256i {
    _mm256_dpwssd_epi32(acc, _mm256_maddubs_epi16(w, x), scale)
}

macro_rules! x86_path {
    ($name:ident, $features:literal, $lanes:ident, $scaled:ident) => {
        pub(crate) mod $name {
            use core::arch::x86_64::*;

            use super::$lanes as lanes;
            use super::$scaled as scaled;
            use crate::acts::{ActBlock, ActSuper};
            use crate::dot::{reduce, reduce8};
            use crate::format::{scales_mins_k4, GgmlType};

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
                    GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => {
                        unreachable!("K-quants go through tile_k")
                    }
                }
                for r in 0..R {
                    let mut lanes16 = [0.0f32; 16];
                    _mm256_storeu_ps(lanes16.as_mut_ptr(), acc[r][0]);
                    _mm256_storeu_ps(lanes16.as_mut_ptr().add(8), acc[r][1]);
                    out[r] = reduce(&lanes16, macc[r]);
                }
            }

            /// [`crate::dot::tile_k`] on this path.
            ///
            /// # Safety
            /// As [`crate::dot::tile_k`]; the CPU has this path's features.
            #[target_feature(enable = $features)]
            pub(crate) unsafe fn tile_k<const R: usize>(
                ty: GgmlType,
                row: &[u8],
                acts: [&[ActSuper]; R],
                out: &mut [f32; R],
            ) {
                let mut acc = [_mm256_setzero_ps(); R];
                let mut macc = [_mm256_setzero_ps(); R];
                let ns = acts[0].len();
                let p = row.as_ptr();
                let m4 = _mm256_set1_epi8(0x0F);
                match ty {
                    GgmlType::Q4_K | GgmlType::Q5_K => {
                        let five = ty == GgmlType::Q5_K;
                        let (bb, qs) = if five { (176, 48) } else { (144, 16) };
                        for s in 0..ns {
                            let blk = p.add(s * bb);
                            let (sc, mn) =
                                scales_mins_k4(std::slice::from_raw_parts(blk.add(4), 12));
                            let qh = if five {
                                load32(blk.add(16))
                            } else {
                                _mm256_setzero_si256()
                            };
                            // two integer chains per row (even and odd sub-blocks), added at the end: exact
                            let mut lo = [_mm256_setzero_si256(); R];
                            let mut hi = [_mm256_setzero_si256(); R];
                            for jj in 0..4 {
                                let q = load32(blk.add(qs + 32 * jj));
                                let mut w_lo = _mm256_and_si256(q, m4);
                                let mut w_hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
                                if five {
                                    let one = _mm256_set1_epi8(1);
                                    let b_lo = _mm256_and_si256(
                                        _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * jj as i32)),
                                        one,
                                    );
                                    let b_hi = _mm256_and_si256(
                                        _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * jj as i32 + 1)),
                                        one,
                                    );
                                    w_lo = _mm256_or_si256(w_lo, _mm256_slli_epi16(b_lo, 4));
                                    w_hi = _mm256_or_si256(w_hi, _mm256_slli_epi16(b_hi, 4));
                                }
                                let s_lo = _mm256_set1_epi16(i16::from(sc[2 * jj]));
                                let s_hi = _mm256_set1_epi16(i16::from(sc[2 * jj + 1]));
                                for r in 0..R {
                                    let x = acts[r].get_unchecked(s).qs.as_ptr().add(64 * jj);
                                    lo[r] = scaled(lo[r], w_lo, _mm256_load_si256(x.cast()), s_lo);
                                    hi[r] = scaled(
                                        hi[r],
                                        w_hi,
                                        _mm256_load_si256(x.add(32).cast()),
                                        s_hi,
                                    );
                                }
                            }
                            let (d, dmin) = (f16(blk), f16(blk.add(2)));
                            // the mins as int16, each twice: [m0, m0, m1, m1, ..]: lane j of a multiply-add with the
                            // activations' 16-long sums is m_j * (sum of sub-block j)
                            let mn8 = _mm_loadl_epi64(mn.as_ptr().cast());
                            let mins16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mn8, mn8));
                            for r in 0..R {
                                let a = acts[r].get_unchecked(s);
                                let t = _mm256_add_epi32(lo[r], hi[r]);
                                acc[r] = _mm256_fmadd_ps(
                                    _mm256_set1_ps(d * a.d),
                                    _mm256_cvtepi32_ps(t),
                                    acc[r],
                                );
                                let sums = _mm256_load_si256(a.sums16.as_ptr().cast());
                                let m = _mm256_madd_epi16(mins16, sums);
                                macc[r] = _mm256_fmadd_ps(
                                    _mm256_set1_ps(dmin * a.d),
                                    _mm256_cvtepi32_ps(m),
                                    macc[r],
                                );
                            }
                        }
                    }
                    GgmlType::Q6_K => {
                        let m2 = _mm256_set1_epi8(3);
                        for s in 0..ns {
                            let blk = p.add(s * 210);
                            let sc = std::slice::from_raw_parts(blk.add(192), 16);
                            // two integer chains per row (t even and odd), added at the end: exact
                            let mut even = [_mm256_setzero_si256(); R];
                            let mut odd = [_mm256_setzero_si256(); R];
                            for half in 0..2 {
                                let ql_a = load32(blk.add(64 * half));
                                let ql_b = load32(blk.add(64 * half + 32));
                                let qh = load32(blk.add(128 + 32 * half));
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
                                    let k = 8 * half + 2 * t;
                                    let scale = _mm256_set_m128i(
                                        _mm_set1_epi16(i16::from(sc[k + 1] as i8)),
                                        _mm_set1_epi16(i16::from(sc[k] as i8)),
                                    );
                                    for r in 0..R {
                                        let x = acts[r]
                                            .get_unchecked(s)
                                            .qs
                                            .as_ptr()
                                            .add(128 * half + 32 * t);
                                        let x = _mm256_load_si256(x.cast());
                                        if t % 2 == 0 {
                                            even[r] = scaled(even[r], w, x, scale);
                                        } else {
                                            odd[r] = scaled(odd[r], w, x, scale);
                                        }
                                    }
                                }
                            }
                            let d = f16(blk.add(208));
                            // the 16 sub-block scales as int16: lane j of a multiply-add with the activations' sums is
                            // sc[2j] * sums16[2j] + sc[2j + 1] * sums16[2j + 1], the code offset's term over 32 values
                            let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(sc.as_ptr().cast()));
                            for r in 0..R {
                                let a = acts[r].get_unchecked(s);
                                let sums = _mm256_load_si256(a.sums16.as_ptr().cast());
                                let off = _mm256_slli_epi32(_mm256_madd_epi16(sc16, sums), 5);
                                let t = _mm256_sub_epi32(_mm256_add_epi32(even[r], odd[r]), off);
                                acc[r] = _mm256_fmadd_ps(
                                    _mm256_set1_ps(d * a.d),
                                    _mm256_cvtepi32_ps(t),
                                    acc[r],
                                );
                            }
                        }
                    }
                    _ => unreachable!("32-long formats go through tile"),
                }
                for r in 0..R {
                    let (mut a8, mut m8) = ([0.0f32; 8], [0.0f32; 8]);
                    _mm256_storeu_ps(a8.as_mut_ptr(), acc[r]);
                    _mm256_storeu_ps(m8.as_mut_ptr(), macc[r]);
                    out[r] = reduce8(&a8) - reduce8(&m8);
                }
            }
        }
    };
}

x86_path!(avx2, "avx2,fma,f16c", lanes_avx2, scaled_avx2);
x86_path!(
    vnni,
    "avx2,fma,f16c,avx512f,avx512vl,avx512vnni",
    lanes_vnni,
    scaled_vnni
);
