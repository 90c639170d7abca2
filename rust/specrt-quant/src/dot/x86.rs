//! The AVX-512 VNNI paths: the canonical orders of [`super`] with `vpdpbusd` (unsigned weight bytes times signed
//! activation bytes, summed in fours into int32 lanes). `vnni` runs one packed group of eight columns
//! ([`crate::packed`]) on 256-bit registers, `vnni512` two groups on 512-bit registers: four activations broadcast
//! to every lane, one multiply-add per four weights of the group's columns, the sub-block scales as lane-wise int32
//! products. The AVX2 path (no VNNI) is [`super::avx2`].
#![allow(clippy::cast_ptr_alignment)] // unaligned loads (loadu) only

use core::arch::x86_64::*;

/// `acc` + lanes `j` = sum of `w[4j..4j + 4] * x[4j..4j + 4]` (`w` unsigned, `x` signed bytes): AVX-512 VNNI's
/// `vpdpbusd` on a 256-bit register.
#[target_feature(enable = "avx2,avx512f,avx512vl,avx512vnni")]
#[inline]
unsafe fn lanes_vnni(acc: __m256i, w: __m256i, x: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(acc, w, x)
}

pub(crate) mod vnni {
    use core::arch::x86_64::*;

    use super::lanes_vnni as lanes;
    use crate::acts::{ActBlock, ActSuper};
    use crate::format::GgmlType;
    use crate::packed::{block_offset, layout, GROUP};

    /// 32 bytes from `p`, unaligned.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
    #[inline]
    unsafe fn load32(p: *const u8) -> __m256i {
        _mm256_loadu_si256(p.cast())
    }

    /// [`crate::dot::group_b`] on this path.
    ///
    /// # Safety
    /// As [`crate::dot::group_b`]; the CPU has this path's features.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
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
        let mut acc = [_mm256_setzero_ps(); R];
        let m4 = _mm256_set1_epi8(0x0F);
        for b in 0..acts[0].len() {
            let p = group.as_ptr().add(b * lay.size);
            let codes = p.add(lay.codes);
            let x: [*const u8; R] =
                std::array::from_fn(|r| acts[r].get_unchecked(b).qs.as_ptr().cast());
            let mut lo = [_mm256_setzero_si256(); R];
            let mut hi = [_mm256_setzero_si256(); R];
            if ty == GgmlType::Q8_0 {
                // the signed codes back (stored + 128), their magnitudes against the activations with their
                // signs: vpmaddubsw pairs stay within 2 * 128 * 127 (unsigned codes up to 255 could saturate)
                let flip = _mm256_set1_epi8(i8::MIN);
                for i in 0..4 {
                    let q_a = _mm256_xor_si256(load32(codes.add(64 * i)), flip);
                    let q_b = _mm256_xor_si256(load32(codes.add(64 * i + 32)), flip);
                    let (w_a, w_b) = (_mm256_abs_epi8(q_a), _mm256_abs_epi8(q_b));
                    for r in 0..R {
                        let xa = x[r].add(8 * i).cast::<i32>().read_unaligned();
                        let xb = x[r].add(8 * i + 4).cast::<i32>().read_unaligned();
                        let xa = _mm256_sign_epi8(_mm256_set1_epi32(xa), q_a);
                        let xb = _mm256_sign_epi8(_mm256_set1_epi32(xb), q_b);
                        lo[r] = lanes(lo[r], w_a, xa);
                        hi[r] = lanes(hi[r], w_b, xb);
                    }
                }
            } else {
                for l in 0..4 {
                    let q = load32(codes.add(32 * l));
                    let mut w_lo = _mm256_and_si256(q, m4);
                    let mut w_hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
                    if ty == GgmlType::Q5_0 {
                        let (b_lo, b_hi) = fifth_bits(load32(p.add(lay.high)), l);
                        w_lo = _mm256_or_si256(w_lo, b_lo);
                        w_hi = _mm256_or_si256(w_hi, b_hi);
                    }
                    for r in 0..R {
                        let xl = x[r].add(4 * l).cast::<i32>().read_unaligned();
                        let xh = x[r].add(16 + 4 * l).cast::<i32>().read_unaligned();
                        lo[r] = lanes(lo[r], w_lo, _mm256_set1_epi32(xl));
                        hi[r] = lanes(hi[r], w_hi, _mm256_set1_epi32(xh));
                    }
                }
            }
            let d = _mm256_cvtph_ps(_mm_loadu_si128(p.add(lay.d).cast()));
            for r in 0..R {
                let a = acts[r].get_unchecked(b);
                let mut sum = _mm256_add_epi32(lo[r], hi[r]);
                if offset != 0 {
                    sum = _mm256_sub_epi32(sum, _mm256_set1_epi32(offset * a.sum));
                }
                let xd = _mm256_set1_ps(a.d);
                acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(d, xd), _mm256_cvtepi32_ps(sum), acc[r]);
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

    /// Bit 4 of the codes of step `l` (low nibbles) and `l + 4` (high nibbles) from a fifth-bit plane `h`
    /// (byte `4c + t`: bit `l`, bit `4 + l`), each at bit 4 of its byte.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
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

    /// [`crate::dot::group_k`] on this path.
    ///
    /// # Safety
    /// As [`crate::dot::group_k`]; the CPU has this path's features.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
    pub(crate) unsafe fn group_k<const R: usize>(
        ty: GgmlType,
        group: &[u8],
        acts: [&[ActSuper]; R],
        out: &mut [[f32; GROUP]; R],
    ) {
        let lay = layout(ty);
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
                            let (b_lo, b_hi) = fifth_bits(load32(high.add(32 * j)), l);
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
                        let xh = x[r].add(32 * j + 16 + 4 * l).cast::<i32>().read_unaligned();
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
                    let sc =
                        _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.add(lay.scales + GROUP * j).cast()));
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
                    acc[r] =
                        _mm256_fmadd_ps(_mm256_mul_ps(d, xd), _mm256_cvtepi32_ps(t[r]), acc[r]);
                }
            } else {
                let dmin = _mm256_cvtph_ps(_mm_loadu_si128(p.add(lay.dmin).cast()));
                let mins: [__m256i; 4] = std::array::from_fn(|i| {
                    _mm256_cvtepu8_epi16(_mm_loadu_si128(p.add(lay.mins + 2 * GROUP * i).cast()))
                });
                for r in 0..R {
                    let a = acts[r].get_unchecked(s);
                    let mi = crate::dot::avx2::mins_dot(&mins, &a.pairs32);
                    let xd = _mm256_set1_ps(a.d);
                    acc[r] =
                        _mm256_fmadd_ps(_mm256_mul_ps(d, xd), _mm256_cvtepi32_ps(t[r]), acc[r]);
                    acc[r] =
                        _mm256_fnmadd_ps(_mm256_mul_ps(dmin, xd), _mm256_cvtepi32_ps(mi), acc[r]);
                }
            }
        }
        for r in 0..R {
            _mm256_storeu_ps(out[r].as_mut_ptr(), acc[r]);
        }
    }
}

/// Two packed groups at once on 512-bit registers (AVX-512 VNNI): group `g0`'s columns in lanes 0..8, `g1`'s in
/// 8..16, each lane computing exactly what [`vnni::group_k`] computes for its column (the same canonical order), with
/// half the instructions: one `vpdpbusd` per four weights of sixteen columns.
pub(crate) mod vnni512 {
    use core::arch::x86_64::*;

    use crate::acts::{ActBlock, ActSuper};
    use crate::format::GgmlType;
    use crate::packed::{block_offset, layout, GROUP};

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
        let lay = layout(ty);
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
                            let (b_lo, b_hi) = fifth_bits(load2(p0.add(at), p1.add(at)), l);
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
                    // indices, not iterator adapters (not always inlined here: see avx2::pairs16)
                    #[allow(clippy::needless_range_loop)]
                    for i in 1..4 {
                        mi = _mm512_add_epi32(
                            mi,
                            _mm512_madd_epi16(mins[i], _mm512_set1_epi32(a.pairs32[i])),
                        );
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

    /// Bit 4 of the codes of steps `l` and `l + 4` from a fifth-bit plane, as the 256-bit paths' `fifth_bits`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    #[inline]
    unsafe fn fifth_bits(h: __m512i, l: usize) -> (__m512i, __m512i) {
        let b_lo = _mm512_and_si512(h, _mm512_set1_epi8(1 << l));
        let b_hi = _mm512_and_si512(h, _mm512_set1_epi8(0x10 << l));
        match l {
            0 => (_mm512_slli_epi16(b_lo, 4), b_hi),
            1 => (_mm512_slli_epi16(b_lo, 3), _mm512_srli_epi16(b_hi, 1)),
            2 => (_mm512_slli_epi16(b_lo, 2), _mm512_srli_epi16(b_hi, 2)),
            _ => (_mm512_slli_epi16(b_lo, 1), _mm512_srli_epi16(b_hi, 3)),
        }
    }

    /// [`crate::dot::group_b2`] on this path.
    ///
    /// # Safety
    /// As [`crate::dot::group_b2`]; the CPU has AVX-512 F / BW / VL / VNNI.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(crate) unsafe fn group_b2<const R: usize>(
        ty: GgmlType,
        g0: &[u8],
        g1: &[u8],
        acts: [&[ActBlock]; R],
        out: &mut [[f32; 2 * GROUP]; R],
    ) {
        let lay = layout(ty);
        let offset = block_offset(ty);
        let mut acc = [_mm512_setzero_ps(); R];
        let m4 = _mm512_set1_epi8(0x0F);
        for b in 0..acts[0].len() {
            let (p0, p1) = (g0.as_ptr().add(b * lay.size), g1.as_ptr().add(b * lay.size));
            let x: [*const u8; R] =
                std::array::from_fn(|r| acts[r].get_unchecked(b).qs.as_ptr().cast());
            let mut lo = [_mm512_setzero_si512(); R];
            let mut hi = [_mm512_setzero_si512(); R];
            if ty == GgmlType::Q8_0 {
                for i in 0..4 {
                    let (at_a, at_b) = (lay.codes + 64 * i, lay.codes + 64 * i + 32);
                    let w_a = load2(p0.add(at_a), p1.add(at_a));
                    let w_b = load2(p0.add(at_b), p1.add(at_b));
                    for r in 0..R {
                        let xa = x[r].add(8 * i).cast::<i32>().read_unaligned();
                        let xb = x[r].add(8 * i + 4).cast::<i32>().read_unaligned();
                        lo[r] = _mm512_dpbusd_epi32(lo[r], w_a, _mm512_set1_epi32(xa));
                        hi[r] = _mm512_dpbusd_epi32(hi[r], w_b, _mm512_set1_epi32(xb));
                    }
                }
            } else {
                for l in 0..4 {
                    let at = lay.codes + 32 * l;
                    let q = load2(p0.add(at), p1.add(at));
                    let mut w_lo = _mm512_and_si512(q, m4);
                    let mut w_hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
                    if ty == GgmlType::Q5_0 {
                        let (b_lo, b_hi) = fifth_bits(load2(p0.add(lay.high), p1.add(lay.high)), l);
                        w_lo = _mm512_or_si512(w_lo, b_lo);
                        w_hi = _mm512_or_si512(w_hi, b_hi);
                    }
                    for r in 0..R {
                        let xl = x[r].add(4 * l).cast::<i32>().read_unaligned();
                        let xh = x[r].add(16 + 4 * l).cast::<i32>().read_unaligned();
                        lo[r] = _mm512_dpbusd_epi32(lo[r], w_lo, _mm512_set1_epi32(xl));
                        hi[r] = _mm512_dpbusd_epi32(hi[r], w_hi, _mm512_set1_epi32(xh));
                    }
                }
            }
            let d = halves_f32(p0.add(lay.d), p1.add(lay.d));
            for r in 0..R {
                let a = acts[r].get_unchecked(b);
                let mut sum = _mm512_add_epi32(lo[r], hi[r]);
                if offset != 0 {
                    sum = _mm512_sub_epi32(sum, _mm512_set1_epi32(offset * a.sum));
                }
                let xd = _mm512_set1_ps(a.d);
                acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(d, xd), _mm512_cvtepi32_ps(sum), acc[r]);
                if ty == GgmlType::Q4_1 {
                    let m = halves_f32(p0.add(lay.dmin), p1.add(lay.dmin));
                    acc[r] =
                        _mm512_fmadd_ps(_mm512_mul_ps(m, xd), _mm512_set1_ps(a.sum as f32), acc[r]);
                }
            }
        }
        for r in 0..R {
            _mm512_storeu_ps(out[r].as_mut_ptr(), acc[r]);
        }
    }
}
