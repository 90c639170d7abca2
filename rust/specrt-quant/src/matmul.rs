//! `y [M, N] = x [M, K] · W^T` for a GGUF-block matrix `W [N, K]`: activations quantized once per pass, each
//! weight row decoded once per tile of [`TILE`] activation rows, work split over output rows in chunks that the
//! caller's thread pool runs.
//!
//! Every output `y[m, n]` is computed by the same sequence of operations whatever `M`, the tile it falls in, the
//! chunking or the thread count ([`crate::dot`]): a row's result does not depend on the pass's shape.

use specrt_core::{Result, SpecError};

use crate::acts::{quantize_rows, ActBlock};
use crate::dot::{tile, KernelPath, TILE};
use crate::format::{QMatrix, ACT_BLOCK};

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

/// A raw output pointer that tasks writing disjoint elements share.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: tasks write disjoint elements (each owns a range of output columns) and the caller waits for all of them.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// `out [m, w.n] = x [m, w.k] · W^T` on `path`, with `scratch` for the quantized activations (reused across calls).
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
    scratch: &mut Vec<ActBlock>,
    par: &dyn ParallelFor,
) -> Result<()> {
    if x.len() != m * w.k || out.len() != m * w.n {
        return Err(SpecError::Shape(format!(
            "GGUF matmul: x has {} values and out {} for M = {m}, K = {}, N = {} (expected {} and {})",
            x.len(),
            out.len(),
            w.k,
            w.n,
            m * w.k,
            m * w.n
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
    if m == 0 {
        return Ok(());
    }
    quantize_rows(x, m, w.k, scratch);
    let acts: &[ActBlock] = scratch;
    let nb = w.k / ACT_BLOCK;
    let n_total = w.n;
    let dst = OutPtr(out.as_mut_ptr());
    let tasks = n_total.div_ceil(ROWS_PER_TASK);
    par.run(tasks, &|task| {
        let dst = dst;
        let n_range = task * ROWS_PER_TASK..((task + 1) * ROWS_PER_TASK).min(n_total);
        let row_acts = |r: usize| &acts[r * nb..(r + 1) * nb];
        let mut m0 = 0;
        while m0 < m {
            let rows = (m - m0).min(TILE);
            for n in n_range.clone() {
                let wrow = w.row(n);
                // SAFETY: path is available (checked above); rows of `w` and `acts` have the shapes checked above;
                // each (row, n) element is written by this task only.
                unsafe {
                    let put = |i: usize, v: f32| *dst.0.add((m0 + i) * n_total + n) = v;
                    match rows {
                        1 => {
                            let mut o = [0.0; 1];
                            tile(path, w.ty, wrow, [row_acts(m0)], &mut o);
                            put(0, o[0]);
                        }
                        2 => {
                            let mut o = [0.0; 2];
                            tile(path, w.ty, wrow, [row_acts(m0), row_acts(m0 + 1)], &mut o);
                            o.iter().enumerate().for_each(|(i, v)| put(i, *v));
                        }
                        3 => {
                            let mut o = [0.0; 3];
                            tile(
                                path,
                                w.ty,
                                wrow,
                                [row_acts(m0), row_acts(m0 + 1), row_acts(m0 + 2)],
                                &mut o,
                            );
                            o.iter().enumerate().for_each(|(i, v)| put(i, *v));
                        }
                        _ => {
                            let mut o = [0.0; TILE];
                            let a = [
                                row_acts(m0),
                                row_acts(m0 + 1),
                                row_acts(m0 + 2),
                                row_acts(m0 + 3),
                            ];
                            tile(path, w.ty, wrow, a, &mut o);
                            o.iter().enumerate().for_each(|(i, v)| put(i, *v));
                        }
                    }
                }
            }
            m0 += rows;
        }
    });
    Ok(())
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
