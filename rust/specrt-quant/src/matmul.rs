//! `y [M, N] = x [M, K] · W^T` for a GGUF-block matrix `W [N, K]`: activations quantized once per pass, each
//! weight row decoded once per tile of [`TILE`] activation rows, work split over output rows in chunks that the
//! caller's thread pool runs.
//!
//! Every output `y[m, n]` is computed by the same sequence of operations whatever `M`, the tile it falls in, the
//! chunking or the thread count ([`crate::dot`]): a row's result does not depend on the pass's shape.

use specrt_core::{Result, SpecError};

use crate::acts::{quantize_rows, quantize_rows_super, ActBlock, ActSuper};
use crate::dot::{group_k2, tile, tile_k, KernelPath, TILE};
use crate::format::{QMatrix, ACT_BLOCK, SUPER_BLOCK};
use crate::packed::{Packed, GROUP};

/// Activation rows per tile of the packed K-quant kernels: a verification pass of K + 1 <= 6 rows reads each
/// weight group once.
pub const TILE_K: usize = 6;

/// Output rows per task: 16 weight rows of K = 8960 (Q4_K) are 80 KB, which stay in L2 while every tile of
/// activation rows passes over them.
pub const ROWS_PER_TASK: usize = 16;

/// Runs `tasks` independent tasks, `f(i)` for `i` in `0..tasks`, possibly in parallel (ONNX Runtime's thread pool
/// in the operator, scoped threads or one thread elsewhere).
pub trait ParallelFor {
    /// Call `f(i)` once for every `i` in `0..tasks` and return when all are done.
    fn run(&self, tasks: usize, f: &(dyn Fn(usize) + Sync));
}

/// Runs every task on the calling thread.
pub struct Serial;

impl ParallelFor for Serial {
    fn run(&self, tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        (0..tasks).for_each(f);
    }
}

/// Runs tasks on `n` scoped threads (the calling one included), task `i` on thread `i % n`.
pub struct ScopedThreads(pub usize);

impl ParallelFor for ScopedThreads {
    fn run(&self, tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        let n = self.0.clamp(1, tasks.max(1));
        std::thread::scope(|s| {
            for t in 1..n {
                s.spawn(move || (t..tasks).step_by(n).for_each(f));
            }
            (0..tasks).step_by(n).for_each(f);
        });
    }
}

/// The quantized activations of a pass, kept between calls to reuse their memory.
#[derive(Default)]
pub struct Scratch {
    blocks: Vec<ActBlock>,
    supers: Vec<ActSuper>,
}

/// A raw output pointer that tasks writing disjoint elements share.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: tasks write disjoint elements (each owns a range of output columns) and the caller waits for all of them.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// The pointer (a method, so closures capture the whole `Sync` wrapper rather than its raw field).
    fn get(&self) -> *mut f32 {
        self.0
    }
}

/// One tile's kernel: `(weight row bytes, first activation row, out[rows])`.
type TileFn<'a> = dyn Fn(&[u8], usize, &mut [f32]) + Sync + 'a;

/// Calls `$f::<R>` with `R` = `$o.len()` (1..=TILE) activation rows `$a(0..R)`.
macro_rules! dispatch {
    ($f:ident, $path:expr, $ty:expr, $row:expr, $a:expr, $o:expr) => {
        match $o.len() {
            1 => {
                let mut r = [0.0; 1];
                $f($path, $ty, $row, [$a(0)], &mut r);
                $o.copy_from_slice(&r);
            }
            2 => {
                let mut r = [0.0; 2];
                $f($path, $ty, $row, [$a(0), $a(1)], &mut r);
                $o.copy_from_slice(&r);
            }
            3 => {
                let mut r = [0.0; 3];
                $f($path, $ty, $row, [$a(0), $a(1), $a(2)], &mut r);
                $o.copy_from_slice(&r);
            }
            _ => {
                let mut r = [0.0; TILE];
                $f($path, $ty, $row, [$a(0), $a(1), $a(2), $a(3)], &mut r);
                $o.copy_from_slice(&r);
            }
        }
    };
}

/// The shape and path checks every entry point makes.
fn check(k: usize, n: usize, x: &[f32], m: usize, out: &[f32], path: KernelPath) -> Result<()> {
    if x.len() != m * k || out.len() != m * n {
        return Err(SpecError::Shape(format!(
            "GGUF matmul: x has {} values and out {} for M = {m}, K = {k}, N = {n} (expected {} and {})",
            x.len(),
            out.len(),
            m * k,
            m * n
        )));
    }
    if !path.is_available() {
        return Err(SpecError::Setting {
            field: "path".into(),
            message: format!(
                "kernel path {:?} needs CPU features this machine lacks",
                path.name()
            ),
        });
    }
    Ok(())
}

/// Whether `path` computes type `w.ty` from a [`Packed`] matrix (the K-quants on the SIMD paths).
#[must_use]
pub fn wants_packed(w: &QMatrix<'_>, path: KernelPath) -> bool {
    path != KernelPath::Portable && w.ty.block_len() == SUPER_BLOCK
}

/// `out [m, w.n] = x [m, w.k] · W^T` on `path`, with `scratch` for the quantized activations (reused across calls).
///
/// Activations are quantized per 32 values for the 32-long formats and per 256 for the K-quants ([`crate::acts`]).
/// The K-quants on a SIMD path are repacked here for this call: callers that multiply by the same matrix again
/// keep a [`Packed`] and call [`Packed::matmul`].
///
/// # Errors
/// `SpecError::Shape` when `x` is not `m * w.k` values or `out` not `m * w.n`; `SpecError::Setting { field:
/// "path" }` when this CPU cannot run `path`.
pub fn matmul(
    w: &QMatrix<'_>,
    x: &[f32],
    m: usize,
    out: &mut [f32],
    path: KernelPath,
    scratch: &mut Scratch,
    par: &dyn ParallelFor,
) -> Result<()> {
    check(w.k, w.n, x, m, out, path)?;
    if m == 0 {
        return Ok(());
    }
    if let Some(packed) = wants_packed(w, path).then(|| Packed::new(w)).flatten() {
        return packed.matmul(x, m, out, path, scratch, par);
    }
    if w.ty.block_len() == SUPER_BLOCK {
        quantize_rows_super(x, m, w.k, &mut scratch.supers);
        let acts: &[ActSuper] = &scratch.supers;
        let ns = w.k / SUPER_BLOCK;
        run_tiles(w, m, out, par, &|wrow, m0, o: &mut [f32]| {
            let a = |i: usize| &acts[(m0 + i) * ns..(m0 + i + 1) * ns];
            // the portable path (the SIMD ones went to matmul_packed above), on rows of the checked shapes
            dispatch!(tile_k, path, w.ty, wrow, a, o);
        });
    } else {
        quantize_rows(x, m, w.k, &mut scratch.blocks);
        let acts: &[ActBlock] = &scratch.blocks;
        let nb = w.k / ACT_BLOCK;
        run_tiles(w, m, out, par, &|wrow, m0, o: &mut [f32]| {
            let a = |i: usize| &acts[(m0 + i) * nb..(m0 + i + 1) * nb];
            // SAFETY: path is available (checked above); the row and the activations have the shapes checked above.
            unsafe { dispatch!(tile, path, w.ty, wrow, a, o) }
        });
    }
    Ok(())
}

impl Packed {
    /// `out [m, n] = x [m, k] · W^T` for this packed K-quant matrix on a SIMD `path`: the same bits as [`matmul`]
    /// on any path.
    ///
    /// # Errors
    /// As [`matmul`]; `SpecError::Setting { field: "path" }` also for the portable path (which reads the GGUF's
    /// rows).
    pub fn matmul(
        &self,
        x: &[f32],
        m: usize,
        out: &mut [f32],
        path: KernelPath,
        scratch: &mut Scratch,
        par: &dyn ParallelFor,
    ) -> Result<()> {
        let p = self;
        check(p.k, p.n, x, m, out, path)?;
        if path == KernelPath::Portable {
            return Err(SpecError::Setting {
                field: "path".into(),
                message:
                    "the portable path computes from the GGUF's rows (matmul), not a packed matrix"
                        .into(),
            });
        }
        if m == 0 {
            return Ok(());
        }
        quantize_rows_super(x, m, p.k, &mut scratch.supers);
        let acts: &[ActSuper] = &scratch.supers;
        let ns = p.supers();
        let (n_total, groups) = (p.n, p.groups());
        // a task = a pair of groups (ROWS_PER_TASK = 2 * GROUP columns), run together on 512-bit registers where
        // the path has them; an odd last group is run as its own pair (its copy's results are dropped)
        let dst = OutPtr(out.as_mut_ptr());
        par.run(groups.div_ceil(2), &|task| {
            let (g0, g1) = (p.group(2 * task), p.group((2 * task + 1).min(groups - 1)));
            let mut o = [[0.0f32; 2 * GROUP]; TILE_K];
            let mut m0 = 0;
            while m0 < m {
                let rows = (m - m0).min(TILE_K);
                let a = |i: usize| &acts[(m0 + i) * ns..(m0 + i + 1) * ns];
                macro_rules! run {
                    ($r:literal, [$($i:literal),*]) => {{
                        let mut t = [[0.0f32; 2 * GROUP]; $r];
                        // SAFETY: path is a SIMD path this CPU runs (checked above); the groups and the activations
                        // have p's shapes.
                        unsafe { group_k2::<$r>(path, p.ty, g0, g1, [$(a($i)),*], &mut t) };
                        o[..$r].copy_from_slice(&t);
                    }};
                }
                match rows {
                    1 => run!(1, [0]),
                    2 => run!(2, [0, 1]),
                    3 => run!(3, [0, 1, 2]),
                    4 => run!(4, [0, 1, 2, 3]),
                    5 => run!(5, [0, 1, 2, 3, 4]),
                    _ => run!(6, [0, 1, 2, 3, 4, 5]),
                }
                let cols = (n_total - 2 * task * GROUP).min(2 * GROUP);
                for (i, orow) in o[..rows].iter().enumerate() {
                    for (c, v) in orow[..cols].iter().enumerate() {
                        // SAFETY: element (m0 + i, 2 * task * GROUP + c) is inside `out` and written by this task
                        // only.
                        unsafe { *dst.get().add((m0 + i) * n_total + 2 * task * GROUP + c) = *v };
                    }
                }
                m0 += rows;
            }
        });
        Ok(())
    }
}

/// Calls `tile(tile, wrow, m0, out)` with `out.len()` = the rows of the tile (1..=TILE) for every output column
/// and tile of activation rows, tasks of [`ROWS_PER_TASK`] columns on `par`, and writes the results into `out`.
fn run_tiles(w: &QMatrix<'_>, m: usize, out: &mut [f32], par: &dyn ParallelFor, tile: &TileFn<'_>) {
    let n_total = w.n;
    let dst = OutPtr(out.as_mut_ptr());
    par.run(n_total.div_ceil(ROWS_PER_TASK), &|task| {
        let mut o = [0.0f32; TILE];
        let mut m0 = 0;
        while m0 < m {
            let rows = (m - m0).min(TILE);
            for n in task * ROWS_PER_TASK..((task + 1) * ROWS_PER_TASK).min(n_total) {
                tile(w.row(n), m0, &mut o[..rows]);
                for (i, v) in o[..rows].iter().enumerate() {
                    // SAFETY: element (m0 + i, n) is inside `out` and written by this task only.
                    unsafe { *dst.get().add((m0 + i) * n_total + n) = *v };
                }
            }
            m0 += rows;
        }
    });
}

/// Rows `indices` of the dequantized matrix `w` into `out [indices.len(), w.k]` (the embedding lookup).
///
/// # Errors
/// `SpecError::Shape` when `out` is not `indices.len() * w.k` values; `SpecError::Vocab` naming the first index
/// outside `0..w.n`.
pub fn gather(w: &QMatrix<'_>, indices: &[i64], out: &mut [f32]) -> Result<()> {
    if out.len() != indices.len() * w.k {
        return Err(SpecError::Shape(format!(
            "GGUF gather: out has {} values for {} indices of K = {} (expected {})",
            out.len(),
            indices.len(),
            w.k,
            indices.len() * w.k
        )));
    }
    for (&i, y) in indices.iter().zip(out.chunks_exact_mut(w.k)) {
        let row = usize::try_from(i)
            .ok()
            .filter(|&r| r < w.n)
            .ok_or_else(|| {
                SpecError::Vocab(format!(
                    "GGUF gather: index {i} is outside the table's rows 0..{}",
                    w.n
                ))
            })?;
        crate::dequant::dequantize_row(w.ty, w.row(row), y);
    }
    Ok(())
}
