//! `Engine`: the draft/verify loop (wraps `specrt_core::Engine` over two `specrt_ort::OrtBackend`s).
//! Converts and forwards, nothing more; the Python `specrt.Decoder` drives it round by round.

use std::path::PathBuf;
use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use specrt_core::sampling::Fault;
use specrt_core::{
    AutoK, Backend, Engine, GenerationConfig, NgramConfig, PinnedCosts, SpecError, Stats,
    StepOutput,
};
use specrt_ort::{OrtBackend, Provider};

use crate::args::{ort_options, prompt_ids, SamplingArgs};
use crate::errors::{run_kernel, to_pyerr};

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
///
/// Raises:
///     FileNotFoundError: a model or the library is missing. VocabError: draft and target vocab sizes differ.
///     ProviderError: CUDA requested and unavailable. BackendError: ONNX Runtime failed (e.g. a corrupt model).
#[pyclass(module = "specrt._specrt", name = "Engine")]
pub struct PyEngine {
    inner: Mutex<Engine>,
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

fn stats_dict<'py>(py: Python<'py>, s: &Stats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("n_prompt_tokens", s.n_prompt_tokens)?;
    d.set_item("n_rounds", s.n_rounds)?;
    d.set_item("n_drafted", s.n_drafted)?;
    d.set_item("n_accepted", s.n_accepted)?;
    d.set_item("n_recovered", s.n_recovered)?;
    d.set_item("n_bonus", s.n_bonus)?;
    d.set_item("n_emitted", s.n_emitted())?;
    d.set_item("accepted_at", s.accepted_at.clone())?;
    d.set_item("n_drafted_ngram", s.n_drafted_ngram)?;
    d.set_item("n_accepted_ngram", s.n_accepted_ngram)?;
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

fn step_dict<'py>(py: Python<'py>, out: &StepOutput) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("tokens", out.tokens.clone())?;
    d.set_item(
        "sources",
        out.sources.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
    )?;
    d.set_item("logprobs", out.logprobs.clone())?;
    d.set_item("n_drafted", out.n_drafted)?;
    d.set_item("finish_reason", out.finish_reason.map(|r| r.as_str()))?;
    Ok(d)
}

#[pymethods]
impl PyEngine {
    #[new]
    #[pyo3(signature = (
        target, draft=None, *, ort_library, provider="cpu", device_id=0, max_seq_len=None,
        intra_op_threads=None, allow_fallback=false
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
    ) -> PyResult<Self> {
        let provider: Provider = provider.parse().map_err(to_pyerr)?;
        let options = ort_options(
            ort_library,
            provider,
            device_id,
            max_seq_len,
            intra_op_threads,
            allow_fallback,
        );
        let (engine, providers) = run_kernel(py, move || {
            let t = OrtBackend::new(&target, &options)?;
            let providers = t.providers();
            let d = match &draft {
                Some(p) => Some(Box::new(OrtBackend::new(p, &options)?) as Box<dyn Backend>),
                None => None,
            };
            Ok((Engine::new(Box::new(t), d)?, providers))
        })?;
        Ok(Self {
            vocab_size: engine.vocab_size(),
            has_draft: engine.has_draft(),
            max_seq_len: engine.max_seq_len(),
            inner: Mutex::new(engine),
            providers,
        })
    }

    /// Start a generation: validate the settings and prefill both caches (GIL released).
    ///
    /// Args:
    ///     prompt: prompt token ids (non-empty).
    ///     max_new_tokens: most tokens to emit (>= 1).
    ///     num_speculative_tokens: K, draft tokens per round, 0..64 (0 = plain target decoding).
    ///     temperature, top_k, top_p, min_p: logits processing (0 = greedy; top_k 0, top_p 1, min_p 0 = off).
    ///     repetition_penalty, frequency_penalty, presence_penalty: penalties (1, 0, 0 = off).
    ///     seed: seed of the request's random stream.
    ///     eos_token_ids, stop_token_ids: ids that end generation (emitted); ignore_eos: go on past EOS ids.
    ///     auto_k: choose K each round (up to ``num_speculative_tokens``) from measured costs and acceptance.
    ///     pinned_c_draft, pinned_c_verify: with ``auto_k``, costs to use instead of timings (reproducible runs):
    ///         one draft pass, and a target pass over n = 1..=K+1 tokens (list of K + 1 values).
    ///     prompt_lookup_min, prompt_lookup_max: enable n-gram (prompt lookup) proposals with these match lengths.
    ///     use_draft_model: draft with the draft model (when attached).
    ///     coupled: coupled sampling: the choice at each position depends on (seed, position) alone, so the output
    ///         equals target-only coupled decoding with the same seed for every K and proposer.
    ///
    /// Raises:
    ///     ConfigError, VocabError, SequenceLengthError (prompt + max_new_tokens > max_seq_len), BackendError.
    #[pyo3(signature = (
        prompt, *, max_new_tokens, num_speculative_tokens=4, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0,
        repetition_penalty=1.0, frequency_penalty=0.0, presence_penalty=0.0, seed=0, eos_token_ids=vec![],
        stop_token_ids=vec![], ignore_eos=false, auto_k=false, pinned_c_draft=None, pinned_c_verify=None,
        prompt_lookup_min=None, prompt_lookup_max=None, use_draft_model=true, coupled=false, _fault=None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn start(
        &self,
        py: Python<'_>,
        prompt: Vec<i64>,
        max_new_tokens: usize,
        num_speculative_tokens: usize,
        temperature: f64,
        top_k: i64,
        top_p: f64,
        min_p: f64,
        repetition_penalty: f64,
        frequency_penalty: f64,
        presence_penalty: f64,
        seed: u64,
        eos_token_ids: Vec<u32>,
        stop_token_ids: Vec<u32>,
        ignore_eos: bool,
        auto_k: bool,
        pinned_c_draft: Option<f64>,
        pinned_c_verify: Option<Vec<f64>>,
        prompt_lookup_min: Option<usize>,
        prompt_lookup_max: Option<usize>,
        use_draft_model: bool,
        coupled: bool,
        _fault: Option<&str>,
    ) -> PyResult<()> {
        // Validated with the rest of the config by the core's `start`.
        let sampling = SamplingArgs {
            temperature,
            top_k,
            top_p,
            min_p,
            repetition_penalty,
            frequency_penalty,
            presence_penalty,
        }
        .convert("an integer >= 0; 0 = off")?;
        let prompt = prompt_ids(&prompt)?;
        if auto_k && (pinned_c_draft.is_some() != pinned_c_verify.is_some()) {
            return Err(to_pyerr(SpecError::Config(
                "pinned costs need both pinned_c_draft and pinned_c_verify".to_owned(),
            )));
        }
        let cfg = GenerationConfig {
            max_new_tokens,
            num_speculative_tokens,
            sampling,
            seed,
            eos_token_ids,
            stop_token_ids,
            ignore_eos,
            auto_k: auto_k.then(|| AutoK {
                k_max: num_speculative_tokens.max(1),
                pinned: match (pinned_c_draft, pinned_c_verify) {
                    (Some(c_draft), Some(c_verify)) => Some(PinnedCosts { c_draft, c_verify }),
                    _ => None,
                },
                ..AutoK::default()
            }),
            ngram: match (prompt_lookup_min, prompt_lookup_max) {
                (None, None) => None,
                (lo, hi) => {
                    let hi = hi.or(lo).unwrap_or(1);
                    Some(NgramConfig {
                        prompt_lookup_min: lo.unwrap_or(1).min(hi),
                        prompt_lookup_max: hi,
                    })
                }
            },
            use_draft_model,
            coupled,
            fault: match _fault {
                None => None,
                Some("residual_from_draft") => Some(Fault::ResidualFromDraft),
                Some(other) => {
                    return Err(to_pyerr(SpecError::Config(format!(
                        "_fault {other:?} is invalid (expected None or \"residual_from_draft\")"
                    ))))
                }
            },
        };
        run_kernel(py, || lock(&self.inner).start(&prompt, cfg))
    }

    /// Run one round (GIL released) and return what it committed:
    /// ``{"tokens": [int], "sources": ["accepted" | "recovered" | "bonus"], "logprobs": [float],
    /// "n_drafted": int, "finish_reason": None | "eos" | "stop" | "length"}``.
    ///
    /// Raises:
    ///     ConfigError: no generation started. NonFiniteLogitsError, BackendError: the generation is dropped.
    fn step<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        // Copied out of the engine's reused buffer to build the Python dict after the GIL is back.
        let out = run_kernel(py, || lock(&self.inner).step().cloned())?;
        step_dict(py, &out)
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
