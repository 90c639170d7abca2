//! The dot products of weight columns with activation rows, in canonical orders of operations that
//! every path (portable, AVX2, AVX-512 VNNI) follows exactly, so their results agree bit for bit and an output never
//! depends on the pass's other rows. Integer sums are exact whatever order a path adds them in; the float steps are
//! fixed here.
//!
//! **32-long formats** (Q4_0, Q4_1, Q5_0, Q8_0; activations [`crate::ActBlock`] per 32), per block `b`, for each
//! output column on its own:
//! 1. the exact integer `S = sum_e c[e] * x.qs[e]`, `c` the weight codes after the format's offset (`q - 8` for
//!    Q4_0, `q - 16` for Q5_0, `q` otherwise);
//! 2. `acc = fma(d_w * x.d, S, acc)`: one float32 accumulator;
//! 3. Q4_1's zero point: `acc = fma(m_w * x.d, x.sum, acc)`;
//! 4. the result is `acc`.
//!
//! **K-quants** (Q4_K, Q5_K, Q6_K; activations [`crate::ActSuper`] per 256, as llama.cpp's `block_q8_K`), per
//! super-block `s`, for each output column on its own:
//! 1. exact integer sub-block sums `S_k = sum_{e in k} q(e) * x.qs[e]` (`q` the unsigned code; sub-blocks of 32, of 16
//!    for Q6_K, whose code offset is removed here: `S_k -= 32 * x.sums16[k]`);
//! 2. the exact integer `T = sum_k sc_k * S_k` (`sc_k` the sub-block's integer scale; within int32 for every format);
//! 3. `acc = fma(d_w * x.d, T, acc)`: one float32 accumulator;
//! 4. the mins of Q4_K / Q5_K: `M = sum_j m_j * (x.sums16[2j] + x.sums16[2j + 1])` (exact), then
//!    `acc = fma(-(dmin_w * x.d), M, acc)`;
//! 5. the result is `acc`.
//!
//! The SIMD paths run it on [`crate::Packed`] groups of eight columns, one column per 32-bit lane, so every step is
//! a vertical vector operation and nothing is summed across lanes; the portable path runs it from the GGUF's rows.

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
pub(crate) mod portable;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

/// Activation rows the portable path computes together against one weight row (decoded once per tile).
pub const TILE: usize = 4;

/// Which implementation of the dot products runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KernelPath {
    /// Plain Rust, any CPU: the reference the SIMD paths are tested against bit for bit.
    Portable,
    /// x86-64 AVX2 + FMA + F16C (`vpmaddubsw` int16 pair sums, widened by `vpmaddwd` against the sub-block scale).
    Avx2,
    /// x86-64 AVX-512 VNNI (`vpdpbusd` integer dots; 256-bit registers, 512-bit for pairs of packed K-quant groups),
    /// with AVX-512 F / BW / VL and AVX2 / FMA / F16C.
    Avx512Vnni,
}

impl KernelPath {
    /// Every path, portable first.
    pub const ALL: [KernelPath; 3] = [
        KernelPath::Portable,
        KernelPath::Avx2,
        KernelPath::Avx512Vnni,
    ];

    /// The path's name (`"portable"`, `"avx2"`, `"avx512vnni"`).
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Portable => "portable",
            Self::Avx2 => "avx2",
            Self::Avx512Vnni => "avx512vnni",
        }
    }

    /// The path called `name`.
    ///
    /// # Errors
    /// `SpecError::Setting { field: "path" }` naming the paths when `name` is none of them.
    pub fn from_name(name: &str) -> specrt_core::Result<Self> {
        Self::ALL
            .iter()
            .copied()
            .find(|p| p.name() == name)
            .ok_or_else(|| specrt_core::SpecError::Setting {
                field: "path".into(),
                message: format!(
                    "kernel path {name:?} is invalid (expected one of: {})",
                    Self::ALL
                        .iter()
                        .map(|p| format!("{:?}", p.name()))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            })
    }

    /// Whether this CPU can run the path.
    #[must_use]
    pub fn is_available(self) -> bool {
        match self {
            Self::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Self::Avx2 => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                    && std::arch::is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Self::Avx512Vnni => {
                Self::Avx2.is_available()
                    && std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512vl")
                    && std::arch::is_x86_feature_detected!("avx512bw")
                    && std::arch::is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The fastest path this CPU runs (AVX-512 VNNI, else AVX2, else portable), detected once.
    #[must_use]
    pub fn best() -> Self {
        static BEST: std::sync::OnceLock<KernelPath> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| {
            [Self::Avx512Vnni, Self::Avx2]
                .into_iter()
                .find(|p| p.is_available())
                .unwrap_or(Self::Portable)
        })
    }
}

/// Dot products of weight row `row` (a 32-long `ty`, `K = acts[r].len() * 32`) with the `R` activation rows `acts`
/// into `out`. Only the portable path reads rows (`path` must be [`KernelPath::Portable`]); the SIMD paths compute
/// the same bits from packed groups ([`group_b2`]).
///
/// # Panics
/// When `row` does not hold `acts[r].len()` blocks of type `ty`.
#[inline]
pub(crate) fn tile<const R: usize>(
    path: KernelPath,
    ty: crate::GgmlType,
    row: &[u8],
    acts: [&[crate::ActBlock]; R],
    out: &mut [f32; R],
) {
    debug_assert_eq!(
        path,
        KernelPath::Portable,
        "the SIMD paths run packed groups"
    );
    portable::tile(ty, row, acts, out);
}

/// Dot products of weight row `row` (a K-quant `ty`, `K = acts[r].len() * 256`) with the `R` activation rows `acts`
/// into `out`. Only the portable path reads rows (`path` must be [`KernelPath::Portable`]); the SIMD paths compute
/// the same bits from packed groups ([`group_k`]).
///
/// # Panics
/// When `row` does not hold `acts[r].len()` super-blocks of type `ty`.
#[inline]
pub(crate) fn tile_k<const R: usize>(
    path: KernelPath,
    ty: crate::GgmlType,
    row: &[u8],
    acts: [&[crate::ActSuper]; R],
    out: &mut [f32; R],
) {
    debug_assert_eq!(
        path,
        KernelPath::Portable,
        "the SIMD paths run packed groups"
    );
    portable::tile_k(ty, row, acts, out);
}

/// Dot products of one packed group of [`crate::packed::GROUP`] columns (`group`, all its super-blocks; a K-quant
/// `ty`) with the `R` activation rows `acts` into `out[r][c]`, on a SIMD `path`.
///
/// # Safety
/// `path` must be a SIMD path with `path.is_available()`, `group` one group of a [`crate::Packed`] of type `ty`
/// with `acts[r].len()` super-blocks, and every `acts[r]` the same length.
#[inline]
pub(crate) unsafe fn group_k<const R: usize>(
    path: KernelPath,
    ty: crate::GgmlType,
    group: &[u8],
    acts: [&[crate::ActSuper]; R],
    out: &mut [[f32; crate::packed::GROUP]; R],
) {
    match path {
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx2 => unsafe { avx2::group_k(ty, group, acts, out) },
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx512Vnni => unsafe { x86::vnni::group_k(ty, group, acts, out) },
        _ => unreachable!("the portable path runs tile_k"),
    }
}

/// [`group_k`] for two packed groups at once (`g0`'s columns in `out[r][..8]`, `g1`'s in `out[r][8..]`), the same
/// bits per column.
///
/// # Safety
/// As [`group_k`] for both groups.
#[inline]
pub(crate) unsafe fn group_k2<const R: usize>(
    path: KernelPath,
    ty: crate::GgmlType,
    g0: &[u8],
    g1: &[u8],
    acts: [&[crate::ActSuper]; R],
    out: &mut [[f32; 2 * crate::packed::GROUP]; R],
) {
    match path {
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx512Vnni => unsafe { x86::vnni512::group_k2(ty, g0, g1, acts, out) },
        _ => {
            let mut a = [[0.0f32; crate::packed::GROUP]; R];
            let mut b = [[0.0f32; crate::packed::GROUP]; R];
            unsafe {
                group_k(path, ty, g0, acts, &mut a);
                group_k(path, ty, g1, acts, &mut b);
            }
            for r in 0..R {
                out[r][..crate::packed::GROUP].copy_from_slice(&a[r]);
                out[r][crate::packed::GROUP..].copy_from_slice(&b[r]);
            }
        }
    }
}

/// Dot products of one packed group (a 32-long `ty`) with the `R` activation rows `acts` into `out[r][c]`, on a SIMD
/// `path` (256-bit registers).
///
/// # Safety
/// `path` must be a SIMD path with `path.is_available()`, `group` one group of a [`crate::Packed`] of type `ty`
/// with `acts[r].len()` blocks, and every `acts[r]` the same length.
#[inline]
pub(crate) unsafe fn group_b<const R: usize>(
    path: KernelPath,
    ty: crate::GgmlType,
    group: &[u8],
    acts: [&[crate::ActBlock]; R],
    out: &mut [[f32; crate::packed::GROUP]; R],
) {
    match path {
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx2 => unsafe { avx2::group_b(ty, group, acts, out) },
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx512Vnni => unsafe { x86::vnni::group_b(ty, group, acts, out) },
        _ => unreachable!("the portable path runs tile"),
    }
}

/// [`group_b`] for two packed groups at once (`g0`'s columns in `out[r][..8]`, `g1`'s in `out[r][8..]`), the same
/// bits per column.
///
/// # Safety
/// As [`group_b`] for both groups.
#[inline]
pub(crate) unsafe fn group_b2<const R: usize>(
    path: KernelPath,
    ty: crate::GgmlType,
    g0: &[u8],
    g1: &[u8],
    acts: [&[crate::ActBlock]; R],
    out: &mut [[f32; 2 * crate::packed::GROUP]; R],
) {
    match path {
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx512Vnni => unsafe { x86::vnni512::group_b2(ty, g0, g1, acts, out) },
        _ => {
            let mut a = [[0.0f32; crate::packed::GROUP]; R];
            let mut b = [[0.0f32; crate::packed::GROUP]; R];
            unsafe {
                group_b(path, ty, g0, acts, &mut a);
                group_b(path, ty, g1, acts, &mut b);
            }
            for r in 0..R {
                out[r][..crate::packed::GROUP].copy_from_slice(&a[r]);
                out[r][crate::packed::GROUP..].copy_from_slice(&b[r]);
            }
        }
    }
}
