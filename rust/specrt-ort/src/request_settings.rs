//! One generation's settings ([`GenerationRequest`]) and the one resolver every caller uses
//! ([`resolve_request`]: the Rust [`crate::Pipeline`], [`crate::Driver`], Python's `Decoder`, `Scheduler` and
//! `specrt serve` through the binding): folder defaults filled in, K and the proposer translated, everything
//! validated with errors that name the setting.

use std::fmt;
use std::str::FromStr;

use specrt_core::{
    check_num_speculative_tokens, check_prompt, invalid_num_speculative_tokens, AutoK,
    GenerationConfig, LookupMethod, LookupProposer, NgramConfig, NgramProposer, PinnedCosts,
    Result, SamplingParams, SpecError,
};
use specrt_grammar::OutputConstraint;
use specrt_text::detok::TextOptions;
use specrt_text::stop::check_stop_strings;

use crate::folder::FolderDefaults;

/// Largest K that [`SpeculativeTokens::Auto`] considers (Python's `num_speculative_tokens="auto"`).
pub const AUTO_K_MAX: usize = 8;

/// How many draft tokens a round verifies: K.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpeculativeTokens {
    /// K draft tokens per round, `0..=`[`specrt_core::MAX_DRAFT_TOKENS`] (0, or no proposer, is plain target decoding).
    Fixed(usize),
    /// Each round picks the K in `0..=`[`AUTO_K_MAX`] that maximises expected tokens per second from running
    /// estimates of acceptance and measured costs (ARCHITECTURE.md, "K per round"). Depends on timings, so the
    /// same seed can give different tokens unless [`GenerationRequest::pinned_costs`] is set.
    Auto,
}

impl Default for SpeculativeTokens {
    /// `Fixed(4)`, Python's default.
    fn default() -> Self {
        SpeculativeTokens::Fixed(4)
    }
}

impl fmt::Display for SpeculativeTokens {
    /// `4` or `auto`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SpeculativeTokens::Fixed(k) => write!(f, "{k}"),
            SpeculativeTokens::Auto => f.write_str("auto"),
        }
    }
}

impl FromStr for SpeculativeTokens {
    type Err = SpecError;

    /// Parse `"auto"` or an integer (range checked by [`Pipeline::resolve`]).
    ///
    /// Errors: [`SpecError::Setting`] (`num_speculative_tokens`) naming the text.
    fn from_str(s: &str) -> Result<Self> {
        let s = s.trim();
        if s == "auto" {
            return Ok(SpeculativeTokens::Auto);
        }
        s.parse()
            .map(SpeculativeTokens::Fixed)
            .map_err(|_| invalid_num_speculative_tokens(format_args!("{s:?}")))
    }
}

/// Who proposes the draft tokens of a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proposer {
    /// `"draft"`: the draft model (needs one).
    DraftModel,
    /// `"ngram"`: prompt lookup: the continuation of the longest matching n-gram of the prompt and text so far.
    Ngram,
    /// `"ngram+draft"`: n-gram first, the draft model when nothing matches (needs a draft model).
    NgramThenDraft,
    /// `"suffix"`: suffix decoding ([`specrt_core::suffix`]): the most frequent continuation of the longest
    /// matching suffix in the request's text and, when the pipeline shares a suffix cache
    /// (`suffix_cache_tokens`), in earlier requests' prompts and outputs.
    Suffix,
    /// `"suffix+draft"`: suffix decoding first, the draft model when nothing matches (needs a draft model).
    SuffixThenDraft,
    /// `"none"`: target-only decoding.
    TargetOnly,
    /// `"auto"`: each round, auto K's controller ([`specrt_core::KController`]) chooses a plain target step, an
    /// n-gram match's prefix or the draft model's K drafts (the draft model when one is loaded), from the request's
    /// own measured acceptance of each and their costs; K is at most `num_speculative_tokens` (a fixed K is the
    /// cap; `"auto"`: [`AUTO_K_MAX`]). Resolved to [`Proposer::NgramThenDraft`] (or [`Proposer::Ngram`] without a
    /// draft model) with auto K.
    Auto,
}

impl Proposer {
    /// Every proposer, in the order error messages list them.
    pub const ALL: [Proposer; 7] = [
        Proposer::DraftModel,
        Proposer::Ngram,
        Proposer::NgramThenDraft,
        Proposer::Suffix,
        Proposer::SuffixThenDraft,
        Proposer::TargetOnly,
        Proposer::Auto,
    ];

    /// The Python / CLI name: `"draft"`, `"ngram"`, `"ngram+draft"`, `"suffix"`, `"suffix+draft"`, `"none"` or
    /// `"auto"`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Proposer::DraftModel => "draft",
            Proposer::Ngram => "ngram",
            Proposer::NgramThenDraft => "ngram+draft",
            Proposer::Suffix => "suffix",
            Proposer::SuffixThenDraft => "suffix+draft",
            Proposer::TargetOnly => "none",
            Proposer::Auto => "auto",
        }
    }

    /// Whether this proposer runs the draft model.
    #[must_use]
    pub fn uses_draft_model(self) -> bool {
        matches!(
            self,
            Proposer::DraftModel | Proposer::NgramThenDraft | Proposer::SuffixThenDraft
        )
    }

    /// The model-free proposer this one runs, if any: prompt lookup or suffix decoding.
    #[must_use]
    pub fn lookup(self) -> Option<LookupMethod> {
        match self {
            Proposer::Ngram | Proposer::NgramThenDraft => Some(LookupMethod::PromptLookup),
            Proposer::Suffix | Proposer::SuffixThenDraft => Some(LookupMethod::Suffix),
            _ => None,
        }
    }
}

impl fmt::Display for Proposer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Proposer {
    type Err = SpecError;

    /// Parse a Python / CLI name (see [`Proposer::as_str`]).
    ///
    /// Errors: [`SpecError::Config`] naming the text and the valid set.
    fn from_str(s: &str) -> Result<Self> {
        Proposer::ALL
            .into_iter()
            .find(|p| p.as_str() == s.trim())
            .ok_or_else(|| {
                let names: Vec<String> = Proposer::ALL
                    .iter()
                    .map(|p| format!("{:?}", p.as_str()))
                    .collect();
                SpecError::setting(
                    "proposer",
                    format!(
                        "proposer {s:?} is invalid (expected one of: {})",
                        names.join(", ")
                    ),
                )
            })
    }
}

/// Settings of one generation. `None` fields take the target folder's default ([`FolderDefaults`]), then the
/// neutral value; the other fields default as Python's keyword arguments do ([`GenerationRequest::default`]).
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationRequest {
    /// Most tokens to emit (>= 1; default 128).
    pub max_new_tokens: usize,
    /// K per round, fixed ([`SpeculativeTokens::Fixed`]) or auto (default `Fixed(4)`).
    pub num_speculative_tokens: SpeculativeTokens,
    /// Who drafts; `None` = [`Proposer::DraftModel`] when a draft model is loaded, else [`Proposer::TargetOnly`].
    pub proposer: Option<Proposer>,
    /// Shortest n-gram prompt lookup matches (default 2; used by the n-gram proposers; `1..=` max).
    pub prompt_lookup_min: usize,
    /// Longest n-gram prompt lookup matches (default 4; `min..=32`).
    pub prompt_lookup_max: usize,
    /// With [`SpeculativeTokens::Auto`] only: costs to use instead of timings (reproducible auto K): one draft
    /// pass, and a target pass over n = 1..=9 tokens, in any one unit.
    pub pinned_costs: Option<PinnedCosts>,
    /// Softmax temperature, >= 0 (0 = greedy); `None` = the folder's, else 1.
    pub temperature: Option<f32>,
    /// Keep the k most likely tokens (0 = off); `None` = the folder's, else 0.
    pub top_k: Option<u32>,
    /// Nucleus mass in (0, 1] (1 = off); `None` = the folder's, else 1.
    pub top_p: Option<f32>,
    /// Keep tokens with probability >= `min_p` x the top one, in [0, 1] (0 = off); `None` = the folder's, else 0.
    pub min_p: Option<f32>,
    /// HF repetition penalty > 0 (1 = off); `None` = the folder's, else 1.
    pub repetition_penalty: Option<f32>,
    /// OpenAI-style frequency penalty (0 = off, the default).
    pub frequency_penalty: f32,
    /// OpenAI-style presence penalty (0 = off, the default).
    pub presence_penalty: f32,
    /// Seed of the request's random stream (default 0): the same seed and settings give the same tokens.
    pub seed: u64,
    /// Stop strings (each non-empty): the text ends before the first match. Token-level generation
    /// ([`Pipeline::generate`]) has no text and refuses them.
    pub stop: Vec<String>,
    /// Extra ids that end generation (emitted, finish reason "stop"); each `< vocab_size`.
    pub stop_token_ids: Vec<u32>,
    /// Which text the output gets: vLLM's `skip_special_tokens` (default true) and `include_stop_str_in_output`
    /// (default false), [`TextOptions`]. Token-level generation has no text and ignores it.
    pub text: TextOptions,
    /// Keep going past the folder's EOS ids (stop token ids still stop).
    pub ignore_eos: bool,
    /// Coupled sampling (default false): the choice at each position depends on `(seed, position)` alone, so the
    /// text is the same with or without speculation ([`specrt_core::coupled`]).
    pub coupled: bool,
    /// Return the target's log-probability of each token (default true); off, a greedy request without penalties
    /// reads only argmax ids ([`specrt_core::GenerationConfig::logprobs`]).
    pub logprobs: bool,
    /// Alternatives per token from the target's verification row of its position, 0..=20 (default 0 = none;
    /// [`specrt_core::GenerationConfig::top_logprobs`]).
    pub top_logprobs: usize,
    /// Score the prompt with this many alternatives per position (`None` = off, the default;
    /// [`specrt_core::GenerationConfig::prompt_logprobs`]): in the output's `prompt`.
    pub prompt_logprobs: Option<usize>,
    /// vLLM's `min_tokens`: no EOS or stop token id before this many tokens (default 0 = off;
    /// [`specrt_core::SamplingParams::min_tokens`]).
    pub min_tokens: u32,
    /// Structured output: a constraint on the output (JSON Schema, any JSON object, regex, Lark grammar, choice;
    /// `None` = free text, the default). Checked by [`resolve_request`] (a bad schema, regex or grammar is a
    /// [`SpecError::Config`] naming it); compiled for the target folder's tokenizer when the generation starts.
    pub constraint: Option<OutputConstraint>,
    /// A deliberate sampler fault (tests of the tests only; `None` in any real use).
    #[doc(hidden)]
    pub fault: Option<specrt_core::sampling::Fault>,
}

impl Default for GenerationRequest {
    fn default() -> Self {
        GenerationRequest {
            max_new_tokens: 128,
            num_speculative_tokens: SpeculativeTokens::default(),
            proposer: None,
            prompt_lookup_min: 2,
            prompt_lookup_max: 4,
            pinned_costs: None,
            temperature: None,
            top_k: None,
            top_p: None,
            min_p: None,
            repetition_penalty: None,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            seed: 0,
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            text: TextOptions::default(),
            ignore_eos: false,
            coupled: false,
            logprobs: true,
            top_logprobs: 0,
            prompt_logprobs: None,
            min_tokens: 0,
            constraint: None,
            fault: None,
        }
    }
}

/// The engine settings of `request`, resolved once for every caller (the Rust [`Pipeline`], Python's `Decoder`,
/// `Scheduler` and `specrt serve`): `defaults` (the target folder's) for the sampling values left `None`, then the
/// neutral ones; K and the proposer translated (`None` = the draft model when `has_draft`, else target-only; K = 0
/// for target-only; auto K up to [`AUTO_K_MAX`]); stop strings non-empty; stop token ids `< vocab_size` when it is
/// given; everything else through [`GenerationConfig::validate`].
///
/// Errors: [`SpecError::Setting`] naming the setting, for a value out of range (named, with the allowed set:
/// proposer, K, n-gram lengths, pinned costs without auto K, sampling settings, `max_new_tokens` 0, an empty stop
/// string, a constraint that does not compile) or a draft proposer without a draft model; [`SpecError::Vocab`] for a
/// stop token id `>= vocab_size`.
pub fn resolve_request(
    request: &GenerationRequest,
    defaults: &FolderDefaults,
    has_draft: bool,
    vocab_size: Option<usize>,
) -> Result<GenerationConfig> {
    check_stop_strings(&request.stop)?;
    if let Some(c) = &request.constraint {
        // The schema, regex or grammar itself (no tokenizer needed): refused before the request queues.
        c.validate()?;
    }
    let stop_token_ids = request.stop_token_ids.clone();
    if let Some(vocab) = vocab_size {
        check_ids("stop_token_ids", &stop_token_ids, vocab)?;
    }
    let requested = request.proposer.unwrap_or(if has_draft {
        Proposer::DraftModel
    } else {
        Proposer::TargetOnly
    });
    // "auto": the controller chooses among every proposer the pipeline has, per round, with auto K
    let auto_proposer = requested == Proposer::Auto;
    let proposer = match requested {
        Proposer::Auto if has_draft => Proposer::NgramThenDraft,
        Proposer::Auto => Proposer::Ngram,
        p => p,
    };
    if proposer.uses_draft_model() && !has_draft {
        return Err(SpecError::setting(
            "proposer",
            format!(
                "proposer {:?} needs a draft model; none is loaded (load one with a draft folder)",
                proposer.as_str()
            ),
        ));
    }
    let auto = request.num_speculative_tokens == SpeculativeTokens::Auto || auto_proposer;
    let k = match request.num_speculative_tokens {
        SpeculativeTokens::Fixed(k) => {
            check_num_speculative_tokens(k)?;
            if proposer == Proposer::TargetOnly {
                0
            } else {
                k
            }
        }
        SpeculativeTokens::Auto => AUTO_K_MAX,
    };
    // a fixed K with the auto proposer is auto K's cap; K = 0 is target-only decoding
    let auto = auto && k > 0;
    if request.pinned_costs.is_some() && !auto {
        return Err(SpecError::setting(
            "pinned_costs",
            "pinned_costs only apply with num_speculative_tokens = \"auto\" or proposer = \"auto\"",
        ));
    }
    let ngram = match proposer.lookup() {
        Some(method) => {
            let cfg = NgramConfig {
                prompt_lookup_min: request.prompt_lookup_min,
                prompt_lookup_max: request.prompt_lookup_max,
                method,
            };
            // The proposers' constructors hold the range checks and their messages (a suffix proposer built
            // without a cache publishes nothing).
            NgramProposer::new(cfg.prompt_lookup_min, cfg.prompt_lookup_max)?;
            LookupProposer::new(&cfg, None)?;
            Some(cfg)
        }
        None => None,
    };
    let d = defaults;
    let cfg = GenerationConfig {
        max_new_tokens: request.max_new_tokens,
        num_speculative_tokens: k,
        sampling: SamplingParams {
            temperature: request.temperature.or(d.temperature).unwrap_or(1.0),
            top_k: request.top_k.or(d.top_k).unwrap_or(0),
            top_p: request.top_p.or(d.top_p).unwrap_or(1.0),
            min_p: request.min_p.or(d.min_p).unwrap_or(0.0),
            repetition_penalty: request
                .repetition_penalty
                .or(d.repetition_penalty)
                .unwrap_or(1.0),
            frequency_penalty: request.frequency_penalty,
            presence_penalty: request.presence_penalty,
            min_tokens: request.min_tokens,
        },
        seed: request.seed,
        eos_token_ids: d.eos_token_ids.clone(),
        stop_token_ids,
        ignore_eos: request.ignore_eos,
        auto_k: (auto && proposer != Proposer::TargetOnly).then(|| AutoK {
            k_max: k,
            pinned: request.pinned_costs.clone(),
            ..AutoK::default()
        }),
        ngram,
        use_draft_model: proposer.uses_draft_model(),
        coupled: request.coupled,
        logprobs: request.logprobs,
        top_logprobs: request.top_logprobs,
        prompt_logprobs: request.prompt_logprobs,
        fault: request.fault,
    };
    cfg.validate()?;
    Ok(cfg)
}

/// A request resolved and checked once, at submission, against the driver that will run it: its prompt ids, its
/// settings as given (stop strings, text options and constraint are read from them when it queues) and the engine
/// settings they resolve to. Made by [`RequestScope::prepare`]; queued by
/// [`crate::Driver::submit_prepared`], which resolves nothing again.
#[derive(Debug, Clone)]
pub struct PreparedRequest {
    /// The prompt's token ids (non-empty, each `< vocab_size`; prompt + `max_new_tokens` within `max_seq_len`).
    pub prompt_ids: Vec<u32>,
    /// The settings as given.
    pub request: GenerationRequest,
    /// What [`resolve_request`] made of them.
    pub config: GenerationConfig,
}

/// What a driver checks a request against, copied out of it ([`crate::Driver::request_scope`]) so that a
/// request can be resolved and checked while the driver runs a round (a server's handler does not wait for it).
#[derive(Debug, Clone)]
pub struct RequestScope {
    /// The target folder's defaults (EOS ids included).
    pub defaults: FolderDefaults,
    /// Whether a draft model is loaded.
    pub has_draft: bool,
    /// The models' vocabulary.
    pub vocab_size: usize,
    /// The KV capacity: prompt + `max_new_tokens` at most.
    pub max_seq_len: usize,
    /// Whether the pipeline has a tokenizer (stop strings need one).
    pub has_tokenizer: bool,
}

impl RequestScope {
    /// `request` on `prompt_ids`, resolved ([`resolve_request`]) and checked ([`check_prompt`]; stop strings need a
    /// tokenizer): everything but the constraint's compilation over the tokenizer, which happens when it queues.
    ///
    /// Errors: as [`resolve_request`]; [`SpecError::Setting`] (`prompt`) for an empty prompt, [`SpecError::Vocab`]
    /// for an id `>= vocab_size`, [`SpecError::Length`] for prompt + `max_new_tokens` beyond `max_seq_len`;
    /// [`SpecError::Setting`] (`stop`) for stop strings without a tokenizer.
    pub fn prepare(
        &self,
        prompt_ids: Vec<u32>,
        request: GenerationRequest,
    ) -> Result<PreparedRequest> {
        let config = resolve_request(
            &request,
            &self.defaults,
            self.has_draft,
            Some(self.vocab_size),
        )?;
        check_prompt(
            &prompt_ids,
            config.max_new_tokens,
            self.vocab_size,
            self.max_seq_len,
        )?;
        if !self.has_tokenizer && !request.stop.is_empty() {
            return Err(stop_without_tokenizer());
        }
        Ok(PreparedRequest {
            prompt_ids,
            request,
            config,
        })
    }
}

/// The error for stop strings given to a pipeline without a tokenizer.
pub(crate) fn stop_without_tokenizer() -> SpecError {
    SpecError::setting(
        "stop",
        "stop strings need text: this driver has no tokenizer",
    )
}

/// Each id `< vocab` ([`SpecError::Vocab`] naming the first bad one and its position, in Python's words).
pub fn check_ids(name: &str, ids: &[u32], vocab: usize) -> Result<()> {
    match ids.iter().enumerate().find(|(_, &t)| t as usize >= vocab) {
        Some((i, t)) => Err(SpecError::Vocab(format!(
            "{name} token {t} at position {i} is out of range (expected 0 <= id < vocab size {vocab})"
        ))),
        None => Ok(()),
    }
}
