//! specrt's quantized matmul for the CPU: `y [M, N] = x [M, K] · W^T` with `W` kept in the GGUF's own block
//! formats (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K), activations quantized to int8 per block of 32 (per super-block of 256 for the K-quants, as llama.cpp does).
//!
//! Built for speculative verification: a pass of a few rows reads each weight once for all of them (the SIMD paths
//! from a [`Packed`] copy made once, whose column groups need no horizontal sums), and every
//! output row is computed in the same order of operations whatever the pass's other rows ([`dot`]'s canonical
//! order), so a one-token pass and a K + 1-token pass give the same row bit for bit. Portable, AVX2 and AVX-512
//! VNNI paths agree bit for bit; [`KernelPath::best`] picks the fastest this CPU runs.
//!
//! No ONNX Runtime here: `specrt-ort` wraps [`matmul`] and [`gather`] as the operators `ai.specrt::GgufMatMul` and
//! `ai.specrt::GgufGather`.

pub mod acts;
pub mod dequant;
pub mod dot;
pub mod format;
mod ksuper;
pub mod matmul;
pub mod packed;

pub use acts::{quantize_rows, quantize_rows_super, ActBlock, ActSuper};
pub use dequant::dequantize_row;
pub use dot::{KernelPath, TILE};
pub use format::{GgmlType, QMatrix, ACT_BLOCK, SUPER_BLOCK, SUPPORTED_TYPES};
pub use matmul::{
    gather, matmul, wants_packed, ParallelFor, ScopedThreads, Scratch, Serial, ROWS_PER_TASK,
    TILE_K,
};
pub use packed::{Packed, GROUP};

#[cfg(test)]
mod tests;
