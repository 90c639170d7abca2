//! `BatchEngine`: batched rounds (wraps `specrt_core::BatchEngine` over two `specrt_ort::BatchedOrtBackend`s).
//! Converts and forwards, nothing more; the Python `specrt.Scheduler` drives it round by round.

use std::path::PathBuf;
use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use specrt_core::{
    BatchBackend, BatchEngine, BatchOptions, RowStep, DEFAULT_PREFIX_CACHE_BYTES,
    DEFAULT_PREFIX_CACHING,
};
use specrt_ort::{BatchedOrtBackend, Provider};

use crate::args::{ort_options, prompt_ids};
use crate::engine::{prompt_dict, stats_dict, step_dict};
use crate::errors::{run_kernel, to_pyerr};
use crate::request::RequestConfig;

/// Batched rounds over a target and an optional draft model in the batched layout (``specrt convert --attention
/// batched``): up to ``max_batch`` requests share each draft pass and each verification pass; a finished request
/// leaves and a waiting one joins at the next round.
///
/// Low-level: ``specrt.Scheduler`` (Python) adds tokenization, stop strings, streams, timeouts and threads. Each
/// method locks the engine for its call.
///
/// Args:
///     target: target model folder (batched layout).
///     draft: draft model folder (batched layout), or ``None``.
///     ort_library: absolute path of ``libonnxruntime.so.1.x``.
///     max_batch: rows decoding at once (1..=64); each model preallocates that many KV cache slots.
///     max_seq_len: longest prompt + new tokens per row (default: the model's ``max_position_embeddings``).
///     intra_op_threads: ONNX Runtime intra-op threads per session (default: the physical cores).
///     prefill_chunk: most prompt tokens a joining request prefills per round (the longest the others wait).
///     provider: ``"cpu"`` (the batched layout runs on CPU only for now).
///     allow_fallback: run on CPU if another provider was asked for and cannot be used.
///     prefix_caching: keep finished rows' KV in the prefix store and copy the longest matching prefix into a
///         joining row's slot (default ``DEFAULT_PREFIX_CACHING``: on).
///     prefix_cache_bytes: the prefix store's budget, both models together, least recently used dropped first
///         (default ``DEFAULT_PREFIX_CACHE_BYTES``, 1 GiB).
///
/// Raises:
///     FileNotFoundError, ModelFileError: a model or the library is missing or unreadable. ConfigError: a model
///     not in the batched layout, or a setting out of range. VocabError, ProviderError, BackendError.
#[pyclass(module = "specrt._specrt", name = "BatchEngine")]
pub struct PyBatchEngine {
    inner: Mutex<BatchEngine>,
    vocab_size: usize,
    has_draft: bool,
    max_seq_len: usize,
    max_batch: usize,
}

fn lock(m: &Mutex<BatchEngine>) -> std::sync::MutexGuard<'_, BatchEngine> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn row_dict<'py>(py: Python<'py>, r: RowStep) -> PyResult<Bound<'py, PyDict>> {
    let d = step_dict(py, &r.out)?;
    d.set_item("id", r.id)?;
    let error = r.error.map(|e| to_pyerr(e).into_value(py));
    d.set_item("error", error)?;
    Ok(d)
}

#[pymethods]
impl PyBatchEngine {
    #[new]
    #[pyo3(signature = (
        target, draft=None, *, ort_library, max_batch=4, max_seq_len=None, intra_op_threads=None,
        prefill_chunk=256, provider="cpu", allow_fallback=false, prefix_caching=None, prefix_cache_bytes=None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        target: PathBuf,
        draft: Option<PathBuf>,
        ort_library: PathBuf,
        max_batch: usize,
        max_seq_len: Option<usize>,
        intra_op_threads: Option<usize>,
        prefill_chunk: usize,
        provider: &str,
        allow_fallback: bool,
        prefix_caching: Option<bool>,
        prefix_cache_bytes: Option<usize>,
    ) -> PyResult<Self> {
        let provider: Provider = provider.parse().map_err(to_pyerr)?;
        let options = ort_options(
            ort_library,
            provider,
            0,
            max_seq_len,
            intra_op_threads,
            allow_fallback,
            false,
        );
        let engine = run_kernel(py, move || {
            let t = BatchedOrtBackend::new(&target, &options, max_batch)?;
            let draft_options = options.for_draft();
            let d = match &draft {
                Some(p) => Some(
                    Box::new(BatchedOrtBackend::new(p, &draft_options, max_batch)?)
                        as Box<dyn BatchBackend>,
                ),
                None => None,
            };
            BatchEngine::new(
                Box::new(t),
                d,
                BatchOptions {
                    prefill_chunk,
                    prefix_caching: prefix_caching.unwrap_or(DEFAULT_PREFIX_CACHING),
                    prefix_cache_bytes: prefix_cache_bytes.unwrap_or(DEFAULT_PREFIX_CACHE_BYTES),
                    ..BatchOptions::default()
                },
            )
        })?;
        Ok(Self {
            vocab_size: engine.vocab_size(),
            has_draft: engine.has_draft(),
            max_seq_len: engine.max_seq_len(),
            max_batch: engine.max_batch(),
            inner: Mutex::new(engine),
        })
    }

    /// Queue request ``id`` (an integer unique among requests not yet cancelled); it joins at the next round with
    /// a free slot.
    ///
    /// Raises:
    ///     ConfigError (a duplicate id, an empty prompt), VocabError, SequenceLengthError.
    fn add(
        &self,
        py: Python<'_>,
        id: u64,
        prompt: Vec<i64>,
        config: PyRef<'_, RequestConfig>,
    ) -> PyResult<()> {
        let prompt = prompt_ids(&prompt)?;
        let cfg = config.0.clone();
        run_kernel(py, || lock(&self.inner).add(id, &prompt, cfg))
    }

    /// Run one round (GIL released); returns one dict per row that committed tokens or failed: the keys of
    /// ``Engine.step`` plus ``"id"`` and ``"error"`` (the row's exception, or ``None``). A finished row has left the
    /// batch; its statistics stay readable (``stats``) until ``cancel(id)``.
    ///
    /// Raises:
    ///     BackendError: a model pass failed (every running row is dropped).
    fn step<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let steps = run_kernel(py, || lock(&self.inner).step().map(<[RowStep]>::to_vec))?;
        steps.into_iter().map(|r| row_dict(py, r)).collect()
    }

    /// Remove request ``id`` (running, waiting or finished); returns whether it was known.
    fn cancel(&self, py: Python<'_>, id: u64) -> PyResult<bool> {
        run_kernel(py, || lock(&self.inner).cancel(id))
    }

    /// Keep only the first ``n_keep`` generated tokens of running request ``id`` and finish it (a stop string).
    fn stop_at(&self, py: Python<'_>, id: u64, n_keep: usize) -> PyResult<()> {
        run_kernel(py, || lock(&self.inner).stop_at(id, n_keep))
    }

    /// Statistics of a running or finished request (a dict as ``Engine.stats``; ``None`` if unknown). Model times
    /// are those of the shared batched passes.
    fn stats<'py>(&self, py: Python<'py>, id: u64) -> PyResult<Option<Bound<'py, PyDict>>> {
        let stats = run_kernel(py, || Ok(lock(&self.inner).stats(id).cloned()))?;
        stats.map(|s| stats_dict(py, &s)).transpose()
    }

    /// The prompt's scores of request ``id`` (as ``Engine.prompt_logprobs``; complete from its first emitted token
    /// on), or None for an unknown id.
    fn prompt_logprobs<'py>(
        &self,
        py: Python<'py>,
        id: u64,
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        let p = run_kernel(py, || Ok(lock(&self.inner).prompt_logprobs(id).cloned()))?;
        p.map(|p| prompt_dict(py, &p)).transpose()
    }

    /// Rows in the batch now (prefilling or decoding).
    #[getter]
    fn n_running(&self, py: Python<'_>) -> PyResult<usize> {
        run_kernel(py, || Ok(lock(&self.inner).n_running()))
    }

    /// Requests waiting for a slot.
    #[getter]
    fn n_waiting(&self, py: Python<'_>) -> PyResult<usize> {
        run_kernel(py, || Ok(lock(&self.inner).n_waiting()))
    }

    /// Vocabulary size shared by target and draft.
    #[getter]
    fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Whether a draft model is attached.
    #[getter]
    fn has_draft(&self) -> bool {
        self.has_draft
    }

    /// Longest prompt + new tokens per row.
    #[getter]
    fn max_seq_len(&self) -> usize {
        self.max_seq_len
    }

    /// Rows decoding at once.
    #[getter]
    fn max_batch(&self) -> usize {
        self.max_batch
    }
}
