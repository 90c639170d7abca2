//! The draft/verify loop: prefill, then rounds of propose (draft model) -> score K + 1 positions (target) ->
//! verify -> commit, with KV bookkeeping by length (see ARCHITECTURE.md, "Authoritative state").
//!
//! Speculative sampling after Leviathan et al. 2023 (arXiv:2211.17192) and Chen et al. 2023 (arXiv:2302.01318).
//! Target-only decoding is the same loop with K = 0: one target row per round, its token counted as a bonus token.
//!
//! The draft never spends an extra pass catching up: the committed tokens it has not seen (the recovered or bonus
//! token, and the last draft token when all K were accepted) are the input of its first pass of the next round.

use std::time::Instant;

use crate::adaptive::RoundKind;
use crate::backend::Backend;
use crate::constrained_round::{ConstrainedScratch, Proposer};
use crate::constraint::{mask_words, Constraint};
use crate::error::{Result, SpecError};
use crate::lookup::LookupProposer;
use crate::prefix::{PrefixReuse, DEFAULT_PREFIX_CACHING};
use crate::request::{
    ms_since, FinishReason, GenerationConfig, GenerationOutput, PromptLogprobs, Request,
    StepOutput, PROMPT_LOGPROBS_CHUNK,
};
use crate::sampling::Sampler;
use crate::stats::Stats;
use crate::suffix::SuffixCache;
use crate::verify::{verify_greedy_ids_into, Verification, VerifyMode, MAX_DRAFT_TOKENS};
use crate::vocab::FittedDraft;

/// A target model, an optional draft model, and the request being decoded. Not thread-safe by itself: a caller
/// sharing one engine between threads serialises the calls (the Python `Decoder` does).
pub struct Engine {
    target: Box<dyn Backend>,
    draft: Option<Box<dyn Backend>>,
    vocab: usize,
    sampler_tgt: Sampler,
    sampler_dft: Sampler,
    // [k, vocab] the distributions the draft tokens of this round were drawn from; grows to the largest K used.
    probs_dft: Vec<f32>,
    // [k] draft tokens of this round.
    tokens_dft: Vec<u32>,
    // [k + 1] target input of this round: the last committed token then the drafts.
    input_tgt: Vec<u32>,
    // Argmax ids of a draft pass ([1]) and of the target pass ([k + 1]) in rounds that need only ids.
    ids_dft: Vec<u32>,
    ids_tgt: Vec<u32>,
    // [vocab] the prefill's last row: the first round's target logits (the prefill reads the whole prompt).
    first_logits: Vec<f32>,
    // The latest prompt prefill's target pass (tokens, ms), kept across requests: auto K's per-token pass cost.
    long_pass: Option<(usize, f64)>,
    // Model-free proposer over the committed tokens (prompt lookup's allocations reused across requests).
    ngram: Option<LookupProposer>,
    // Suffix decoding's cache of earlier requests, shared with whoever else holds it (None: each request's own).
    suffix_cache: Option<std::sync::Arc<SuffixCache>>,
    // Reused result of the round's verification.
    ver: Verification,
    // Constrained requests: the round's masks, masked rows and proposal scratch.
    cons: ConstrainedScratch,
    request: Option<Request>,
    // Reused output of `step`.
    out: StepOutput,
    // Prefix caching: reuse what each cache holds at the next `start`.
    prefix_caching: bool,
    // Token ids whose KV the target / draft cache holds, taken from the last request when the next one starts
    // (while a request runs, its `tokens[..n_past_*]` are the truth and these are empty).
    cached_tgt: Vec<u32>,
    cached_dft: Vec<u32>,
}

impl Engine {
    /// An engine over a target and an optional draft model of the same logits width.
    ///
    /// Errors: [`SpecError::Vocab`] if the draft's vocabulary size differs from the target's (both named).
    pub fn new(target: Box<dyn Backend>, draft: Option<Box<dyn Backend>>) -> Result<Self> {
        Self::with_tokenizer_vocab(target, draft, None)
    }

    /// An engine over a target and an optional draft model of one tokenizer whose size (largest id + 1) is
    /// `tokenizer_vocab` (`None`: unknown): their logits widths may then differ in padding rows beyond it
    /// ([`crate::vocab::check_draft_width`]), and the draft is fitted to the target's width
    /// ([`crate::vocab::FittedDraft`]: q = 0 on the rows it lacks; the output keeps the target's distribution).
    ///
    /// Errors: [`SpecError::Vocab`] if the widths differ otherwise (both named, and the tokenizer's size).
    pub fn with_tokenizer_vocab(
        target: Box<dyn Backend>,
        draft: Option<Box<dyn Backend>>,
        tokenizer_vocab: Option<usize>,
    ) -> Result<Self> {
        let vocab = target.vocab_size();
        let draft = draft
            .map(|d| FittedDraft::fit(d, vocab, tokenizer_vocab))
            .transpose()?;
        Ok(Self {
            target,
            draft,
            vocab,
            sampler_tgt: Sampler::new(vocab),
            sampler_dft: Sampler::new(vocab),
            probs_dft: Vec::new(),
            tokens_dft: Vec::with_capacity(MAX_DRAFT_TOKENS),
            input_tgt: Vec::with_capacity(MAX_DRAFT_TOKENS + 1),
            ids_dft: Vec::with_capacity(1),
            ids_tgt: Vec::with_capacity(MAX_DRAFT_TOKENS + 1),
            first_logits: Vec::new(),
            long_pass: None,
            ngram: None,
            suffix_cache: None,
            ver: Verification::default(),
            cons: ConstrainedScratch::default(),
            request: None,
            out: StepOutput::default(),
            prefix_caching: DEFAULT_PREFIX_CACHING,
            cached_tgt: Vec::new(),
            cached_dft: Vec::new(),
        })
    }

    /// Turn prefix caching on or off ([`DEFAULT_PREFIX_CACHING`]: on). On, [`Engine::start`] reuses each cache's
    /// positions that the new prompt's token ids repeat from the previous generation (its prompt and output, as far
    /// as each model's KV is valid) and prefills only the rest; off, it prefills the whole prompt and forgets what
    /// the caches hold.
    pub fn set_prefix_caching(&mut self, on: bool) {
        self.prefix_caching = on;
        if !on {
            self.cached_tgt.clear();
            self.cached_dft.clear();
        }
    }

    /// Share suffix decoding's cache of earlier requests ([`crate::suffix`]; `None`: each request drafts from its
    /// own text only). Requests that ask for suffix decoding read it and publish their text to it when they end.
    pub fn set_suffix_cache(&mut self, cache: Option<std::sync::Arc<SuffixCache>>) {
        self.suffix_cache = cache;
    }

    /// Whether prefix caching is on ([`Engine::set_prefix_caching`]).
    #[must_use]
    pub fn prefix_caching(&self) -> bool {
        self.prefix_caching
    }

    /// Take from the current (or last) request the token ids whose KV each cache holds: `tokens[..n_past_*]`, cut
    /// to the committed tokens (a round cut by a stop has valid KV for accepted drafts it did not emit).
    fn keep_cached_prefix(&mut self) {
        let Some(req) = self.request.as_ref().filter(|_| self.prefix_caching) else {
            return;
        };
        for (kept, n) in [
            (&mut self.cached_tgt, req.n_past_tgt),
            (&mut self.cached_dft, req.n_past_dft),
        ] {
            kept.clear();
            kept.extend_from_slice(&req.tokens[..n.min(req.tokens.len())]);
        }
    }

    /// The target's logits width: the vocabulary of prompts and outputs (a draft of another width is fitted to
    /// it, [`Engine::with_tokenizer_vocab`]).
    #[must_use]
    pub fn vocab_size(&self) -> usize {
        self.vocab
    }

    /// Whether a draft model is attached.
    #[must_use]
    pub fn has_draft(&self) -> bool {
        self.draft.is_some()
    }

    /// Longest sequence (prompt + new tokens) both caches can hold.
    #[must_use]
    pub fn max_seq_len(&self) -> usize {
        let t = self.target.max_seq_len();
        self.draft.as_ref().map_or(t, |d| t.min(d.max_seq_len()))
    }

    /// Start a generation: validate, prefill the target with the prompt (its last row of logits is the first
    /// round's: that round proposes nothing and runs no pass). The draft reads the prompt in its first drafting
    /// pass (lazily, so the first token never waits for it). Any generation in progress is dropped. With prefix caching
    /// ([`Engine::set_prefix_caching`], on by default) each cache prefills only the prompt positions after the
    /// longest prefix it already holds from the previous generation ([`PrefixReuse`]; counted in
    /// [`Stats::n_cached_tokens`]).
    ///
    /// Errors: [`SpecError::Config`] (empty prompt, bad settings), [`SpecError::Vocab`] (a prompt id >= vocab),
    /// [`SpecError::Length`] (prompt + max_new_tokens beyond [`Engine::max_seq_len`]), backend errors.
    pub fn start(&mut self, prompt: &[u32], cfg: GenerationConfig) -> Result<()> {
        self.start_with(prompt, cfg, None)
    }

    /// [`Engine::start`] with a constraint on the output (structured output, [`crate::constraint`]): every
    /// emitted token is one it allows, EOS only where it accepts, and the generation ends with
    /// [`FinishReason::Grammar`] once it is complete (also under `ignore_eos`, which then masks EOS out). The
    /// constraint must be fresh (no token consumed). Greedy rounds read the models' logits (no `ids_only` rounds).
    ///
    /// Errors: as [`Engine::start`]; [`SpecError::Config`] for a constraint that consumed tokens already.
    pub fn start_with(
        &mut self,
        prompt: &[u32],
        cfg: GenerationConfig,
        constraint: Option<Box<dyn Constraint>>,
    ) -> Result<()> {
        self.keep_cached_prefix();
        self.request = None;
        let mut req = Request::new(prompt, cfg, self.vocab, self.max_seq_len())?;
        if let Some(c) = constraint {
            req.set_constraint(c)?;
            let rows = self.cons.prepare(&req, self.vocab);
            if self.probs_dft.len() < (rows - 1) * self.vocab {
                self.probs_dft.resize((rows - 1) * self.vocab, 0.0);
            }
        }
        let cfg = &req.cfg;
        match cfg.ngram {
            Some(ng) => {
                let shared = self.suffix_cache.as_ref();
                if self.ngram.as_ref().is_none_or(|p| !p.fits(&ng, shared)) {
                    // (the one it replaces publishes its last request to its shared cache, if any, when dropped)
                    self.ngram = Some(LookupProposer::new(&ng, shared)?);
                }
                let p = self.ngram.as_mut().expect("just set");
                p.reset();
                p.extend(prompt);
            }
            None => {
                if let Some(p) = self.ngram.as_mut() {
                    p.reset();
                }
            }
        }
        let t0 = Instant::now();
        let n_prompt = prompt.len();
        let use_draft = self.draft.is_some() && req.may_draft();
        // Prefix caching: positions each cache already holds for this prompt. From here on the caches change, so
        // what they hold is this request's to say (a failed prefill leaves nothing to reuse).
        let reuse = if self.prefix_caching {
            PrefixReuse::of(
                prompt,
                &self.cached_tgt,
                &self.cached_dft,
                req.cfg.prompt_logprobs.is_some(),
            )
        } else {
            PrefixReuse::default()
        };
        self.cached_tgt.clear();
        self.cached_dft.clear();
        // (Reuse leaves at least the last prompt token to feed: its row is the first token's distribution.)
        self.first_logits.clear();
        if req.cfg.prompt_logprobs.is_some() {
            // Scored in chunks, each pass's rows reduced to the values asked for before the next; row r predicts
            // prompt token a + r + 1, the last chunk's last row the first output token.
            for a in (0..n_prompt).step_by(PROMPT_LOGPROBS_CHUNK) {
                let b = (a + PROMPT_LOGPROBS_CHUNK).min(n_prompt);
                let logits = self.target.forward(&prompt[a..b], a, b - a)?;
                let (scored, last) = if b == n_prompt {
                    logits.split_at((b - a - 1) * self.vocab)
                } else {
                    (logits, &[][..])
                };
                req.record_prompt_logprobs(scored, self.vocab, a)?;
                self.first_logits.extend_from_slice(last);
            }
        } else {
            let t_pass = Instant::now();
            let logits = self
                .target
                .forward(&prompt[reuse.n_tgt..], reuse.n_tgt, 1)?;
            self.first_logits.extend_from_slice(logits);
            // A long pass gives auto K the per-token slope of a pass's cost (`KController::observe_long_pass`).
            self.long_pass = Some((n_prompt - reuse.n_tgt, ms_since(t_pass)));
        }
        if let (Some(c), Some((n, ms))) = (req.controller.as_mut(), self.long_pass) {
            c.observe_long_pass(n, ms);
        }
        // Size every per-round buffer for the largest K of this request now, so rounds never allocate.
        let k_max = req.k_max();
        for v in [&mut self.out.tokens, &mut self.ver.tokens] {
            v.reserve(k_max + 1);
        }
        self.out.sources.reserve(k_max + 1);
        self.out.logprobs.reserve(k_max + 1);
        self.ver.accept_probs.reserve(k_max + 1);
        self.ver.row_norms.reserve(k_max + 1);
        if self.draft.is_some() && self.probs_dft.len() < k_max * self.vocab {
            self.probs_dft.resize(k_max * self.vocab, 0.0);
        }
        req.n_past_tgt = n_prompt;
        // The draft holds the reused prefix (a draft this request does not run keeps it for a later request).
        req.n_past_dft = reuse.n_dft;
        req.stats.n_cached_tokens = reuse.n_tgt as u64;
        req.stats.n_cached_tokens_dft = if use_draft { reuse.n_dft as u64 } else { 0 };
        req.stats.prefill_ms = ms_since(t0);
        self.sampler_tgt.inject_fault(req.cfg.fault);
        self.request = Some(req);
        Ok(())
    }

    /// Run one round and commit its tokens; returns what it committed (a buffer reused by the next call). After
    /// the generation finished, returns an empty output with the finish reason.
    ///
    /// Errors: [`SpecError::Config`] if no generation was started; backend, non-finite-logits and verification
    /// errors (the generation is then dropped: its caches are in an unknown state).
    pub fn step(&mut self) -> Result<&StepOutput> {
        if let Err(e) = self.step_inner() {
            self.request = None;
            return Err(e);
        }
        Ok(&self.out)
    }

    #[allow(clippy::too_many_lines)]
    fn step_inner(&mut self) -> Result<()> {
        let vocab = self.vocab;
        let req = self.request.as_mut().ok_or_else(|| {
            SpecError::Config("no generation in progress (call start first)".to_owned())
        })?;
        let out = &mut self.out;
        out.tokens.clear();
        out.sources.clear();
        out.logprobs.clear();
        out.n_drafted = 0;
        out.finish_reason = req.finish_reason;
        if req.finish_reason.is_some() {
            return Ok(());
        }
        let len = req.tokens.len();
        let remaining = req.remaining();
        let draft_usable = self.draft.is_some() && req.cfg.use_draft_model;
        let constrained = req.constraint.is_some();
        let words = mask_words(vocab);
        // Greedy without penalties or log-probabilities: the models' argmax ids are all a round reads (not under a
        // constraint: the mask must see the logits).
        // The first round's target row is the prefill's (`first_logits`): no pass, so no ids-only pass either.
        let first = len == req.n_prompt;
        let ids_only = req.cfg.ids_only() && !constrained && !first;
        // Constrained rounds: mask rows filled so far (row i = the state after d_1 .. d_i), and whether the
        // proposals end the sequence (an EOS or a completing token: no row after it is ever emitted).
        let mut n_masks = 0usize;
        let mut ended = false;
        // K is fixed before any random draw of the round, so the round is lossless whatever K is; it never drafts
        // past max_new_tokens.
        // (A constrained request proposes grammar-forced tokens even without a draft model.)
        // The first round proposes nothing: its token is drawn from the prefill's last row, as the batched engine
        // draws it (`BatchEngine::step`), so both give the same output.
        let k_cap = if !first && (draft_usable || req.cfg.ngram.is_some() || constrained) {
            remaining - 1
        } else {
            0
        };
        let k_fixed = req
            .cfg
            .auto_k
            .as_ref()
            .map_or(req.cfg.num_speculative_tokens, |a| a.k_max)
            .min(k_cap);

        let t_draft = Instant::now();
        self.tokens_dft.clear();
        // Proposals, first choice: the continuation of a matching n-gram (deterministic drafts).
        let mut mode = VerifyMode::Stochastic;
        if let Some(c) = req.controller.as_mut() {
            // What the draft model must read first if it drafts this round (costed by both choices below).
            c.set_draft_backlog(len - req.n_past_dft, req.cfg.ngram.is_some());
            c.set_forced(0);
            c.set_remaining(remaining);
        }
        if let (Some(ng), true) = (self.ngram.as_ref(), req.cfg.ngram.is_some() && k_fixed > 0) {
            let offered = ng.propose(k_fixed, &mut self.tokens_dft);
            // With auto K, verify the length the cost model prefers, or decline the match for the draft model
            // (or a plain target step) when that is predicted to be faster.
            let take = match req.controller.as_mut() {
                Some(c) if offered > 0 => {
                    c.choose_ngram(offered, if draft_usable { k_cap } else { 0 })
                }
                _ => offered,
            };
            self.tokens_dft.truncate(take);
            if constrained && take > 0 {
                // Cut at the first token the constraint refuses; it stays advanced through the rest (rows' masks).
                // (Nothing kept: the draft model may still draft; its masks start at row 0 again.)
                (n_masks, ended) =
                    req.constrain_proposals(&mut self.tokens_dft, &mut self.cons.masks, words)?;
            }
            if !self.tokens_dft.is_empty() {
                mode = VerifyMode::Deterministic;
            }
        }
        // Otherwise the draft model: K sequential passes, the first one feeding every committed token it has not
        // seen (no separate catch-up pass).
        let mut n_draft_passes = 0;
        // (ms, input tokens) of this round's first draft pass.
        let mut first_pass = (0.0, 0usize);
        // Constrained: draft tokens the draft model read this round (set by the constrained proposer).
        let mut n_fed_cons = None;
        req.forced_bits = 0;
        if mode == VerifyMode::Stochastic && constrained && k_fixed > 0 {
            // Grammar-forced tokens (free, verified as point masses) and the draft model's tokens between them.
            if req.controller.is_some() && draft_usable {
                // The forced tokens ahead cost verification rows but no draft pass (auto K prices them).
                let n_forced = req.forced_ahead(&mut self.cons)?;
                if let Some(c) = req.controller.as_mut() {
                    c.set_forced(n_forced);
                }
            }
            let k = match (req.controller.as_mut(), draft_usable) {
                (Some(c), true) => c.choose(k_cap),
                (None, true) => k_fixed,
                (_, false) => 0,
            };
            let cap = Request::constrained_cap(k_fixed, k_cap);
            let sc = &mut self.cons;
            let mut prop = Proposer::begin(req, sc, k, cap, draft_usable);
            let res = (|| -> Result<()> {
                while prop.run_until_pass(
                    req,
                    sc,
                    &mut self.probs_dft,
                    &mut self.tokens_dft,
                    vocab,
                )? {
                    let d_model = self.draft.as_mut().expect("draft_usable");
                    let t_pass = Instant::now();
                    let logits = d_model.forward(&sc.input, prop.n_past, 1)?;
                    let pass_ms = ms_since(t_pass);
                    prop.take_pass(
                        req,
                        sc,
                        logits,
                        pass_ms,
                        &mut self.sampler_dft,
                        &mut self.probs_dft,
                        &mut self.tokens_dft,
                        vocab,
                    )?;
                }
                Ok(())
            })();
            let p = prop.finish(req);
            res?;
            n_masks = p.n_masks;
            ended = p.ended;
            n_draft_passes = p.n_passes;
            first_pass = p.first_pass;
            n_fed_cons = Some(p.n_fed);
        } else if mode == VerifyMode::Stochastic && draft_usable {
            let k = match req.controller.as_mut() {
                Some(c) => c.choose(k_cap),
                None => k_fixed,
            };
            if k > 0 {
                let draft = self.draft.as_mut().expect("draft_usable");
                if self.probs_dft.len() < k * vocab {
                    self.probs_dft.resize(k * vocab, 0.0);
                }
                let n_committed = req.penalties.len();
                let mut n_past = req.n_past_dft;
                let mut prev = [0u32; 1];
                let t_first = Instant::now();
                for i in 0..k {
                    let input: &[u32] = if i == 0 { &req.tokens[n_past..] } else { &prev };
                    let n_input = input.len();
                    let d = if ids_only {
                        draft.forward_argmax(input, n_past, 1, &mut self.ids_dft)?;
                        self.ids_dft[0]
                    } else {
                        let logits = draft.forward(input, n_past, 1)?;
                        let q_row = &mut self.probs_dft[i * vocab..(i + 1) * vocab];
                        req.draft_choice(&mut self.sampler_dft, logits, i, q_row)?
                    };
                    n_past += n_input;
                    self.tokens_dft.push(d);
                    prev[0] = d;
                    if i == 0 {
                        first_pass = (ms_since(t_first), n_input);
                    }
                }
                // A rejected draft leaves no trace in the penalties.
                req.penalties.truncate(n_committed);
                req.n_past_dft = n_past;
                n_draft_passes = k;
            }
        }
        let k = self.tokens_dft.len();
        // Draft tokens the draft model read in this round: d_1 .. d_{K-1} (constrained rounds: those before its
        // last pass, all K when it stopped for lack of mass).
        let n_fed_dft = n_fed_cons.unwrap_or(k.saturating_sub(1));
        if constrained {
            self.cons.bonus_mask(req, k, n_masks, ended, vocab)?;
        }
        let draft_ms = ms_since(t_draft);

        // Target: one pass over the last committed token and the K drafts, K + 1 rows of logits.
        let t_target = Instant::now();
        self.input_tgt.clear();
        self.input_tgt.push(req.tokens[len - 1]);
        self.input_tgt.extend_from_slice(&self.tokens_dft);
        let logits_tgt: &[f32] = if first {
            &self.first_logits
        } else if ids_only {
            self.target
                .forward_argmax(&self.input_tgt, len - 1, k + 1, &mut self.ids_tgt)?;
            &[]
        } else {
            self.target.forward(&self.input_tgt, len - 1, k + 1)?
        };
        let target_ms = ms_since(t_target);

        let t_core = Instant::now();
        let probs_dft: &[f32] = if mode == VerifyMode::Stochastic {
            &self.probs_dft[..k * vocab]
        } else {
            &[]
        };
        // Constrained: verification sees the masked target rows; log-probabilities stay the raw rows'.
        let logits_ver: &[f32] = if constrained {
            self.cons
                .mask_target(req, logits_tgt, &self.tokens_dft, vocab)?
        } else {
            logits_tgt
        };
        let ver = &mut self.ver;
        if ids_only {
            verify_greedy_ids_into(&self.ids_tgt, &self.tokens_dft, vocab, ver)?;
        } else {
            req.verify(
                &mut self.sampler_tgt,
                logits_ver,
                probs_dft,
                &self.tokens_dft,
                mode,
                ver,
            )?;
        }
        let n_acc = ver.n_accepted;
        req.n_past_tgt = len + n_acc;
        if n_draft_passes > 0 {
            // The draft saw the committed prefix and d_1 .. d_{K-1} (all K when it stopped for lack of mass).
            req.n_past_dft = len + n_acc.min(n_fed_dft);
        }
        // (The first round ran no pass: nothing to time.)
        if let (Some(c), false) = (req.controller.as_mut(), first) {
            if mode == VerifyMode::Deterministic {
                c.observe_ngram(k, &ver.accept_probs, target_ms);
            } else {
                // (A forced-only round's acceptances are the forced estimate's.)
                let probs: &[f32] = if n_draft_passes > 0 || req.forced_bits != 0 {
                    &ver.accept_probs
                } else {
                    &[]
                };
                // A catch-up first pass is measured apart: it would inflate the per-pass draft cost.
                let (ms, passes) = if first_pass.1 > 1 {
                    c.observe_catchup(first_pass.0, first_pass.1);
                    (draft_ms - first_pass.0, n_draft_passes - 1)
                } else {
                    (draft_ms, n_draft_passes)
                };
                c.observe_with_forced(k, probs, req.forced_bits, ms, passes, target_ms);
            }
            let kind = if mode == VerifyMode::Deterministic {
                RoundKind::Ngram
            } else if n_draft_passes > 0 {
                RoundKind::Draft
            } else {
                RoundKind::Plain
            };
            c.observe_round(kind, ver.tokens.len(), draft_ms + target_ms);
        }

        req.commit(
            ver,
            logits_tgt,
            vocab,
            k,
            mode,
            (draft_ms, target_ms),
            self.ngram.as_mut(),
            out,
        )?;
        req.stats.core_ms += ms_since(t_core);
        Ok(())
    }

    /// Keep only the first `n_keep` generated tokens and finish with [`FinishReason::Stop`] (the caller matched a
    /// stop string). Statistics then count only the kept tokens.
    ///
    /// Errors: [`SpecError::Config`] if no generation was started or `n_keep` exceeds the generated count.
    pub fn stop_at(&mut self, n_keep: usize) -> Result<()> {
        let req = self.request.as_mut().ok_or_else(|| {
            SpecError::Config("no generation in progress (call start first)".to_owned())
        })?;
        req.stop_at(n_keep, self.ngram.as_mut())
    }

    /// What the last [`Engine::step`] committed.
    #[must_use]
    pub fn last_step(&self) -> &StepOutput {
        &self.out
    }

    /// Statistics of the current (or last) generation.
    #[must_use]
    pub fn stats(&self) -> Option<&Stats> {
        self.request.as_ref().map(|r| &r.stats)
    }

    /// The prompt scores of the current (or last) generation ([`GenerationConfig::prompt_logprobs`]; empty lists
    /// without it), complete once [`Engine::start`] returned.
    #[must_use]
    pub fn prompt_logprobs(&self) -> Option<&PromptLogprobs> {
        self.request.as_ref().map(|r| &r.prompt_scores)
    }

    /// Whether the current generation has finished (`None` when there is none).
    #[must_use]
    pub fn finish_reason(&self) -> Option<FinishReason> {
        self.request.as_ref().and_then(|r| r.finish_reason)
    }

    /// The result of the current (or last) generation.
    ///
    /// Errors: [`SpecError::Config`] if none was started or it has not finished.
    pub fn output(&self) -> Result<GenerationOutput> {
        let req = self.request.as_ref().ok_or_else(|| {
            SpecError::Config("no generation in progress (call start first)".to_owned())
        })?;
        req.output()
    }

    /// Generate to the end: [`Engine::start`], then [`Engine::step`] until finished. `on_step` sees each round's
    /// committed tokens as they are committed (streaming) and may return `false` to stop early
    /// ([`FinishReason::Stop`]).
    ///
    /// Errors: as [`Engine::start`] and [`Engine::step`].
    pub fn generate(
        &mut self,
        prompt: &[u32],
        cfg: GenerationConfig,
        on_step: impl FnMut(&StepOutput) -> bool,
    ) -> Result<GenerationOutput> {
        self.generate_with(prompt, cfg, None, on_step)
    }

    /// [`Engine::generate`] with a constraint on the output ([`Engine::start_with`]).
    ///
    /// Errors: as [`Engine::start_with`] and [`Engine::step`].
    pub fn generate_with(
        &mut self,
        prompt: &[u32],
        cfg: GenerationConfig,
        constraint: Option<Box<dyn Constraint>>,
        mut on_step: impl FnMut(&StepOutput) -> bool,
    ) -> Result<GenerationOutput> {
        self.start_with(prompt, cfg, constraint)?;
        while self.finish_reason().is_none() {
            let out = self.step()?;
            if !on_step(out) && out.finish_reason.is_none() {
                let n = self.request.as_ref().map_or(0, |r| r.sources.len());
                self.stop_at(n)?;
            }
        }
        self.output()
    }
}
