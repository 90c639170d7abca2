//! The kernel against its own scalar dequantization (the Python tests check it against gguf-py's, an independent
//! implementation), every SIMD path against the portable one bit for bit, rows independent of M, and deliberately
//! broken kernels that the same checks catch.

use proptest::prelude::*;

use crate::dot::portable::{tile_k_with, tile_with, Mutation};
use crate::{
    dequantize_row, matmul, quantize_rows, quantize_rows_super, ActBlock, ActSuper, GgmlType,
    KernelPath, QMatrix, ScopedThreads, Scratch, Serial, SUPPORTED_TYPES,
};

/// A tiny deterministic generator (splitmix64), so the tests need no RNG crate.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
}

fn put_f16(b: &mut [u8], v: f32) {
    b[..2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
}

/// `n` random rows of `k` weights of type `ty`: random codes, scales of random sign and size (some zero).
fn random_blocks(ty: GgmlType, n: usize, k: usize, rng: &mut Rng) -> Vec<u8> {
    let bytes = n * ty.row_bytes(k).unwrap();
    let mut data: Vec<u8> = (0..bytes).map(|_| rng.next() as u8).collect();
    for blk in data.chunks_exact_mut(ty.block_bytes()) {
        let scale = |rng: &mut Rng| {
            let u = rng.unit();
            if u < 0.02 {
                0.0
            } else {
                (u - 0.5) * 0.2
            }
        };
        match ty {
            GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => put_f16(blk, scale(rng)),
            GgmlType::Q4_1 | GgmlType::Q4_K | GgmlType::Q5_K => {
                put_f16(blk, scale(rng));
                put_f16(&mut blk[2..], scale(rng));
            }
            GgmlType::Q6_K => put_f16(&mut blk[208..], scale(rng)),
        }
    }
    data
}

fn random_x(m: usize, k: usize, rng: &mut Rng) -> Vec<f32> {
    // activations with outliers, as a transformer's have: mostly N(0,1)-ish, a few 20x larger
    (0..m * k)
        .map(|_| (rng.unit() - 0.5) * if rng.unit() < 0.01 { 40.0 } else { 2.0 })
        .collect()
}

/// Shapes: K with an odd number of 32-blocks or of super-blocks, and M across decode, verify and prefill sizes.
fn shapes(ty: GgmlType) -> Vec<(usize, usize)> {
    let ks = if ty.block_len() == 32 {
        vec![32, 96, 224, 1536]
    } else {
        vec![256, 768, 1280]
    };
    let ms = [1, 2, 3, 5, 17];
    ks.iter()
        .flat_map(|&k| ms.iter().map(move |&m| (m, k)))
        .collect()
}

fn run(path: KernelPath, w: &QMatrix<'_>, x: &[f32], m: usize) -> Vec<f32> {
    let mut out = vec![0.0; m * w.n];
    matmul(
        w,
        x,
        m,
        &mut out,
        path,
        &mut Scratch::default(),
        &ScopedThreads(2),
    )
    .unwrap();
    out
}

/// The reference and its bound for output (r, n): `sum_e w[e] * x[e]` in f64 from the dequantized row, and the
/// largest error int8 activations allow: each `x[e]` moves by at most `d_x / 2` (half a code), so
/// `|y - ref| <= sum_e |w[e]| * d_x(e) / 2`, plus float32 rounding of the sum (1e-5 of `sum |w x|`).
fn reference(ty: GgmlType, row: &[u8], x: &[f32]) -> (f64, f64) {
    let mut w = vec![0.0f32; x.len()];
    dequantize_row(ty, row, &mut w);
    let d_of: Vec<f32> = if ty.block_len() == 256 {
        let mut acts: Vec<ActSuper> = Vec::new();
        quantize_rows_super(x, 1, x.len(), &mut acts, KernelPath::Portable);
        (0..x.len()).map(|e| acts[e / 256].d).collect()
    } else {
        let mut acts: Vec<ActBlock> = Vec::new();
        quantize_rows(x, 1, x.len(), &mut acts, KernelPath::Portable);
        (0..x.len()).map(|e| acts[e / 32].d).collect()
    };
    let (mut y, mut bound, mut mag) = (0.0f64, 0.0f64, 0.0f64);
    for (e, (&wi, &xi)) in w.iter().zip(x).enumerate() {
        y += f64::from(wi) * f64::from(xi);
        bound += f64::from(wi.abs()) * f64::from(d_of[e]) / 2.0;
        mag += (f64::from(wi) * f64::from(xi)).abs();
    }
    (y, bound * 1.0001 + 1e-5 * mag + 1e-6)
}

/// Whether every element of `out [m, n]` is within its tolerance of the expected value: `expect(weight row,
/// activation row)` gives `(y, tolerance)`; the first miss otherwise.
fn check_rows(
    ty: GgmlType,
    w: &QMatrix<'_>,
    x: &[f32],
    m: usize,
    out: &[f32],
    expect: impl Fn(&[u8], &[f32]) -> (f64, f64),
) -> Result<(), String> {
    for r in 0..m {
        for n in 0..w.n {
            let (y, tol) = expect(w.row(n), &x[r * w.k..(r + 1) * w.k]);
            let got = f64::from(out[r * w.n + n]);
            if (got - y).abs() > tol {
                return Err(format!(
                    "{} M={m} K={} row {r} col {n}: {got} vs {y} (tolerance {tol})",
                    ty.name(),
                    w.k
                ));
            }
        }
    }
    Ok(())
}

/// Whether `out [m, n]` matches the reference within its bound everywhere; the first miss otherwise.
fn check_reference(
    ty: GgmlType,
    w: &QMatrix<'_>,
    x: &[f32],
    m: usize,
    out: &[f32],
) -> Result<(), String> {
    check_rows(ty, w, x, m, out, |row, xr| reference(ty, row, xr))
}

#[test]
fn every_type_matches_the_dequantized_reference_within_the_int8_activation_bound() {
    let mut rng = Rng(1);
    for ty in SUPPORTED_TYPES {
        for (m, k) in shapes(ty) {
            let n = 7;
            let data = random_blocks(ty, n, k, &mut rng);
            let w = QMatrix::new(ty, n, k, &data).unwrap();
            let x = random_x(m, k, &mut rng);
            check_reference(ty, &w, &x, m, &run(KernelPath::Portable, &w, &x, m)).unwrap();
        }
    }
}

/// Every SIMD path in `paths` gives the portable path's bits for `x` (`m` rows) against `w`; `what` names the case.
fn simd_equals_portable(paths: &[KernelPath], w: &QMatrix<'_>, x: &[f32], m: usize, what: &str) {
    let want = run(KernelPath::Portable, w, x, m);
    for &p in paths {
        let got = run(p, w, x, m);
        let same = want
            .iter()
            .zip(&got)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(
            same,
            "{} {what}: differs from portable ({} vs {})",
            p.name(),
            got[0],
            want[0]
        );
    }
}

#[test]
fn simd_paths_equal_the_portable_path_bit_for_bit() {
    let mut rng = Rng(2);
    let paths: Vec<KernelPath> = KernelPath::ALL
        .into_iter()
        .filter(|p| p.is_available())
        .collect();
    assert!(paths.contains(&KernelPath::Portable));
    for ty in SUPPORTED_TYPES {
        for (m, k) in shapes(ty) {
            let n = 19; // more than one task of 16 rows
            let data = random_blocks(ty, n, k, &mut rng);
            let w = QMatrix::new(ty, n, k, &data).unwrap();
            let x = random_x(m, k, &mut rng);
            simd_equals_portable(&paths, &w, &x, m, &format!("{} M={m} K={k}", ty.name()));
        }
    }
}

/// The largest integer partial sums a pass can meet: every code at its extreme (all bytes 0xFF: 4-bit codes 15,
/// 5-bit 31, 6-bit 63; 0x80 and 0x7F: Q8_0's -128 and 127; and the scales at their extremes) against activations
/// that all quantize to +127 or all to -127. A SIMD path that adds int16 pair sums beyond int16 (or a scale product
/// beyond int32) saturates or wraps here and differs from the portable path, which sums in int32.
#[test]
fn extreme_codes_and_activations_do_not_overflow_the_simd_sums() {
    let paths: Vec<KernelPath> = KernelPath::ALL
        .into_iter()
        .filter(|p| p.is_available())
        .collect();
    for ty in SUPPORTED_TYPES {
        for fill in [0xFFu8, 0x80, 0x7F] {
            let (n, k) = (11, 2 * ty.block_len());
            let mut data = vec![fill; n * ty.row_bytes(k).unwrap()];
            for blk in data.chunks_exact_mut(ty.block_bytes()) {
                match ty {
                    GgmlType::Q6_K => put_f16(&mut blk[208..], 0.01),
                    GgmlType::Q4_1 | GgmlType::Q4_K | GgmlType::Q5_K => {
                        put_f16(blk, 0.01);
                        put_f16(&mut blk[2..], 0.02);
                    }
                    _ => put_f16(blk, 0.01),
                }
            }
            let w = QMatrix::new(ty, n, k, &data).unwrap();
            for sign in [1.0f32, -1.0] {
                let m = 3;
                let x = vec![sign; m * k];
                let what = format!("{} fill {fill:#x} x = {sign}", ty.name());
                simd_equals_portable(&paths, &w, &x, m, &what);
            }
        }
    }
}

#[test]
fn a_row_is_the_same_bits_whatever_the_other_rows_of_the_pass() {
    let mut rng = Rng(3);
    for path in KernelPath::ALL.into_iter().filter(|p| p.is_available()) {
        for ty in SUPPORTED_TYPES {
            let k = if ty.block_len() == 32 { 224 } else { 512 };
            let n = 21;
            let data = random_blocks(ty, n, k, &mut rng);
            let w = QMatrix::new(ty, n, k, &data).unwrap();
            let x = random_x(17, k, &mut rng);
            let all = run(path, &w, &x, 17);
            for r in [0, 3, 4, 16] {
                let mut one = vec![0.0; n];
                matmul(
                    &w,
                    &x[r * k..(r + 1) * k],
                    1,
                    &mut one,
                    path,
                    &mut Scratch::default(),
                    &Serial,
                )
                .unwrap();
                let same = one
                    .iter()
                    .zip(&all[r * n..(r + 1) * n])
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    same,
                    "{} {}: row {r} of M=17 differs from the same row alone",
                    path.name(),
                    ty.name()
                );
            }
        }
    }
}

/// Runs the portable tile with `mutation` over every row and output column, one activation row at a time.
fn mutated(mutation: Mutation, w: &QMatrix<'_>, x: &[f32], m: usize) -> Vec<f32> {
    let mut out = vec![0.0; m * w.n];
    let mut blocks: Vec<ActBlock> = Vec::new();
    let mut supers: Vec<ActSuper> = Vec::new();
    let k_quant = w.ty.block_len() == 256;
    if k_quant {
        quantize_rows_super(x, m, w.k, &mut supers, KernelPath::Portable);
    } else {
        quantize_rows(x, m, w.k, &mut blocks, KernelPath::Portable);
    }
    for r in 0..m {
        for n in 0..w.n {
            let mut o = [0.0f32; 1];
            if k_quant {
                let ns = w.k / 256;
                tile_k_with(
                    mutation,
                    w.ty,
                    w.row(n),
                    [&supers[r * ns..(r + 1) * ns]],
                    &mut o,
                );
            } else {
                let nb = w.k / 32;
                tile_with(
                    mutation,
                    w.ty,
                    w.row(n),
                    [&blocks[r * nb..(r + 1) * nb]],
                    &mut o,
                );
            }
            out[r * w.n + n] = o[0];
        }
    }
    out
}

#[test]
fn the_word_wise_scale_decoding_equals_ggml_s_per_index_rule() {
    let mut rng = Rng(9);
    for _ in 0..2000 {
        let q: Vec<u8> = (0..12).map(|_| rng.next() as u8).collect();
        let (sc, mn) = crate::format::scales_mins_k4(&q);
        for j in 0..8 {
            assert_eq!(
                (sc[j], mn[j]),
                crate::format::scale_min_k4(j, &q),
                "{q:?} j={j}"
            );
        }
    }
}

#[test]
fn bad_shapes_and_types_are_refused_with_the_field_named() {
    let err = GgmlType::from_id(1).unwrap_err().to_string();
    assert!(err.contains("ggml_type") && err.contains("Q4_K"), "{err}");
    let err = GgmlType::Q4_K.row_bytes(300).unwrap_err().to_string();
    assert!(err.contains("K = 300") && err.contains("256"), "{err}");
    let data = vec![0u8; 18 * 3];
    assert!(QMatrix::new(GgmlType::Q4_0, 2, 32, &data).is_err());
    let w = QMatrix::new(GgmlType::Q4_0, 3, 32, &data).unwrap();
    let mut out = vec![0.0; 3];
    assert!(matmul(
        &w,
        &[0.0; 31],
        1,
        &mut out,
        KernelPath::Portable,
        &mut Scratch::default(),
        &Serial
    )
    .is_err());
    let mut g = vec![0.0; 32];
    assert!(crate::gather(&w, &[3], &mut g)
        .unwrap_err()
        .to_string()
        .contains("index 3"));
}

#[test]
fn a_non_finite_activation_gives_nan_not_a_finite_guess() {
    let mut rng = Rng(5);
    let data = random_blocks(GgmlType::Q8_0, 2, 64, &mut rng);
    let w = QMatrix::new(GgmlType::Q8_0, 2, 64, &data).unwrap();
    let mut x = random_x(1, 64, &mut rng);
    x[40] = f32::INFINITY;
    for path in KernelPath::ALL.into_iter().filter(|p| p.is_available()) {
        let y = run(path, &w, &x, 1);
        assert!(y.iter().all(|v| v.is_nan()), "{}: {y:?}", path.name());
    }
}

/// The activation code as `f32::round` (half away from zero, llama.cpp's `roundf`) then the clamp would give it.
fn code_by_round(v: f32) -> i8 {
    v.round().clamp(-127.0, 127.0) as i8
}

#[test]
fn activation_codes_round_half_away_from_zero_as_roundf() {
    let halfway = (-128..=128).flat_map(|i| {
        let h = i as f32 + 0.5;
        [
            h,
            f32::from_bits(h.to_bits() - 1),
            f32::from_bits(h.to_bits() + 1),
        ]
    });
    let special = [
        0.0,
        -0.0,
        0.49999997,
        -0.49999997,
        126.5,
        -126.5,
        127.4,
        127.5,
        -127.5,
        1e9,
        -1e9,
    ];
    let special = special.into_iter().chain([
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::MIN_POSITIVE,
    ]);
    for v in halfway.chain(special) {
        assert_eq!(
            crate::acts::code(v),
            code_by_round(v),
            "v = {v:e} ({:#010x})",
            v.to_bits()
        );
    }
    // a rounding that breaks ties toward even (as `round_ties_even` or a `+ 0.5` trick would) is caught here
    assert_ne!((2.5f32).round_ties_even() as i8, code_by_round(2.5));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]
    #[test]
    fn activation_codes_equal_roundf_on_any_float(bits in any::<u32>(), scaled in -140.0f32..140.0) {
        let v = f32::from_bits(bits);
        prop_assert_eq!(crate::acts::code(v), code_by_round(v), "v = {:e}", v);
        prop_assert_eq!(crate::acts::code(scaled), code_by_round(scaled), "v = {:e}", scaled);
    }
}

/// Activations that stress the quantizers: random with outliers, values whose scaled codes land on and beside every
/// halfway point (each 32-block's largest value 127 so that `x * id` is the code's own float), zeros, and (when
/// `bad` is given) one non-finite value at that index.
fn quantizer_input(rng: &mut Rng, k: usize, bad: Option<(usize, f32)>) -> Vec<f32> {
    let mut x = random_x(1, k, rng);
    for (i, v) in x.iter_mut().enumerate() {
        match rng.next() % 4 {
            0 => {
                let h = (rng.next() % 254) as f32 - 127.0 + 0.5;
                *v = f32::from_bits(
                    h.to_bits()
                        .wrapping_add((rng.next() % 3) as u32)
                        .wrapping_sub(1),
                );
            }
            1 if i % 64 < 32 => *v = 0.0,
            _ => {}
        }
        if i % 32 == 0 {
            *v = 127.0;
        }
    }
    if rng.next().is_multiple_of(8) {
        x[..32.min(k)].fill(0.0); // an all-zero block: scale 0
    }
    if let Some((at, v)) = bad {
        x[at % k] = v;
    }
    x
}

/// Every field of the SIMD quantizers' blocks equals the portable quantizer's: codes, scales (bit patterns, so NaN
/// against NaN compares), sums, offsets and pairs.
fn assert_quantizers_agree(x: &[f32], k: usize) {
    let m = x.len() / k;
    for path in KernelPath::ALL.into_iter().filter(|p| p.is_available()) {
        if k.is_multiple_of(256) {
            let (mut want, mut got) = (Vec::new(), Vec::new());
            quantize_rows_super(x, m, k, &mut want, KernelPath::Portable);
            quantize_rows_super(x, m, k, &mut got, path);
            for (i, (a, b)) in want.iter().zip(&got).enumerate() {
                let at = format!("{} super-block {i}", path.name());
                assert_eq!(a.qs, b.qs, "{at}: codes");
                assert_eq!(a.d.to_bits(), b.d.to_bits(), "{at}: d");
                assert_eq!(a.sums16, b.sums16, "{at}: sums16");
                assert_eq!(a.offsets16, b.offsets16, "{at}: offsets16");
                assert_eq!(a.pairs32, b.pairs32, "{at}: pairs32");
            }
        }
        let (mut want, mut got) = (Vec::new(), Vec::new());
        quantize_rows(x, m, k, &mut want, KernelPath::Portable);
        quantize_rows(x, m, k, &mut got, path);
        for (i, (a, b)) in want.iter().zip(&got).enumerate() {
            let at = format!("{} block {i}", path.name());
            assert_eq!(a.qs, b.qs, "{at}: codes");
            assert_eq!(a.d.to_bits(), b.d.to_bits(), "{at}: d");
            assert_eq!(a.sum, b.sum, "{at}: sum");
        }
    }
}

#[test]
fn simd_quantizers_equal_the_portable_one_on_halfway_zero_and_non_finite_activations() {
    let mut rng = Rng(11);
    for round in 0..200 {
        let k = 256 * (1 + round % 3);
        let bad = match round % 5 {
            0 => Some((rng.next() as usize, f32::NAN)),
            1 => Some((rng.next() as usize, f32::NEG_INFINITY)),
            _ => None,
        };
        assert_quantizers_agree(&quantizer_input(&mut rng, k, bad), k);
    }
    // the check sees a quantizer that rounds ties to even: the portable codes of exact halfway values differ from it
    let x: Vec<f32> = (0..32)
        .map(|i| if i == 0 { 127.0 } else { i as f32 - 0.5 })
        .collect();
    let mut want = Vec::new();
    quantize_rows(&x, 1, 32, &mut want, KernelPath::Portable);
    let even: Vec<i8> = x.iter().map(|v| v.round_ties_even() as i8).collect();
    assert_ne!(want[0].qs.to_vec(), even);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn simd_quantizers_equal_the_portable_one_on_any_floats(bits in proptest::collection::vec(any::<u32>(), 256), scale in -30i32..30) {
        // any bit patterns (NaN, infinities, subnormals among them) and the same values scaled into a finite range
        let raw: Vec<f32> = bits.iter().map(|&b| f32::from_bits(b)).collect();
        assert_quantizers_agree(&raw, 256);
        let finite: Vec<f32> = bits.iter().map(|&b| f32::from_bits(b & 0x807F_FFFF | 0x3F80_0000) * 2f32.powi(scale)).collect();
        assert_quantizers_agree(&finite, 256);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn simd_equals_portable_on_random_shapes(seed in any::<u64>(), t in 0usize..7, blocks in 1usize..6, m in 1usize..9, n in 1usize..40) {
        let ty = SUPPORTED_TYPES[t];
        let k = blocks * ty.block_len();
        let mut rng = Rng(seed);
        let data = random_blocks(ty, n, k, &mut rng);
        let w = QMatrix::new(ty, n, k, &data).unwrap();
        let x = random_x(m, k, &mut rng);
        let want = run(KernelPath::Portable, &w, &x, m);
        prop_assert!(check_reference(ty, &w, &x, m, &want).is_ok());
        for p in KernelPath::ALL.into_iter().filter(|p| p.is_available()) {
            let got = run(p, &w, &x, m);
            prop_assert!(want.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()), "{}", p.name());
        }
    }
}

/// Activations on the int8 grid (codes times 2^-4, every 32 values reaching +-127): they quantize without loss, so
/// the kernel must equal the dequantized reference to float32 rounding.
fn grid_x(m: usize, k: usize, rng: &mut Rng) -> Vec<f32> {
    (0..m * k)
        .map(|i| {
            let q = if i % 32 == 0 {
                127
            } else {
                (rng.next() % 255) as i32 - 127
            };
            q as f32 / 16.0
        })
        .collect()
}

/// Whether `out` equals the reference to float32 rounding (1e-5 of `sum |w x|`) for grid activations.
fn check_exact(
    ty: GgmlType,
    w: &QMatrix<'_>,
    x: &[f32],
    m: usize,
    out: &[f32],
) -> Result<(), String> {
    check_rows(ty, w, x, m, out, |row, xr| {
        let mut wd = vec![0.0f32; w.k];
        dequantize_row(ty, row, &mut wd);
        let terms = wd
            .iter()
            .zip(xr)
            .map(|(a, b)| f64::from(*a) * f64::from(*b));
        let mag: f64 = terms.clone().map(f64::abs).sum();
        (terms.sum(), 1e-5 * mag + 1e-6)
    })
}

#[test]
fn grid_activations_match_the_reference_to_float_rounding_and_catch_broken_kernels() {
    let mut rng = Rng(4);
    for ty in SUPPORTED_TYPES {
        let (m, k, n) = (3, if ty.block_len() == 32 { 224 } else { 512 }, 9);
        let data = random_blocks(ty, n, k, &mut rng);
        let w = QMatrix::new(ty, n, k, &data).unwrap();
        let x = grid_x(m, k, &mut rng);
        for p in KernelPath::ALL.into_iter().filter(|p| p.is_available()) {
            check_exact(ty, &w, &x, m, &run(p, &w, &x, m)).unwrap();
        }
        check_exact(ty, &w, &x, m, &mutated(Mutation::None, &w, &x, m)).unwrap();
        for bug in [Mutation::WrongScaleIndex, Mutation::DroppedTail] {
            let out = mutated(bug, &w, &x, m);
            assert!(
                check_exact(ty, &w, &x, m, &out).is_err(),
                "{} with {bug:?} passed the check",
                ty.name()
            );
        }
    }
}

#[test]
fn packing_on_several_threads_gives_the_single_thread_bytes() {
    let mut rng = Rng(0x5EED_0009);
    for ty in SUPPORTED_TYPES {
        let k = 2 * ty.block_len();
        // fewer groups than threads, a padded last group, more groups than threads
        for n in [1, 9, 41, 100] {
            let data = random_blocks(ty, n, k, &mut rng);
            let w = QMatrix::new(ty, n, k, &data).unwrap();
            let one = crate::Packed::new(&w);
            for threads in [0, 2, 3, 8] {
                let many = crate::Packed::new_threads(&w, threads);
                assert_eq!(many.bytes(), one.bytes(), "{ty:?} n {n} threads {threads}");
                for g in 0..one.groups() {
                    assert_eq!(
                        many.group(g),
                        one.group(g),
                        "{ty:?} n {n} threads {threads} group {g}"
                    );
                }
            }
        }
    }
}
