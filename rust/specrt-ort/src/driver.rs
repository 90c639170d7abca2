//! [`Driver`]: the one driver of every generation (Rust's `Pipeline`, Python's `Decoder` and `Scheduler`, the
//! server), many requests at once on the batched layout or one at a time on the single-stream engine, text in and
//! text out: submit requests (each resolved and checked once by the one resolver), call [`Driver::step`] to run one
//! round, and receive each request's [`DriverEvent`]s (its new text, the tokens, and on its last event the output).
//! Stop strings are cut per request (the engine's row is cut back with `stop_at`), and one request's bad settings or
//! failure never touches the others.
//!
//! ```no_run
//! use std::path::Path;
//! use specrt_ort::specrt_core::BatchOptions;
//! use specrt_ort::{find_ort_library, Driver, GenerationRequest, OrtOptions};
//!
//! let options = OrtOptions::new(find_ort_library(None)?);
//! let mut batch = Driver::load(
//!     Path::new("/models/smollm2-135m-instruct/fp32-B"), // the batched layout (`specrt convert --attention batched`)
//!     None,
//!     &options,
//!     4, // max_batch
//!     BatchOptions::default(), // prefill_chunk 256, prefix caching on
//! )?;
//! let request = GenerationRequest { max_new_tokens: 32, temperature: Some(0.0), ..GenerationRequest::default() };
//! let a = batch.submit_text("The capital of France is", &request)?;
//! let b = batch.submit_text("One, two, three,", &GenerationRequest { stop: vec!["six".into()], ..request.clone() })?;
//! while !batch.is_idle() {
//!     for event in batch.step()? {
//!         print!("[{}] {}", event.id, event.text);
//!     }
//! }
//! # let _ = (a, b);
//! # Ok::<(), specrt_core::SpecError>(())
//! ```

use std::collections::HashMap;
use std::path::Path;

use serde_json::Value;

use specrt_core::{
    Backend, BatchBackend, BatchEngine, BatchOptions, Engine, RequestEngine, SingleStream,
};
use specrt_core::{FinishReason, GenerationOutput, PromptLogprobs, Result, SpecError, StepOutput};
use specrt_text::chat::ChatTemplate;
use specrt_text::detok::{RoundEnd, TextAssembler};
use specrt_text::tokenizer::Tokenizer;

use crate::batched::BatchedOrtBackend;
use crate::constraint_compiler::ConstraintCompiler;
use crate::cross_vocab::DraftFit;
use crate::folder::{chat_ids, FolderDefaults, TargetFolder};
use crate::model::{resolve_model_file, SpecrtConfig};
use crate::options::{KvLayout, OrtOptions};
use crate::ort_backend::OrtBackend;
use crate::request_settings::{
    resolve_request, stop_without_tokenizer, GenerationRequest, PreparedRequest, RequestScope,
};

/// What one round brought one request.
#[derive(Debug, Clone, PartialEq)]
pub struct DriverEvent {
    /// The request's id ([`Driver::submit_text`]'s).
    pub id: u64,
    /// Text to show now (empty for a request submitted as ids without a tokenizer, or while text is held back:
    /// a partial UTF-8 character or a possible partial stop string).
    pub text: String,
    /// The tokens the round committed for it, cut after the token that ends a stop string (with their sources,
    /// the target's log-probabilities and alternatives as the request asked, and the finish reason: `Stop` for a
    /// stop string; `None` while it goes on).
    pub step: StepOutput,
    /// On the request's first event, when it asked for `prompt_logprobs`: the prompt's scores.
    pub prompt: Option<PromptLogprobs>,
    /// On the request's last event: its whole text (cut before a stop string) and output (tokens cut at the
    /// token holding a stop string's last character; finish reason, statistics). The request is then gone.
    pub done: Option<(String, GenerationOutput)>,
    /// The request failed in this round (it has left the batch; the others go on).
    pub error: Option<SpecError>,
}

/// One request's text and what its events have carried.
struct Tracked {
    text: Option<TextAssembler>,
    /// Tokens its events have carried so far.
    n_emitted: usize,
    /// Whether it asked for the prompt's scores (sent on its first event).
    scored: bool,
}

/// The driver of every generation: an engine of requests ([`RequestEngine`]: a batched engine over folders in the
/// batched layout, or the single-stream engine, one request at a time) with the target folder's defaults and
/// tokenizer.
pub struct Driver {
    engine: Box<dyn RequestEngine>,
    /// ONNX Runtime execution providers of the target session, preferred first (empty for
    /// [`Driver::from_engine`]).
    providers: Vec<&'static str>,
    /// Why CUDA was requested but the CPU is used (`allow_fallback`), if it was.
    fallback_reason: Option<String>,
    /// Loaded by [`Self::load`]: requests share batched rounds.
    batched: bool,
    defaults: FolderDefaults,
    tokenizer: Option<Tokenizer>,
    chat_template: Option<ChatTemplate>,
    requests: HashMap<u64, Tracked>,
    next_id: u64,
    /// Compiles requests' constraints over the tokenizer (as [`crate::Pipeline`]'s).
    constraints: ConstraintCompiler,
    /// With a draft loaded from a folder: how its vocabulary relates to the target's ([`Self::draft_vocabulary`]).
    draft_vocabulary: Option<Value>,
}

impl Driver {
    /// Load a target folder (and an optional draft, loaded with [`OrtOptions::for_draft`]) converted with
    /// `--attention batched`, holding up to `max_batch` rows, with the batched engine's `batch_options` (`prefill_chunk`
    /// = most prompt tokens a joining request prefills per round; prefix caching and its byte budget).
    ///
    /// Errors: as [`crate::Pipeline::load`], and [`SpecError::Config`] for a folder not in the batched layout or a
    /// zero `prefill_chunk`.
    pub fn load(
        target: &Path,
        draft: Option<&Path>,
        options: &OrtOptions,
        max_batch: usize,
        batch_options: BatchOptions,
    ) -> Result<Self> {
        let mut folder = TargetFolder::open(target, draft)?;
        let t = BatchedOrtBackend::new(&folder.model_file, options, max_batch)?;
        let fallback_reason = t.fallback_reason().map(str::to_owned);
        let (d, tokenizer_vocab, report) = match (draft, folder.draft_vocabulary.take()) {
            (Some(p), Some(vocabulary)) => {
                let d = Box::new(BatchedOrtBackend::new(p, &options.for_draft(), max_batch)?);
                let (fit, report) = DraftFit::new(vocabulary, t.vocab_size(), d.vocab_size())?;
                let (d, n) = fit.batched(d)?;
                (Some(d), n, Some(report))
            }
            _ => (None, None, None),
        };
        let engine =
            BatchEngine::with_tokenizer_vocab(Box::new(t), d, batch_options, tokenizer_vocab)?;
        let mut driver = Self::loaded(engine, folder, report, fallback_reason);
        driver.providers = vec!["CPUExecutionProvider"];
        driver.batched = true;
        Ok(driver)
    }

    /// Load a target folder (and an optional draft, loaded with [`OrtOptions::for_draft`]) in the single-stream
    /// layouts (default or graph form, any provider; CUDA graphs with `options.cuda_graph`) and serve its requests
    /// one at a time ([`SingleStream`]), with prefix reuse between generations when `prefix_caching`.
    ///
    /// Errors: as [`crate::Pipeline::load`].
    pub fn load_single(
        target: &Path,
        draft: Option<&Path>,
        options: &OrtOptions,
        prefix_caching: bool,
    ) -> Result<Self> {
        let mut folder = TargetFolder::open(target, draft)?;
        let t = OrtBackend::new(&folder.model_file, options)?;
        let providers = t.providers();
        let fallback_reason = t.fallback_reason().map(str::to_owned);
        let mut draft_options = options.for_draft();
        draft_options.profile = None; // the target's session is the one profiled
        let (d, tokenizer_vocab, report) = match (draft, folder.draft_vocabulary.take()) {
            (Some(p), Some(vocabulary)) => {
                let d = Box::new(OrtBackend::new(p, &draft_options)?);
                let (fit, report) = DraftFit::new(vocabulary, t.vocab_size(), d.vocab_size())?;
                let (d, n) = fit.single(d)?;
                (Some(d), n, Some(report))
            }
            _ => (None, None, None),
        };
        let mut engine = Engine::with_tokenizer_vocab(Box::new(t), d, tokenizer_vocab)?;
        engine.set_prefix_caching(prefix_caching);
        let mut driver = Self::loaded(SingleStream::new(engine), folder, report, fallback_reason);
        driver.providers = providers;
        Ok(driver)
    }

    /// The driver over `engine`, loaded from `folder` (its defaults, tokenizer and chat template), with the draft's
    /// vocabulary `report` and the provider's `fallback_reason`.
    fn loaded(
        engine: impl RequestEngine + 'static,
        folder: TargetFolder,
        report: Option<Value>,
        fallback_reason: Option<String>,
    ) -> Self {
        let mut driver = Self::from_engine(engine, folder.defaults, folder.tokenizer);
        driver.draft_vocabulary = report;
        driver.chat_template = folder.chat_template;
        driver.fallback_reason = fallback_reason;
        driver
    }

    /// Load a target folder (and an optional draft) in the layout they were converted for, read from their
    /// `specrt_config.json` (`kv_layout`): the batched layout ([`Self::load`], `max_batch` rows, `batch_options`) or
    /// a single-stream one ([`Self::load_single`], prefix reuse as `batch_options.prefix_caching`). A batched-layout
    /// folder runs batched rounds at any `max_batch`.
    ///
    /// Errors: [`SpecError::Config`] when target and draft were converted for different layouts, or `max_batch` > 1
    /// asks for batched rounds of a folder not in the batched layout (folder and its `kv_layout` named); as
    /// [`Self::load`] and [`Self::load_single`].
    pub fn open(
        target: &Path,
        draft: Option<&Path>,
        options: &OrtOptions,
        max_batch: usize,
        batch_options: BatchOptions,
    ) -> Result<Self> {
        let batched = folder_layout(target)? == Some(KvLayout::BatchedRows);
        check_layout(target, batched || max_batch > 1)?;
        if let Some(d) = draft {
            check_layout(d, batched)?;
        }
        if batched {
            Self::load(target, draft, options, max_batch, batch_options)
        } else {
            Self::load_single(target, draft, options, batch_options.prefix_caching)
        }
    }

    /// A driver over an engine of requests built elsewhere (other backends, mock models in tests).
    #[must_use]
    pub fn from_engine(
        engine: impl RequestEngine + 'static,
        defaults: FolderDefaults,
        tokenizer: Option<Tokenizer>,
    ) -> Self {
        let constraints = ConstraintCompiler::new(
            tokenizer.clone(),
            engine.vocab_size(),
            defaults.eos_token_ids.clone(),
        );
        Self {
            engine: Box::new(engine),
            providers: Vec::new(),
            fallback_reason: None,
            batched: false,
            defaults,
            tokenizer,
            chat_template: None,
            requests: HashMap::new(),
            next_id: 0,
            constraints,
            draft_vocabulary: None,
        }
    }

    /// How the draft's vocabulary relates to the target's, for a draft loaded from a folder (`None` without one):
    /// `{"method": "same tokenizer", "tokenizer_vocab_size": n | null}`, or for a draft of another tokenizer
    /// ([`specrt_core::cross_vocab`]) `{"method": "token-level intersection", ...}` with the counts of
    /// [`crate::cross_vocab::CrossVocabReport::to_json`].
    #[must_use]
    pub fn draft_vocabulary(&self) -> Option<&Value> {
        self.draft_vocabulary.as_ref()
    }

    /// Share suffix decoding's cache of earlier requests among this driver's requests (`None`: each request that
    /// asks for suffix decoding drafts from its own text; [`specrt_core::SuffixCache::for_setting`] builds one from
    /// `suffix_cache_tokens`).
    pub fn set_suffix_cache(&mut self, cache: Option<std::sync::Arc<specrt_core::SuffixCache>>) {
        self.engine.set_suffix_cache(cache);
    }

    /// Whether requests share batched rounds (the batched layout, [`Self::load`]); else they run one at a time.
    #[must_use]
    pub fn is_batched(&self) -> bool {
        self.batched
    }

    /// The target folder's tokenizer, if it has one.
    #[must_use]
    pub fn tokenizer(&self) -> Option<&Tokenizer> {
        self.tokenizer.as_ref()
    }

    /// The prompt ids of chat `messages`, as [`crate::Pipeline::chat_prompt_ids`].
    ///
    /// Errors: [`SpecError::Setting`] (`messages`) without a chat template or tokenizer; the template's errors when
    /// it refuses the messages.
    pub fn chat_prompt_ids(&self, messages: &[serde_json::Value]) -> Result<Vec<u32>> {
        let tokenizer = self
            .tokenizer
            .as_ref()
            .ok_or_else(|| no_tokenizer("messages"))?;
        chat_ids(self.chat_template.as_ref(), tokenizer, messages)
    }

    /// Rows the batch holds.
    #[must_use]
    pub fn max_batch(&self) -> usize {
        self.engine.max_batch()
    }

    /// Whether no request is running or waiting.
    #[must_use]
    pub fn is_idle(&self) -> bool {
        self.requests.is_empty()
    }

    /// Queue a text prompt (encoded with the target folder's tokenizer, special tokens added as its post-processor
    /// says). Returns the request's id. Resolved and checked now (the one resolver); it joins the batch at a
    /// later [`Driver::step`] with a free slot.
    ///
    /// Errors: [`SpecError::Setting`] (`prompt`) without a tokenizer; otherwise as [`Driver::submit_ids`].
    pub fn submit_text(&mut self, prompt: &str, request: &GenerationRequest) -> Result<u64> {
        let tokenizer = self
            .tokenizer
            .as_ref()
            .ok_or_else(|| no_tokenizer("prompt"))?;
        let ids = tokenizer.encode(prompt, true)?;
        self.submit_ids(&ids, request)
    }

    /// Queue a prompt of token ids; its output is text too when the driver has a tokenizer (stop strings need
    /// one). Returns the request's id. The same as [`Driver::prepare`] then
    /// [`Driver::submit_prepared`].
    ///
    /// Errors: as [`RequestScope::prepare`] and [`Driver::submit_prepared`]. Nothing is queued on an error.
    pub fn submit_ids(&mut self, prompt_ids: &[u32], request: &GenerationRequest) -> Result<u64> {
        let prepared = self.prepare(prompt_ids.to_vec(), request.clone())?;
        self.submit_prepared(&prepared)
    }

    /// `request` on `prompt_ids` resolved and checked against this driver ([`RequestScope::prepare`]), not queued.
    ///
    /// Errors: as [`RequestScope::prepare`].
    pub fn prepare(
        &self,
        prompt_ids: Vec<u32>,
        request: GenerationRequest,
    ) -> Result<PreparedRequest> {
        self.request_scope().prepare(prompt_ids, request)
    }

    /// What this driver checks requests against, as a copy ([`RequestScope::prepare`] needs nothing else): a
    /// caller that shares the driver between threads prepares requests with it without waiting for a round.
    #[must_use]
    pub fn request_scope(&self) -> RequestScope {
        RequestScope {
            defaults: self.defaults.clone(),
            has_draft: self.engine.has_draft(),
            vocab_size: self.engine.vocab_size(),
            max_seq_len: self.engine.max_seq_len(),
            has_tokenizer: self.tokenizer.is_some(),
        }
    }

    /// Queue a request prepared by [`Driver::prepare`] or a [`RequestScope`] of this driver (its settings
    /// are not resolved again). Returns its id; it joins the batch at a later [`Driver::step`] with a free
    /// slot.
    ///
    /// Errors: [`SpecError::Setting`] for a constraint (`request.constraint`) that does not compile over the
    /// tokenizer, [`SpecError::Config`] for one without a tokenizer; [`SpecError::Setting`] (`stop`) for stop strings
    /// without a tokenizer; the engine's own checks of the prompt. Nothing is queued on an error.
    pub fn submit_prepared(&mut self, prepared: &PreparedRequest) -> Result<u64> {
        let PreparedRequest {
            prompt_ids,
            request,
            config,
        } = prepared;
        // Compiled before the request queues: a bad constraint is refused here.
        let constraint = self
            .constraints
            .compile_for(request.constraint.as_ref(), &self.defaults.eos_token_ids)?;
        let text = match &self.tokenizer {
            Some(t) => Some(TextAssembler::new(
                t.clone(),
                request.stop.clone(),
                request.text,
            )?),
            None if !request.stop.is_empty() => return Err(stop_without_tokenizer()),
            None => None,
        };
        let id = self.next_id;
        let scored = config.prompt_logprobs.is_some();
        self.engine
            .add_with(id, prompt_ids, config.clone(), constraint)?;
        self.next_id += 1;
        self.requests.insert(
            id,
            Tracked {
                text,
                n_emitted: 0,
                scored,
            },
        );
        Ok(id)
    }

    /// Remove a request now (running or waiting); returns whether it was known.
    ///
    /// Errors: [`SpecError::Backend`] if moving another row's cache into the freed slot fails.
    pub fn cancel(&mut self, id: u64) -> Result<bool> {
        let known = self.requests.remove(&id).is_some();
        Ok(self.engine.cancel(id)? || known)
    }

    /// Stop request `id` now, keeping the tokens its events carried (finish reason `Stop`, as when a caller stops
    /// reading); returns its whole text and output, as its last event would. The request is then gone.
    ///
    /// Errors: [`SpecError::Config`] for an id not running (unknown, waiting, or already ended).
    pub fn finish(&mut self, id: u64) -> Result<(String, GenerationOutput)> {
        let Some(tracked) = self.requests.get(&id) else {
            return Err(SpecError::setting(
                "id",
                format!("request {id} is not running (expected the id of a running request)"),
            ));
        };
        self.engine.stop_at(id, tracked.n_emitted)?;
        let mut text = self.requests.remove(&id).and_then(|t| t.text);
        if let Some(assembler) = &mut text {
            assembler.feed(&[], RoundEnd::Finished)?;
        }
        let output = self.engine.take_output(id).ok_or_else(|| {
            SpecError::Internal(format!("request {id} stopped without an output"))
        })?;
        Ok((
            text.map(|a| a.text().to_owned()).unwrap_or_default(),
            output,
        ))
    }

    /// The engine settings `request` resolves to here ([`resolve_request`] with this driver's defaults, draft
    /// and vocabulary): what [`Driver::submit_ids`] would run.
    ///
    /// Errors: as [`resolve_request`].
    pub fn resolve(&self, request: &GenerationRequest) -> Result<specrt_core::GenerationConfig> {
        resolve_request(
            request,
            &self.defaults,
            self.engine.has_draft(),
            Some(self.engine.vocab_size()),
        )
    }

    /// The target folder's chat template (`None` without `chat_template.jinja`).
    #[must_use]
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat_template.as_ref()
    }

    /// Use `tokenizer` for text (a driver built with [`Driver::from_engine`] without one).
    pub fn set_tokenizer(&mut self, tokenizer: Tokenizer) {
        self.constraints.set_tokenizer(tokenizer.clone());
        self.tokenizer = Some(tokenizer);
    }

    /// Why CUDA was requested but the CPU is used (`allow_fallback`), if it was.
    #[must_use]
    pub fn fallback_reason(&self) -> Option<&str> {
        self.fallback_reason.as_deref()
    }

    /// Run one batched round; returns an event for each request that committed tokens, finished or failed.
    ///
    /// Errors: [`SpecError::Backend`] / [`SpecError::NonFinite`] when the round itself fails (every running
    /// request is then failed); a single request's failure is its event's `error`.
    pub fn step(&mut self) -> Result<Vec<DriverEvent>> {
        let steps = self.engine.step()?;
        let mut events = Vec::with_capacity(steps.len());
        for row in steps {
            let id = row.id;
            if let Some(error) = row.error {
                self.requests.remove(&id);
                events.push(DriverEvent {
                    id,
                    text: String::new(),
                    step: StepOutput::default(),
                    prompt: None,
                    done: None,
                    error: Some(error),
                });
                continue;
            }
            let Some(tracked) = self.requests.get_mut(&id) else {
                continue; // cancelled meanwhile (cannot happen within one call; be safe)
            };
            let mut step = row.out;
            let end = RoundEnd::from_finish(step.finish_reason);
            let (text, finished) = match &mut tracked.text {
                Some(assembler) => {
                    let delta = assembler.feed(&step.tokens, end)?;
                    if let Some(hit) = &delta.stop {
                        self.engine.stop_at(id, hit.n_keep)?;
                        cut_step(&mut step, hit.n_keep.saturating_sub(tracked.n_emitted));
                    }
                    (delta.text, delta.finished)
                }
                None => (String::new(), end != RoundEnd::Continue),
            };
            let prompt = (tracked.scored && tracked.n_emitted == 0)
                .then(|| self.engine.prompt_logprobs(id).cloned())
                .flatten();
            tracked.n_emitted += step.tokens.len();
            let done = if finished {
                let assembler = self.requests.remove(&id).and_then(|t| t.text);
                let output = self.engine.take_output(id).ok_or_else(|| {
                    SpecError::Internal(format!("request {id} finished without an output"))
                })?;
                step.finish_reason = Some(output.finish_reason);
                Some((
                    assembler.map(|a| a.text().to_owned()).unwrap_or_default(),
                    output,
                ))
            } else {
                None
            };
            events.push(DriverEvent {
                id,
                text,
                step,
                prompt,
                done,
                error: None,
            });
        }
        Ok(events)
    }

    /// The target's logits width: the vocabulary of prompts and outputs (a draft of another width is fitted to
    /// it).
    #[must_use]
    pub fn vocab_size(&self) -> usize {
        self.engine.vocab_size()
    }

    /// Whether a draft model is attached.
    #[must_use]
    pub fn has_draft(&self) -> bool {
        self.engine.has_draft()
    }

    /// Longest prompt + new tokens per row.
    #[must_use]
    pub fn max_seq_len(&self) -> usize {
        self.engine.max_seq_len()
    }

    /// Requests in the batch now (prefilling or decoding).
    #[must_use]
    pub fn n_running(&self) -> usize {
        self.engine.n_running()
    }

    /// Requests waiting for a free row.
    #[must_use]
    pub fn n_waiting(&self) -> usize {
        self.engine.n_waiting()
    }

    /// Prefixes in the batched layout's prefix store and the bytes of their KV copies (both models; bounded by
    /// `BatchOptions::prefix_cache_bytes`); (0, 0) in the single-stream layout, which keeps no copies.
    #[must_use]
    pub fn prefix_cache_usage(&self) -> (usize, usize) {
        self.engine.prefix_cache_usage()
    }

    /// The target folder's defaults (generation_config.json; its EOS ids).
    #[must_use]
    pub fn defaults(&self) -> &FolderDefaults {
        &self.defaults
    }

    /// End requests submitted from now on at these ids instead of the folder's EOS ids (structured output's
    /// end too).
    pub fn set_eos_token_ids(&mut self, ids: Vec<u32>) {
        self.constraints.set_eos_token_ids(&ids);
        self.defaults.eos_token_ids = ids;
    }

    /// ONNX Runtime execution providers of the target session, preferred first.
    #[must_use]
    pub fn providers(&self) -> &[&'static str] {
        &self.providers
    }

    /// Statistics so far of a running request.
    #[must_use]
    pub fn stats(&self, id: u64) -> Option<&specrt_core::Stats> {
        self.engine.stats(id)
    }

    /// Statistics of the request run last, even one cancelled or failed since ([`RequestEngine::last_stats`]:
    /// the single-stream engine's; `None` when batched).
    #[must_use]
    pub fn last_stats(&self) -> Option<&specrt_core::Stats> {
        self.engine.last_stats()
    }
}

/// Keep the first `n` tokens of a round (a stop string ended in it) and mark it finished by the stop.
fn cut_step(step: &mut StepOutput, n: usize) {
    step.tokens.truncate(n);
    step.sources.truncate(n);
    step.logprobs.truncate(n);
    step.top_logprobs.truncate(n);
    step.finish_reason = Some(FinishReason::Stop);
}

/// The `kv_layout` of the model folder (or `.onnx` file) `path` (`None`: its `specrt_config.json` names none).
fn folder_layout(path: &Path) -> Result<Option<KvLayout>> {
    Ok(SpecrtConfig::read_beside(&resolve_model_file(path)?)?.kv_layout)
}

/// The refusal of a text input (`field`: `prompt`, `messages`) by a driver without a tokenizer.
fn no_tokenizer(field: &str) -> SpecError {
    SpecError::setting(
        field,
        format!("{field} is text but this driver has no tokenizer; submit token ids"),
    )
}

/// `path` is in the batched layout when `batched`, in a single-stream one otherwise ([`Driver::open`]).
///
/// Errors: [`SpecError::Setting`] (`max_batch`) naming the folder, its layout and the one needed.
fn check_layout(path: &Path, batched: bool) -> Result<()> {
    let layout = folder_layout(path)?;
    if (layout == Some(KvLayout::BatchedRows)) == batched {
        return Ok(());
    }
    let want = if batched {
        "the batched layout (`specrt convert --attention batched`)"
    } else {
        "the GQA layout"
    };
    Err(SpecError::setting(
        "max_batch",
        format!(
        "{} is not in {want} that this decoder needs (kv_layout {}); target and draft must share one layout, and \
         max_batch > 1 needs the batched one",
        path.display(),
        layout.map_or("None".to_owned(), |l| format!("'{}'", l.as_str())),
    ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::Pipeline;
    use specrt_core::testing::{MockBatchModel, MockModel};
    use specrt_core::{Engine, FinishReason};

    const VOCAB: usize = 48;

    /// A word-level tokenizer over the mock's vocabulary: id i is the word "w{i}", decoded with spaces between.
    fn tokenizer() -> Tokenizer {
        let vocab: Vec<String> = (0..VOCAB).map(|i| format!("\"w{i}\": {i}")).collect();
        let json = format!(
            r#"{{"version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
                "normalizer": null, "pre_tokenizer": {{"type": "Whitespace"}}, "post_processor": null,
                "decoder": null,
                "model": {{"type": "WordLevel", "vocab": {{{}}}, "unk_token": "w0"}}}}"#,
            vocab.join(", ")
        );
        Tokenizer::from_json(&json, "test").unwrap()
    }

    fn models() -> (MockModel, MockModel) {
        let target = MockModel::new(VOCAB, 256, 11, 3.0);
        let draft = target.clone().with_noise(5, 0.5);
        (target, draft)
    }

    fn batch(max_batch: usize) -> Driver {
        let (t, d) = models();
        let engine = BatchEngine::new(
            Box::new(MockBatchModel::new(&t, max_batch)),
            Some(Box::new(MockBatchModel::new(&d, max_batch))),
            BatchOptions::default(),
        )
        .unwrap();
        Driver::from_engine(engine, FolderDefaults::default(), Some(tokenizer()))
    }

    fn solo() -> Pipeline {
        let (t, d) = models();
        let mut p = Pipeline::from_engine(
            Engine::new(Box::new(t), Some(Box::new(d))).unwrap(),
            FolderDefaults::default(),
        );
        p.set_tokenizer(tokenizer());
        p
    }

    fn requests() -> Vec<(String, GenerationRequest)> {
        let base = GenerationRequest {
            max_new_tokens: 20,
            ignore_eos: true,
            ..GenerationRequest::default()
        };
        vec![
            (
                "w1 w2 w3".into(),
                GenerationRequest {
                    temperature: Some(0.0),
                    ..base.clone()
                },
            ),
            (
                "w4 w5".into(),
                GenerationRequest {
                    temperature: Some(1.0),
                    coupled: true,
                    seed: 9,
                    ..base.clone()
                },
            ),
            (
                "w7".into(),
                GenerationRequest {
                    temperature: Some(0.0),
                    num_speculative_tokens: crate::SpeculativeTokens::Fixed(2),
                    ..base.clone()
                },
            ),
        ]
    }

    fn run_all(b: &mut Driver) -> HashMap<u64, (String, String, GenerationOutput)> {
        run_from(b, Vec::new())
    }

    /// [`run_all`] after rounds already run, whose events are `first`.
    fn run_from(
        b: &mut Driver,
        first: Vec<DriverEvent>,
    ) -> HashMap<u64, (String, String, GenerationOutput)> {
        let mut streamed: HashMap<u64, String> = HashMap::new();
        let mut steps: HashMap<u64, StepOutput> = HashMap::new();
        let mut done = HashMap::new();
        let mut pending = Some(first);
        while pending.is_some() || !b.is_idle() {
            let events = match pending.take() {
                Some(first) => first,
                None => b.step().unwrap(),
            };
            for e in events {
                assert!(e.error.is_none(), "{:?}", e.error);
                streamed.entry(e.id).or_default().push_str(&e.text);
                let all = steps.entry(e.id).or_default();
                assert!(
                    all.finish_reason.is_none(),
                    "no event after the one that finished"
                );
                all.tokens.extend(&e.step.tokens);
                all.sources.extend(&e.step.sources);
                all.logprobs.extend(&e.step.logprobs);
                all.finish_reason = e.step.finish_reason;
                if let Some((text, out)) = e.done {
                    // The events' pieces make the output: tokens (cut at a stop string), sources, logprobs.
                    let all = &steps[&e.id];
                    assert_eq!(all.tokens, out.tokens);
                    assert_eq!(all.sources, out.sources);
                    assert_eq!(all.logprobs, out.logprobs);
                    assert_eq!(all.finish_reason, Some(out.finish_reason));
                    done.insert(e.id, (streamed[&e.id].clone(), text, out));
                } else {
                    assert!(
                        e.step.finish_reason.is_none(),
                        "a finish reason comes with the output"
                    );
                }
            }
        }
        done
    }

    #[test]
    fn batched_text_equals_each_request_alone() {
        let mut p = solo();
        let mut b = batch(2); // 3 requests, 2 slots: one waits and joins
        let mut ids = Vec::new();
        for (prompt, r) in requests() {
            ids.push(b.submit_text(&prompt, &r).unwrap());
        }
        let done = run_all(&mut b);
        for ((prompt, r), id) in requests().into_iter().zip(ids) {
            let alone = p.generate_text(&prompt, &r).unwrap();
            let (streamed, text, out) = &done[&id];
            assert_eq!(streamed, text, "the streamed pieces make the text");
            assert_eq!(text, &alone.text);
            assert_eq!(out.tokens, alone.output.tokens);
        }
    }

    #[test]
    fn a_stop_string_cuts_its_request_and_not_the_others() {
        let mut p = solo();
        let (prompt, r) = requests().remove(0);
        let full = p.generate_text(&prompt, &r).unwrap();
        // A stop string from the middle of the text, ending inside a word (a token).
        let words: Vec<&str> = full.text.split(' ').collect();
        let stop = format!("{} {}", words[4], &words[5][..2]);
        let at = full.text.find(&stop).unwrap();
        let stopped = GenerationRequest {
            stop: vec![stop],
            ..r.clone()
        };
        let mut b = batch(2);
        let a = b.submit_text(&prompt, &stopped).unwrap();
        let other = b.submit_text(&prompt, &r).unwrap();
        let done = run_all(&mut b);
        assert_eq!(done[&a].1, full.text[..at]);
        assert_eq!(done[&a].2.finish_reason, FinishReason::Stop);
        assert_eq!(
            done[&a].2.tokens,
            full.output.tokens[..6],
            "kept up to the token ending the stop string"
        );
        assert_eq!(done[&other].1, full.text);
        let alone = p.generate_text(&prompt, &stopped).unwrap();
        assert_eq!(done[&a].1, alone.text);
        assert_eq!(done[&a].2.tokens, alone.output.tokens);
    }

    #[test]
    fn a_bad_request_is_refused_at_submit_and_queues_nothing() {
        let mut b = batch(2);
        let bad = GenerationRequest {
            temperature: Some(-1.0),
            ..GenerationRequest::default()
        };
        let err = b.submit_text("w1", &bad).unwrap_err();
        assert!(err.to_string().contains("temperature"), "{err}");
        let err = b
            .submit_ids(&[1, VOCAB as u32], &GenerationRequest::default())
            .unwrap_err();
        assert!(matches!(err, SpecError::Vocab(_)), "{err}");
        assert!(b.is_idle());
        let (prompt, r) = requests().remove(0);
        let id = b.submit_text(&prompt, &r).unwrap();
        assert_eq!(run_all(&mut b)[&id].2.tokens.len(), 20);
    }

    #[test]
    fn a_cancelled_request_leaves_and_the_others_finish() {
        let mut b = batch(2);
        let (prompt, r) = requests().remove(0);
        let a = b.submit_text(&prompt, &r).unwrap();
        let c = b.submit_text(&prompt, &r).unwrap();
        // (Both prompts prefill and decode in the first round: its events count for `c`.)
        let first = b.step().unwrap();
        assert!(b.cancel(a).unwrap());
        let done = run_from(&mut b, first);
        assert!(!done.contains_key(&a));
        assert_eq!(done[&c].2.tokens.len(), 20);
    }

    #[test]
    fn the_first_event_carries_the_prompt_scores_when_asked() {
        let mut b = batch(2);
        let (prompt, r) = requests().remove(0);
        let scored = GenerationRequest {
            prompt_logprobs: Some(2),
            ..r.clone()
        };
        let a = b.submit_text(&prompt, &scored).unwrap();
        let plain = b.submit_text(&prompt, &r).unwrap();
        let mut first: HashMap<u64, Option<PromptLogprobs>> = HashMap::new();
        let mut later_prompt = false;
        let mut outputs = HashMap::new();
        while !b.is_idle() {
            for e in b.step().unwrap() {
                match first.entry(e.id) {
                    std::collections::hash_map::Entry::Occupied(_) => {
                        later_prompt |= e.prompt.is_some();
                    }
                    std::collections::hash_map::Entry::Vacant(v) => {
                        v.insert(e.prompt.clone());
                    }
                }
                if let Some((_, out)) = e.done {
                    outputs.insert(e.id, out);
                }
            }
        }
        assert!(
            !later_prompt,
            "only the first event carries the prompt's scores"
        );
        assert!(first[&plain].is_none());
        let scores = first[&a].clone().expect("asked for");
        assert_eq!(
            scores.logprobs.len(),
            2,
            "three prompt tokens: two scored positions"
        );
        assert_eq!(scores, outputs[&a].prompt);
    }
}
