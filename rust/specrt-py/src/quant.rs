//! Python wrappers of `specrt_quant` (the GGUF-block matmul, for tests against gguf-py and for benches) and of
//! `specrt_ort::GraphSession` (a one-file session on specrt's ONNX Runtime). Convert, call, convert back.

use std::path::PathBuf;
use std::sync::Mutex;

use numpy::{PyArray2, PyArrayMethods, PyReadonlyArray2, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use specrt_core::SpecError;
use specrt_ort::{GraphSession, OrtOptions};
use specrt_quant::{GgmlType, KernelPath, QMatrix, ScopedThreads, Serial, SUPPORTED_TYPES};

use crate::errors::{run_kernel, to_pyerr};

fn matrix<'a>(
    blocks: &'a [u8],
    shape: &[usize],
    ty: GgmlType,
    k: usize,
) -> Result<QMatrix<'a>, SpecError> {
    let row = ty.row_bytes(k)?;
    if shape[1] != row {
        return Err(SpecError::Shape(format!(
            "blocks has {} bytes per row; {} rows of K = {k} need {row}",
            shape[1],
            ty.name()
        )));
    }
    QMatrix::new(ty, shape[0], k, blocks)
}

fn contiguous<'a, T: numpy::Element>(
    a: &'a PyReadonlyArray2<'_, T>,
    name: &str,
) -> PyResult<&'a [T]> {
    a.as_slice().map_err(|_| {
        to_pyerr(SpecError::Shape(format!(
            "{name} must be C-contiguous (use numpy.ascontiguousarray)"
        )))
    })
}

/// `x @ dequantize(blocks).T` with specrt's GGUF-block kernel (the `ai.specrt::GgufMatMul` operator's).
///
/// Args:
///     x: `[M, K]` float32 activations (quantized to int8 inside: per block of 32 for Q4_0 / Q4_1 / Q5_0 / Q8_0, per super-block of 256 for Q4_K / Q5_K / Q6_K).
///     blocks: `[N, row_bytes]` uint8, the GGUF tensor's stored bytes (row n = output channel n).
///     ggml_type: ggml's type id (`GGUF_MATMUL_TYPES`).
///     path: `"portable"`, `"avx2"`, `"avx512vnni"` or None for the fastest this CPU runs.
///     threads: threads to split the output columns over (results do not depend on it).
///
/// Returns:
///     `[M, N]` float32.
///
/// Raises:
///     ConfigError: an unsupported `ggml_type` or `path` (`.field` names it), or a path this CPU cannot run.
///     ShapeError: `blocks`' row width does not match `K` of `x`, or K is not a multiple of the block length.
#[pyfunction]
#[pyo3(signature = (x, blocks, ggml_type, *, path = None, threads = 1))]
fn gguf_matmul<'py>(
    py: Python<'py>,
    x: PyReadonlyArray2<'py, f32>,
    blocks: PyReadonlyArray2<'py, u8>,
    ggml_type: i64,
    path: Option<&str>,
    threads: usize,
) -> PyResult<Bound<'py, PyArray2<f32>>> {
    let ty = GgmlType::from_id(ggml_type).map_err(to_pyerr)?;
    let path = path
        .map(KernelPath::from_name)
        .transpose()
        .map_err(to_pyerr)?
        .unwrap_or_else(KernelPath::best);
    let (m, k) = (x.shape()[0], x.shape()[1]);
    let bshape = blocks.shape().to_vec();
    let xs = contiguous(&x, "x")?;
    let bs = contiguous(&blocks, "blocks")?;
    let out = run_kernel(py, || {
        let w = matrix(bs, &bshape, ty, k)?;
        let mut out = vec![0.0f32; m * w.n];
        let mut scratch = specrt_quant::Scratch::default();
        if threads > 1 {
            specrt_quant::matmul(
                &w,
                xs,
                m,
                &mut out,
                path,
                &mut scratch,
                &ScopedThreads(threads),
            )?;
        } else {
            specrt_quant::matmul(&w, xs, m, &mut out, path, &mut scratch, &Serial)?;
        }
        Ok(out)
    })?;
    let n = bshape[0];
    numpy::PyArray1::from_vec(py, out).reshape([m, n])
}

/// Dequantize GGUF blocks with specrt's kernel crate (`GgufGather`'s rows).
///
/// Args:
///     blocks: `[N, row_bytes]` uint8.
///     ggml_type: ggml's type id.
///     k: weights per row.
///
/// Returns:
///     `[N, k]` float32.
///
/// Raises:
///     ConfigError: an unsupported `ggml_type`, or `k` not a multiple of its block length.
///     ShapeError: `blocks`' row width does not match `k`.
#[pyfunction]
fn gguf_dequantize<'py>(
    py: Python<'py>,
    blocks: PyReadonlyArray2<'py, u8>,
    ggml_type: i64,
    k: usize,
) -> PyResult<Bound<'py, PyArray2<f32>>> {
    let ty = GgmlType::from_id(ggml_type).map_err(to_pyerr)?;
    let bshape = blocks.shape().to_vec();
    let bs = contiguous(&blocks, "blocks")?;
    let out = run_kernel(py, || {
        let w = matrix(bs, &bshape, ty, k)?;
        let indices: Vec<i64> = (0..w.n as i64).collect();
        let mut out = vec![0.0f32; w.n * k];
        specrt_quant::gather(&w, &indices, &mut out)?;
        Ok(out)
    })?;
    numpy::PyArray1::from_vec(py, out).reshape([bshape[0], k])
}

/// The kernel paths this CPU runs, fastest last (`["portable", "avx2", "avx512vnni"]` on AVX-512 VNNI CPUs).
#[pyfunction]
fn gguf_kernel_paths() -> Vec<&'static str> {
    KernelPath::ALL
        .into_iter()
        .filter(|p| p.is_available())
        .map(KernelPath::name)
        .collect()
}

/// A CPU session of one ONNX file on specrt's ONNX Runtime, with specrt's operators (`ai.specrt`) registered.
/// For benches and tests that run a graph directly; float32 inputs and outputs only.
#[pyclass(module = "specrt._specrt", name = "GraphSession")]
pub struct PyGraphSession {
    inner: Mutex<GraphSession>,
}

#[pymethods]
impl PyGraphSession {
    /// Open `model` with the ONNX Runtime library at `ort_library` and `intra_op_threads` threads (None: the
    /// physical cores).
    ///
    /// Raises:
    ///     ModelFileNotFoundError / SpecrtError: the file or library cannot be loaded.
    #[new]
    #[pyo3(signature = (model, ort_library, intra_op_threads = None))]
    fn new(
        py: Python<'_>,
        model: PathBuf,
        ort_library: PathBuf,
        intra_op_threads: Option<usize>,
    ) -> PyResult<Self> {
        let mut options = OrtOptions::new(ort_library);
        options.intra_op_threads = intra_op_threads;
        let session = run_kernel(py, || GraphSession::open(&model, &options))?;
        Ok(Self {
            inner: Mutex::new(session),
        })
    }

    /// Run with float32 inputs `{name: array}`; returns `{name: float32 array}` of every output.
    ///
    /// Raises:
    ///     ShapeError: an input that is not a float32 array.
    ///     BackendError: ONNX Runtime's error (unknown input, failing kernel).
    fn run<'py>(
        &self,
        py: Python<'py>,
        inputs: &Bound<'py, PyDict>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let mut owned = Vec::new();
        for (k, v) in inputs.iter() {
            let name: String = k.extract()?;
            let arr = v.cast::<numpy::PyArrayDyn<f32>>().map_err(|_| {
                to_pyerr(SpecError::Shape(format!(
                    "input {name:?} must be a float32 numpy array"
                )))
            })?;
            let shape: Vec<i64> = arr.shape().iter().map(|&d| d as i64).collect();
            owned.push((name, shape, arr.to_vec()?));
        }
        let outputs = run_kernel(py, || {
            let refs: Vec<(String, Vec<i64>, &[f32])> = owned
                .iter()
                .map(|(n, s, v)| (n.clone(), s.clone(), v.as_slice()))
                .collect();
            let mut session = self
                .inner
                .lock()
                .map_err(|_| SpecError::Internal("session lock poisoned".into()))?;
            session.run(&refs)
        })?;
        let out = PyDict::new(py);
        for o in outputs {
            let dims: Vec<usize> = o
                .shape
                .iter()
                .map(|&d| usize::try_from(d).unwrap_or(0))
                .collect();
            out.set_item(
                o.name,
                numpy::PyArray1::from_vec(py, o.values).reshape(dims)?,
            )?;
        }
        Ok(out)
    }
}

/// Register the functions, the class and `GGUF_MATMUL_TYPES` (`{"Q4_0": 2, ...}`).
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(gguf_matmul, m)?)?;
    m.add_function(wrap_pyfunction!(gguf_dequantize, m)?)?;
    m.add_function(wrap_pyfunction!(gguf_kernel_paths, m)?)?;
    m.add_class::<PyGraphSession>()?;
    let types = PyDict::new(m.py());
    for t in SUPPORTED_TYPES {
        types.set_item(t.name(), t as i64)?;
    }
    m.add("GGUF_MATMUL_TYPES", types)?;
    m.add("OPERATOR_DOMAIN", specrt_ort::ops::DOMAIN)?;
    Ok(())
}
