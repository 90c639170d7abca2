//! `OrtModel`: one ONNX decoder on ONNX Runtime (wraps `specrt_ort::OrtBackend`), for tests and diagnostics.
//! Converts and forwards, nothing more.

use std::path::PathBuf;
use std::sync::Mutex;

use numpy::{PyArray1, PyArray2, PyArrayMethods, PyReadonlyArray1, PyUntypedArrayMethods};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use specrt_core::{backend::Backend, SpecError};
use specrt_ort::{KvLayout, MemoryPlan, OrtBackend, Provider};

use crate::args::ort_options;
use crate::errors::{run_kernel, to_pyerr as spec_err};

/// Token ids from a 1-D numpy integer array (any signed/unsigned width) or a sequence of ints.
fn extract_tokens(tokens: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
    fn convert<T: Copy + TryInto<u32> + std::fmt::Display>(values: &[T]) -> PyResult<Vec<u32>> {
        values
            .iter()
            .enumerate()
            .map(|(i, &t)| {
                t.try_into().map_err(|_| {
                    spec_err(SpecError::Vocab(format!(
                        "token {t} at index {i} is out of range (expected 0..2^32)"
                    )))
                })
            })
            .collect()
    }
    macro_rules! try_dtype {
        ($($t:ty),*) => {$(
            if let Ok(array) = tokens.extract::<PyReadonlyArray1<'_, $t>>() {
                return match array.as_slice() {
                    Ok(slice) => convert(slice),
                    Err(_) => convert(&array.as_array().iter().copied().collect::<Vec<$t>>()),
                };
            }
        )*};
    }
    try_dtype!(i64, i32, u32, u64, i16, u16, i8, u8);
    if let Ok(array) = tokens.cast::<numpy::PyUntypedArray>() {
        return Err(PyTypeError::new_err(format!(
            "tokens must be a 1-D integer array, got ndim={} dtype={}",
            array.ndim(),
            array.dtype()
        )));
    }
    let values: Vec<i64> = tokens.extract().map_err(|_| {
        PyTypeError::new_err("tokens must be a 1-D numpy integer array or a sequence of ints")
    })?;
    convert(&values)
}

/// One ONNX decoder model in one ONNX Runtime session, with its KV cache.
///
/// Args:
///     path: model folder (holding ``model.onnx`` and optionally ``specrt_config.json``) or an ``.onnx`` file.
///     ort_library: absolute path of ``libonnxruntime.so.1.x``; default: ``specrt._ort.find_ort_library()``
///         (``SPECRT_ORT_LIBRARY``, else the installed onnxruntime wheel).
///     provider: ``"cpu"`` or ``"cuda"``.
///     device_id: CUDA device ordinal.
///     max_seq_len: longest total sequence (cached + new); default: the model's ``max_position_embeddings`` or 4096,
///         always capped by the model's maximum.
///     intra_op_threads: ONNX Runtime intra-op threads; default: number of physical cores.
///     allow_fallback: if CUDA cannot be used, run on CPU (see ``fallback_reason``) instead of raising.
///     layout: force ``"shared_buffer"`` or ``"optimum"`` instead of detecting it.
///     profile: turn ONNX Runtime's profiler on, writing a Chrome-trace JSON named from this prefix (ONNX Runtime
///         appends a timestamp) in an existing folder; :meth:`end_profiling` finishes it and returns its path. The
///         process's sessions share one thread pool whose profiler starts and ends with this one: profile in a
///         process where no other model runs on another thread meanwhile (ONNX Runtime fails that run).
///     device_argmax: whether :meth:`forward_argmax` reads a graph-form model's ``argmax`` output (``None``: on CUDA
///         only; on the CPU the logits are scanned, which keeps the NaN / inf check).
///     cuda_graph: with ``provider="cuda"`` and a graph-form model (``specrt convert --attention gqa-graph``),
///         replay each decode step shape (1 to 16 new tokens with their logits, and 2 tokens with the last row's)
///         from a CUDA graph.
///     cpu_graph_steps: with ``provider="cpu"`` and a graph-form model, run the decode steps through the CUDA-graph
///         step bindings with the replay invariants checked (nothing captured; a test mode).
///
/// Raises:
///     ModelFileNotFoundError: model file or ONNX Runtime library missing (a ``FileNotFoundError``).
///     ModelFileError: unreadable or corrupt model / ``specrt_config.json`` (an ``OSError``).
///     ConfigError: invalid option, or the model does not follow a supported decoder layout (a ``ValueError``).
///     ProviderError: CUDA requested and unavailable, without ``allow_fallback`` (a ``RuntimeError``).
///     BackendError: ONNX Runtime failed, e.g. a library that cannot be loaded (a ``RuntimeError``).
#[pyclass(module = "specrt._specrt", name = "OrtModel")]
pub struct PyOrtModel {
    inner: Mutex<OrtBackend>,
}

#[pymethods]
impl PyOrtModel {
    #[new]
    #[pyo3(signature = (
        path, *, ort_library=None, provider="cpu", device_id=0, max_seq_len=None, intra_op_threads=None,
        allow_fallback=false, layout=None, profile=None, device_argmax=None, cuda_graph=false,
        cpu_graph_steps=false
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        ort_library: Option<PathBuf>,
        provider: &str,
        device_id: i32,
        max_seq_len: Option<usize>,
        intra_op_threads: Option<usize>,
        allow_fallback: bool,
        layout: Option<&str>,
        profile: Option<PathBuf>,
        device_argmax: Option<bool>,
        cuda_graph: bool,
        cpu_graph_steps: bool,
    ) -> PyResult<Self> {
        let provider: Provider = provider.parse().map_err(spec_err)?;
        let ort_library = match ort_library {
            Some(p) => {
                if provider == Provider::Cuda {
                    // find_ort_library does this itself; with an explicit library do it here.
                    py.import("specrt._ort")?
                        .call_method0("preload_cuda_dlls")?;
                }
                p
            }
            None => py
                .import("specrt._ort")?
                .call_method1("find_ort_library", (provider.as_str(),))?
                .extract::<PathBuf>()?,
        };
        let mut options = ort_options(
            ort_library,
            provider,
            device_id,
            max_seq_len,
            intra_op_threads,
            allow_fallback,
            false,
        );
        options.layout = layout
            .map(str::parse::<KvLayout>)
            .transpose()
            .map_err(spec_err)?;
        options.profile = profile;
        options.device_argmax = device_argmax;
        options.cuda_graph = cuda_graph;
        options.cpu_graph_steps = cpu_graph_steps;
        let backend = run_kernel(py, || OrtBackend::new(&path, &options))?;
        Ok(PyOrtModel {
            inner: Mutex::new(backend),
        })
    }

    /// Run ``tokens`` on top of the first ``n_past`` cached positions.
    ///
    /// Args:
    ///     tokens: ``[S]`` token ids (numpy integer array of any width, or a sequence of ints), ``S >= 1``.
    ///     n_past: cached positions to keep (a smaller value than last time rolls back).
    ///     n_logits: rows wanted, ``1 <= n_logits <= S``.
    ///
    /// Returns:
    ///     ``[n_logits, vocab_size] float32``: the logits of the last ``n_logits`` positions (a new array).
    ///
    /// Raises:
    ///     ConfigError: empty tokens, bad ``n_logits``, ``n_past`` beyond the cached positions.
    ///     SequenceLengthError: ``n_past + S > max_seq_len``.
    ///     VocabError: a token id ``< 0`` or ``>= vocab_size``.
    ///     TypeError: tokens not a 1-D integer array / sequence of ints.
    ///     BackendError: ONNX Runtime failed.
    #[pyo3(signature = (tokens, n_past, n_logits=1))]
    fn forward<'py>(
        &self,
        py: Python<'py>,
        tokens: &Bound<'py, PyAny>,
        n_past: usize,
        n_logits: usize,
    ) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let tokens = extract_tokens(tokens)?;
        // Lock with the GIL released (inside `run_kernel`): never wait for the mutex while holding the GIL.
        let (logits, vocab) = run_kernel(py, || {
            let mut backend = self
                .inner
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let vocab = backend.vocab_size();
            backend
                .forward(&tokens, n_past, n_logits)
                .map(|rows| (rows.to_vec(), vocab))
        })?;
        PyArray1::from_vec(py, logits).reshape([n_logits, vocab])
    }

    /// Like :meth:`forward`, but only the greedy choice of each of the last ``n_logits`` positions: the first
    /// maximum of each row (a graph-form model computes it in the graph and returns only the ids; others scan the
    /// logits, checked for NaN / inf).
    ///
    /// Returns:
    ///     ``[n_logits]`` token ids (a list of ints).
    ///
    /// Raises: as :meth:`forward`; NonFiniteLogitsError for a NaN / inf row (models without an argmax output).
    #[pyo3(signature = (tokens, n_past, n_logits=1))]
    fn forward_argmax(
        &self,
        py: Python<'_>,
        tokens: &Bound<'_, PyAny>,
        n_past: usize,
        n_logits: usize,
    ) -> PyResult<Vec<u32>> {
        let tokens = extract_tokens(tokens)?;
        run_kernel(py, || {
            let mut out = Vec::with_capacity(n_logits);
            self.lock()
                .forward_argmax(&tokens, n_past, n_logits, &mut out)?;
            Ok(out)
        })
    }

    /// End ONNX Runtime's profiling (the model was created with ``profile``) and return the trace file's path.
    ///
    /// Raises:
    ///     ConfigError: the model was created without ``profile``, or profiling already ended.
    ///     BackendError: ONNX Runtime failed to write the file.
    fn end_profiling(&self, py: Python<'_>) -> PyResult<PathBuf> {
        run_kernel(py, || self.lock().end_profiling())
    }

    /// Logits width.
    #[getter]
    fn vocab_size(&self) -> usize {
        self.lock().vocab_size()
    }

    /// Longest total sequence (cached + new tokens).
    #[getter]
    fn max_seq_len(&self) -> usize {
        self.lock().max_seq_len()
    }

    /// KV layout: ``"shared_buffer"`` (the specrt contract) or ``"optimum"``.
    #[getter]
    fn layout(&self) -> &'static str {
        self.lock().layout().as_str()
    }

    /// ONNX Runtime providers of the session, preferred first.
    #[getter]
    fn providers(&self) -> Vec<&'static str> {
        self.lock().providers()
    }

    /// Why CUDA was not used (``allow_fallback=True`` and it fell back to CPU), else ``None``.
    #[getter]
    fn fallback_reason(&self) -> Option<String> {
        self.lock().fallback_reason().map(str::to_string)
    }

    /// Number of layers.
    #[getter]
    fn num_layers(&self) -> usize {
        self.lock().decoder_io().n_layers
    }

    /// Element type of the KV cache (``"float32"``, ``"float16"``, ``"bfloat16"``).
    #[getter]
    fn kv_dtype(&self) -> String {
        self.lock().decoder_io().kv_dtype.clone()
    }

    /// Positions with valid KV after the last call.
    #[getter]
    fn n_cached(&self) -> usize {
        self.lock().n_cached()
    }

    /// Path of the model file.
    #[getter]
    fn model_path(&self) -> PathBuf {
        self.lock().model_file().to_path_buf()
    }

    /// Data addresses of the KV tensors (constant for ``"shared_buffer"``: allocated once). Diagnostics.
    fn kv_buffer_addresses(&self) -> Vec<usize> {
        self.lock().kv_buffer_addresses()
    }

    /// How the CUDA-graph steps copy their inputs and outputs: ``"cudaMemcpy"``, ``"onnxruntime"`` (ONNX Runtime's
    /// copy, the fallback or ``SPECRT_GRAPH_COPIES=onnxruntime``), ``"host"`` (``cpu_graph_steps``), or ``None``
    /// without graph steps.
    #[getter]
    fn graph_copies(&self) -> Option<&'static str> {
        self.lock().graph_copies()
    }

    /// Data address of the last returned logits buffer inside the backend. Diagnostics.
    fn logits_address(&self) -> usize {
        self.lock().logits_address()
    }

    /// Where this model's tensors live: ``{"kv_cache", "logits", "inputs"}`` -> ``"host"``, ``"cuda_pinned"`` or
    /// ``"cuda_device"`` (the plan of the provider the session runs on).
    #[getter]
    fn memory_plan<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let plan = self.lock().memory_plan();
        plan_dict(py, plan)
    }

    /// The memory plan a session on ``provider`` (``"cpu"`` or ``"cuda"``) would use, without loading a model.
    ///
    /// Raises:
    ///     ConfigError: unknown provider name.
    #[staticmethod]
    fn planned_memory<'py>(py: Python<'py>, provider: &str) -> PyResult<Bound<'py, PyDict>> {
        let provider: Provider = provider.parse().map_err(spec_err)?;
        plan_dict(py, MemoryPlan::for_provider(provider))
    }

    /// Check that the CUDA provider can be registered with ``ort_library``; raises ProviderError naming what is
    /// missing.
    #[staticmethod]
    #[pyo3(signature = (ort_library, device_id=0))]
    fn check_cuda(py: Python<'_>, ort_library: PathBuf, device_id: i32) -> PyResult<()> {
        run_kernel(py, || {
            specrt_ort::check_cuda_provider(&ort_library, device_id)
        })
    }

    fn __repr__(&self) -> String {
        let b = self.lock();
        format!(
            "OrtModel({:?}, layout={:?}, provider={:?}, vocab_size={}, max_seq_len={})",
            b.model_file().display().to_string(),
            b.layout().as_str(),
            b.provider().as_str(),
            b.vocab_size(),
            b.max_seq_len()
        )
    }
}

impl PyOrtModel {
    fn lock(&self) -> std::sync::MutexGuard<'_, OrtBackend> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn plan_dict(py: Python<'_>, plan: MemoryPlan) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("kv_cache", plan.kv_cache.as_str())?;
    d.set_item("logits", plan.logits.as_str())?;
    d.set_item("inputs", plan.inputs.as_str())?;
    Ok(d)
}
