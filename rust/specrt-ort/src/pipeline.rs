//! [`Pipeline`]: load a target (and optional draft) model folder and generate from token ids, from Rust alone, with
//! the behaviour of Python's `specrt.Decoder`.
//!
//! What it does as Python does:
//! - defaults from the target folder's `generation_config.json` ([`FolderDefaults`]): `temperature`, `top_k`,
//!   `top_p`, `min_p`, `repetition_penalty`, and the EOS ids (`eos_token_id`, else `specrt_config.json`'s
//!   `eos_token_ids`); a [`GenerationRequest`] field left `None` takes the folder's value, else the neutral one;
//! - K fixed or [`SpeculativeTokens::Auto`] (each round picks K in `0..=8` from measured costs and acceptance);
//! - the proposer ([`Proposer`]): the draft model (default when one is loaded), prompt lookup (n-gram), both, or
//!   none;
//! - one resolver for every caller ([`resolve_request`]: Python's `Decoder`, `Scheduler` and `specrt serve` use
//!   it through the binding);
//! - the same validation, with errors that name the bad value and the allowed set ([`SpecError::Config`],
//!   [`SpecError::Vocab`]), and a draft whose `tokenizer.json` vocabulary differs from the target's is refused.
//!
//! Text in, text out ([`Pipeline::generate_text`], [`Pipeline::generate_text_stream`],
//! [`Pipeline::generate_ids_text_stream`]): the target folder's `tokenizer.json` (`specrt-text`, the same
//! tokenizers version as Python's), stop strings ([`GenerationRequest::stop`]; they may end mid-token) and
//! incremental detokenization that never shows a partial UTF-8 character, with the same text and token ids as
//! Python's `Decoder` (tests/test_rust_parity.py). Token ids in, token ids out: [`Pipeline::generate`]. Batched
//! decoding from Rust is not here yet (Python's `Scheduler` drives the batched engine).
//!
//! KV memory: [`OrtOptions::new`] sets `max_seq_len = Some(4096)` ([`crate::DEFAULT_MAX_SEQ_LEN`], capped by the
//! model's `max_position_embeddings`), as Python's `Decoder` does; `None` means the model's whole
//! `max_position_embeddings`. A draft loads with [`OrtOptions::for_draft`] (its prefill graph when its folder has
//! one), as in Python.
//!
//! ```no_run
//! use std::path::Path;
//! use specrt_ort::{find_ort_library, GenerationRequest, OrtOptions, Pipeline, SpeculativeTokens};
//!
//! let options = OrtOptions::new(find_ort_library(None)?); // max_seq_len 4096
//! let mut pipeline = Pipeline::load(
//!     Path::new("/models/smollm2-135m-instruct/fp32"),
//!     Some(Path::new("/models/smollm2-135m-instruct/fp32-L6")),
//!     &options,
//! )?;
//! let request = GenerationRequest {
//!     max_new_tokens: 64,
//!     temperature: Some(0.0), // greedy; None = generation_config.json's value
//!     num_speculative_tokens: SpeculativeTokens::Auto,
//!     ..GenerationRequest::default()
//! };
//! let prompt_ids = [504, 3575, 282, 4649, 314]; // from your tokenizer
//! let out = pipeline.generate_stream(&prompt_ids, &request, |step| {
//!     println!("round committed {:?}", step.tokens);
//!     true // keep going
//! })?;
//! println!("{} tokens, finish: {}", out.tokens.len(), out.finish_reason.as_str());
//! println!("acceptance rate: {:?}", out.stats.acceptance_rate());
//! # Ok::<(), specrt_core::SpecError>(())
//! ```

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use serde_json::{Map, Value};
use specrt_text::chat::ChatTemplate;
use specrt_text::detok::{RoundEnd, TextAssembler, TextOptions};
use specrt_text::tokenizer::Tokenizer;

use specrt_core::{
    AutoK, Backend, Constraint, Engine, GenerationConfig, GenerationOutput, NgramConfig,
    NgramProposer, PinnedCosts, Result, SamplingParams, SpecError, StepOutput, MAX_DRAFT_TOKENS,
};

use specrt_grammar::OutputConstraint;

use crate::constraints::ConstraintCompiler;

use crate::backend::OrtBackend;
use crate::model::{resolve_model_file, CONFIG_FILE};
use crate::options::OrtOptions;

/// Name of the Hugging Face generation defaults file in a model folder.
pub const GENERATION_CONFIG_FILE: &str = "generation_config.json";
/// Name of the chat template file in a model folder.
pub const CHAT_TEMPLATE_FILE: &str = "chat_template.jinja";
/// Name of the tokenizer file in a model folder (compared between draft and target).
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// Largest K that [`SpeculativeTokens::Auto`] considers (Python's `num_speculative_tokens="auto"`).
pub const AUTO_K_MAX: usize = 8;

/// How many draft tokens a round verifies: K.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpeculativeTokens {
    /// K draft tokens per round, `0..=64` (0, or no proposer, is plain target decoding).
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
    /// Errors: [`SpecError::Config`] naming the text.
    fn from_str(s: &str) -> Result<Self> {
        let s = s.trim();
        if s == "auto" {
            return Ok(SpeculativeTokens::Auto);
        }
        s.parse().map(SpeculativeTokens::Fixed).map_err(|_| {
            SpecError::setting(
                "num_speculative_tokens",
                format!(
                    "num_speculative_tokens {s:?} is invalid (expected an integer 0..64 or \"auto\")"
                ),
            )
        })
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
    /// `"none"`: target-only decoding.
    TargetOnly,
}

impl Proposer {
    /// Every proposer, in the order error messages list them.
    pub const ALL: [Proposer; 4] = [
        Proposer::DraftModel,
        Proposer::Ngram,
        Proposer::NgramThenDraft,
        Proposer::TargetOnly,
    ];

    /// The Python / CLI name: `"draft"`, `"ngram"`, `"ngram+draft"` or `"none"`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Proposer::DraftModel => "draft",
            Proposer::Ngram => "ngram",
            Proposer::NgramThenDraft => "ngram+draft",
            Proposer::TargetOnly => "none",
        }
    }

    /// Whether this proposer runs the draft model.
    #[must_use]
    pub fn uses_draft_model(self) -> bool {
        matches!(self, Proposer::DraftModel | Proposer::NgramThenDraft)
    }

    /// Whether this proposer runs prompt lookup.
    #[must_use]
    pub fn uses_ngram(self) -> bool {
        matches!(self, Proposer::Ngram | Proposer::NgramThenDraft)
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

/// Generation defaults a model folder gives: `generation_config.json` (and `specrt_config.json` for the EOS ids).
///
/// Read as Python's `Decoder` reads them: a missing file counts as empty, a key that is absent (or `null`) leaves
/// the field `None`, other keys (`do_sample`, `max_new_tokens`, ...) are ignored.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FolderDefaults {
    /// `temperature` (0 = greedy).
    pub temperature: Option<f32>,
    /// `top_k` (0 = off).
    pub top_k: Option<u32>,
    /// `top_p` (1 = off).
    pub top_p: Option<f32>,
    /// `min_p` (0 = off).
    pub min_p: Option<f32>,
    /// `repetition_penalty` (1 = off).
    pub repetition_penalty: Option<f32>,
    /// End-of-sequence ids: `eos_token_id` of `generation_config.json` (one id or a list) when the key is present,
    /// else `eos_token_ids` of `specrt_config.json`, else none.
    pub eos_token_ids: Vec<u32>,
}

impl FolderDefaults {
    /// Read the defaults of a model folder (or of the folder holding a `.onnx` file).
    ///
    /// Errors: [`SpecError::Io`] when a file exists but cannot be read, is not a JSON object, or has a field of the
    /// wrong type (file and field named); [`SpecError::Config`] for a negative `top_k`.
    pub fn read(model: &Path) -> Result<Self> {
        let folder = if model.is_dir() {
            model
        } else {
            model.parent().unwrap_or(Path::new("."))
        };
        let generation_path = folder.join(GENERATION_CONFIG_FILE);
        let config_path = folder.join(CONFIG_FILE);
        Self::parse(
            read_optional(&generation_path)?.as_deref(),
            read_optional(&config_path)?.as_deref(),
            &generation_path,
            &config_path,
        )
    }

    /// Parse the texts of `generation_config.json` and `specrt_config.json` (`None` = file absent); the paths only
    /// name the files in errors.
    ///
    /// Errors: as [`FolderDefaults::read`].
    pub fn parse(
        generation_config: Option<&str>,
        specrt_config: Option<&str>,
        generation_path: &Path,
        config_path: &Path,
    ) -> Result<Self> {
        let generation = json_object(generation_config, generation_path)?;
        let config = json_object(specrt_config, config_path)?;
        let float = |key: &str| -> Result<Option<f32>> {
            match generation.get(key) {
                None | Some(Value::Null) => Ok(None),
                #[allow(clippy::cast_possible_truncation)]
                Some(v) => v
                    .as_f64()
                    .map(|x| Some(x as f32))
                    .ok_or_else(|| field_error(generation_path, key, v, "a number")),
            }
        };
        let top_k = match generation.get("top_k") {
            None | Some(Value::Null) => None,
            Some(v) => Some(parse_top_k(v, generation_path)?),
        };
        let eos_token_ids = match generation.get("eos_token_id") {
            Some(v) => parse_ids(v, generation_path, "eos_token_id")?,
            None => match config.get("eos_token_ids") {
                Some(v) => parse_ids(v, config_path, "eos_token_ids")?,
                None => Vec::new(),
            },
        };
        Ok(FolderDefaults {
            temperature: float("temperature")?,
            top_k,
            top_p: float("top_p")?,
            min_p: float("min_p")?,
            repetition_penalty: float("repetition_penalty")?,
            eos_token_ids,
        })
    }
}

/// The text of `path`, or `None` when it does not exist.
fn read_optional(path: &Path) -> Result<Option<String>> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(SpecError::Io(format!("{}: {e}", path.display()))),
    }
}

/// The top-level object of a JSON text (`None` = empty object).
fn json_object(text: Option<&str>, path: &Path) -> Result<Map<String, Value>> {
    let Some(text) = text else {
        return Ok(Map::new());
    };
    match serde_json::from_str(text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(SpecError::Io(format!(
            "{}: is not a JSON object",
            path.display()
        ))),
        Err(e) => Err(SpecError::Io(format!(
            "{}: is not valid JSON: {e}",
            path.display()
        ))),
    }
}

fn field_error(path: &Path, key: &str, value: &Value, expected: &str) -> SpecError {
    SpecError::Io(format!(
        "{}: {key} = {value} is invalid (expected {expected})",
        path.display()
    ))
}

/// `top_k` as Python's `int(...)` reads it: an integer (or an integral float); negative is a config error.
fn parse_top_k(v: &Value, path: &Path) -> Result<u32> {
    let n = v
        .as_i64()
        .or_else(|| {
            #[allow(clippy::cast_possible_truncation)]
            v.as_f64().filter(|x| x.fract() == 0.0).map(|x| x as i64)
        })
        .ok_or_else(|| field_error(path, "top_k", v, "an integer"))?;
    u32::try_from(n).map_err(|_| {
        SpecError::Config(format!(
            "{}: top_k {n} is invalid (expected an integer >= 0; 0 = off)",
            path.display()
        ))
    })
}

/// One token id or a list of them (`null` = none).
fn parse_ids(v: &Value, path: &Path, key: &str) -> Result<Vec<u32>> {
    let one = |x: &Value| {
        x.as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| field_error(path, key, v, "a token id or a list of token ids"))
    };
    match v {
        Value::Null => Ok(Vec::new()),
        Value::Array(items) => items.iter().map(one).collect(),
        _ => one(v).map(|id| vec![id]),
    }
}

/// Settings of one generation. `None` fields take the target folder's default ([`FolderDefaults`]), then the
/// neutral value; the other fields default as Python's keyword arguments do ([`GenerationRequest::default`]).
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationRequest {
    /// Most tokens to emit (>= 1; default 128).
    pub max_new_tokens: usize,
    /// K per round, fixed `0..=64` or auto (default `Fixed(4)`).
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

/// A target model, an optional draft model and the target folder's defaults, ready to generate from token ids.
///
/// One generation at a time (`&mut self`); share one between threads behind a `Mutex`, or load one per thread.
pub struct Pipeline {
    engine: Engine,
    defaults: FolderDefaults,
    /// The target folder's `tokenizer.json` (`None` for [`Pipeline::from_engine`] or a folder without one).
    tokenizer: Option<Tokenizer>,
    /// The target folder's chat template (`None` without one).
    chat_template: Option<ChatTemplate>,
    providers: Vec<&'static str>,
    fallback_reason: Option<String>,
    /// Compiles requests' constraints over the tokenizer (llguidance's parser factory, built by the first
    /// constrained request).
    constraints: ConstraintCompiler,
}

impl Pipeline {
    /// Load a target model folder (or `.onnx` file) and an optional draft, with the same options for both.
    ///
    /// Loads the ONNX Runtime library named by `options.ort_library` on first use (see
    /// [`crate::find_ort_library`]), reads the target's [`FolderDefaults`], and checks the draft against the
    /// target ([`check_draft_folder`]: the same `tokenizer.json` vocabulary; logits widths equal or differing only
    /// in padding rows beyond the tokenizer's ids, as Qwen2.5 7B's 152064 against 0.5B's 151936, the draft then
    /// fitted to the target's width: [`specrt_core::vocab`]).
    ///
    /// Errors: [`SpecError::Io`] (a missing model or library, an unreadable or malformed JSON file),
    /// [`SpecError::Vocab`] (draft and target vocabularies differ, both named), [`SpecError::Provider`] (CUDA
    /// unavailable without `allow_fallback`), [`SpecError::Config`] (bad options), [`SpecError::Backend`] (ONNX
    /// Runtime failed to load a model).
    pub fn load(target: &Path, draft: Option<&Path>, options: &OrtOptions) -> Result<Self> {
        let target_file = resolve_model_file(target)?;
        let defaults = FolderDefaults::read(&target_file)?;
        let tokenizer_vocab = match draft {
            Some(draft) => check_draft_folder(&target_file, draft)?,
            None => None,
        };
        let target_backend = OrtBackend::new(&target_file, options)?;
        let providers = target_backend.providers();
        let fallback_reason = target_backend.fallback_reason().map(str::to_owned);
        let draft_backend = match draft {
            Some(p) => {
                Some(Box::new(OrtBackend::new(p, &options.for_draft())?) as Box<dyn Backend>)
            }
            None => None,
        };
        let tokenizer = folder_tokenizer(&target_file)?;
        let chat_template = folder_chat_template(&target_file)?;
        let mut pipeline = Self::from_engine(
            Engine::with_tokenizer_vocab(Box::new(target_backend), draft_backend, tokenizer_vocab)?,
            defaults,
        );
        if let Some(t) = &tokenizer {
            pipeline.constraints.set_tokenizer(t.clone());
        }
        pipeline.tokenizer = tokenizer;
        pipeline.chat_template = chat_template;
        pipeline.providers = providers;
        pipeline.fallback_reason = fallback_reason;
        Ok(pipeline)
    }

    /// A pipeline over an engine built elsewhere (other backends, mock models in tests) and the defaults to use.
    #[must_use]
    pub fn from_engine(engine: Engine, defaults: FolderDefaults) -> Self {
        let constraints =
            ConstraintCompiler::new(None, engine.vocab_size(), defaults.eos_token_ids.clone());
        Pipeline {
            engine,
            defaults,
            tokenizer: None,
            chat_template: None,
            providers: Vec::new(),
            fallback_reason: None,
            constraints,
        }
    }

    /// The target folder's defaults in use.
    #[must_use]
    pub fn defaults(&self) -> &FolderDefaults {
        &self.defaults
    }

    /// End-of-sequence ids from the target folder.
    #[must_use]
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.defaults.eos_token_ids
    }

    /// The target's logits width: the vocabulary of prompts and outputs (a draft of another width is fitted to
    /// it).
    #[must_use]
    pub fn vocab_size(&self) -> usize {
        self.engine.vocab_size()
    }

    /// Longest prompt + new tokens both KV caches hold.
    #[must_use]
    pub fn max_seq_len(&self) -> usize {
        self.engine.max_seq_len()
    }

    /// Whether a draft model is loaded.
    #[must_use]
    pub fn has_draft(&self) -> bool {
        self.engine.has_draft()
    }

    /// ONNX Runtime execution providers of the target session, preferred first (empty for
    /// [`Pipeline::from_engine`]).
    #[must_use]
    pub fn providers(&self) -> &[&'static str] {
        &self.providers
    }

    /// Why CUDA was requested but the CPU is used (`allow_fallback`), if it was.
    #[must_use]
    pub fn fallback_reason(&self) -> Option<&str> {
        self.fallback_reason.as_deref()
    }

    /// The engine, for driving a generation round by round (`start` with [`Pipeline::resolve`]'s config, `step`,
    /// `stop_at` for a stop string, `output`, `stats`).
    pub fn engine_mut(&mut self) -> &mut Engine {
        &mut self.engine
    }

    /// The engine settings for `request`: folder defaults filled in, K and the proposer translated as Python does,
    /// everything validated.
    ///
    /// Errors: [`SpecError::Config`] for a value out of range (named, with the allowed set: proposer, K, n-gram
    /// lengths, pinned costs without auto K, sampling settings, `max_new_tokens` 0) or a draft proposer without a
    /// draft model; [`SpecError::Vocab`] for a stop token id `>= vocab_size`.
    pub fn resolve(&self, request: &GenerationRequest) -> Result<GenerationConfig> {
        resolve_request(
            request,
            &self.defaults,
            self.has_draft(),
            Some(self.vocab_size()),
        )
    }

    /// Generate from `prompt_ids` (`[n_prompt]` token ids, each `< vocab_size`) to the end: EOS id, stop token id
    /// or `max_new_tokens`.
    ///
    /// Returns the emitted tokens (the prompt excluded; an EOS or stop id that ended generation included), where
    /// each came from, the target's log-probability of each (natural log), the finish reason and the statistics
    /// (timings in ms).
    ///
    /// Errors: as [`Pipeline::resolve`]; [`SpecError::Config`] for an empty prompt; [`SpecError::Vocab`] for a
    /// prompt id `>= vocab_size` (position named); [`SpecError::Length`] when prompt + `max_new_tokens` exceeds
    /// [`Pipeline::max_seq_len`]; [`SpecError::NonFinite`] / [`SpecError::Backend`] from a model.
    pub fn generate(
        &mut self,
        prompt_ids: &[u32],
        request: &GenerationRequest,
    ) -> Result<GenerationOutput> {
        self.generate_stream(prompt_ids, request, |_| true)
    }

    /// [`Pipeline::generate`], calling `on_step` with the tokens each round commits, as it commits them
    /// ([`StepOutput`]: tokens, sources, logprobs, K used, finish reason on the last round). Returning `false` stops
    /// the generation after that round with finish reason "stop", keeping what was emitted.
    ///
    /// Errors: as [`Pipeline::generate`].
    pub fn generate_stream(
        &mut self,
        prompt_ids: &[u32],
        request: &GenerationRequest,
        on_step: impl FnMut(&StepOutput) -> bool,
    ) -> Result<GenerationOutput> {
        // The prompt is checked by the engine (`specrt_core::check_prompt`, the one definition).
        if !request.stop.is_empty() {
            return Err(SpecError::Config(
                "stop strings need text: token-level generation cannot match them (pass stop token ids, or cut \
                 the decoded text yourself)"
                    .to_owned(),
            ));
        }
        let cfg = self.resolve(request)?;
        let constraint = self.compile_constraint(request)?;
        self.engine
            .generate_with(prompt_ids, cfg, constraint, on_step)
    }

    /// A fresh matcher of `request.constraint` for this pipeline's tokenizer (`None` without one). The first
    /// constrained request builds llguidance's parser factory over the tokenizer (kept for later requests).
    ///
    /// Errors: [`SpecError::Config`] without a tokenizer or EOS ids, or when the constraint does not compile.
    pub fn compile_constraint(
        &mut self,
        request: &GenerationRequest,
    ) -> Result<Option<Box<dyn Constraint>>> {
        self.constraints
            .compile_for(request.constraint.as_ref(), &self.defaults.eos_token_ids)
    }

    /// The target folder's tokenizer (`None` when the folder has no `tokenizer.json`, or for
    /// [`Pipeline::from_engine`] until [`Pipeline::set_tokenizer`]).
    #[must_use]
    pub fn tokenizer(&self) -> Option<&Tokenizer> {
        self.tokenizer.as_ref()
    }

    /// The target folder's chat template (`None` when it has no `chat_template.jinja`).
    #[must_use]
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat_template.as_ref()
    }

    /// The prompt ids of chat `messages` (`[{"role": ..., "content": ...}, ...]` as JSON values): rendered with the
    /// target folder's chat template as transformers' `apply_chat_template(..., add_generation_prompt=True)` does,
    /// then encoded without added special tokens (the template places them), as Python's `Decoder` does.
    ///
    /// Errors: [`SpecError::Config`] without a chat template or tokenizer, or when the template refuses the
    /// messages (its message, or the construct it cannot render).
    pub fn chat_prompt_ids(&self, messages: &[serde_json::Value]) -> Result<Vec<u32>> {
        chat_ids(
            self.chat_template.as_ref(),
            self.text_tokenizer()?,
            messages,
        )
    }

    /// Use `tokenizer` for the text API (a pipeline built with [`Pipeline::from_engine`]).
    pub fn set_tokenizer(&mut self, tokenizer: Tokenizer) {
        self.constraints.set_tokenizer(tokenizer.clone());
        self.tokenizer = Some(tokenizer);
    }

    /// Text in, text out: encode `prompt` with the target folder's tokenizer (special tokens added as the
    /// tokenizer's post-processor says, as Python's `Decoder.generate("text")`), generate, and return the text with
    /// `request.stop` strings cut (a stop string may end mid-token and span tokens: generation stops at the token
    /// holding its last character, and the text ends before it).
    ///
    /// Errors: [`SpecError::Config`] when the pipeline has no tokenizer; otherwise as [`Pipeline::generate`].
    pub fn generate_text(
        &mut self,
        prompt: &str,
        request: &GenerationRequest,
    ) -> Result<TextOutput> {
        self.generate_text_stream(prompt, request, |_| true)
    }

    /// [`Pipeline::generate_text`], calling `on_text` with each round's [`TextStep`] (the text to show now: never
    /// a partial UTF-8 character or a possible partial stop string while generation goes on). Returning `false`
    /// stops after that round with finish reason "stop", keeping what was emitted.
    ///
    /// Errors: as [`Pipeline::generate_text`].
    pub fn generate_text_stream(
        &mut self,
        prompt: &str,
        request: &GenerationRequest,
        on_text: impl FnMut(&TextStep) -> bool,
    ) -> Result<TextOutput> {
        let tokenizer = self.text_tokenizer()?;
        let ids = tokenizer.encode(prompt, true)?;
        self.generate_ids_text_stream(&ids, request, on_text)
    }

    /// [`Pipeline::generate_text_stream`] from token ids (a prompt encoded or rendered elsewhere, e.g. a chat
    /// template's text encoded without special tokens): the output is text, with stop strings cut.
    ///
    /// Errors: as [`Pipeline::generate_text`].
    pub fn generate_ids_text_stream(
        &mut self,
        prompt_ids: &[u32],
        request: &GenerationRequest,
        mut on_text: impl FnMut(&TextStep) -> bool,
    ) -> Result<TextOutput> {
        let tokenizer = self.text_tokenizer()?.clone();
        let cfg = self.resolve(request)?;
        let constraint = self.compile_constraint(request)?;
        let mut text = TextAssembler::new(tokenizer, request.stop.clone(), request.text)?;
        self.engine.start_with(prompt_ids, cfg, constraint)?;
        loop {
            let step = self.engine.step()?;
            let end = RoundEnd::from_finish(step.finish_reason);
            let n_drafted = step.n_drafted;
            let tokens = step.tokens.clone();
            let delta = text.feed(&tokens, end)?;
            if let Some(hit) = &delta.stop {
                self.engine.stop_at(hit.n_keep)?;
            }
            let finished = delta.finished;
            let keep_going = on_text(&TextStep {
                text: delta.text,
                tokens,
                n_drafted,
                finished,
            });
            if finished {
                break;
            }
            if !keep_going {
                let n = text.tokens().len();
                self.engine.stop_at(n)?;
                text.feed(&[], RoundEnd::Finished)?;
                break;
            }
        }
        Ok(TextOutput {
            text: text.text().to_owned(),
            output: self.engine.output()?,
        })
    }

    fn text_tokenizer(&self) -> Result<&Tokenizer> {
        self.tokenizer.as_ref().ok_or_else(|| {
            SpecError::Config(format!(
                "this pipeline has no tokenizer (the target folder has no {TOKENIZER_FILE}); generate from token \
                 ids with Pipeline::generate"
            ))
        })
    }
}

/// The checks a draft folder (or `.onnx` file) gets against its target's before any session loads (files of the
/// models): the same `tokenizer.json` vocabulary, and its own `generation_config.json` well formed (not used: the
/// target's defaults apply; a malformed file is an error, as in Python). Every engine that loads a draft from a
/// folder calls it ([`Pipeline::load`], [`crate::BatchPipeline::load`], the Python binding's `Engine`).
///
/// Returns the tokenizer's size (largest id + 1 of the target's `tokenizer.json`; `None` without one): what the
/// engines' width rule ([`specrt_core::check_draft_width`], through [`Engine::with_tokenizer_vocab`] and
/// [`specrt_core::BatchEngine::with_tokenizer_vocab`]) compares logits widths that differ with.
///
/// Errors: [`SpecError::Vocab`] (vocabularies differ), [`SpecError::Io`] (a missing model file, a malformed file).
pub fn check_draft_folder(target: &Path, draft: &Path) -> Result<Option<usize>> {
    let target_file = resolve_model_file(target)?;
    let draft_file = resolve_model_file(draft)?;
    check_same_vocabulary(&target_file, &draft_file)?;
    FolderDefaults::read(&draft_file)?;
    tokenizer_size(&target_file.with_file_name(TOKENIZER_FILE))
}

/// The size of a `tokenizer.json`'s vocabulary: its largest id + 1 over `model.vocab` (a token -> id map, or a
/// list whose index is the id, as Unigram's) and `added_tokens`; `None` without the file or any id.
///
/// Errors: [`SpecError::Io`] for an unreadable or malformed file.
fn tokenizer_size(path: &Path) -> Result<Option<usize>> {
    let Some(text) = read_optional(path)? else {
        return Ok(None);
    };
    let root = json_object(Some(&text), path)?;
    let mut bound: Option<u64> = None;
    let mut see = |id: u64| bound = Some(bound.map_or(id, |b| b.max(id)));
    match root.get("model").and_then(|m| m.get("vocab")) {
        Some(Value::Object(map)) => map.values().filter_map(Value::as_u64).for_each(&mut see),
        Some(Value::Array(list)) if !list.is_empty() => see(list.len() as u64 - 1),
        _ => {}
    }
    if let Some(Value::Array(added)) = root.get("added_tokens") {
        added
            .iter()
            .filter_map(|e| e.get("id").and_then(Value::as_u64))
            .for_each(&mut see);
    }
    Ok(bound.and_then(|b| usize::try_from(b).ok()).map(|b| b + 1))
}

/// The `tokenizer.json` beside a model file, if there is one.
///
/// Errors: [`SpecError::Io`] for a file that `tokenizers` cannot load.
/// The chat template of a model file's folder (`None` without `chat_template.jinja`).
pub(crate) fn folder_chat_template(model_file: &Path) -> Result<Option<ChatTemplate>> {
    let folder = model_file.parent().unwrap_or(Path::new("."));
    if folder.join(CHAT_TEMPLATE_FILE).is_file() {
        ChatTemplate::from_folder(folder).map(Some)
    } else {
        Ok(None)
    }
}

/// Chat `messages` rendered with `template` (as transformers' `apply_chat_template(..., add_generation_prompt=True)`)
/// and encoded without added special tokens (the template places them): [`Pipeline::chat_prompt_ids`] and
/// [`crate::BatchPipeline::chat_prompt_ids`].
pub(crate) fn chat_ids(
    template: Option<&ChatTemplate>,
    tokenizer: &Tokenizer,
    messages: &[serde_json::Value],
) -> Result<Vec<u32>> {
    let template = template.ok_or_else(|| {
        SpecError::Config(format!(
            "this pipeline has no chat template (the target folder has no {CHAT_TEMPLATE_FILE}); pass a plain \
             prompt"
        ))
    })?;
    let text = template.render(messages, true, None, None, &Map::new())?;
    tokenizer.encode(&text, false)
}

pub(crate) fn folder_tokenizer(model_file: &Path) -> Result<Option<Tokenizer>> {
    let path = model_file
        .parent()
        .unwrap_or(Path::new("."))
        .join(TOKENIZER_FILE);
    if path.is_file() {
        Tokenizer::from_file(&path).map(Some)
    } else {
        Ok(None)
    }
}

/// One round of [`Pipeline::generate_text_stream`].
#[derive(Debug, Clone, PartialEq)]
pub struct TextStep {
    /// Text to show now (may be empty: held back until the next round).
    pub text: String,
    /// The token ids the round committed (before a stop-string cut).
    pub tokens: Vec<u32>,
    /// K used in the round.
    pub n_drafted: usize,
    /// Whether this is the last round.
    pub finished: bool,
}

/// A finished text generation.
#[derive(Debug, Clone, PartialEq)]
pub struct TextOutput {
    /// The generated text (special tokens skipped; cut before the first stop string).
    pub text: String,
    /// Tokens (cut at the token holding a stop string's last character), sources, log-probabilities, finish
    /// reason ("stop" at a stop string) and statistics.
    pub output: GenerationOutput,
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
    if request.stop.iter().any(String::is_empty) {
        return Err(SpecError::setting("stop", "stop strings must be non-empty"));
    }
    if let Some(c) = &request.constraint {
        // The schema, regex or grammar itself (no tokenizer needed): refused before the request queues.
        c.validate()?;
    }
    let stop_token_ids = request.stop_token_ids.clone();
    if let Some(vocab) = vocab_size {
        check_ids("stop_token_ids", &stop_token_ids, vocab)?;
    }
    let proposer = request.proposer.unwrap_or(if has_draft {
        Proposer::DraftModel
    } else {
        Proposer::TargetOnly
    });
    if proposer.uses_draft_model() && !has_draft {
        return Err(SpecError::setting(
            "proposer",
            format!(
                "proposer {:?} needs a draft model; none is loaded (load one with a draft folder)",
                proposer.as_str()
            ),
        ));
    }
    let auto = request.num_speculative_tokens == SpeculativeTokens::Auto;
    let k = match request.num_speculative_tokens {
        SpeculativeTokens::Fixed(k) if k > MAX_DRAFT_TOKENS => {
            return Err(SpecError::setting(
                "num_speculative_tokens",
                format!(
                    "num_speculative_tokens {k} is invalid (expected 0 <= K <= {MAX_DRAFT_TOKENS}, or \"auto\")"
                ),
            ))
        }
        SpeculativeTokens::Fixed(_) if proposer == Proposer::TargetOnly => 0,
        SpeculativeTokens::Fixed(k) => k,
        SpeculativeTokens::Auto => AUTO_K_MAX,
    };
    if request.pinned_costs.is_some() && !auto {
        return Err(SpecError::setting(
            "pinned_costs",
            "pinned_costs only apply with num_speculative_tokens = \"auto\"",
        ));
    }
    let ngram = if proposer.uses_ngram() {
        let (lo, hi) = (request.prompt_lookup_min, request.prompt_lookup_max);
        // The proposer's constructor holds the range check and its message.
        NgramProposer::new(lo, hi)?;
        Some(NgramConfig {
            prompt_lookup_min: lo,
            prompt_lookup_max: hi,
        })
    } else {
        None
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
            k_max: AUTO_K_MAX,
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

/// Each id `< vocab` ([`SpecError::Vocab`] naming the first bad one and its position, in Python's words).
pub fn check_ids(name: &str, ids: &[u32], vocab: usize) -> Result<()> {
    match ids.iter().enumerate().find(|(_, &t)| t as usize >= vocab) {
        Some((i, t)) => Err(SpecError::Vocab(format!(
            "{name} token {t} at position {i} is out of range (expected 0 <= id < vocab size {vocab})"
        ))),
        None => Ok(()),
    }
}

/// The token -> id map of a `tokenizer.json`: `model.vocab` plus `added_tokens` (what `Tokenizer.get_vocab()`
/// returns in Python).
fn tokenizer_vocabulary(path: &Path) -> Result<Option<std::collections::HashMap<String, u64>>> {
    let Some(text) = read_optional(path)? else {
        return Ok(None);
    };
    let root = json_object(Some(&text), path)?;
    let mut vocab = std::collections::HashMap::new();
    if let Some(Value::Object(model)) = root.get("model").and_then(|m| m.get("vocab")) {
        for (token, id) in model {
            vocab.insert(token.clone(), id.as_u64().unwrap_or(u64::MAX));
        }
    }
    if let Some(Value::Array(added)) = root.get("added_tokens") {
        for entry in added {
            if let (Some(content), Some(id)) = (
                entry.get("content").and_then(Value::as_str),
                entry.get("id").and_then(Value::as_u64),
            ) {
                vocab.insert(content.to_owned(), id);
            }
        }
    }
    Ok(Some(vocab))
}

/// Refuse a draft whose tokenizer vocabulary differs from the target's (as Python's `Decoder` does).
fn check_same_vocabulary(target_file: &Path, draft_file: &Path) -> Result<()> {
    let target = target_file.with_file_name(TOKENIZER_FILE);
    let draft = draft_file.with_file_name(TOKENIZER_FILE);
    if !target.is_file() || !draft.is_file() {
        return Ok(());
    }
    // Usually byte-identical (a draft cut from the target, or one family's converter): no parsing needed.
    let same_bytes = std::fs::read(&target).ok() == std::fs::read(&draft).ok();
    if same_bytes {
        return Ok(());
    }
    let (Some(vt), Some(vd)) = (
        tokenizer_vocabulary(&target)?,
        tokenizer_vocabulary(&draft)?,
    ) else {
        return Ok(());
    };
    if vt != vd {
        return Err(SpecError::Vocab(format!(
            "draft tokenizer ({}, {} tokens) differs from target tokenizer ({}, {} tokens)",
            draft.display(),
            vd.len(),
            target.display(),
            vt.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use specrt_core::testing::MockModel;
    use specrt_core::FinishReason;

    const VOCAB: usize = 50;

    fn pipeline(draft: bool, defaults: FolderDefaults) -> Pipeline {
        let target = MockModel::new(VOCAB, 256, 7, 4.0);
        let d = draft.then(|| Box::new(target.clone().with_noise(3, 0.5)) as Box<dyn Backend>);
        Pipeline::from_engine(Engine::new(Box::new(target), d).unwrap(), defaults)
    }

    /// The setting a refused request names, and the message.
    fn setting_error(p: &Pipeline, request: &GenerationRequest) -> (String, String) {
        match p.resolve(request) {
            Err(SpecError::Setting { field, message }) => (field, message),
            other => panic!("expected a setting error, got {other:?}"),
        }
    }

    fn parse(generation: &str, specrt: Option<&str>) -> Result<FolderDefaults> {
        FolderDefaults::parse(
            Some(generation),
            specrt,
            Path::new("g.json"),
            Path::new("s.json"),
        )
    }

    #[test]
    fn defaults_read_as_python_reads_them() {
        let d = parse(
            r#"{"temperature": 0.6, "top_k": 50, "top_p": 0.9, "min_p": null, "do_sample": true,
                "repetition_penalty": 1.1, "eos_token_id": 7}"#,
            Some(r#"{"eos_token_ids": [1, 2]}"#),
        )
        .unwrap();
        assert_eq!(d.temperature, Some(0.6));
        assert_eq!(d.top_k, Some(50));
        assert_eq!(d.top_p, Some(0.9));
        assert_eq!(d.min_p, None);
        assert_eq!(d.repetition_penalty, Some(1.1));
        assert_eq!(d.eos_token_ids, vec![7], "generation_config's id wins");
        let d = parse("{}", Some(r#"{"eos_token_ids": [1, 2]}"#)).unwrap();
        assert_eq!(d.eos_token_ids, vec![1, 2], "else specrt_config's list");
        let d = parse(
            r#"{"eos_token_id": null}"#,
            Some(r#"{"eos_token_ids": [1]}"#),
        )
        .unwrap();
        assert!(d.eos_token_ids.is_empty(), "a present null means none");
        assert_eq!(
            FolderDefaults::parse(None, None, Path::new("g"), Path::new("s")).unwrap(),
            FolderDefaults::default()
        );
    }

    #[test]
    fn malformed_defaults_name_the_file_and_field() {
        for (text, needle) in [
            (r#"{"temperature": "hot"}"#, "temperature = \"hot\""),
            (r#"{"eos_token_id": [1, -2]}"#, "eos_token_id = [1,-2]"),
            (r#"{"top_k": 2.5}"#, "top_k = 2.5"),
            ("[1]", "not a JSON object"),
            ("{", "not valid JSON"),
        ] {
            let err = parse(text, None).unwrap_err();
            assert!(
                matches!(&err, SpecError::Io(m) if m.contains("g.json") && m.contains(needle)),
                "{text}: {err}"
            );
        }
        let err = parse(r#"{"top_k": -1}"#, None).unwrap_err();
        assert!(
            matches!(&err, SpecError::Config(m) if m.contains("top_k -1")),
            "{err}"
        );
    }

    #[test]
    fn none_fields_take_the_folder_defaults_then_neutral_values() {
        let defaults = FolderDefaults {
            temperature: Some(0.0),
            top_k: Some(5),
            eos_token_ids: vec![3],
            ..FolderDefaults::default()
        };
        let p = pipeline(false, defaults);
        let cfg = p.resolve(&GenerationRequest::default()).unwrap();
        assert_eq!(cfg.sampling.temperature, 0.0);
        assert_eq!(cfg.sampling.top_k, 5);
        assert_eq!(cfg.sampling.top_p, 1.0);
        assert_eq!(cfg.sampling.repetition_penalty, 1.0);
        assert_eq!(cfg.eos_token_ids, vec![3]);
        assert_eq!(
            cfg.num_speculative_tokens, 0,
            "no draft: target-only by default"
        );
        assert!(!cfg.use_draft_model && cfg.ngram.is_none() && cfg.auto_k.is_none());
        let cfg = p
            .resolve(&GenerationRequest {
                temperature: Some(0.7),
                top_k: Some(0),
                ..GenerationRequest::default()
            })
            .unwrap();
        assert_eq!((cfg.sampling.temperature, cfg.sampling.top_k), (0.7, 0));
    }

    #[test]
    fn k_and_proposer_translate_as_in_python() {
        let p = pipeline(true, FolderDefaults::default());
        let cfg = p.resolve(&GenerationRequest::default()).unwrap();
        assert_eq!(cfg.num_speculative_tokens, 4);
        assert!(cfg.use_draft_model && cfg.ngram.is_none());
        let cfg = p
            .resolve(&GenerationRequest {
                num_speculative_tokens: SpeculativeTokens::Auto,
                proposer: Some(Proposer::NgramThenDraft),
                ..GenerationRequest::default()
            })
            .unwrap();
        assert_eq!(cfg.auto_k.as_ref().map(|a| a.k_max), Some(AUTO_K_MAX));
        assert_eq!(
            cfg.ngram,
            Some(NgramConfig {
                prompt_lookup_min: 2,
                prompt_lookup_max: 4
            })
        );
        let cfg = p
            .resolve(&GenerationRequest {
                proposer: Some(Proposer::TargetOnly),
                num_speculative_tokens: SpeculativeTokens::Fixed(6),
                ..GenerationRequest::default()
            })
            .unwrap();
        assert_eq!(cfg.num_speculative_tokens, 0);
        assert!(!cfg.use_draft_model);
    }

    #[test]
    fn bad_settings_name_the_value_and_the_allowed_set() {
        let p = pipeline(false, FolderDefaults::default());
        let pinned = PinnedCosts {
            c_draft: 1.0,
            c_verify: vec![1.0; 9],
        };
        let cases = [
            (
                GenerationRequest {
                    proposer: Some(Proposer::DraftModel),
                    ..GenerationRequest::default()
                },
                "proposer",
                "proposer \"draft\" needs a draft model",
            ),
            (
                GenerationRequest {
                    num_speculative_tokens: SpeculativeTokens::Fixed(65),
                    ..GenerationRequest::default()
                },
                "num_speculative_tokens",
                "65 is invalid (expected 0 <= K <= 64",
            ),
            (
                GenerationRequest {
                    pinned_costs: Some(pinned),
                    ..GenerationRequest::default()
                },
                "pinned_costs",
                "pinned_costs only apply",
            ),
            (
                GenerationRequest {
                    proposer: Some(Proposer::Ngram),
                    prompt_lookup_min: 5,
                    prompt_lookup_max: 3,
                    ..GenerationRequest::default()
                },
                "prompt_lookup_min",
                "prompt_lookup_min = 5",
            ),
            (
                GenerationRequest {
                    temperature: Some(-1.0),
                    ..GenerationRequest::default()
                },
                "temperature",
                "temperature -1",
            ),
            (
                GenerationRequest {
                    top_p: Some(0.0),
                    ..GenerationRequest::default()
                },
                "top_p",
                "top_p 0",
            ),
            (
                GenerationRequest {
                    max_new_tokens: 0,
                    ..GenerationRequest::default()
                },
                "max_new_tokens",
                "max_new_tokens 0",
            ),
            (
                GenerationRequest {
                    max_new_tokens: 4,
                    min_tokens: 5,
                    ..GenerationRequest::default()
                },
                "min_tokens",
                "min_tokens 5",
            ),
            (
                GenerationRequest {
                    top_logprobs: 21,
                    ..GenerationRequest::default()
                },
                "top_logprobs",
                "top_logprobs 21",
            ),
            (
                GenerationRequest {
                    stop: vec!["ok".into(), String::new()],
                    ..GenerationRequest::default()
                },
                "stop",
                "stop strings must be non-empty",
            ),
            (
                GenerationRequest {
                    constraint: Some(OutputConstraint::Regex("(unclosed".into())),
                    ..GenerationRequest::default()
                },
                "regex",
                "regex \"(unclosed\" is invalid",
            ),
        ];
        // Each refusal names its setting (the one its message names).
        for (request, field, needle) in cases {
            let (f, m) = setting_error(&p, &request);
            assert_eq!(f, field, "{m}");
            assert!(m.contains(needle), "{needle:?} not in {m:?}");
        }
        assert_eq!(
            "beam".parse::<Proposer>().unwrap_err().field(),
            Some("proposer")
        );
        let m = "beam".parse::<Proposer>().unwrap_err().to_string();
        assert!(
            m.contains("\"beam\"") && m.contains("\"ngram+draft\""),
            "{m}"
        );
        let m = "many".parse::<SpeculativeTokens>().unwrap_err().to_string();
        assert!(m.contains("\"many\"") && m.contains("\"auto\""), "{m}");
        assert_eq!(
            "auto".parse::<SpeculativeTokens>().unwrap(),
            SpeculativeTokens::Auto
        );
        assert_eq!(
            "3".parse::<SpeculativeTokens>().unwrap(),
            SpeculativeTokens::Fixed(3)
        );
        for p in Proposer::ALL {
            assert_eq!(p.as_str().parse::<Proposer>().unwrap(), p);
        }
    }

    #[test]
    fn out_of_range_ids_are_vocab_errors_naming_the_position() {
        let mut p = pipeline(false, FolderDefaults::default());
        let err = p
            .generate(&[1, 2, VOCAB as u32], &GenerationRequest::default())
            .unwrap_err();
        assert!(
            matches!(&err, SpecError::Vocab(m) if m.contains("prompt token 50 at position 2")),
            "{err}"
        );
        let err = p
            .generate(
                &[1],
                &GenerationRequest {
                    stop_token_ids: vec![4, 99],
                    ..GenerationRequest::default()
                },
            )
            .unwrap_err();
        assert!(
            matches!(&err, SpecError::Vocab(m) if m.contains("stop_token_ids token 99 at position 1")),
            "{err}"
        );
        assert_eq!(
            p.generate(&[], &GenerationRequest::default())
                .unwrap_err()
                .field(),
            Some("prompt")
        );
    }

    /// Greedy settings for 40 tokens, and the target-only output under them for the prompt `[1, 2, 3]`.
    fn greedy_reference() -> (GenerationRequest, GenerationOutput) {
        let request = GenerationRequest {
            temperature: Some(0.0),
            max_new_tokens: 40,
            ..GenerationRequest::default()
        };
        let out = pipeline(false, FolderDefaults::default())
            .generate(&[1, 2, 3], &request)
            .unwrap();
        (request, out)
    }

    #[test]
    fn greedy_speculative_equals_target_only_and_streams_every_token() {
        let (request, plain) = greedy_reference();
        let mut streamed = Vec::new();
        let spec = pipeline(true, FolderDefaults::default())
            .generate_stream(&[1, 2, 3], &request, |step| {
                streamed.extend_from_slice(&step.tokens);
                true
            })
            .unwrap();
        assert_eq!(spec.tokens, plain.tokens);
        assert_eq!(streamed, spec.tokens);
        assert_eq!(spec.finish_reason, FinishReason::Length);
        assert!(spec.stats.n_drafted > 0);
    }

    #[test]
    fn folder_eos_and_stop_ids_end_generation() {
        let (request, free) = greedy_reference();
        let eos = free.tokens[5];
        let first = free.tokens.iter().position(|&t| t == eos).unwrap();
        let defaults = FolderDefaults {
            eos_token_ids: vec![eos],
            ..FolderDefaults::default()
        };
        let out = pipeline(true, defaults.clone())
            .generate(&[1, 2, 3], &request)
            .unwrap();
        assert_eq!(out.tokens, free.tokens[..=first]);
        assert_eq!(out.finish_reason, FinishReason::Eos);
        let out = pipeline(true, defaults)
            .generate(
                &[1, 2, 3],
                &GenerationRequest {
                    ignore_eos: true,
                    stop_token_ids: vec![eos],
                    ..request.clone()
                },
            )
            .unwrap();
        assert_eq!(out.tokens, free.tokens[..=first]);
        assert_eq!(out.finish_reason, FinishReason::Stop);
    }

    #[test]
    fn returning_false_from_the_callback_stops_with_reason_stop() {
        let mut p = pipeline(true, FolderDefaults::default());
        let mut rounds = 0;
        let out = p
            .generate_stream(&[1, 2, 3], &GenerationRequest::default(), |_| {
                rounds += 1;
                rounds < 2
            })
            .unwrap();
        assert_eq!(out.finish_reason, FinishReason::Stop);
        assert_eq!(out.stats.n_rounds, 2);
    }

    #[test]
    fn tokenizers_with_different_vocabularies_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let write = |dir: &str, vocab: &str| {
            let folder = tmp.path().join(dir);
            std::fs::create_dir_all(&folder).unwrap();
            std::fs::write(
                folder.join(TOKENIZER_FILE),
                format!(r#"{{"model": {{"vocab": {vocab}}}, "added_tokens": [{{"id": 2, "content": "<e>"}}]}}"#),
            )
            .unwrap();
            folder.join("model.onnx")
        };
        let t = write("t", r#"{"a": 0, "b": 1}"#);
        let same = write("same", r#"{"b": 1,  "a": 0}"#);
        let other = write("other", r#"{"a": 0, "c": 1}"#);
        check_same_vocabulary(&t, &same).unwrap();
        let err = check_same_vocabulary(&t, &other).unwrap_err();
        assert!(
            matches!(&err, SpecError::Vocab(m) if m.contains("other") && m.contains("3 tokens")),
            "{err}"
        );
        check_same_vocabulary(&t, &tmp.path().join("none/model.onnx")).unwrap();
    }

    #[test]
    fn the_tokenizer_size_is_its_largest_id_plus_one() {
        let tmp = tempfile::tempdir().unwrap();
        let size = |json: &str| {
            let path = tmp.path().join(TOKENIZER_FILE);
            std::fs::write(&path, json).unwrap();
            tokenizer_size(&path).unwrap()
        };
        let added = r#""added_tokens": [{"id": 7, "content": "<e>"}]"#;
        assert_eq!(
            size(&format!(
                r#"{{"model": {{"vocab": {{"a": 0, "b": 3}}}}, {added}}}"#
            )),
            Some(8)
        );
        assert_eq!(
            size(r#"{"model": {"vocab": {"a": 0, "b": 9}}, "added_tokens": []}"#),
            Some(10)
        );
        // Unigram: a list of [piece, score], the index is the id.
        assert_eq!(
            size(r#"{"model": {"vocab": [["a", 0.0], ["b", -1.0]]}}"#),
            Some(2)
        );
        assert_eq!(size(r#"{"model": {}}"#), None);
        assert_eq!(tokenizer_size(&tmp.path().join("none.json")).unwrap(), None);
    }
}
