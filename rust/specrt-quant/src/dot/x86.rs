//! The x86-64 paths: the canonical orders of [`super`] on 256-bit registers. Both paths share the weight decoding
//! and the float steps; they differ only in how the exact integer lanes are formed: AVX2 multiplies bytes into
//! int16 pairs (`vpmaddubsw`, which cannot saturate here: codes are at most 63, or |q| <= 128 for Q8_0 against
//! |x| <= 127, so a pair stays within 2 * 128 * 127 < 32767) and adds pairs (`vpmaddwd`); AVX-512 VNNI does both
//! in one instruction (`vpdpbusd`). The code is written once, in a macro, and compiled for each feature set.
//!
//! The 32-long formats run one weight row against a tile of activation rows (`tile`); the K-quants run a packed
//! group of eight columns ([`crate::packed`]) against a tile (`group_k`): four activations broadcast to every lane,
//! one multiply-add per four weights of eight columns, the sub-block scales as lane-wise int32 products.
#![allow(clippy::cast_ptr_alignment)] // unaligned loads (loadu) only

use core::arch::x86_64::*;

/// `acc` + lanes `j` = sum of `w[4j..4j + 4] * x[4j..4j + 4]` (`w` unsigned, `x` signed bytes), AVX2.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn lanes_avx2(acc: __m256i, w: __m256i, x: __m256i) -> __m256i {
    _mm256_add_epi32(
        acc,
        _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)),
    )
}

/// The same lanes with AVX-512 VNNI (`vpdpbusd` on a 256-bit register, accumulating into `acc`).
#[target_feature(enable = "avx2,avx512f,avx512vl,avx512vnni")]
#[inline]
unsafe fn lanes_vnni(acc: __m256i, w: __m256i, x: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(acc, w, x)
}

macro_rules! x86_path {
    ($name:ident, $features:literal, $lanes:ident) => {
        pub(crate) mod $name {
            use core::arch::x86_64::*;

            use super::$lanes as lanes;
            use crate::acts::{ActBlock, ActSuper};
            use crate::dot::reduce;
            use crate::format::GgmlType;
            use crate::packed::{layout, GROUP};

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
                    let mut l = lanes(_mm256_setzero_si256(), w, x);
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
                        unreachable!("K-quants go through group_k")
                    }
                }
                for r in 0..R {
                    let mut lanes16 = [0.0f32; 16];
                    _mm256_storeu_ps(lanes16.as_mut_ptr(), acc[r][0]);
                    _mm256_storeu_ps(lanes16.as_mut_ptr().add(8), acc[r][1]);
                    out[r] = reduce(&lanes16, macc[r]);
                }
            }

            /// [`crate::dot::group_k`] on this path.
            ///
            /// # Safety
            /// As [`crate::dot::group_k`]; the CPU has this path's features.
            #[target_feature(enable = $features)]
            pub(crate) unsafe fn group_k<const R: usize>(
                ty: GgmlType,
                group: &[u8],
                acts: [&[ActSuper]; R],
                out: &mut [[f32; GROUP]; R],
            ) {
                let lay = layout(ty).unwrap_unchecked();
                let mut acc = [_mm256_setzero_ps(); R];
                let ns = acts[0].len();
                let m4 = _mm256_set1_epi8(0x0F);
                let m30 = _mm256_set1_epi8(0x30);
                for s in 0..ns {
                    let p = group.as_ptr().add(s * lay.size);
                    let codes = p.add(lay.codes);
                    let high = p.add(lay.high);
                    let x: [*const u8; R] =
                        std::array::from_fn(|r| acts[r].get_unchecked(s).qs.as_ptr().cast());
                    let mut t = [_mm256_setzero_si256(); R];
                    for j in 0..8 {
                        let mut lo = [_mm256_setzero_si256(); R];
                        let mut hi = [_mm256_setzero_si256(); R];
                        for l in 0..4 {
                            let q = load32(codes.add(128 * j + 32 * l));
                            let mut w_lo = _mm256_and_si256(q, m4);
                            let mut w_hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
                            match ty {
                                GgmlType::Q5_K => {
                                    let h = load32(high.add(32 * j));
                                    let b_lo = _mm256_and_si256(h, _mm256_set1_epi8(1 << l));
                                    let b_hi = _mm256_and_si256(h, _mm256_set1_epi8(0x10 << l));
                                    let (b_lo, b_hi) = match l {
                                        0 => (_mm256_slli_epi16(b_lo, 4), b_hi),
                                        1 => {
                                            (_mm256_slli_epi16(b_lo, 3), _mm256_srli_epi16(b_hi, 1))
                                        }
                                        2 => {
                                            (_mm256_slli_epi16(b_lo, 2), _mm256_srli_epi16(b_hi, 2))
                                        }
                                        _ => {
                                            (_mm256_slli_epi16(b_lo, 1), _mm256_srli_epi16(b_hi, 3))
                                        }
                                    };
                                    // one bit per byte moved within its byte: no mask needed after the shift
                                    w_lo = _mm256_or_si256(w_lo, b_lo);
                                    w_hi = _mm256_or_si256(w_hi, b_hi);
                                }
                                GgmlType::Q6_K => {
                                    let h_lo = load32(high.add(64 * j));
                                    let h_hi = load32(high.add(64 * j + 32));
                                    // bits 2l, 2l + 1 of each byte to bits 4, 5
                                    let at45 = |h: __m256i| match l {
                                        0 => _mm256_slli_epi16(h, 4),
                                        1 => _mm256_slli_epi16(h, 2),
                                        2 => h,
                                        _ => _mm256_srli_epi16(h, 2),
                                    };
                                    w_lo = _mm256_or_si256(w_lo, _mm256_and_si256(at45(h_lo), m30));
                                    w_hi = _mm256_or_si256(w_hi, _mm256_and_si256(at45(h_hi), m30));
                                }
                                _ => {}
                            }
                            for r in 0..R {
                                let xl = x[r].add(32 * j + 4 * l).cast::<i32>().read_unaligned();
                                let xh =
                                    x[r].add(32 * j + 16 + 4 * l).cast::<i32>().read_unaligned();
                                lo[r] = lanes(lo[r], w_lo, _mm256_set1_epi32(xl));
                                hi[r] = lanes(hi[r], w_hi, _mm256_set1_epi32(xh));
                            }
                        }
                        if ty == GgmlType::Q6_K {
                            let sc_lo = _mm256_cvtepi8_epi32(_mm_loadl_epi64(
                                p.add(lay.scales + GROUP * 2 * j).cast(),
                            ));
                            let sc_hi = _mm256_cvtepi8_epi32(_mm_loadl_epi64(
                                p.add(lay.scales + GROUP * (2 * j + 1)).cast(),
                            ));
                            for r in 0..R {
                                let a = acts[r].get_unchecked(s);
                                let off_lo = _mm256_set1_epi32(a.offsets16[2 * j]);
                                let off_hi = _mm256_set1_epi32(a.offsets16[2 * j + 1]);
                                let u = _mm256_mullo_epi32(_mm256_sub_epi32(lo[r], off_lo), sc_lo);
                                let v = _mm256_mullo_epi32(_mm256_sub_epi32(hi[r], off_hi), sc_hi);
                                t[r] = _mm256_add_epi32(t[r], _mm256_add_epi32(u, v));
                            }
                        } else {
                            let sc = _mm256_cvtepu8_epi32(_mm_loadl_epi64(
                                p.add(lay.scales + GROUP * j).cast(),
                            ));
                            for r in 0..R {
                                let sj = _mm256_add_epi32(lo[r], hi[r]);
                                t[r] = _mm256_add_epi32(t[r], _mm256_mullo_epi32(sj, sc));
                            }
                        }
                    }
                    let d = _mm256_cvtph_ps(_mm_loadu_si128(p.add(lay.d).cast()));
                    if ty == GgmlType::Q6_K {
                        for r in 0..R {
                            let xd = _mm256_set1_ps(acts[r].get_unchecked(s).d);
                            acc[r] = _mm256_fmadd_ps(
                                _mm256_mul_ps(d, xd),
                                _mm256_cvtepi32_ps(t[r]),
                                acc[r],
                            );
                        }
                    } else {
                        let dmin = _mm256_cvtph_ps(_mm_loadu_si128(p.add(lay.dmin).cast()));
                        let mins: [__m256i; 4] = std::array::from_fn(|i| {
                            _mm256_cvtepu8_epi16(_mm_loadu_si128(
                                p.add(lay.mins + 2 * GROUP * i).cast(),
                            ))
                        });
                        for r in 0..R {
                            let a = acts[r].get_unchecked(s);
                            let mut mi =
                                _mm256_madd_epi16(mins[0], _mm256_set1_epi32(a.pairs32[0]));
                            for i in 1..4 {
                                mi = _mm256_add_epi32(
                                    mi,
                                    _mm256_madd_epi16(mins[i], _mm256_set1_epi32(a.pairs32[i])),
                                );
                            }
                            let xd = _mm256_set1_ps(a.d);
                            acc[r] = _mm256_fmadd_ps(
                                _mm256_mul_ps(d, xd),
                                _mm256_cvtepi32_ps(t[r]),
                                acc[r],
                            );
                            acc[r] = _mm256_fnmadd_ps(
                                _mm256_mul_ps(dmin, xd),
                                _mm256_cvtepi32_ps(mi),
                                acc[r],
                            );
                        }
                    }
                }
                for r in 0..R {
                    _mm256_storeu_ps(out[r].as_mut_ptr(), acc[r]);
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

/// Two packed groups at once on 512-bit registers (AVX-512 VNNI): group `g0`'s columns in lanes 0..8, `g1`'s in
/// 8..16, each lane computing exactly what [`vnni::group_k`] computes for its column (the same canonical order), with
/// half the instructions: one `vpdpbusd` per four weights of sixteen columns.
pub(crate) mod vnni512 {
    use core::arch::x86_64::*;

    use crate::acts::ActSuper;
    use crate::format::GgmlType;
    use crate::packed::{layout, GROUP};

    /// 32 bytes at `a` in the low half and 32 bytes at `b` in the high half.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    #[inline]
    unsafe fn load2(a: *const u8, b: *const u8) -> __m512i {
        let lo = _mm256_loadu_si256(a.cast());
        _mm512_inserti64x4(_mm512_castsi256_si512(lo), _mm256_loadu_si256(b.cast()), 1)
    }

    /// 16 bytes (8 at `a`, 8 at `b`) as int32 lanes: zero-extended, or sign-extended when `signed`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    #[inline]
    unsafe fn bytes_i32(a: *const u8, b: *const u8, signed: bool) -> __m512i {
        let v = _mm_unpacklo_epi64(_mm_loadl_epi64(a.cast()), _mm_loadl_epi64(b.cast()));
        if signed {
            _mm512_cvtepi8_epi32(v)
        } else {
            _mm512_cvtepu8_epi32(v)
        }
    }

    /// Eight float16 at `a` and eight at `b` as sixteen float32.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    #[inline]
    unsafe fn halves_f32(a: *const u8, b: *const u8) -> __m512 {
        let v = _mm256_set_m128i(_mm_loadu_si128(b.cast()), _mm_loadu_si128(a.cast()));
        _mm512_cvtph_ps(v)
    }

    /// [`crate::dot::group_k2`] on this path.
    ///
    /// # Safety
    /// As [`crate::dot::group_k2`]; the CPU has AVX-512 F / BW / VL / VNNI.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(crate) unsafe fn group_k2<const R: usize>(
        ty: GgmlType,
        g0: &[u8],
        g1: &[u8],
        acts: [&[ActSuper]; R],
        out: &mut [[f32; 2 * GROUP]; R],
    ) {
        let lay = layout(ty).unwrap_unchecked();
        let mut acc = [_mm512_setzero_ps(); R];
        let ns = acts[0].len();
        let m4 = _mm512_set1_epi8(0x0F);
        let m30 = _mm512_set1_epi8(0x30);
        for s in 0..ns {
            let (p0, p1) = (g0.as_ptr().add(s * lay.size), g1.as_ptr().add(s * lay.size));
            let x: [*const u8; R] =
                std::array::from_fn(|r| acts[r].get_unchecked(s).qs.as_ptr().cast());
            let mut t = [_mm512_setzero_si512(); R];
            for j in 0..8 {
                let mut lo = [_mm512_setzero_si512(); R];
                let mut hi = [_mm512_setzero_si512(); R];
                for l in 0..4 {
                    let at = lay.codes + 128 * j + 32 * l;
                    let q = load2(p0.add(at), p1.add(at));
                    let mut w_lo = _mm512_and_si512(q, m4);
                    let mut w_hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
                    match ty {
                        GgmlType::Q5_K => {
                            let at = lay.high + 32 * j;
                            let h = load2(p0.add(at), p1.add(at));
                            let b_lo = _mm512_and_si512(h, _mm512_set1_epi8(1 << l));
                            let b_hi = _mm512_and_si512(h, _mm512_set1_epi8(0x10 << l));
                            let (b_lo, b_hi) = match l {
                                0 => (_mm512_slli_epi16(b_lo, 4), b_hi),
                                1 => (_mm512_slli_epi16(b_lo, 3), _mm512_srli_epi16(b_hi, 1)),
                                2 => (_mm512_slli_epi16(b_lo, 2), _mm512_srli_epi16(b_hi, 2)),
                                _ => (_mm512_slli_epi16(b_lo, 1), _mm512_srli_epi16(b_hi, 3)),
                            };
                            w_lo = _mm512_or_si512(w_lo, b_lo);
                            w_hi = _mm512_or_si512(w_hi, b_hi);
                        }
                        GgmlType::Q6_K => {
                            let at = lay.high + 64 * j;
                            let h_lo = load2(p0.add(at), p1.add(at));
                            let h_hi = load2(p0.add(at + 32), p1.add(at + 32));
                            let at45 = |h: __m512i| match l {
                                0 => _mm512_slli_epi16(h, 4),
                                1 => _mm512_slli_epi16(h, 2),
                                2 => h,
                                _ => _mm512_srli_epi16(h, 2),
                            };
                            w_lo = _mm512_or_si512(w_lo, _mm512_and_si512(at45(h_lo), m30));
                            w_hi = _mm512_or_si512(w_hi, _mm512_and_si512(at45(h_hi), m30));
                        }
                        _ => {}
                    }
                    for r in 0..R {
                        let xl = x[r].add(32 * j + 4 * l).cast::<i32>().read_unaligned();
                        let xh = x[r].add(32 * j + 16 + 4 * l).cast::<i32>().read_unaligned();
                        lo[r] = _mm512_dpbusd_epi32(lo[r], w_lo, _mm512_set1_epi32(xl));
                        hi[r] = _mm512_dpbusd_epi32(hi[r], w_hi, _mm512_set1_epi32(xh));
                    }
                }
                if ty == GgmlType::Q6_K {
                    let (a_lo, a_hi) =
                        (lay.scales + GROUP * 2 * j, lay.scales + GROUP * (2 * j + 1));
                    let sc_lo = bytes_i32(p0.add(a_lo), p1.add(a_lo), true);
                    let sc_hi = bytes_i32(p0.add(a_hi), p1.add(a_hi), true);
                    for r in 0..R {
                        let a = acts[r].get_unchecked(s);
                        let off_lo = _mm512_set1_epi32(a.offsets16[2 * j]);
                        let off_hi = _mm512_set1_epi32(a.offsets16[2 * j + 1]);
                        let u = _mm512_mullo_epi32(_mm512_sub_epi32(lo[r], off_lo), sc_lo);
                        let v = _mm512_mullo_epi32(_mm512_sub_epi32(hi[r], off_hi), sc_hi);
                        t[r] = _mm512_add_epi32(t[r], _mm512_add_epi32(u, v));
                    }
                } else {
                    let at = lay.scales + GROUP * j;
                    let sc = bytes_i32(p0.add(at), p1.add(at), false);
                    for r in 0..R {
                        let sj = _mm512_add_epi32(lo[r], hi[r]);
                        t[r] = _mm512_add_epi32(t[r], _mm512_mullo_epi32(sj, sc));
                    }
                }
            }
            let d = halves_f32(p0.add(lay.d), p1.add(lay.d));
            if ty == GgmlType::Q6_K {
                for r in 0..R {
                    let xd = _mm512_set1_ps(acts[r].get_unchecked(s).d);
                    acc[r] =
                        _mm512_fmadd_ps(_mm512_mul_ps(d, xd), _mm512_cvtepi32_ps(t[r]), acc[r]);
                }
            } else {
                let dmin = halves_f32(p0.add(lay.dmin), p1.add(lay.dmin));
                let mins: [__m512i; 4] = std::array::from_fn(|i| {
                    let at = lay.mins + 2 * GROUP * i;
                    let v = _mm256_set_m128i(
                        _mm_loadu_si128(p1.add(at).cast()),
                        _mm_loadu_si128(p0.add(at).cast()),
                    );
                    _mm512_cvtepu8_epi16(v)
                });
                for r in 0..R {
                    let a = acts[r].get_unchecked(s);
                    let mut mi = _mm512_madd_epi16(mins[0], _mm512_set1_epi32(a.pairs32[0]));
                    for (mv, &pair) in mins.iter().zip(&a.pairs32).skip(1) {
                        mi = _mm512_add_epi32(mi, _mm512_madd_epi16(*mv, _mm512_set1_epi32(pair)));
                    }
                    let xd = _mm512_set1_ps(a.d);
                    acc[r] =
                        _mm512_fmadd_ps(_mm512_mul_ps(d, xd), _mm512_cvtepi32_ps(t[r]), acc[r]);
                    acc[r] =
                        _mm512_fnmadd_ps(_mm512_mul_ps(dmin, xd), _mm512_cvtepi32_ps(mi), acc[r]);
                }
            }
        }
        for r in 0..R {
            _mm512_storeu_ps(out[r].as_mut_ptr(), acc[r]);
        }
    }
}
