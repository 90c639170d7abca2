//! `y [M, N] = x [M, K] · W^T` for a GGUF-block matrix `W [N, K]`: activations quantized once per pass; on the SIMD
//! paths each pair of [`Packed`] column groups decoded once per tile of [`TILE_K`] activation rows (the portable
//! path: each weight row once per tile of [`TILE`] rows), work split over output columns in tasks that the caller's
//! thread pool runs.
//!
//! Every output `y[m, n]` is computed by the same sequence of operations whatever `M`, the tile it falls in, the
//! chunking or the thread count ([`crate::dot`]): a row's result does not depend on the pass's shape.

use specrt_core::{Result, SpecError};

use crate::acts::{quantize_rows, quantize_rows_super, ActBlock, ActSuper};
use crate::dot::{group_b2, group_k2, tile, tile_k, KernelPath, TILE};
use crate::format::{QMatrix, ACT_BLOCK, SUPER_BLOCK};
use crate::packed::{Packed, GROUP};

/// Activation rows per tile of the packed kernels: a verification pass of K + 1 <= 6 rows reads each weight group
/// once.
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

/// Whether `path` computes from a [`Packed`] matrix (the SIMD paths do; the portable one reads the GGUF's rows).
#[must_use]
pub fn wants_packed(path: KernelPath) -> bool {
    path != KernelPath::Portable
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
    if wants_packed(path) {
        return Packed::new(w).matmul(x, m, out, path, scratch, par);
    }
    if w.ty.block_len() == SUPER_BLOCK {
        quantize_rows_super(x, m, w.k, &mut scratch.supers, path);
        let acts: &[ActSuper] = &scratch.supers;
        let ns = w.k / SUPER_BLOCK;
        run_tiles(w, m, out, par, &|wrow, m0, o: &mut [f32]| {
            let a = |i: usize| &acts[(m0 + i) * ns..(m0 + i + 1) * ns];
            // the portable path (the SIMD ones went to matmul_packed above), on rows of the checked shapes
            dispatch!(tile_k, path, w.ty, wrow, a, o);
        });
    } else {
        quantize_rows(x, m, w.k, &mut scratch.blocks, path);
        let acts: &[ActBlock] = &scratch.blocks;
        let nb = w.k / ACT_BLOCK;
        run_tiles(w, m, out, par, &|wrow, m0, o: &mut [f32]| {
            let a = |i: usize| &acts[(m0 + i) * nb..(m0 + i + 1) * nb];
            // the portable path (the SIMD ones went to Packed::matmul above), on rows of the checked shapes
            dispatch!(tile, path, w.ty, wrow, a, o);
        });
    }
    Ok(())
}

/// One call of a pair kernel `$f::<$r>` on activation rows `$a($i)`, copied into `$o[..$r]`.
macro_rules! pair_call {
    ($f:ident, $r:literal, [$($i:literal),*], $path:expr, $ty:expr, $g0:expr, $g1:expr, $a:expr, $o:expr) => {{
        let mut t = [[0.0f32; 2 * GROUP]; $r];
        // SAFETY: the caller checked that path is a SIMD path this CPU runs; the groups and the activations have
        // the packed matrix's shapes.
        unsafe { $f::<$r>($path, $ty, $g0, $g1, [$($a($i)),*], &mut t) };
        $o[..$r].copy_from_slice(&t);
    }};
}

/// Calls the pair kernel `$f::<R>` with `R` = `$rows` (1..=TILE_K) activation rows.
macro_rules! pairs {
    ($f:ident, $rows:expr, $($rest:expr),*) => {
        match $rows {
            1 => pair_call!($f, 1, [0], $($rest),*),
            2 => pair_call!($f, 2, [0, 1], $($rest),*),
            3 => pair_call!($f, 3, [0, 1, 2], $($rest),*),
            4 => pair_call!($f, 4, [0, 1, 2, 3], $($rest),*),
            5 => pair_call!($f, 5, [0, 1, 2, 3, 4], $($rest),*),
            _ => pair_call!($f, 6, [0, 1, 2, 3, 4, 5], $($rest),*),
        }
    };
}

/// One pair kernel call: `(g0, g1, first activation row, rows, out)`.
type PairFn<'a> = dyn Fn(&[u8], &[u8], usize, usize, &mut [[f32; 2 * GROUP]; TILE_K]) + Sync + 'a;

impl Packed {
    /// `out [m, n] = x [m, k] · W^T` for this packed matrix on a SIMD `path`: the same bits as [`matmul`] on any
    /// path.
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
        check(self.k, self.n, x, m, out, path)?;
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
        let nb = self.blocks();
        let ty = self.ty;
        if ty.block_len() == SUPER_BLOCK {
            quantize_rows_super(x, m, self.k, &mut scratch.supers, path);
            let acts: &[ActSuper] = &scratch.supers;
            self.run_pairs(m, out, par, &|g0, g1, m0, rows, o| {
                let a = |i: usize| &acts[(m0 + i) * nb..(m0 + i + 1) * nb];
                pairs!(group_k2, rows, path, ty, g0, g1, a, o);
            });
        } else {
            quantize_rows(x, m, self.k, &mut scratch.blocks, path);
            let acts: &[ActBlock] = &scratch.blocks;
            self.run_pairs(m, out, par, &|g0, g1, m0, rows, o| {
                let a = |i: usize| &acts[(m0 + i) * nb..(m0 + i + 1) * nb];
                pairs!(group_b2, rows, path, ty, g0, g1, a, o);
            });
        }
        Ok(())
    }

    /// Runs `kernel` over every pair of groups (a task: ROWS_PER_TASK = 2 * GROUP columns, run together on 512-bit
    /// registers where the path has them; an odd last group runs as its own pair, its copy's results dropped) and
    /// tile of up to TILE_K activation rows, and writes the results into `out`.
    fn run_pairs(&self, m: usize, out: &mut [f32], par: &dyn ParallelFor, kernel: &PairFn<'_>) {
        let (n_total, groups) = (self.n, self.groups());
        let dst = OutPtr(out.as_mut_ptr());
        par.run(groups.div_ceil(2), &|task| {
            let (g0, g1) = (
                self.group(2 * task),
                self.group((2 * task + 1).min(groups - 1)),
            );
            let mut o = [[0.0f32; 2 * GROUP]; TILE_K];
            let mut m0 = 0;
            while m0 < m {
                let rows = (m - m0).min(TILE_K);
                kernel(g0, g1, m0, rows, &mut o);
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
