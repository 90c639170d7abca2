//! `Engine`: the draft/verify loop (wraps `specrt_core::Engine` over two `specrt_ort::OrtBackend`s).
//! Converts and forwards, nothing more; the Python `specrt.Decoder` drives it round by round.

use std::path::PathBuf;
use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use specrt_core::{Backend, Engine, Stats, StepOutput, DEFAULT_PREFIX_CACHING};
use specrt_ort::{check_draft_folder, ConstraintCompiler, OrtBackend, Provider};

use crate::args::{ort_options, prompt_ids};
use crate::errors::{run_kernel, to_pyerr};
use crate::request::RequestConfig;

/// The draft/verify loop over a target model and an optional draft model (ONNX Runtime sessions).
///
/// Low-level: `specrt.Decoder` (Python) adds tokenization, stop strings, streaming and thread safety for whole
/// generations. One call at a time: methods lock the engine; `start` drops any generation in progress.
///
/// Args:
///     target: target model folder or ``.onnx`` file.
///     draft: draft model folder or ``.onnx`` file, or ``None`` (target-only decoding).
///     ort_library: absolute path of ``libonnxruntime.so.1.x``.
///     provider: ``"cpu"`` or ``"cuda"``.
///     device_id: CUDA device ordinal.
///     max_seq_len: longest total sequence (prompt + new tokens) each KV cache is preallocated for; default: the
///         model's ``max_position_embeddings`` (capped by it in any case).
///     intra_op_threads: ONNX Runtime intra-op threads per session; default: number of physical cores.
///     allow_fallback: if CUDA cannot be used, run on CPU instead of raising ``ProviderError``.
///     prefix_caching: reuse the KV of the prompt prefix that the previous generation left in each cache (default
///         ``DEFAULT_PREFIX_CACHING``: on); ``stats()["n_cached_tokens"]`` counts the reused prompt tokens.
///     profile: turn ONNX Runtime's profiler on for the target's session (not the draft's), writing a Chrome-trace
///         JSON named from this prefix (ONNX Runtime appends a timestamp) in an existing folder when the engine is
///         dropped (``benches/bench_step.py --profile``: a round's time inside and outside the run). The
///         process's sessions share one thread pool whose profiler starts and ends with this one: profile in a
///         process where no other model runs on another thread meanwhile (ONNX Runtime fails that run).
///
/// Raises:
///     FileNotFoundError: a model or the library is missing. VocabError: the draft's ``tokenizer.json``
///         vocabulary differs from the target's, or the logits widths differ other than in padding rows beyond the
///         tokenizer's ids (both widths and the tokenizer's size named; a draft of another width is otherwise
///         fitted to the target's: ``specrt_core::vocab``).
///     ProviderError: CUDA requested and unavailable. BackendError: ONNX Runtime failed (e.g. a corrupt model).
#[pyclass(module = "specrt._specrt", name = "Engine")]
pub struct PyEngine {
    inner: Mutex<Engine>,
    /// The target model folder or file (its tokenizer.json is read by the first constrained request).
    target: PathBuf,
    /// Compiles requests' constraints over the target folder's tokenizer.json (structured output; built by the
    /// first constrained request, so that a plain Engine never reads the tokenizer).
    constraints: Mutex<Option<ConstraintCompiler>>,
    // Fixed at construction and kept outside the mutex: reading them never waits for a round another thread is
    // running (that wait would hold the GIL and stall every Python thread).
    providers: Vec<&'static str>,
    vocab_size: usize,
    has_draft: bool,
    max_seq_len: usize,
}

/// Lock the engine. Call it with the GIL released (inside `run_kernel`): waiting for a round with the GIL held
/// would stall every Python thread.
fn lock(m: &Mutex<Engine>) -> std::sync::MutexGuard<'_, Engine> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub(crate) fn stats_dict<'py>(py: Python<'py>, s: &Stats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("n_prompt_tokens", s.n_prompt_tokens)?;
    d.set_item("n_cached_tokens", s.n_cached_tokens)?;
    d.set_item("n_cached_tokens_dft", s.n_cached_tokens_dft)?;
    d.set_item("prefix_cache_hit", s.prefix_cache_hit())?;
    d.set_item("n_rounds", s.n_rounds)?;
    d.set_item("n_drafted", s.n_drafted)?;
    d.set_item("n_accepted", s.n_accepted)?;
    d.set_item("n_recovered", s.n_recovered)?;
    d.set_item("n_bonus", s.n_bonus)?;
    d.set_item("n_emitted", s.n_emitted())?;
    d.set_item("accepted_at", s.accepted_at.clone())?;
    d.set_item("n_drafted_ngram", s.n_drafted_ngram)?;
    d.set_item("n_accepted_ngram", s.n_accepted_ngram)?;
    d.set_item("n_drafted_forced", s.n_drafted_forced)?;
    d.set_item("n_accepted_forced", s.n_accepted_forced)?;
    d.set_item("mask_ms", s.mask_ms)?;
    d.set_item("rounds_by_k", s.rounds_by_k.clone())?;
    d.set_item("acceptance_rate", s.acceptance_rate())?;
    d.set_item("mean_tokens_per_round", s.mean_tokens_per_round())?;
    d.set_item("prefill_ms", s.prefill_ms)?;
    d.set_item("draft_ms", s.draft_ms)?;
    d.set_item("target_ms", s.target_ms)?;
    d.set_item("core_ms", s.core_ms)?;
    d.set_item("decode_ms", s.decode_ms())?;
    d.set_item("decode_tokens_per_s", s.decode_tokens_per_s())?;
    d.set_item("tokens_per_s", s.tokens_per_s())?;
    Ok(d)
}

/// ``{"logprobs": [float], "top_logprobs": [[(int, float)]]}`` of a prompt's scores (entry j: prompt token j + 1).
pub(crate) fn prompt_dict<'py>(
    py: Python<'py>,
    p: &specrt_core::PromptLogprobs,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("logprobs", p.logprobs.clone())?;
    d.set_item("top_logprobs", p.top_logprobs.clone())?;
    Ok(d)
}

pub(crate) fn step_dict<'py>(py: Python<'py>, out: &StepOutput) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("tokens", out.tokens.clone())?;
    d.set_item(
        "sources",
        out.sources.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
    )?;
    d.set_item("logprobs", out.logprobs.clone())?;
    d.set_item("top_logprobs", out.top_logprobs.clone())?;
    d.set_item("n_drafted", out.n_drafted)?;
    d.set_item("finish_reason", out.finish_reason.map(|r| r.as_str()))?;
    Ok(d)
}

#[pymethods]
impl PyEngine {
    #[new]
    #[pyo3(signature = (
        target, draft=None, *, ort_library, provider="cpu", device_id=0, max_seq_len=None,
        intra_op_threads=None, allow_fallback=false, cuda_graph=false, prefix_caching=None, profile=None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        target: PathBuf,
        draft: Option<PathBuf>,
        ort_library: PathBuf,
        provider: &str,
        device_id: i32,
        max_seq_len: Option<usize>,
        intra_op_threads: Option<usize>,
        allow_fallback: bool,
        cuda_graph: bool,
        prefix_caching: Option<bool>,
        profile: Option<PathBuf>,
    ) -> PyResult<Self> {
        let provider: Provider = provider.parse().map_err(to_pyerr)?;
        let mut options = ort_options(
            ort_library,
            provider,
            device_id,
            max_seq_len,
            intra_op_threads,
            allow_fallback,
            cuda_graph,
        );
        options.profile = profile;
        let target_path = target.clone();
        let (engine, providers) = run_kernel(py, move || {
            // The draft's tokenizer against the target's, before any session loads; the widths' rule is the
            // engine's (the same check as the Rust Pipeline's).
            let tokenizer_vocab = match &draft {
                Some(p) => check_draft_folder(&target, p)?,
                None => None,
            };
            let t = OrtBackend::new(&target, &options)?;
            let providers = t.providers();
            let mut draft_options = options.for_draft();
            draft_options.profile = None;
            let d = match &draft {
                Some(p) => Some(Box::new(OrtBackend::new(p, &draft_options)?) as Box<dyn Backend>),
                None => None,
            };
            let mut engine = Engine::with_tokenizer_vocab(Box::new(t), d, tokenizer_vocab)?;
            engine.set_prefix_caching(prefix_caching.unwrap_or(DEFAULT_PREFIX_CACHING));
            Ok((engine, providers))
        })?;
        Ok(Self {
            vocab_size: engine.vocab_size(),
            has_draft: engine.has_draft(),
            max_seq_len: engine.max_seq_len(),
            inner: Mutex::new(engine),
            target: target_path,
            constraints: Mutex::new(None),
            providers,
        })
    }

    /// Start a generation: validate the settings, compile the request's output constraint (structured output,
    /// over the target folder's tokenizer.json and the request's EOS ids) and prefill both caches (GIL released).
    ///
    /// Args:
    ///     prompt: prompt token ids (non-empty).
    ///     config: the request's settings.
    ///
    /// Raises:
    ///     ConfigError (also: a constraint without the folder's tokenizer.json or EOS ids), VocabError,
    ///     SequenceLengthError (prompt + max_new_tokens > max_seq_len), BackendError.
    fn start(
        &self,
        py: Python<'_>,
        prompt: Vec<i64>,
        config: PyRef<'_, RequestConfig>,
    ) -> PyResult<()> {
        let prompt = prompt_ids(&prompt)?;
        let cfg = config.cfg.clone();
        let spec = config.constraint.clone();
        run_kernel(py, || {
            let constraint = match &spec {
                None => None,
                Some(c) => {
                    let mut guard = self
                        .constraints
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    if guard.is_none() {
                        // EOS ids come with each request (its resolved settings).
                        *guard = Some(ConstraintCompiler::from_folder(
                            &self.target,
                            self.vocab_size,
                            Vec::new(),
                        )?);
                    }
                    let compiler = guard.as_mut().expect("just built");
                    compiler.compile_for(Some(c), &cfg.eos_token_ids)?
                }
            };
            lock(&self.inner).start_with(&prompt, cfg, constraint)
        })
    }

    /// Run one round (GIL released) and return what it committed:
    /// ``{"tokens": [int], "sources": ["accepted" | "recovered" | "bonus"], "logprobs": [float],
    /// "top_logprobs": [[(int, float)]], "n_drafted": int, "finish_reason": None | "eos" | "stop" | "length" | "grammar"}``.
    ///
    /// Raises:
    ///     ConfigError: no generation started. NonFiniteLogitsError, BackendError: the generation is dropped.
    fn step<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        // Copied out of the engine's reused buffer to build the Python dict after the GIL is back.
        let out = run_kernel(py, || lock(&self.inner).step().cloned())?;
        step_dict(py, &out)
    }

    /// The prompt's scores of the current (or last) request (``RequestConfig(prompt_logprobs=k)``; empty lists
    /// without it): ``{"logprobs": [float], "top_logprobs": [[(int, float)]]}``, entry j for prompt token j + 1;
    /// None before any request.
    fn prompt_logprobs<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let p = run_kernel(py, || Ok(lock(&self.inner).prompt_logprobs().cloned()))?;
        p.map(|p| prompt_dict(py, &p)).transpose()
    }

    /// Keep only the first ``n_keep`` generated tokens and finish with reason ``"stop"`` (a stop string matched).
    fn stop_at(&self, py: Python<'_>, n_keep: usize) -> PyResult<()> {
        run_kernel(py, || lock(&self.inner).stop_at(n_keep))
    }

    /// Statistics of the current or last generation (a dict; ``None`` if there is none). Times in ms, rates in
    /// tokens/s, ``acceptance_rate`` = accepted / drafted.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let stats = run_kernel(py, || Ok(lock(&self.inner).stats().cloned()))?;
        stats.map(|s| stats_dict(py, &s)).transpose()
    }

    /// The target's logits width: the vocabulary of prompts and outputs (a draft of another width is fitted to
    /// it).
    #[getter]
    fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Whether a draft model is attached.
    #[getter]
    fn has_draft(&self) -> bool {
        self.has_draft
    }

    /// Longest prompt + new tokens both caches hold.
    #[getter]
    fn max_seq_len(&self) -> usize {
        self.max_seq_len
    }

    /// ONNX Runtime execution providers of the target session, preferred first.
    #[getter]
    fn providers(&self) -> Vec<&'static str> {
        self.providers.clone()
    }
}
