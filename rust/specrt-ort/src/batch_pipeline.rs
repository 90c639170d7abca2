//! [`BatchPipeline`]: many requests at once from Rust, text in and text out: submit requests (each resolved and
//! checked at once by the one resolver), call [`BatchPipeline::step`] to run one batched round, and receive each
//! request's [`BatchEvent`]s (its new text, the tokens, and on its last event the output). Stop strings are cut
//! per request (the engine's row is cut back with `stop_at`), and one request's bad settings or failure never
//! touches the others.
//!
//! ```no_run
//! use std::path::Path;
//! use specrt_ort::{find_ort_library, BatchPipeline, GenerationRequest, OrtOptions};
//!
//! let options = OrtOptions::new(find_ort_library(None)?);
//! let mut batch = BatchPipeline::load(
//!     Path::new("/models/smollm2-135m-instruct/fp32-B"), // the batched layout (`specrt convert --attention batched`)
//!     None,
//!     &options,
//!     4,   // max_batch
//!     256, // prefill_chunk
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

use specrt_core::{BatchBackend, BatchEngine, BatchOptions};
use specrt_core::{GenerationOutput, Result, SpecError};
use specrt_text::detok::{RoundEnd, TextAssembler, TextOptions};
use specrt_text::tokenizer::Tokenizer;

use crate::batched::BatchedOrtBackend;
use crate::model::resolve_model_file;
use crate::options::OrtOptions;
use crate::pipeline::{check_same_folders, resolve_request, FolderDefaults, GenerationRequest};

/// What one round brought one request.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchEvent {
    /// The request's id ([`BatchPipeline::submit_text`]'s).
    pub id: u64,
    /// Text to show now (empty for a request submitted as ids without a tokenizer, or while text is held back:
    /// a partial UTF-8 character or a possible partial stop string).
    pub text: String,
    /// The token ids the round committed for it (before a stop-string cut).
    pub tokens: Vec<u32>,
    /// On the request's last event: its whole text (cut before a stop string) and output (tokens cut at the
    /// token holding a stop string's last character; finish reason, statistics). The request is then gone.
    pub done: Option<(String, GenerationOutput)>,
    /// The request failed in this round (it has left the batch; the others go on).
    pub error: Option<SpecError>,
}

/// A batched engine over a target (and optional draft) model folder in the batched layout, with the target
/// folder's defaults and tokenizer.
pub struct BatchPipeline {
    engine: BatchEngine,
    defaults: FolderDefaults,
    tokenizer: Option<Tokenizer>,
    texts: HashMap<u64, Option<TextAssembler>>,
    next_id: u64,
}

impl BatchPipeline {
    /// Load a target folder (and an optional draft, loaded with [`OrtOptions::for_draft`]) converted with
    /// `--attention batched`, holding up to `max_batch` rows; `prefill_chunk` = most prompt tokens a joining request
    /// prefills per round.
    ///
    /// Errors: as [`crate::Pipeline::load`], and [`SpecError::Config`] for a folder not in the batched layout or a
    /// zero `prefill_chunk`.
    pub fn load(
        target: &Path,
        draft: Option<&Path>,
        options: &OrtOptions,
        max_batch: usize,
        prefill_chunk: usize,
    ) -> Result<Self> {
        let target_file = resolve_model_file(target)?;
        let defaults = FolderDefaults::read(&target_file)?;
        if let Some(d) = draft {
            check_same_folders(&target_file, &resolve_model_file(d)?)?;
        }
        let t = BatchedOrtBackend::new(&target_file, options, max_batch)?;
        let d = match draft {
            Some(p) => Some(
                Box::new(BatchedOrtBackend::new(p, &options.for_draft(), max_batch)?)
                    as Box<dyn BatchBackend>,
            ),
            None => None,
        };
        let engine = BatchEngine::new(
            Box::new(t),
            d,
            BatchOptions {
                prefill_chunk,
                ..BatchOptions::default()
            },
        )?;
        let tokenizer = crate::pipeline::folder_tokenizer(&target_file)?;
        Ok(Self::from_engine(engine, defaults, tokenizer))
    }

    /// A pipeline over a batched engine built elsewhere (mock models in tests).
    #[must_use]
    pub fn from_engine(
        engine: BatchEngine,
        defaults: FolderDefaults,
        tokenizer: Option<Tokenizer>,
    ) -> Self {
        Self {
            engine,
            defaults,
            tokenizer,
            texts: HashMap::new(),
            next_id: 0,
        }
    }

    /// The target folder's tokenizer, if it has one.
    #[must_use]
    pub fn tokenizer(&self) -> Option<&Tokenizer> {
        self.tokenizer.as_ref()
    }

    /// Rows the batch holds.
    #[must_use]
    pub fn max_batch(&self) -> usize {
        self.engine.max_batch()
    }

    /// Whether no request is running or waiting.
    #[must_use]
    pub fn is_idle(&self) -> bool {
        self.texts.is_empty()
    }

    /// Queue a text prompt (encoded with the target folder's tokenizer, special tokens added as its post-processor
    /// says). Returns the request's id. Resolved and checked now (the one resolver); it joins the batch at a
    /// later [`BatchPipeline::step`] with a free slot.
    ///
    /// Errors: [`SpecError::Config`] without a tokenizer; otherwise as [`BatchPipeline::submit_ids`].
    pub fn submit_text(&mut self, prompt: &str, request: &GenerationRequest) -> Result<u64> {
        let tokenizer = self.tokenizer.as_ref().ok_or_else(|| {
            SpecError::Config("this pipeline has no tokenizer; submit token ids".to_owned())
        })?;
        let ids = tokenizer.encode(prompt, true)?;
        self.submit_ids(&ids, request)
    }

    /// Queue a prompt of token ids; its output is text too when the pipeline has a tokenizer (stop strings need
    /// one). Returns the request's id.
    ///
    /// Errors: as [`resolve_request`] (settings), [`SpecError::Config`] / [`SpecError::Vocab`] /
    /// [`SpecError::Length`] for the prompt ([`specrt_core::check_prompt`]), [`SpecError::Config`] for stop strings
    /// without a tokenizer. Nothing is queued on an error.
    pub fn submit_ids(&mut self, prompt_ids: &[u32], request: &GenerationRequest) -> Result<u64> {
        if request.constraint.is_some() {
            return Err(SpecError::Config(
                "structured output (constraint) is not supported by batched rounds yet; use Pipeline".to_owned(),
            ));
        }
        let cfg = resolve_request(
            request,
            &self.defaults,
            self.engine.has_draft(),
            Some(self.engine.vocab_size()),
        )?;
        let text = match &self.tokenizer {
            Some(t) => Some(TextAssembler::new(
                t.clone(),
                request.stop.clone(),
                TextOptions::default(),
            )?),
            None if !request.stop.is_empty() => {
                return Err(SpecError::Config(
                    "stop strings need text: this pipeline has no tokenizer".to_owned(),
                ))
            }
            None => None,
        };
        let id = self.next_id;
        self.engine.add(id, prompt_ids, cfg)?;
        self.next_id += 1;
        self.texts.insert(id, text);
        Ok(id)
    }

    /// Remove a request now (running or waiting); returns whether it was known.
    ///
    /// Errors: [`SpecError::Backend`] if moving another row's cache into the freed slot fails.
    pub fn cancel(&mut self, id: u64) -> Result<bool> {
        let known = self.texts.remove(&id).is_some();
        Ok(self.engine.cancel(id)? || known)
    }

    /// Run one batched round; returns an event for each request that committed tokens, finished or failed.
    ///
    /// Errors: [`SpecError::Backend`] / [`SpecError::NonFinite`] when the round itself fails (every running
    /// request is then failed); a single request's failure is its event's `error`.
    pub fn step(&mut self) -> Result<Vec<BatchEvent>> {
        let steps = self.engine.step()?.to_vec();
        let mut events = Vec::with_capacity(steps.len());
        for row in steps {
            let id = row.id;
            if let Some(error) = row.error {
                self.texts.remove(&id);
                events.push(BatchEvent {
                    id,
                    text: String::new(),
                    tokens: Vec::new(),
                    done: None,
                    error: Some(error),
                });
                continue;
            }
            let end = RoundEnd::from_finish(row.out.finish_reason);
            let tokens = row.out.tokens;
            let (text, finished) = match self.texts.get_mut(&id) {
                Some(Some(assembler)) => {
                    let delta = assembler.feed(&tokens, end)?;
                    if let Some(hit) = &delta.stop {
                        self.engine.stop_at(id, hit.n_keep)?;
                    }
                    (delta.text, delta.finished)
                }
                _ => (String::new(), end != RoundEnd::Continue),
            };
            let done = if finished {
                let assembler = self.texts.remove(&id).flatten();
                let output = self.engine.take_output(id).ok_or_else(|| {
                    SpecError::Internal(format!("request {id} finished without an output"))
                })?;
                Some((
                    assembler.map(|a| a.text().to_owned()).unwrap_or_default(),
                    output,
                ))
            } else {
                None
            };
            events.push(BatchEvent {
                id,
                text,
                tokens,
                done,
                error: None,
            });
        }
        Ok(events)
    }
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

    fn batch(max_batch: usize) -> BatchPipeline {
        let (t, d) = models();
        let engine = BatchEngine::new(
            Box::new(MockBatchModel::new(&t, max_batch)),
            Some(Box::new(MockBatchModel::new(&d, max_batch))),
            BatchOptions::default(),
        )
        .unwrap();
        BatchPipeline::from_engine(engine, FolderDefaults::default(), Some(tokenizer()))
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

    fn run_all(b: &mut BatchPipeline) -> HashMap<u64, (String, String, GenerationOutput)> {
        let mut streamed: HashMap<u64, String> = HashMap::new();
        let mut done = HashMap::new();
        while !b.is_idle() {
            for e in b.step().unwrap() {
                assert!(e.error.is_none(), "{:?}", e.error);
                streamed.entry(e.id).or_default().push_str(&e.text);
                if let Some((text, out)) = e.done {
                    done.insert(e.id, (streamed[&e.id].clone(), text, out));
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
        b.step().unwrap();
        assert!(b.cancel(a).unwrap());
        let done = run_all(&mut b);
        assert!(!done.contains_key(&a));
        assert_eq!(done[&c].2.tokens.len(), 20);
    }
}
