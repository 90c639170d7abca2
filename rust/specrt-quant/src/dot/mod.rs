//! The dot products of one weight row with up to [`TILE`] activation rows, in one canonical order of operations
//! that every path (portable, AVX2, AVX-512 VNNI) follows exactly, so their results agree bit for bit and an
//! output never depends on the pass's other rows.
//!
//! For activation row `x` (blocks of 32, [`crate::ActBlock`]) and weight row `w`, per 32-long block `b`:
//! 1. integer lanes `L[j] = sum_{e in 4j..4j+4} c[e] * x.qs[e]`, `j` in 0..8, with `c` the weight codes after the
//!    format's offset (`q - 8` for Q4_0, `q - 16` for Q5_0, `q - 32` for Q6_K, `q` otherwise): exact integers, however
//!    a path computes them (`vpmaddubsw` + `vpmaddwd`, `vpdpbusd`, or scalar);
//! 2. lane scales `S[j] = ws[j] * x.d` where `ws` is the block's weight scale as ggml defines it (`d`, or `d * sc` of
//!    the sub-block a lane falls in for the K-quants);
//! 3. `acc[(b % 2) * 8 + j] = fma(S[j], L[j], acc[...])`: sixteen float32 accumulators, even blocks in the first
//!    eight, odd blocks in the last eight (two independent FMA chains per row);
//! 4. float zero points (Q4_1, Q4_K, Q5_K): `macc = fma(mw * x.d, x.sum, macc)` in block order, `mw = m` (Q4_1) or
//!    `-(dmin * m)` (K-quants);
//! 5. the result `((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7)) + macc` reduced from `v[j] = acc[j] + acc[8 + j]`
//!    in the fixed order of [`reduce`].

pub(crate) mod portable;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

/// Activation rows computed together against one weight row (the weight row is decoded once per tile).
pub const TILE: usize = 4;

/// Which implementation of the dot products runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KernelPath {
    /// Plain Rust, any CPU: the reference the SIMD paths are tested against bit for bit.
    Portable,
    /// x86-64 AVX2 + FMA + F16C (`vpmaddubsw` / `vpmaddwd` integer dots).
    Avx2,
    /// x86-64 AVX-512 VNNI on 256-bit registers (`vpdpbusd` integer dots), plus AVX2 / FMA / F16C.
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

/// Step 5 of the canonical order: the sixteen accumulators and the zero-point sum to one float32.
#[inline]
pub(crate) fn reduce(acc: &[f32; 16], macc: f32) -> f32 {
    let v: [f32; 8] = std::array::from_fn(|j| acc[j] + acc[8 + j]);
    let w = [v[0] + v[4], v[1] + v[5], v[2] + v[6], v[3] + v[7]];
    let u = [w[0] + w[2], w[1] + w[3]];
    (u[0] + u[1]) + macc
}

/// Dot products of weight row `row` (type `ty`, `K = acts[r].len() * 32`) with the `R` activation rows `acts`
/// into `out`, on `path`.
///
/// # Safety
/// `path.is_available()` must hold, `row` must hold `acts[r].len() * 32 / ty.block_len()` blocks of type `ty`, and
/// every `acts[r]` must have the same length, a multiple of `ty.block_len() / 32`.
#[inline]
pub(crate) unsafe fn tile<const R: usize>(
    path: KernelPath,
    ty: crate::GgmlType,
    row: &[u8],
    acts: [&[crate::ActBlock]; R],
    out: &mut [f32; R],
) {
    match path {
        KernelPath::Portable => portable::tile(ty, row, acts, out),
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx2 => unsafe { x86::avx2::tile(ty, row, acts, out) },
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx512Vnni => unsafe { x86::vnni::tile(ty, row, acts, out) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => unreachable!("checked by is_available"),
    }
}
