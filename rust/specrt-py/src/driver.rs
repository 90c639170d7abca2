//! `Driver`: many requests in batched rounds, text out (wraps `specrt_ort::Driver`: the one resolver,
//! the tokenizer, stop strings and streamed text are Rust's). Converts and forwards, nothing more; the Python
//! `specrt.Scheduler` adds the queue, threads, timeouts and asyncio.

use std::path::PathBuf;
use std::sync::{Mutex, RwLock};

use pyo3::prelude::*;
use pyo3::types::PyDict;
use specrt_core::{
    BatchOptions, DEFAULT_MAX_PREFILL_TOKENS, DEFAULT_PREFIX_CACHE_BYTES, DEFAULT_PREFIX_CACHING,
};
use specrt_ort::{check_ids, Driver, DriverEvent, Provider, RequestScope};

use crate::args::ort_options;
use crate::errors::{run_kernel, to_pyerr};
use crate::outputs::{prompt_dict, stats_dict, step_dict};
use crate::prepared::PyPreparedRequest;
use crate::request_config::{ids_of, request_of, PyFolderDefaults};
use crate::text::PyTokenizer;

/// The driver every generation runs through (``specrt_ort::Driver``): requests submitted with their
/// settings, one round per ``step``, per-request events out, ``cancel``. With ``batched`` (folders in the batched
/// layout, ``specrt convert --attention batched``) up to ``max_batch`` requests share each draft pass and each
/// verification pass, a finished request leaving and a waiting one joining at the next round; without it the
/// single-stream engine (default or graph form, any provider, CUDA graphs, structured output) serves one request
/// at a time and the others wait. Requests are resolved and checked once by the one resolver at ``prepare`` (the
/// target folder's generation_config.json defaults, every check) and queued by ``submit``; text, stop strings and streamed pieces are the target folder's
/// tokenizer's (as ``TextAssembler``).
///
/// Low-level: ``specrt.Decoder`` and ``specrt.Scheduler`` (Python) add model names, the queue, threads, timeouts
/// and asyncio. Each method locks the driver for its call, except ``prepare`` and the getters of fixed values and
/// defaults, which never wait for a round.
///
/// Args:
///     target: target model folder.
///     draft: draft model folder (the target's layout), or ``None``.
///     ort_library: absolute path of ``libonnxruntime.so.1.x``.
///     batched: the batched engine (folders in the batched layout) or the single-stream one (default: batched).
///     max_batch: rows decoding at once (1..=64, batched only); each model preallocates that many KV cache slots.
///     max_seq_len: longest prompt + new tokens per row (default: the model's ``max_position_embeddings``).
///     intra_op_threads: ONNX Runtime intra-op threads per session (default: the physical cores).
///     prefill_chunk: most prompt tokens a joining request prefills per pass (its prompt's chunks; batched only).
///     max_prefill_tokens: most prompt tokens prefilled per round over all joining requests, in whole chunks (the
///         round's first always; default ``DEFAULT_MAX_PREFILL_TOKENS``, 256): the longest the running rows wait
///         (batched only).
///     provider: ``"cpu"`` or ``"cuda"`` (the batched layout runs on CPU only for now); ``device_id``: the GPU.
///     allow_fallback: run on CPU if another provider was asked for and cannot be used.
///     cuda_graph: capture and replay CUDA graphs (single-stream graph-form folders on CUDA).
///     prefix_caching: reuse the longest prompt prefix the caches hold (default ``DEFAULT_PREFIX_CACHING``: on;
///         batched: finished rows' KV kept in the prefix store and copied into a joining row's slot).
///     prefix_cache_bytes: the batched prefix store's budget, both models together, least recently used dropped
///         first (default ``DEFAULT_PREFIX_CACHE_BYTES``, 1 GiB).
///     profile: write ONNX Runtime's profile of the target's session under this prefix (single-stream only).
///     suffix_cache_tokens: tokens of earlier requests' prompts and outputs that suffix decoding
///         (``proposer="suffix"``, ``"suffix+draft"``) shares among this driver's requests (default 0: none, each
///         request drafts from its own text; about 1 KB a token at most). A request's text can then shape another's
///         drafts, never its output.
///
/// Raises:
///     FileNotFoundError, ModelFileError: a model or the library is missing or unreadable. ConfigError: a model
///     not in the layout asked for, or a setting out of range. VocabError, ProviderError, BackendError.
#[pyclass(module = "specrt._specrt", name = "Driver")]
pub struct PyDriver {
    inner: Mutex<Driver>,
    /// What requests are checked against (a copy, refreshed when the EOS ids change): `prepare` reads it without
    /// waiting for a running round.
    scope: RwLock<RequestScope>,
    vocab_size: usize,
    has_draft: bool,
    max_seq_len: usize,
    max_batch: usize,
}

fn lock(m: &Mutex<Driver>) -> std::sync::MutexGuard<'_, Driver> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn read(s: &RwLock<RequestScope>) -> std::sync::RwLockReadGuard<'_, RequestScope> {
    s.read().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One event as a dict: the round's keys (its tokens, sources, logprobs, top_logprobs, n_drafted,
/// finish_reason) plus ``id``, ``text``, ``prompt`` (a prompt-scores dict or None), ``error`` (an exception or None)
/// and ``done`` (None, or ``{"text", "tokens", "sources", "logprobs", "top_logprobs", "finish_reason", "stats",
/// "prompt"}`` on the request's last event).
fn event_dict(py: Python<'_>, e: DriverEvent) -> PyResult<Bound<'_, PyDict>> {
    let d = step_dict(py, &e.step)?;
    d.set_item("id", e.id)?;
    d.set_item("text", e.text)?;
    d.set_item("prompt", e.prompt.map(|p| prompt_dict(py, &p)).transpose()?)?;
    d.set_item("error", e.error.map(|err| to_pyerr(err).into_value(py)))?;
    let done = match e.done {
        None => None,
        Some((text, out)) => {
            let o = PyDict::new(py);
            o.set_item("text", text)?;
            o.set_item("tokens", out.tokens)?;
            o.set_item(
                "sources",
                out.sources.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
            )?;
            o.set_item("logprobs", out.logprobs)?;
            o.set_item("top_logprobs", out.top_logprobs)?;
            o.set_item("finish_reason", out.finish_reason.as_str())?;
            o.set_item("stats", stats_dict(py, &out.stats)?)?;
            o.set_item("prompt", prompt_dict(py, &out.prompt)?)?;
            Some(o)
        }
    };
    d.set_item("done", done)?;
    Ok(d)
}

#[pymethods]
impl PyDriver {
    #[new]
    #[pyo3(signature = (
        target, draft=None, *, ort_library, batched=None, max_batch=4, max_seq_len=None, intra_op_threads=None,
        prefill_chunk=256, provider="cpu", device_id=0, allow_fallback=false, cuda_graph=false,
        prefix_caching=None, prefix_cache_bytes=None, max_prefill_tokens=None, profile=None,
        suffix_cache_tokens=0
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        target: PathBuf,
        draft: Option<PathBuf>,
        ort_library: PathBuf,
        batched: Option<bool>,
        max_batch: usize,
        max_seq_len: Option<usize>,
        intra_op_threads: Option<usize>,
        prefill_chunk: usize,
        provider: &str,
        device_id: i32,
        allow_fallback: bool,
        cuda_graph: bool,
        prefix_caching: Option<bool>,
        prefix_cache_bytes: Option<usize>,
        max_prefill_tokens: Option<usize>,
        profile: Option<PathBuf>,
        suffix_cache_tokens: i64,
    ) -> PyResult<Self> {
        let suffix_cache =
            specrt_core::SuffixCache::for_setting(suffix_cache_tokens).map_err(to_pyerr)?;
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
        let prefix_caching = prefix_caching.unwrap_or(DEFAULT_PREFIX_CACHING);
        let batch_options = BatchOptions {
            prefill_chunk,
            prefix_caching,
            prefix_cache_bytes: prefix_cache_bytes.unwrap_or(DEFAULT_PREFIX_CACHE_BYTES),
            max_prefill_tokens: max_prefill_tokens.unwrap_or(DEFAULT_MAX_PREFILL_TOKENS),
            ..BatchOptions::default()
        };
        let driver = run_kernel(py, move || match batched {
            None => Driver::open(
                &target,
                draft.as_deref(),
                &options,
                max_batch,
                batch_options,
            ),
            Some(true) => Driver::load(
                &target,
                draft.as_deref(),
                &options,
                max_batch,
                batch_options,
            ),
            Some(false) => Driver::load_single(&target, draft.as_deref(), &options, prefix_caching),
        })?;
        let mut driver = driver;
        driver.set_suffix_cache(suffix_cache);
        Ok(Self {
            scope: RwLock::new(driver.request_scope()),
            vocab_size: driver.vocab_size(),
            has_draft: driver.has_draft(),
            max_seq_len: driver.max_seq_len(),
            max_batch: driver.max_batch(),
            inner: Mutex::new(driver),
        })
    }

    /// Resolve and check a request, once: ``prompt`` token ids and ``settings`` (``Decoder.stream``'s keyword
    /// arguments by name, as ``resolve_request`` takes them; ``stop`` strings and the structured-output fields
    /// included) against this driver's defaults, draft, vocabulary and ``max_seq_len``. Never waits for a running
    /// round. Queue the result with ``submit``.
    ///
    /// Raises:
    ///     ConfigError (a setting out of range, named; an empty prompt; a schema, regex or grammar that is not
    ///     valid), VocabError, SequenceLengthError, TypeError (a token id that is not an integer).
    fn prepare(
        &self,
        py: Python<'_>,
        prompt: &Bound<'_, PyAny>,
        settings: &Bound<'_, PyDict>,
    ) -> PyResult<PyPreparedRequest> {
        let prompt = ids_of("prompt", prompt, Some(self.vocab_size))?;
        let request = request_of(settings, Some(self.vocab_size))?;
        run_kernel(py, || read(&self.scope).prepare(prompt, request)).map(PyPreparedRequest)
    }

    /// Queue a request made by ``prepare`` (not resolved again). Returns its id; it joins the batch at a later
    /// ``step`` with a free row. Nothing is queued on an error.
    ///
    /// Raises:
    ///     ConfigError: a constraint that does not compile over the tokenizer.
    fn submit(&self, py: Python<'_>, request: &PyPreparedRequest) -> PyResult<u64> {
        run_kernel(py, || lock(&self.inner).submit_prepared(&request.0))
    }

    /// Run one round (GIL released); returns one dict per request that committed tokens, finished or failed (see
    /// the class docs for the keys). A finished or failed request has left the driver.
    ///
    /// Raises:
    ///     BackendError, NonFiniteLogitsError: the round itself failed (every running request is dropped).
    fn step<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let events = run_kernel(py, || lock(&self.inner).step())?;
        events.into_iter().map(|e| event_dict(py, e)).collect()
    }

    /// Remove request ``id`` now (running or waiting); returns whether it was known.
    fn cancel(&self, py: Python<'_>, id: u64) -> PyResult<bool> {
        run_kernel(py, || lock(&self.inner).cancel(id))
    }

    /// Whether no request is running or waiting.
    #[getter]
    fn is_idle(&self, py: Python<'_>) -> PyResult<bool> {
        run_kernel(py, || Ok(lock(&self.inner).is_idle()))
    }

    /// Rows in the batch now (prefilling or decoding).
    #[getter]
    fn n_running(&self, py: Python<'_>) -> PyResult<usize> {
        run_kernel(py, || Ok(lock(&self.inner).n_running()))
    }

    /// Requests waiting for a row.
    #[getter]
    fn n_waiting(&self, py: Python<'_>) -> PyResult<usize> {
        run_kernel(py, || Ok(lock(&self.inner).n_waiting()))
    }

    /// ``(entries, bytes)``: prefixes in the batched layout's prefix store and the bytes of their KV copies (both
    /// models; at most ``prefix_cache_bytes``); ``(0, 0)`` in the single-stream layout (it keeps no copies).
    #[getter]
    fn prefix_cache_usage(&self, py: Python<'_>) -> PyResult<(usize, usize)> {
        run_kernel(py, || Ok(lock(&self.inner).prefix_cache_usage()))
    }

    /// The target's logits width: the vocabulary of prompts and outputs (a draft of another width is fitted to
    /// it).
    #[getter]
    fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// How the draft's vocabulary relates to the target's, as JSON text (``None`` without a draft folder):
    /// ``{"method": "same tokenizer", "tokenizer_vocab_size": int | null}`` or, for a draft of another tokenizer
    /// drafting through token-level intersection (Timor et al., ICML 2025, arXiv:2502.05202),
    /// ``{"method": "token-level intersection", "target_vocab_size", "draft_vocab_size", "shared_tokens",
    /// "multi_token_spellings", "sample_shared_fraction"}``.
    #[getter]
    fn draft_vocabulary_json(&self, py: Python<'_>) -> PyResult<Option<String>> {
        run_kernel(py, || {
            Ok(lock(&self.inner)
                .draft_vocabulary()
                .map(std::string::ToString::to_string))
        })
    }

    /// Whether requests share batched rounds (a folder in the batched layout); else they run one at a time.
    #[getter]
    fn batched(&self, py: Python<'_>) -> PyResult<bool> {
        run_kernel(py, || Ok(lock(&self.inner).is_batched()))
    }

    /// The target folder's tokenizer (``tokenizer.json``), or ``None`` when the folder has none.
    #[getter]
    fn tokenizer(&self, py: Python<'_>) -> PyResult<Option<PyTokenizer>> {
        run_kernel(py, || {
            Ok(lock(&self.inner).tokenizer().cloned().map(PyTokenizer))
        })
    }

    /// The source of the target folder's chat template (``chat_template.jinja``), or ``None`` when it has none.
    #[getter]
    fn chat_template_source(&self, py: Python<'_>) -> PyResult<Option<String>> {
        run_kernel(py, || {
            Ok(lock(&self.inner)
                .chat_template()
                .map(|t| t.source().to_owned()))
        })
    }

    /// The target folder's generation defaults (``generation_config.json``; ``specrt_config.json``'s EOS ids).
    #[getter]
    fn defaults(&self) -> PyFolderDefaults {
        PyFolderDefaults(read(&self.scope).defaults.clone())
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

    /// Rows decoding at once (1 for the single-stream engine).
    #[getter]
    fn max_batch(&self) -> usize {
        self.max_batch
    }

    /// ONNX Runtime execution providers of the target session, preferred first.
    #[getter]
    fn providers(&self, py: Python<'_>) -> PyResult<Vec<&'static str>> {
        run_kernel(py, || Ok(lock(&self.inner).providers().to_vec()))
    }

    /// The ids that end requests submitted from now on (default: the target folder's EOS ids).
    #[getter]
    fn eos_token_ids(&self) -> Vec<u32> {
        read(&self.scope).defaults.eos_token_ids.clone()
    }

    #[setter]
    fn set_eos_token_ids(&self, py: Python<'_>, ids: Vec<u32>) -> PyResult<()> {
        check_ids("eos_token_ids", &ids, self.vocab_size).map_err(to_pyerr)?;
        run_kernel(py, || {
            let mut driver = lock(&self.inner);
            driver.set_eos_token_ids(ids);
            *self
                .scope
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = driver.request_scope();
            Ok(())
        })
    }

    /// Statistics so far of running request ``id`` (the keys of ``Stats``), or ``None`` when it is not running.
    fn stats<'py>(&self, py: Python<'py>, id: u64) -> PyResult<Option<Bound<'py, PyDict>>> {
        let stats = run_kernel(py, || Ok(lock(&self.inner).stats(id).cloned()))?;
        stats.map(|s| stats_dict(py, &s)).transpose()
    }

    /// Statistics of the request run last, even one cancelled or failed since (single-stream: the engine keeps them
    /// until its next request starts), or ``None`` (batched, or nothing run yet). Read between rounds.
    fn last_stats<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let stats = run_kernel(py, || Ok(lock(&self.inner).last_stats().cloned()))?;
        stats.map(|s| stats_dict(py, &s)).transpose()
    }
}
