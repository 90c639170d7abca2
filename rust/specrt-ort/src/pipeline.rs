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
//! - the same validation, with errors that name the bad setting and the allowed set ([`SpecError::Setting`],
//!   [`SpecError::Vocab`]), and a draft whose `tokenizer.json` vocabulary differs from the target's is refused.
//!
//! Text in, text out ([`Pipeline::generate_text`], [`Pipeline::generate_text_stream`],
//! [`Pipeline::generate_ids_text_stream`]): the target folder's `tokenizer.json` (`specrt-text`, the same
//! tokenizers version as Python's), stop strings ([`GenerationRequest::stop`]; they may end mid-token) and
//! incremental detokenization that never shows a partial UTF-8 character, with the same text and token ids as
//! Python's `Decoder` (tests/engine/test_rust_parity.py). Token ids in, token ids out: [`Pipeline::generate`]. Batched
//! decoding from Rust: [`crate::Driver`] (requests submitted, stepped together, events per request).
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

use std::path::Path;

use specrt_core::{
    Engine, GenerationConfig, GenerationOutput, Result, SingleStream, SpecError, StepOutput,
    DEFAULT_PREFIX_CACHING,
};
use specrt_text::chat::ChatTemplate;
use specrt_text::tokenizer::Tokenizer;

use crate::driver::{Driver, DriverEvent};
use crate::folder::{FolderDefaults, TOKENIZER_FILE};
use crate::options::OrtOptions;
use crate::request_settings::GenerationRequest;

/// A target model, an optional draft model and the target folder's defaults, ready to generate from token ids or
/// text, one generation at a time: a front of the one driver ([`Driver`] over the single-stream engine,
/// [`specrt_core::SingleStream`]), which every generation runs through (Python's `Decoder` and `Scheduler`,
/// `specrt serve`).
///
/// One generation at a time (`&mut self`); share one between threads behind a `Mutex`, or load one per thread.
pub struct Pipeline {
    driver: Driver,
}

impl Pipeline {
    /// Load a target model folder (or `.onnx` file) and an optional draft, with the same options for both (the
    /// draft's through [`OrtOptions::for_draft`]); prefix caching between generations on
    /// ([`specrt_core::DEFAULT_PREFIX_CACHING`]).
    ///
    /// Loads the ONNX Runtime library named by `options.ort_library` on first use (see
    /// [`crate::find_ort_library`]), reads the target's [`FolderDefaults`], and checks the draft against the
    /// target ([`crate::check_draft_folder`]: the same `tokenizer.json` vocabulary; logits widths equal or differing
    /// only in padding rows beyond the tokenizer's ids, as Qwen2.5 7B's 152064 against 0.5B's 151936, the draft then
    /// fitted to the target's width: [`specrt_core::vocab`]).
    ///
    /// Errors: [`SpecError::NotFound`] (a missing model or library), [`SpecError::Io`] /
    /// [`SpecError::ModelFormat`] (an unreadable / malformed file or model), [`SpecError::Vocab`] (draft and target
    /// vocabularies differ, both named), [`SpecError::Provider`] (CUDA unavailable without `allow_fallback`),
    /// [`SpecError::Setting`] (bad options, named), [`SpecError::Backend`] (ONNX Runtime failed to load a model).
    pub fn load(target: &Path, draft: Option<&Path>, options: &OrtOptions) -> Result<Self> {
        Driver::load_single(target, draft, options, DEFAULT_PREFIX_CACHING)
            .map(|driver| Self { driver })
    }

    /// A pipeline over an engine built elsewhere (other backends, mock models in tests) and the defaults to use.
    #[must_use]
    pub fn from_engine(engine: Engine, defaults: FolderDefaults) -> Self {
        Self {
            driver: Driver::from_engine(SingleStream::new(engine), defaults, None),
        }
    }

    /// A pipeline over a single-stream driver loaded elsewhere ([`Driver::load_single`], e.g. with prefix
    /// caching off).
    #[must_use]
    pub fn from_driver(driver: Driver) -> Self {
        Self { driver }
    }

    /// The target folder's defaults in use.
    #[must_use]
    pub fn defaults(&self) -> &FolderDefaults {
        self.driver.defaults()
    }

    /// End-of-sequence ids from the target folder.
    #[must_use]
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.driver.defaults().eos_token_ids
    }

    /// The target's logits width: the vocabulary of prompts and outputs (a draft of another width is fitted to
    /// it).
    #[must_use]
    pub fn vocab_size(&self) -> usize {
        self.driver.vocab_size()
    }

    /// Longest prompt + new tokens both KV caches hold.
    #[must_use]
    pub fn max_seq_len(&self) -> usize {
        self.driver.max_seq_len()
    }

    /// Whether a draft model is loaded.
    #[must_use]
    pub fn has_draft(&self) -> bool {
        self.driver.has_draft()
    }

    /// ONNX Runtime execution providers of the target session, preferred first (empty for
    /// [`Pipeline::from_engine`]).
    #[must_use]
    pub fn providers(&self) -> &[&'static str] {
        self.driver.providers()
    }

    /// Why CUDA was requested but the CPU is used (`allow_fallback`), if it was.
    #[must_use]
    pub fn fallback_reason(&self) -> Option<&str> {
        self.driver.fallback_reason()
    }

    /// The driver this pipeline runs on (submit / step / cancel; [`Driver::stats`] of a running request).
    pub fn driver_mut(&mut self) -> &mut Driver {
        &mut self.driver
    }

    /// The engine settings for `request`: folder defaults filled in, K and the proposer translated as Python does,
    /// everything validated ([`resolve_request`]).
    ///
    /// Errors: [`SpecError::Setting`] for a value out of range (named, with the allowed set: proposer, K, n-gram
    /// lengths, pinned costs without auto K, sampling settings, `max_new_tokens` 0) or a draft proposer without a
    /// draft model; [`SpecError::Vocab`] for a stop token id `>= vocab_size`.
    pub fn resolve(&self, request: &GenerationRequest) -> Result<GenerationConfig> {
        self.driver.resolve(request)
    }

    /// Generate from `prompt_ids` (`[n_prompt]` token ids, each `< vocab_size`) to the end: EOS id, stop token id
    /// or `max_new_tokens`.
    ///
    /// Returns the emitted tokens (the prompt excluded; an EOS or stop id that ended generation included), where
    /// each came from, the target's log-probability of each (natural log), the finish reason and the statistics
    /// (timings in ms).
    ///
    /// Errors: as [`Pipeline::resolve`]; [`SpecError::Setting`] (`prompt`) for an empty prompt; [`SpecError::Vocab`] for a
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
    /// Errors: as [`Pipeline::generate`]; [`SpecError::Setting`] (`stop`) for stop strings (they need text).
    pub fn generate_stream(
        &mut self,
        prompt_ids: &[u32],
        request: &GenerationRequest,
        mut on_step: impl FnMut(&StepOutput) -> bool,
    ) -> Result<GenerationOutput> {
        if !request.stop.is_empty() {
            return Err(SpecError::setting(
                "stop",
                "stop strings need text: token-level generation cannot match them (pass stop token ids, or use \
                 generate_text)",
            ));
        }
        let id = self.driver.submit_ids(prompt_ids, request)?;
        self.drive(id, |event| on_step(&event.step))
            .map(|(_, output)| output)
    }

    /// The target folder's tokenizer (`None` when the folder has no `tokenizer.json`, or for
    /// [`Pipeline::from_engine`] until [`Pipeline::set_tokenizer`]).
    #[must_use]
    pub fn tokenizer(&self) -> Option<&Tokenizer> {
        self.driver.tokenizer()
    }

    /// The target folder's chat template (`None` when it has no `chat_template.jinja`).
    #[must_use]
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.driver.chat_template()
    }

    /// The prompt ids of chat `messages` (`[{"role": ..., "content": ...}, ...]` as JSON values): rendered with the
    /// target folder's chat template as transformers' `apply_chat_template(..., add_generation_prompt=True)` does,
    /// then encoded without added special tokens (the template places them), as Python's `Decoder` does.
    ///
    /// Errors: [`SpecError::Config`] without a chat template or tokenizer, or when the template refuses the
    /// messages (its message, or the construct it cannot render).
    pub fn chat_prompt_ids(&self, messages: &[serde_json::Value]) -> Result<Vec<u32>> {
        self.driver.chat_prompt_ids(messages)
    }

    /// Use `tokenizer` for the text API (a pipeline built with [`Pipeline::from_engine`]).
    pub fn set_tokenizer(&mut self, tokenizer: Tokenizer) {
        self.driver.set_tokenizer(tokenizer);
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
        let ids = self.text_tokenizer()?.encode(prompt, true)?;
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
        self.text_tokenizer()?;
        let id = self.driver.submit_ids(prompt_ids, request)?;
        let (text, output) = self.drive(id, |event| {
            on_text(&TextStep {
                text: event.text.clone(),
                tokens: event.step.tokens.clone(),
                n_drafted: event.step.n_drafted,
                finished: event.done.is_some(),
            })
        })?;
        Ok(TextOutput { text, output })
    }

    /// Step the driver until request `id` ends, calling `on_event` with each of its events; `false` from it stops
    /// the request keeping what was emitted ([`Driver::finish`]). Returns its text and output.
    fn drive(
        &mut self,
        id: u64,
        mut on_event: impl FnMut(&DriverEvent) -> bool,
    ) -> Result<(String, GenerationOutput)> {
        loop {
            let events = match self.driver.step() {
                Ok(events) => events,
                Err(e) => {
                    self.driver.cancel(id).ok(); // the round failed: the request is gone
                    return Err(e);
                }
            };
            if events.is_empty() && self.driver.is_idle() {
                return Err(SpecError::Internal(format!(
                    "request {id} left the driver without an output"
                )));
            }
            for event in events {
                if event.id != id {
                    continue; // one generation at a time: nothing else was submitted
                }
                if let Some(error) = event.error {
                    return Err(error);
                }
                let keep_going = on_event(&event);
                if let Some(done) = event.done {
                    return Ok(done);
                }
                if !keep_going {
                    return self.driver.finish(id);
                }
            }
        }
    }

    fn text_tokenizer(&self) -> Result<&Tokenizer> {
        self.driver.tokenizer().ok_or_else(|| {
            SpecError::Config(format!(
                "this pipeline has no tokenizer (the target folder has no {TOKENIZER_FILE}); generate from token \
                 ids with Pipeline::generate"
            ))
        })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request_settings::{Proposer, SpeculativeTokens, AUTO_K_MAX};
    use specrt_core::testing::MockModel;
    use specrt_core::FinishReason;
    use specrt_core::{Backend, NgramConfig, PinnedCosts};
    use specrt_grammar::OutputConstraint;

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
                prompt_lookup_max: 4,
                method: specrt_core::LookupMethod::PromptLookup,
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
    fn the_auto_proposer_is_every_proposer_the_pipeline_has_under_auto_k() {
        let auto = |k: SpeculativeTokens| GenerationRequest {
            proposer: Some(Proposer::Auto),
            num_speculative_tokens: k,
            ..GenerationRequest::default()
        };
        // with a draft model: n-gram and draft model, auto K up to the fixed K (the cap) or AUTO_K_MAX
        let with_draft = pipeline(true, FolderDefaults::default());
        let cfg = with_draft
            .resolve(&auto(SpeculativeTokens::Fixed(4)))
            .unwrap();
        assert!(cfg.use_draft_model && cfg.ngram.is_some());
        assert_eq!(cfg.num_speculative_tokens, 4);
        assert_eq!(cfg.auto_k.as_ref().map(|a| a.k_max), Some(4));
        let cfg = with_draft.resolve(&auto(SpeculativeTokens::Auto)).unwrap();
        assert_eq!(cfg.auto_k.as_ref().map(|a| a.k_max), Some(AUTO_K_MAX));
        // K = 0: target-only decoding
        let cfg = with_draft
            .resolve(&auto(SpeculativeTokens::Fixed(0)))
            .unwrap();
        assert!(cfg.auto_k.is_none());
        // without one: prompt lookup alone, never an error
        let cfg = pipeline(false, FolderDefaults::default())
            .resolve(&auto(SpeculativeTokens::Fixed(4)))
            .unwrap();
        assert!(!cfg.use_draft_model && cfg.ngram.is_some() && cfg.auto_k.is_some());
        assert_eq!("auto".parse::<Proposer>().unwrap(), Proposer::Auto);
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
                "65 is invalid (expected an integer 0 <= K <= 64",
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
}
