//! `RequestConfig`: the settings of one generation request, shared by `Engine.start` and `BatchEngine.add`.

use pyo3::prelude::*;
use specrt_core::sampling::Fault;
use specrt_core::{AutoK, GenerationConfig, NgramConfig, PinnedCosts, SpecError};

use crate::args::SamplingArgs;
use crate::errors::to_pyerr;

/// The settings of one generation request (``specrt.Decoder`` builds it from its keyword arguments).
#[pyclass(module = "specrt._specrt", name = "RequestConfig", frozen)]
pub struct RequestConfig(pub GenerationConfig);

#[pymethods]
impl RequestConfig {
    /// Settings of one request, checked in full (``GenerationConfig::validate``); needs no model.
    ///
    /// Args:
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
    ///     logprobs: return the target's log-probability of each emitted token (off: none are returned, and a
    ///         greedy request without penalties reads only the models' argmax ids).
    ///     top_logprobs: alternatives per emitted token, 0..=20: the most likely tokens of the target's
    ///         verification row of its position with their log-probabilities (0 = none).
    ///     min_tokens: no EOS or stop token id before this many tokens (vLLM's; 0 = off, <= max_new_tokens).
    ///     prompt_logprobs: score the prompt with this many alternatives per position, 0..=20 (None = off): the
    ///         target's log-probability of each prompt token after the first, from the prefill pass.
    ///
    /// Raises:
    ///     ConfigError: a setting out of range, or pinned costs given by halves.
    #[new]
    #[pyo3(signature = (
        *, max_new_tokens, num_speculative_tokens=4, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0,
        repetition_penalty=1.0, frequency_penalty=0.0, presence_penalty=0.0, seed=0, eos_token_ids=vec![],
        stop_token_ids=vec![], ignore_eos=false, auto_k=false, pinned_c_draft=None, pinned_c_verify=None,
        prompt_lookup_min=None, prompt_lookup_max=None, use_draft_model=true, coupled=false, logprobs=true,
        top_logprobs=0, prompt_logprobs=None, min_tokens=0, _fault=None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
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
        logprobs: bool,
        top_logprobs: usize,
        prompt_logprobs: Option<usize>,
        min_tokens: u32,
        _fault: Option<&str>,
    ) -> PyResult<Self> {
        let mut sampling = SamplingArgs {
            temperature,
            top_k,
            top_p,
            min_p,
            repetition_penalty,
            frequency_penalty,
            presence_penalty,
        }
        .convert("an integer >= 0; 0 = off")?;
        sampling.min_tokens = min_tokens;
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
            logprobs,
            top_logprobs,
            prompt_logprobs,
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
        // Checked here, so a bad setting is refused before a request queues or a model loads (the engines check
        // again at start: one definition, `GenerationConfig::validate`).
        cfg.validate().map_err(to_pyerr)?;
        Ok(Self(cfg))
    }

    /// Most tokens to emit.
    #[getter]
    fn max_new_tokens(&self) -> usize {
        self.0.max_new_tokens
    }

    fn __repr__(&self) -> String {
        format!("RequestConfig({:?})", self.0)
    }
}
