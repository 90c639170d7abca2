//! `runtime_info`: which ONNX Runtime library the Rust side loads and what it offers (wraps
//! `specrt_ort::runtime_info`). Converts and forwards, nothing more.

use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::run_kernel;

/// Load ``ort_library`` (once per process, as every model does) and describe it.
///
/// Args:
///     ort_library: absolute path of ``libonnxruntime.so.1.x``.
///
/// Returns:
///     dict with ``library`` (pathlib.Path, the canonical path loaded), ``build_info`` (str), ``version`` (str, the library's own
///     version string, e.g. ``"1.32.0"``) and ``providers`` (list of str: the
///     execution providers the library was built with, e.g. ``["CUDAExecutionProvider", "CPUExecutionProvider"]``).
///
/// Raises:
///     FileNotFoundError: no such library. ConfigError: a relative path, or another library is already loaded.
///     BackendError: the file is not a usable ONNX Runtime library.
#[pyfunction]
#[pyo3(text_signature = "(ort_library)")]
fn runtime_info(py: Python<'_>, ort_library: PathBuf) -> PyResult<Bound<'_, PyDict>> {
    let info = run_kernel(py, move || {
        specrt_ort::init_runtime(&ort_library)?;
        specrt_ort::runtime_info()
    })?;
    let d = PyDict::new(py);
    d.set_item("library", info.library)?;
    d.set_item("build_info", info.build_info)?;
    d.set_item("version", info.version)?;
    d.set_item("providers", info.providers)?;
    Ok(d)
}

/// Register the functions of this module.
/// The absolute path of ``libonnxruntime.so.1.x`` by the one search of ``specrt_ort::discover``
/// (``find_ort_library_in_package``): ``$SPECRT_ORT_LIBRARY``, ``$ORT_DYLIB_PATH``, the newest
/// ``capi/libonnxruntime.so.1*`` of the onnxruntime package folder ``package`` (the calling interpreter's; None: not
/// installed), then the system library folders.
///
/// Args:
///     package: the ``onnxruntime`` package folder, or None.
///     install: how to install ONNX Runtime, the end of the "not found" message.
///
/// Raises:
///     ModelFileNotFoundError: a variable names no file (naming it), or nothing was found (every place searched
///         listed, then ``install``).
#[pyfunction]
#[pyo3(signature = (package, install))]
fn find_ort_library(py: Python<'_>, package: Option<PathBuf>, install: &str) -> PyResult<PathBuf> {
    run_kernel(py, || {
        specrt_ort::discover::find_ort_library_in_package(package.as_deref(), install)
    })
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(find_ort_library, m)?)?;
    m.add_function(wrap_pyfunction!(runtime_info, m)?)
}
