//! Batched rounds: several requests ("rows") share each draft pass and the target's verification pass of a round
//! (ARCHITECTURE.md, "Batched rounds"), with continuous batching: a finished row leaves and a waiting request joins
//! at the next round.
//!
//! Each row keeps everything the single-request [`crate::Engine`] keeps: its own committed tokens, cache lengths in
//! both models (a rejected draft is rolled back by a smaller `n_past`, per row), sampling settings, seeded random
//! stream, penalties, stop ids and statistics. Rows accept different numbers of tokens in the same round (0 for one,
//! K for another) and draft different K (their own `num_speculative_tokens`, capped by what they may still emit);
//! a row that drafts fewer tokens than the others sits the later draft passes out. Verification is the same
//! per-row modified rejection sampling (Leviathan et al. 2023, arXiv:2211.17192) or coupled choice as the
//! single-request engine, so each row's output is exactly what that row would produce alone with the same seed and
//! the same K per round, on a backend that computes the same logits batched as alone.
//!
//! A joining request's prompt is prefilled in chunks of at most `prefill_chunk` tokens before the round's draft
//! passes; a round prefills chunks of the joining prompts (in slot order, a row's chunks before the next row's)
//! while they fit in `max_prefill_tokens` (at least one chunk a round), so requests arriving together start decoding
//! in fewer rounds (SGLang's `--max-prefill-tokens`, vLLM's `max_num_batched_tokens`): the rows already decoding wait
//! at most that many prompt tokens' prefill per round.
//!
//! K for rows with `auto_k`: chosen once per round for the whole batch by a [`KController`] kept per batch size (the
//! number of slots a pass runs), from the draft and verification costs measured at that batch size and the pooled
//! acceptance of the batch: at batch size B a round emits about `B E(K)` tokens for `K c_q(B) + c_verify(B, K + 1)`,
//! whose best K is the controller's choice at those costs. The first rounds at a new batch size are plain (K = 0)
//! until a plain pass is timed twice: a plain pass's cost extrapolated from long passes is overstated once a batched
//! pass is compute-bound. A size first reached below a larger one (rows finishing) skips those plain rounds: it starts
//! from the larger size's target costs, scaled to its own as it times them. It goes down to K = 0 when speculation
//! does not pay at that load (probing now and then).
//!
//! Constrained rows ([`BatchEngine::add_with`], structured output): each row its own constraint, with the round of
//! the single-request engine from the same code (`constrained_round.rs`): its forced tokens proposed as free drafts up to
//! its next draft position, then the batched draft pass it shares with the other rows, masked draft and target rows.
//! Auto K prices the forced tokens ahead of the auto rows (the largest count: the pass is as long as its longest
//! row) and pools their acceptance apart from the drafts'.
//!
//! Errors: a backend failure ends every running row (its caches are in an unknown state) and is returned by
//! [`BatchEngine::step`]; an error of one row's sampling, verification or constraint (non-finite logits, a matcher
//! failure, ...) ends that row only and is reported in its [`RowStep`].

use std::collections::VecDeque;
use std::time::Instant;

use crate::adaptive::{is_forced, AutoK, KController};
use crate::backend::{BatchBackend, BatchRow};
use crate::constrained_round::{ConstrainedProposal, ConstrainedScratch, Proposer};
use crate::constraint::{mask_words, Constraint};
use crate::error::{Result, SpecError};
use crate::lookup::LookupProposer;
use crate::prefix::{PrefixPool, DEFAULT_PREFIX_CACHE_BYTES, DEFAULT_PREFIX_CACHING};
use crate::request::{
    ms_since, GenerationConfig, GenerationOutput, PromptLogprobs, Request, StepOutput,
};
use crate::request_engine::{id_in_use, RequestEngine, RowStep};
use crate::sampling::Sampler;
use crate::stats::Stats;
use crate::suffix::SuffixCache;
use crate::verify::{Verification, VerifyMode};
use crate::vocab::FittedBatchDraft;

/// A draft with at most this many committed tokens to read catches up inside its first drafting pass (right-padded
/// with the other rows); further behind, it catches up in a separate pass first ([`BatchEngine::step`]).
const CATCHUP_INLINE: usize = 4;

/// Most plain rounds run at a new batch size to time a plain pass before auto K chooses.
const PLAIN_FIRST: usize = 4;

/// Default of [`BatchOptions::max_prefill_tokens`]: one chunk of the default `prefill_chunk` (256), so the running
/// rows wait at most one chunk's prefill a round, while joining prompts shorter than that (a prefix-cache hit's rest,
/// short questions) share a round. More prefills several long prompts in one round: fewer rounds to their first
/// tokens, but each chunk is its own pass, so on a CPU it does not make them cheaper, and the earliest of them waits
/// for the others (benches/RESULTS.md: mean TTFT of 16 long prompts at once was higher with 1024 than with 256).
pub const DEFAULT_MAX_PREFILL_TOKENS: usize = 256;

/// Settings of a [`BatchEngine`].
#[derive(Clone, Debug, PartialEq)]
pub struct BatchOptions {
    /// Most prompt tokens a joining request prefills per pass (>= 1): the unit its prompt is prefilled in.
    pub prefill_chunk: usize,
    /// Most prompt tokens prefilled per round over all joining requests ([`BatchOptions::MAX_PREFILL_TOKENS`];
    /// [`DEFAULT_MAX_PREFILL_TOKENS`]): chunks are taken in slot order while they fit, the round's first always
    /// (so a value below `prefill_chunk` prefills one chunk a round). The longest the running rows wait per round.
    /// Chunk boundaries do not depend on it, so neither do the outputs.
    pub max_prefill_tokens: usize,
    /// Cost-model settings of the per-batch-size K controllers (used by rows with `auto_k`; each row's own
    /// `auto_k.k_max` caps its K further).
    pub auto_k: AutoK,
    /// Prefix caching ([`DEFAULT_PREFIX_CACHING`]: on): a row that leaves the batch has the KV of its valid prefix
    /// copied into the prefix store, and a joining request whose prompt begins with a stored prefix has it copied
    /// into its slot and prefills only the rest (ARCHITECTURE.md, "Prefix caching").
    pub prefix_caching: bool,
    /// Budget of the prefix store in bytes, target and draft together ([`DEFAULT_PREFIX_CACHE_BYTES`]); the least
    /// recently used prefixes are dropped to stay within it, and a prefix larger than it is not kept. 0 = keep
    /// nothing.
    pub prefix_cache_bytes: usize,
}

impl BatchOptions {
    /// `max_prefill_tokens`' allowed values, as messages word them.
    pub const MAX_PREFILL_TOKENS: &'static str = "an integer >= 1";

    /// Check the options.
    ///
    /// Errors: [`SpecError::Setting`] naming the option, its value and the allowed values; the auto K settings'
    /// errors ([`AutoK::validate`]).
    pub fn validate(&self) -> Result<()> {
        if self.prefill_chunk == 0 {
            return Err(SpecError::setting(
                "prefill_chunk",
                "prefill_chunk 0 is invalid (expected >= 1)",
            ));
        }
        if self.max_prefill_tokens == 0 {
            return Err(SpecError::setting(
                "max_prefill_tokens",
                format!(
                    "max_prefill_tokens 0 is invalid (expected {})",
                    Self::MAX_PREFILL_TOKENS
                ),
            ));
        }
        self.auto_k.validate()
    }
}

impl Default for BatchOptions {
    fn default() -> Self {
        Self {
            prefill_chunk: 256,
            max_prefill_tokens: DEFAULT_MAX_PREFILL_TOKENS,
            auto_k: AutoK::default(),
            prefix_caching: DEFAULT_PREFIX_CACHING,
            prefix_cache_bytes: DEFAULT_PREFIX_CACHE_BYTES,
        }
    }
}

/// One request in the batch.
struct Row {
    id: u64,
    req: Request,
    ngram: Option<LookupProposer>,
    // Prompt tokens (of the n_prompt - 1 to prefill) in the caches so far.
    prefilled: usize,
    // Whether the prefix store was searched for its prompt (at its first prefill chunk, not at admission: a row
    // admitted in the same round as one sharing its prompt's head finds that row's prompt, stored once prefilled).
    looked_up: bool,
    // Whether the draft model's cache is kept for this row.
    use_draft: bool,
    // [k_max, vocab] the distributions this round's draft tokens were drawn from.
    probs_dft: Vec<f32>,
    // [k] this round's draft tokens; `k_plan` of them are drafted by the draft model (0 when n-gram or none).
    tokens_dft: Vec<u32>,
    k_plan: usize,
    mode: VerifyMode,
    // [k + 1] target input of this round.
    input_tgt: Vec<u32>,
    // Committed tokens' penalty-context length before drafting.
    n_committed: usize,
    failed: Option<SpecError>,
    // Constrained rows: the round scratch; whether this round's proposals come from `proposer` (forced tokens and
    // the draft model's masked samples, at most `cons_cap`), whether it waits for a draft pass, and what the
    // round's proposals were (mask rows, end, draft passes).
    cons: Option<Box<ConstrainedScratch>>,
    cons_propose: bool,
    cons_cap: usize,
    proposer: Option<Proposer>,
    needs_pass: bool,
    proposal: ConstrainedProposal,
}

impl Row {
    /// Prompt positions the prefill feeds: all of them; the last chunk's last row is the first token's
    /// distribution, committed in the prefill step ([`BatchEngine::commit_first`]).
    fn prefill_target(&self) -> usize {
        self.req.n_prompt
    }

    fn decoding(&self) -> bool {
        self.prefilled >= self.prefill_target()
            && self.req.finish_reason.is_none()
            && self.failed.is_none()
    }
}

/// Target and optional draft models with per-slot caches, the rows decoding in them and the requests waiting.
/// Not thread-safe by itself: a caller sharing one engine between threads serialises the calls.
pub struct BatchEngine {
    target: Box<dyn BatchBackend>,
    draft: Option<Box<dyn BatchBackend>>,
    vocab: usize,
    max_batch: usize,
    opts: BatchOptions,
    sampler_tgt: Sampler,
    sampler_dft: Sampler,
    ver: Verification,
    // rows[i] holds cache slot i in both models.
    rows: Vec<Row>,
    waiting: VecDeque<Row>,
    finished: Vec<(u64, Request)>,
    // [max_batch + 1] K controllers by batch size (slots in a pass), and the plain rounds each ran to time a plain
    // pass first.
    controllers: Vec<Option<KController>>,
    plain_first: Vec<usize>,
    // The latest prefill chunk's target pass (tokens, ms): auto K's per-token pass cost.
    long_pass: Option<(usize, f64)>,
    steps: Vec<RowStep>,
    // A step committed first tokens from prefills and returned before its round: the next step runs that round
    // first (no admission, no prefill), so rows decoding never lose a round to a joining prompt.
    round_due: bool,
    // The index of the prefix store (the KV copies live in the backends).
    pool: PrefixPool,
    // Suffix decoding's cache of earlier requests (None: each request drafts from its own text).
    suffix_cache: Option<std::sync::Arc<SuffixCache>>,
}

impl BatchEngine {
    /// An engine over a target and an optional draft model (both batched). The batch holds
    /// `min(target.max_batch(), draft.max_batch())` rows.
    ///
    /// Errors: [`SpecError::Vocab`] if the vocabulary sizes differ; [`SpecError::Config`] for bad options.
    pub fn new(
        target: Box<dyn BatchBackend>,
        draft: Option<Box<dyn BatchBackend>>,
        opts: BatchOptions,
    ) -> Result<Self> {
        Self::with_tokenizer_vocab(target, draft, opts, None)
    }

    /// [`BatchEngine::new`] for a target and draft of one tokenizer whose size (largest id + 1) is
    /// `tokenizer_vocab`: their logits widths may differ in padding rows beyond it, as in
    /// [`crate::Engine::with_tokenizer_vocab`] (the draft fitted to the target's width,
    /// [`crate::vocab::FittedBatchDraft`]).
    ///
    /// Errors: as [`BatchEngine::new`] ([`crate::vocab::check_draft_width`]'s message for the widths).
    pub fn with_tokenizer_vocab(
        target: Box<dyn BatchBackend>,
        draft: Option<Box<dyn BatchBackend>>,
        opts: BatchOptions,
        tokenizer_vocab: Option<usize>,
    ) -> Result<Self> {
        let vocab = target.vocab_size();
        let draft = draft
            .map(|d| FittedBatchDraft::fit(d, vocab, tokenizer_vocab))
            .transpose()?;
        opts.validate()?;
        let max_batch = draft.as_ref().map_or(target.max_batch(), |d| {
            d.max_batch().min(target.max_batch())
        });
        Ok(Self {
            target,
            draft,
            vocab,
            max_batch,
            sampler_tgt: Sampler::new(vocab),
            sampler_dft: Sampler::new(vocab),
            ver: Verification::default(),
            rows: Vec::with_capacity(max_batch),
            waiting: VecDeque::new(),
            finished: Vec::new(),
            controllers: vec![None; max_batch + 1],
            plain_first: vec![0; max_batch + 1],
            long_pass: None,
            round_due: false,
            steps: Vec::with_capacity(max_batch),
            pool: PrefixPool::new(opts.prefix_cache_bytes),
            suffix_cache: None,
            opts,
        })
    }

    /// The target's logits width: the vocabulary of prompts and outputs (a draft of another width is fitted to
    /// it, [`BatchEngine::with_tokenizer_vocab`]).
    #[must_use]
    pub fn vocab_size(&self) -> usize {
        self.vocab
    }

    /// Whether a draft model is attached.
    #[must_use]
    pub fn has_draft(&self) -> bool {
        self.draft.is_some()
    }

    /// Share suffix decoding's cache of earlier requests ([`crate::suffix`]; `None`: each request drafts from its
    /// own text only). Rows that ask for suffix decoding read it and publish their text to it when they leave.
    pub fn set_suffix_cache(&mut self, cache: Option<std::sync::Arc<SuffixCache>>) {
        self.suffix_cache = cache;
    }

    /// Most rows decoding at once (cache slots).
    #[must_use]
    pub fn max_batch(&self) -> usize {
        self.max_batch
    }

    /// Longest sequence (prompt + new tokens) both models' slots can hold.
    #[must_use]
    pub fn max_seq_len(&self) -> usize {
        let t = self.target.max_seq_len();
        self.draft.as_ref().map_or(t, |d| t.min(d.max_seq_len()))
    }

    /// Rows in the batch (prefilling or decoding).
    #[must_use]
    pub fn n_running(&self) -> usize {
        self.rows.len()
    }

    /// Requests waiting for a slot.
    #[must_use]
    pub fn n_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Whether nothing is running or waiting.
    #[must_use]
    pub fn is_idle(&self) -> bool {
        self.rows.is_empty() && self.waiting.is_empty()
    }

    /// Queue a request under `id` (unique among requests not yet taken with [`BatchEngine::take_output`]). It is
    /// validated now and joins the batch at the next [`BatchEngine::step`] with a free slot.
    ///
    /// Errors: [`SpecError::Config`] (a duplicate id, an empty prompt, bad settings), [`SpecError::Vocab`] (a prompt
    /// id >= vocab), [`SpecError::Length`] (prompt + max_new_tokens beyond [`BatchEngine::max_seq_len`]).
    pub fn add(&mut self, id: u64, prompt: &[u32], cfg: GenerationConfig) -> Result<()> {
        self.add_with(id, prompt, cfg, None)
    }

    /// [`BatchEngine::add`] with a constraint on the output (structured output, [`crate::constraint`]), with the
    /// round semantics of [`crate::Engine::start_with`]: every emitted token is one it allows, EOS only where it
    /// accepts, forced tokens proposed as free drafts, and the request ends with [`crate::FinishReason::Grammar`]
    /// once it is complete. A matcher error in a round ends this row only (reported in its [`RowStep`]).
    ///
    /// Errors: as [`BatchEngine::add`]; [`SpecError::Config`] for a constraint that consumed tokens already.
    pub fn add_with(
        &mut self,
        id: u64,
        prompt: &[u32],
        cfg: GenerationConfig,
        constraint: Option<Box<dyn Constraint>>,
    ) -> Result<()> {
        if self.knows(id) {
            return Err(id_in_use(id));
        }
        let mut req = Request::new(prompt, cfg, self.vocab, self.max_seq_len())?;
        req.controller = None; // the batch chooses K
        let ngram = match req.cfg.ngram {
            Some(ng) => {
                // (a suffix proposer publishes the request's text to the shared cache when its row is dropped)
                let mut p = LookupProposer::new(&ng, self.suffix_cache.as_ref())?;
                p.extend(prompt);
                Some(p)
            }
            None => None,
        };
        let use_draft = self.draft.is_some() && req.may_draft();
        let k_max = req.k_max();
        // A constrained row's q rows also hold its forced tokens' one-hot rows (with or without a draft).
        let (cons, q_rows) = match constraint {
            Some(c) => {
                req.set_constraint(c)?;
                let mut sc = Box::<ConstrainedScratch>::default();
                let rows = sc.prepare(&req, self.vocab);
                (Some(sc), (rows - 1).max(k_max))
            }
            None => (None, if use_draft { k_max } else { 0 }),
        };
        self.waiting.push_back(Row {
            id,
            ngram,
            prefilled: 0,
            looked_up: false,
            use_draft,
            probs_dft: vec![0.0; q_rows * self.vocab],
            tokens_dft: Vec::with_capacity(k_max),
            k_plan: 0,
            mode: VerifyMode::Stochastic,
            input_tgt: Vec::with_capacity(k_max + 1),
            n_committed: 0,
            failed: None,
            cons,
            cons_propose: false,
            cons_cap: 0,
            proposer: None,
            needs_pass: false,
            proposal: ConstrainedProposal::default(),
            req,
        });
        Ok(())
    }

    fn knows(&self, id: u64) -> bool {
        self.rows.iter().any(|r| r.id == id)
            || self.waiting.iter().any(|r| r.id == id)
            || self.finished.iter().any(|(i, _)| *i == id)
    }

    /// Remove a running or waiting request now (its slot is free for the next round); a finished one's output is
    /// dropped. Returns whether `id` was known.
    ///
    /// Errors: [`SpecError::Backend`] if moving another row's cache into the freed slot fails.
    pub fn cancel(&mut self, id: u64) -> Result<bool> {
        if let Some(i) = self.waiting.iter().position(|r| r.id == id) {
            self.waiting.remove(i);
            return Ok(true);
        }
        if let Some(i) = self.finished.iter().position(|(r, _)| *r == id) {
            self.finished.swap_remove(i);
            return Ok(true);
        }
        match self.rows.iter().position(|r| r.id == id) {
            Some(i) => {
                self.retire(i)?; // a running row has not finished: it is dropped
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Keep only the first `n_keep` generated tokens of request `id` and finish it with
    /// [`crate::FinishReason::Stop`] (the caller matched a stop string): a running request leaves the batch now; a
    /// request that finished in the last round (its stop string found in that round's text) is cut back in place.
    ///
    /// Errors: [`SpecError::Config`] for an id neither running nor finished, or `n_keep` beyond its generated count.
    pub fn stop_at(&mut self, id: u64, n_keep: usize) -> Result<()> {
        if let Some((_, req)) = self.finished.iter_mut().find(|(r, _)| *r == id) {
            return req.stop_at(n_keep, None);
        }
        let i = self.rows.iter().position(|r| r.id == id).ok_or_else(|| {
            SpecError::Config(format!(
                "request id {id} is neither running nor finished (expected an id given to add)"
            ))
        })?;
        let row = &mut self.rows[i];
        row.req.stop_at(n_keep, row.ngram.as_mut())?;
        self.retire(i)
    }

    /// The result of finished request `id`, removed from the engine (`None` if it is not finished or unknown).
    pub fn take_output(&mut self, id: u64) -> Option<GenerationOutput> {
        let i = self.finished.iter().position(|(r, _)| *r == id)?;
        let (_, req) = self.finished.swap_remove(i);
        req.output().ok()
    }

    /// The prompt scores of a running or finished request ([`GenerationConfig::prompt_logprobs`]; complete once its
    /// prompt is prefilled, i.e. from its first emitted token on).
    #[must_use]
    pub fn prompt_logprobs(&self, id: u64) -> Option<&crate::PromptLogprobs> {
        self.request(id).map(|q| &q.prompt_scores)
    }

    /// The state of a running or finished request.
    fn request(&self, id: u64) -> Option<&Request> {
        self.rows
            .iter()
            .find(|r| r.id == id)
            .map(|r| &r.req)
            .or_else(|| self.finished.iter().find(|(r, _)| *r == id).map(|(_, q)| q))
    }

    /// Statistics so far of a running or finished request.
    #[must_use]
    pub fn stats(&self, id: u64) -> Option<&Stats> {
        self.request(id).map(|q| &q.stats)
    }

    /// The current per-token acceptance estimate and last choice inputs of the K controller at batch size `b`
    /// (`None` before auto-K rows ran at that size).
    #[must_use]
    pub fn controller(&self, b: usize) -> Option<&KController> {
        self.controllers.get(b).and_then(Option::as_ref)
    }

    /// Prefixes in the prefix store and the bytes they take (target and draft together).
    #[must_use]
    pub fn prefix_cache_usage(&self) -> (usize, usize) {
        self.pool.usage()
    }

    /// Move row `i` out of the batch: its valid KV goes to the prefix store (unless it failed), the last row takes
    /// its slot (caches copied), and it is kept for [`BatchEngine::take_output`] when it finished (a cancelled or
    /// failed row is dropped).
    fn retire(&mut self, i: usize) -> Result<()> {
        let kept = self.keep_prefix(i);
        let last = self.rows.len() - 1;
        let moved = self.remove_row_slot(i, last);
        let row = self.rows.swap_remove(i);
        if row.req.finish_reason.is_some() && row.failed.is_none() {
            self.finished.push((row.id, row.req));
        }
        kept.and(moved)
    }

    /// Copy row `i`'s valid prefix in each model (`tokens[..n_past_*]`, cut to the committed tokens) into the prefix
    /// store, dropping what it makes redundant or what the budget no longer holds.
    ///
    /// Errors: backend errors of the copy (the entry is then forgotten).
    fn keep_prefix(&mut self, i: usize) -> Result<()> {
        let row = &self.rows[i];
        if !self.opts.prefix_caching || row.failed.is_some() {
            return Ok(());
        }
        let tokens = &row.req.tokens;
        let n_tgt = row.req.n_past_tgt.min(tokens.len());
        let n_dft = if row.use_draft {
            row.req.n_past_dft.min(tokens.len())
        } else {
            0
        };
        let bytes = n_tgt * self.target.kv_bytes_per_token()
            + self
                .draft
                .as_ref()
                .map_or(0, |d| n_dft * d.kv_bytes_per_token());
        let Some((key, dropped)) = self.pool.insert(tokens, n_tgt, n_dft, bytes) else {
            return Ok(());
        };
        for k in dropped {
            self.target.drop_prefix(k);
            if let Some(d) = self.draft.as_mut() {
                d.drop_prefix(k);
            }
        }
        let mut stored = if n_tgt > 0 {
            self.target.store_prefix(key, i, n_tgt)
        } else {
            Ok(())
        };
        if let (Some(d), true, true) = (self.draft.as_mut(), n_dft > 0, stored.is_ok()) {
            stored = d.store_prefix(key, i, n_dft);
        }
        if stored.is_err() {
            self.pool.remove(key);
            self.target.drop_prefix(key);
            if let Some(d) = self.draft.as_mut() {
                d.drop_prefix(key);
            }
        }
        stored
    }

    /// Prefix caching for the request in row `i` (slot `i`), before its first prefill chunk: copy in the stored
    /// prefix that gives its prompt the longest reuse, in each model, and start its prefill after it.
    ///
    /// Errors: backend errors of the copy.
    fn reuse_prefix(&mut self, i: usize) -> Result<()> {
        if !self.opts.prefix_caching {
            return Ok(());
        }
        let t0 = Instant::now();
        let row = &mut self.rows[i];
        let prompt = &row.req.tokens[..row.req.n_prompt];
        let score_prompt = row.req.cfg.prompt_logprobs.is_some();
        let Some((key, reuse)) = self.pool.lookup(prompt, score_prompt, row.use_draft) else {
            return Ok(());
        };
        if reuse.n_tgt > 0 {
            self.target.load_prefix(key, i, reuse.n_tgt)?;
        }
        if reuse.n_dft > 0 {
            let d = self.draft.as_mut().expect("a draft reuse needs a draft");
            d.load_prefix(key, i, reuse.n_dft)?;
        }
        row.prefilled = reuse.n_tgt;
        row.req.n_past_tgt = reuse.n_tgt;
        row.req.n_past_dft = reuse.n_dft;
        row.req.stats.n_cached_tokens = reuse.n_tgt as u64;
        row.req.stats.n_cached_tokens_dft = reuse.n_dft as u64;
        row.req.stats.prefill_ms += ms_since(t0);
        Ok(())
    }

    /// Copy the last row's caches into slot `i` (before `swap_remove(i)`).
    fn remove_row_slot(&mut self, i: usize, last: usize) -> Result<()> {
        if i == last {
            return Ok(());
        }
        let r = &self.rows[last];
        self.target.move_slot(last, i, r.req.n_past_tgt)?;
        if let (Some(d), true) = (self.draft.as_mut(), r.use_draft) {
            d.move_slot(last, i, r.req.n_past_dft)?;
        }
        Ok(())
    }

    /// Run one round: admit waiting requests into free slots, prefill chunks of joining prompts (up to
    /// [`BatchOptions::max_prefill_tokens`]), then draft, verify and commit for every decoding row. Returns what
    /// each row committed (rows that finished have left the batch; take their results with
    /// [`BatchEngine::take_output`]).
    ///
    /// A prompt's last chunk gives its first token (sampled from the chunk's last row as a round with K = 0
    /// would: the same draws, so the output does not depend on where the prompt was cut). When a step commits
    /// first tokens it returns before its round, so they reach the caller one round earlier (time to first
    /// token = the prefill); the next step then runs that round before admitting or prefilling anything more.
    ///
    /// Errors: backend errors (every running row is then dropped).
    pub fn step(&mut self) -> Result<&[RowStep]> {
        self.steps.clear();
        while !self.round_due && self.rows.len() < self.max_batch {
            match self.waiting.pop_front() {
                Some(row) => self.rows.push(row),
                None => break,
            }
        }
        if let Err(e) = self.step_inner() {
            self.rows.clear();
            self.round_due = false;
            return Err(e);
        }
        // Finished and failed rows leave, from the back so indices stay valid.
        for i in (0..self.rows.len()).rev() {
            let r = &self.rows[i];
            if r.req.finish_reason.is_some() || r.failed.is_some() {
                if let Err(e) = self.retire(i) {
                    self.rows.clear();
                    return Err(e);
                }
            }
        }
        Ok(&self.steps)
    }

    /// The round's prefill: the joining rows' chunks in slot order (a row's next chunks before the next row's), each
    /// while it fits in what is left of `max_prefill_tokens` (the round's first always), so the earliest joining
    /// rows start decoding first. Each chunk is its own pass at its row's slot, cut exactly as with one chunk a
    /// round (at `prefilled + prefill_chunk`), so the outputs do not depend on the budget.
    ///
    /// A row's first chunk is preceded by its prefix-store lookup ([`BatchEngine::reuse_prefix`]), and a row whose
    /// prefill completes has its prompt stored ([`BatchEngine::keep_prefix`]): requests arriving together with a
    /// shared head (a system prompt) prefill it once, the first of them, when the budget holds that prompt.
    fn prefill_chunks(&mut self) -> Result<()> {
        let mut budget = self.opts.max_prefill_tokens;
        let mut first = true;
        for i in 0..self.rows.len() {
            if !self.rows[i].looked_up {
                self.rows[i].looked_up = true;
                self.reuse_prefix(i)?;
            }
            loop {
                let r = &self.rows[i];
                let n =
                    (r.prefill_target().saturating_sub(r.prefilled)).min(self.opts.prefill_chunk);
                if n == 0 || (!first && n > budget) {
                    break;
                }
                self.prefill_chunk_at(i)?;
                budget = budget.saturating_sub(n);
                first = false;
                let r = &self.rows[i];
                if r.prefilled == r.prefill_target() {
                    self.keep_prefix(i)?;
                }
            }
            if budget == 0 {
                break; // the rows further on are looked up when a round reaches them
            }
        }
        Ok(())
    }

    /// Prefill the next chunk of row `i`'s prompt (a batch of one at its slot), in the target and, for a fixed K,
    /// the draft.
    fn prefill_chunk_at(&mut self, i: usize) -> Result<()> {
        let t0 = Instant::now();
        let vocab = self.vocab;
        let row = &mut self.rows[i];
        let start = row.prefilled;
        let end = (start + self.opts.prefill_chunk).min(row.prefill_target());
        let last = end == row.prefill_target();
        let rows = [BatchRow {
            tokens: &row.req.tokens[start..end],
            n_past: start,
        }];
        let t_pass = Instant::now();
        let logits = self
            .target
            .forward_rows(i, &rows, row.req.prefill_logits(end - start))?;
        let pass = (end - start, ms_since(t_pass));
        let n_rows = logits.len() / vocab;
        // Row r predicts prompt token start + r + 1; the last chunk's last row predicts the first output token.
        let (scored, first) = if last {
            logits.split_at((n_rows - 1) * vocab)
        } else {
            (logits, &[][..])
        };
        row.req.record_prompt_logprobs(scored, vocab, start)?;
        // The draft is prefilled lazily, for every row: only if and when the batch drafts for it (the catch-up
        // pass of the round; a row with a fixed K reads all it lacks there, an auto row a chunk a round), so a load
        // at which speculation does not pay never pays for the draft's prefill, and no prompt waits for it.
        row.prefilled = end;
        row.req.n_past_tgt = end;
        row.req.stats.prefill_ms += ms_since(t0);
        if last {
            Self::commit_first(
                row,
                first,
                vocab,
                &mut self.sampler_tgt,
                &mut self.ver,
                &mut self.steps,
            );
        }
        // A single-row pass: over enough tokens, the per-token slope of a pass's cost for auto K
        // (`KController::observe_long_pass`).
        if n_rows <= 1 {
            self.long_pass = Some(pass); // (not a pass scoring the prompt: its head runs on every row)
        }
        Ok(())
    }

    /// Commit a row's first token from its prefill's last row of logits (`[vocab]` float32), as a round with no
    /// proposals would (its mask under a constraint, its draw, its log-probabilities), and report it in `steps`;
    /// an error fails the row alone.
    fn commit_first(
        row: &mut Row,
        logits: &[f32],
        vocab: usize,
        sampler: &mut Sampler,
        ver: &mut Verification,
        steps: &mut Vec<RowStep>,
    ) {
        let t_core = Instant::now();
        row.tokens_dft.clear();
        row.k_plan = 0;
        row.mode = VerifyMode::Stochastic;
        row.cons_propose = false;
        row.proposal = ConstrainedProposal::default();
        row.req.forced_bits = 0;
        sampler.inject_fault(row.req.cfg.fault);
        let mut out = StepOutput::default();
        let mut result = Ok(());
        if let Some(sc) = row.cons.as_mut() {
            result = sc.bonus_mask(&mut row.req, 0, 0, false, vocab);
        }
        let logits_ver = match (result, row.cons.as_mut()) {
            (Err(e), _) => Err(e),
            (Ok(()), Some(sc)) => sc.mask_target(&row.req, logits, &[], vocab),
            (Ok(()), None) => Ok(logits),
        };
        let result = logits_ver
            .and_then(|logits_ver| {
                row.req
                    .verify(sampler, logits_ver, &[], &[], VerifyMode::Stochastic, ver)
            })
            .and_then(|()| {
                row.req.commit(
                    ver,
                    logits,
                    vocab,
                    0,
                    VerifyMode::Stochastic,
                    (0.0, 0.0),
                    row.ngram.as_mut(),
                    &mut out,
                )
            });
        row.req.stats.core_ms += ms_since(t_core);
        match result {
            Ok(()) => {
                // Nothing proposed, nothing accepted: the target has read the prompt, the new token is unread.
                row.req.n_past_tgt = row.req.tokens.len() - 1;
                steps.push(RowStep {
                    id: row.id,
                    out,
                    error: None,
                });
            }
            Err(e) => {
                row.failed = Some(e.clone());
                steps.push(RowStep {
                    id: row.id,
                    out: StepOutput::default(),
                    error: Some(e),
                });
            }
        }
    }

    #[allow(clippy::too_many_lines)]
    fn step_inner(&mut self) -> Result<()> {
        if !self.round_due {
            self.prefill_chunks()?;
            if !self.steps.is_empty() {
                // First tokens (or a failed first draw): out now, the round in the next step.
                self.round_due = true;
                return Ok(());
            }
        }
        self.round_due = false;
        let vocab = self.vocab;
        let b = self.rows.len();
        if !self.rows.iter().any(Row::decoding) {
            return Ok(());
        }
        // K for auto rows: one choice for the batch at this batch size.
        let auto_cap = self
            .rows
            .iter()
            .filter(|r| r.decoding() && r.req.cfg.auto_k.is_some())
            .map(|r| self.k_cap(r).min(r.req.k_max()))
            .max();
        // The draft's backlog over the auto rows (a catch-up pass's cost grows with the tokens it feeds, summed
        // over rows), as one row's `unseen` (`set_draft_backlog` counts all but one token).
        let backlog = 1 + self
            .rows
            .iter()
            .filter(|r| r.decoding() && r.use_draft && r.req.cfg.auto_k.is_some())
            .map(|r| (r.req.tokens.len() - r.req.n_past_dft).saturating_sub(1))
            .sum::<usize>();
        let remaining = self
            .rows
            .iter()
            .filter(|r| r.decoding() && r.req.cfg.auto_k.is_some())
            .map(|r| r.req.remaining())
            .max()
            .unwrap_or(0);
        // Forced tokens ahead of the auto rows (the batch pass is as long as its longest row: their largest count).
        let mut n_forced = 0;
        for row in &mut self.rows {
            if !(row.decoding() && row.req.cfg.auto_k.is_some()) {
                continue;
            }
            if let Some(sc) = row.cons.as_mut() {
                match row.req.forced_ahead(sc) {
                    Ok(n) => n_forced = n_forced.max(n),
                    Err(e) => row.failed = Some(e),
                }
            }
        }
        let k_auto = match auto_cap {
            Some(cap) => {
                if self.controllers[b].is_none() {
                    // A new batch size starts from the nearest size's acceptance and draft-cost estimates (a
                    // pass's cost differs, so the draft cost is provisional until re-timed), the larger one on a
                    // tie. Its target-pass costs are measured afresh (a plain pass first), unless the nearest size is
                    // larger (rows finished): then that size's costs stand in, scaled to this size as it times its
                    // own (`KController::inherit_target_costs`), and no plain round is needed first.
                    let mut c = KController::new(self.opts.auto_k.clone()).expect("validated");
                    let nearest = (1..self.controllers.len())
                        .filter(|&i| self.controllers[i].is_some())
                        .min_by_key(|&i| (i.abs_diff(b), std::cmp::Reverse(i)));
                    if let Some(i) = nearest {
                        let other = self.controllers[i].as_ref().expect("filtered");
                        c.inherit_estimates(other);
                        if i > b {
                            c.inherit_target_costs(other);
                        }
                    }
                    self.controllers[b] = Some(c);
                }
                let c = self.controllers[b].as_mut().expect("just set");
                // A plain round's cost at this batch size is measured first: extrapolated from long passes it is
                // overstated once a batch pass is compute-bound, and speculation would look better than it is.
                // (At most `PLAIN_FIRST` rounds: rows with a fixed K in the same batch may lengthen every pass.)
                let tries = &mut self.plain_first[b];
                if c.verify_cost_known(1) || *tries >= PLAIN_FIRST {
                    c.set_rows(b);
                    if let Some((n, ms)) = self.long_pass {
                        c.observe_long_pass(n, ms);
                    }
                    c.set_draft_backlog(backlog, false);
                    c.set_forced(n_forced);
                    c.set_remaining(remaining);
                    c.choose(cap)
                } else {
                    *tries += 1;
                    0
                }
            }
            None => 0,
        };

        // Plan each row's proposals: an n-gram match, else the draft model.
        let has_draft = self.draft.is_some();
        for i in 0..b {
            let cap = self.k_cap(&self.rows[i]);
            let row = &mut self.rows[i];
            row.tokens_dft.clear();
            row.k_plan = 0;
            row.mode = VerifyMode::Stochastic;
            row.cons_propose = false;
            row.proposal = ConstrainedProposal::default();
            row.req.forced_bits = 0;
            if !row.decoding() {
                continue;
            }
            let k = if row.req.cfg.auto_k.is_some() {
                k_auto.min(cap).min(row.req.k_max())
            } else {
                row.req.cfg.num_speculative_tokens.min(cap)
            };
            if let Some(sc) = row.cons.as_mut() {
                // As `Engine::step`: n-gram proposals cut at the first refused token, else forced tokens and up to
                // K masked draft samples (forced ones even at K = 0, not with a zero K setting).
                let k_fixed = row
                    .req
                    .cfg
                    .auto_k
                    .as_ref()
                    .map_or(row.req.cfg.num_speculative_tokens, |a| a.k_max)
                    .min(cap);
                if k_fixed == 0 {
                    continue;
                }
                if let (Some(ng), true) = (row.ngram.as_ref(), k > 0) {
                    if ng.propose(k, &mut row.tokens_dft) > 0 {
                        match row.req.constrain_proposals(
                            &mut row.tokens_dft,
                            &mut sc.masks,
                            mask_words(vocab),
                        ) {
                            Ok((n_masks, ended)) => {
                                row.proposal.n_masks = n_masks;
                                row.proposal.ended = ended;
                            }
                            Err(e) => {
                                row.failed = Some(e);
                                continue;
                            }
                        }
                        if !row.tokens_dft.is_empty() {
                            row.mode = VerifyMode::Deterministic;
                            continue;
                        }
                    }
                }
                row.cons_propose = true;
                row.cons_cap = Request::constrained_cap(k_fixed, cap);
                if has_draft && row.use_draft {
                    row.k_plan = k;
                }
                continue;
            }
            if k == 0 {
                continue;
            }
            if let Some(ng) = row.ngram.as_ref() {
                if ng.propose(k, &mut row.tokens_dft) > 0 {
                    row.mode = VerifyMode::Deterministic;
                    continue;
                }
            }
            if has_draft && row.use_draft {
                row.k_plan = k;
                row.n_committed = row.req.penalties.len();
            }
        }

        // Rows whose draft is far behind (lazily prefilled, or after plain rounds) catch up first, in one batched
        // pass of at most `prefill_chunk` tokens each (logits of one position: none is read); a row still behind
        // after it sits this round's drafting out.
        let t_catchup = Instant::now();
        let catchup_tokens = self.catch_up_drafts()?;
        let catchup_ms = ms_since(t_catchup);

        // Constrained rows propose their forced tokens up to their first draft position.
        for row in &mut self.rows {
            row.proposer = None;
            row.needs_pass = false;
            if !row.cons_propose || row.failed.is_some() {
                continue;
            }
            let sc = row.cons.as_mut().expect("cons_propose");
            let mut p = Proposer::begin(&mut row.req, sc, row.k_plan, row.cons_cap, row.k_plan > 0);
            match p.run_until_pass(
                &mut row.req,
                sc,
                &mut row.probs_dft,
                &mut row.tokens_dft,
                vocab,
            ) {
                Ok(need) => row.needs_pass = need,
                Err(e) => row.failed = Some(e),
            }
            row.proposer = Some(p);
        }

        // Draft passes: pass i feeds every unconstrained row that drafts more than i tokens (the first pass also
        // the committed tokens the draft has not seen) and every constrained row waiting for a pass (its forced
        // tokens since its last pass too); the other rows sit it out.
        let t_draft = Instant::now();
        let mut n_passes = 0;
        if let Some(draft) = self.draft.as_mut() {
            loop {
                let pass = n_passes;
                let inputs: Vec<BatchRow<'_>> = self
                    .rows
                    .iter()
                    .map(|r| match (&r.proposer, &r.cons) {
                        (Some(p), Some(sc)) if r.needs_pass && r.failed.is_none() => BatchRow {
                            tokens: &sc.input,
                            n_past: p.n_past,
                        },
                        _ if !r.cons_propose && pass < r.k_plan && r.failed.is_none() => {
                            let n_past = r.req.n_past_dft;
                            let tokens = if pass == 0 {
                                &r.req.tokens[n_past..]
                            } else {
                                &r.tokens_dft[pass - 1..pass]
                            };
                            BatchRow { tokens, n_past }
                        }
                        _ => BatchRow::EMPTY,
                    })
                    .collect();
                let lens: Vec<usize> = inputs.iter().map(|r| r.tokens.len()).collect();
                if lens.iter().all(|&m| m == 0) {
                    break;
                }
                let s = lens.iter().copied().max().unwrap_or(0);
                let min_m = lens.iter().copied().filter(|&m| m > 0).min().unwrap_or(1);
                let n_logits = s - min_m + 1;
                let t_pass = Instant::now();
                let logits = draft.forward_rows(0, &inputs, n_logits)?;
                let pass_ms = ms_since(t_pass);
                drop(inputs);
                n_passes += 1;
                for (r, row) in self.rows.iter_mut().enumerate() {
                    let m = lens[r];
                    if m == 0 {
                        continue;
                    }
                    let at = r * n_logits + (m - 1) - (s - n_logits);
                    let logits_row = &logits[at * vocab..(at + 1) * vocab];
                    if let (Some(p), Some(sc)) = (row.proposer.as_mut(), row.cons.as_mut()) {
                        let res = p
                            .take_pass(
                                &mut row.req,
                                sc,
                                logits_row,
                                pass_ms,
                                &mut self.sampler_dft,
                                &mut row.probs_dft,
                                &mut row.tokens_dft,
                                vocab,
                            )
                            .and_then(|()| {
                                p.run_until_pass(
                                    &mut row.req,
                                    sc,
                                    &mut row.probs_dft,
                                    &mut row.tokens_dft,
                                    vocab,
                                )
                            });
                        match res {
                            Ok(need) => row.needs_pass = need,
                            Err(e) => {
                                row.needs_pass = false;
                                row.failed = Some(e);
                            }
                        }
                        continue;
                    }
                    row.req.n_past_dft += m;
                    let q_row = &mut row.probs_dft[pass * vocab..(pass + 1) * vocab];
                    match row
                        .req
                        .draft_choice(&mut self.sampler_dft, logits_row, pass, q_row)
                    {
                        Ok(d) => row.tokens_dft.push(d),
                        Err(e) => row.failed = Some(e),
                    }
                }
            }
        }
        for row in &mut self.rows {
            if let Some(p) = row.proposer.take() {
                row.proposal = p.finish(&mut row.req);
            } else if row.k_plan > 0 && !row.cons_propose {
                // A rejected draft leaves no trace in the penalties.
                row.req.penalties.truncate(row.n_committed);
            }
            // The bonus row's mask (the proposals wrote the others).
            let decoding = row.decoding();
            if let (Some(sc), true) = (row.cons.as_mut(), decoding) {
                let (k, n, ended) = (
                    row.tokens_dft.len(),
                    row.proposal.n_masks,
                    row.proposal.ended,
                );
                if let Err(e) = sc.bonus_mask(&mut row.req, k, n, ended, vocab) {
                    row.failed = Some(e);
                }
            }
        }
        let draft_ms = ms_since(t_draft) + catchup_ms;

        // Target: one pass over every decoding row's last committed token and drafts.
        let t_target = Instant::now();
        for row in &mut self.rows {
            row.input_tgt.clear();
            if row.decoding() {
                let len = row.req.tokens.len();
                row.input_tgt.push(row.req.tokens[len - 1]);
                row.input_tgt.extend_from_slice(&row.tokens_dft);
            }
        }
        let inputs: Vec<BatchRow<'_>> = self
            .rows
            .iter()
            .map(|r| BatchRow {
                tokens: &r.input_tgt,
                n_past: if r.input_tgt.is_empty() {
                    0
                } else {
                    r.req.tokens.len() - 1
                },
            })
            .collect();
        let s = inputs.iter().map(|r| r.tokens.len()).max().unwrap_or(0);
        if s == 0 {
            // Every decoding row failed while planning or drafting: each reports its error.
            for row in &self.rows {
                report_failed(&mut self.steps, row);
            }
            return Ok(());
        }
        let logits_all = self.target.forward_rows(0, &inputs, s)?;
        drop(inputs);
        let target_ms = ms_since(t_target);

        // The auto rows' acceptance probabilities: (draft positions, grammar-forced positions).
        let mut pooled = (Vec::new(), Vec::new());
        let mut k_round = 0;
        for (r, row) in self.rows.iter_mut().enumerate() {
            if row.input_tgt.is_empty() {
                report_failed(&mut self.steps, row);
                continue;
            }
            let t_core = Instant::now();
            let k = row.tokens_dft.len();
            k_round = k_round.max(k);
            let logits_tgt = &logits_all[r * s * vocab..(r * s + k + 1) * vocab];
            let probs_dft: &[f32] = if row.mode == VerifyMode::Stochastic {
                &row.probs_dft[..k * vocab]
            } else {
                &[]
            };
            self.sampler_tgt.inject_fault(row.req.cfg.fault);
            let mut out = StepOutput::default();
            let len = row.req.tokens.len();
            // Constrained: verification sees the masked target rows; log-probabilities stay the raw rows'.
            let logits_ver = match row.cons.as_mut() {
                Some(sc) => sc.mask_target(&row.req, logits_tgt, &row.tokens_dft, vocab),
                None => Ok(logits_tgt),
            };
            let result = logits_ver
                .and_then(|logits_ver| {
                    row.req.verify(
                        &mut self.sampler_tgt,
                        logits_ver,
                        probs_dft,
                        &row.tokens_dft,
                        row.mode,
                        &mut self.ver,
                    )
                })
                .and_then(|()| {
                    row.req.commit(
                        &self.ver,
                        logits_tgt,
                        vocab,
                        k,
                        row.mode,
                        (draft_ms, target_ms),
                        row.ngram.as_mut(),
                        &mut out,
                    )
                });
            if let Err(e) = result {
                row.failed = Some(e.clone());
                self.steps.push(RowStep {
                    id: row.id,
                    out: StepOutput::default(),
                    error: Some(e),
                });
                continue;
            }
            let n_acc = self.ver.n_accepted;
            row.req.n_past_tgt = len + n_acc;
            // The draft saw the committed prefix and d_1 .. d_{K-1} (constrained rows: the proposals before its last
            // pass, all of them when it stopped for lack of mass).
            let n_fed = if row.cons_propose {
                (row.proposal.n_passes > 0).then_some(row.proposal.n_fed)
            } else {
                (row.k_plan > 0).then(|| k - 1)
            };
            if let Some(n_fed) = n_fed {
                row.req.n_past_dft = len + n_acc.min(n_fed);
                if row.req.cfg.auto_k.is_some() {
                    pool_acceptance(&self.ver.accept_probs, row.req.forced_bits, &mut pooled);
                }
            } else if row.req.forced_bits != 0 && row.req.cfg.auto_k.is_some() {
                // A forced-only round: its acceptances are the forced estimate's.
                pool_acceptance(&self.ver.accept_probs, row.req.forced_bits, &mut pooled);
            }
            row.req.stats.core_ms += ms_since(t_core);
            self.steps.push(RowStep {
                id: row.id,
                out,
                error: None,
            });
        }
        if auto_cap.is_some() {
            if let Some(c) = self.controllers[b].as_mut() {
                if catchup_tokens > 1 {
                    c.observe_catchup(catchup_ms, catchup_tokens);
                }
                c.observe(
                    k_round,
                    &pooled.0,
                    draft_ms - catchup_ms,
                    n_passes,
                    target_ms,
                );
                c.observe_forced(&pooled.1);
            }
        }
        Ok(())
    }

    /// The catch-up pass: every row planning to draft whose draft has more than [`CATCHUP_INLINE`] committed tokens
    /// to read is fed them (all but the last, which its first drafting pass feeds; auto-K rows at most
    /// `prefill_chunk`, and one still further behind does not draft this round). Returns the tokens fed, summed over
    /// rows (0: no pass).
    fn catch_up_drafts(&mut self) -> Result<usize> {
        let chunk = self.opts.prefill_chunk;
        let behind =
            |r: &Row| r.k_plan > 0 && r.req.tokens.len() - r.req.n_past_dft > CATCHUP_INLINE;
        if !self.rows.iter().any(behind) {
            return Ok(0);
        }
        let draft = self.draft.as_mut().expect("k_plan > 0 needs a draft");
        let inputs: Vec<BatchRow<'_>> = self
            .rows
            .iter()
            .map(|r| {
                if behind(r) {
                    // Rows with a fixed K catch up fully (they draft every round, as they would alone); auto rows a
                    // chunk per round.
                    let start = r.req.n_past_dft;
                    let last = r.req.tokens.len() - 1;
                    let end = if r.req.cfg.auto_k.is_some() {
                        (start + chunk).min(last)
                    } else {
                        last
                    };
                    BatchRow {
                        tokens: &r.req.tokens[start..end],
                        n_past: start,
                    }
                } else {
                    BatchRow::EMPTY
                }
            })
            .collect();
        let fed: Vec<usize> = inputs.iter().map(|r| r.tokens.len()).collect();
        // One batched pass pads every row to the longest; when that would more than double the positions computed
        // (one long prompt behind, the other rows in step), each row behind is fed alone instead.
        let total: usize = fed.iter().sum();
        let longest = fed.iter().copied().max().unwrap_or(0);
        if inputs.len() * longest <= 2 * total {
            draft.forward_rows(0, &inputs, 1)?;
        } else {
            for (i, row) in inputs.iter().enumerate() {
                if !row.tokens.is_empty() {
                    draft.forward_rows(i, std::slice::from_ref(row), 1)?;
                }
            }
        }
        drop(inputs);
        for (row, &m) in self.rows.iter_mut().zip(&fed) {
            if m == 0 {
                continue;
            }
            row.req.n_past_dft += m;
            if row.req.tokens.len() - row.req.n_past_dft > CATCHUP_INLINE {
                row.k_plan = 0; // still behind: verify its last token alone this round
            }
        }
        Ok(fed.into_iter().sum())
    }

    /// Most drafts row `r` may propose this round: none past `max_new_tokens`, none without a proposer.
    fn k_cap(&self, r: &Row) -> usize {
        // (A constrained row proposes grammar-forced tokens even without a draft model.)
        if (self.draft.is_some() && r.use_draft)
            || r.req.cfg.ngram.is_some()
            || r.req.constraint.is_some()
        {
            r.req.remaining().saturating_sub(1)
        } else {
            0
        }
    }
}

/// The step of a row that failed this round (nothing when it did not): its error, no tokens.
fn report_failed(steps: &mut Vec<RowStep>, row: &Row) {
    if let Some(e) = row.failed.clone() {
        steps.push(RowStep {
            id: row.id,
            out: StepOutput::default(),
            error: Some(e),
        });
    }
}

/// Append a row's acceptance probabilities (`accept_probs`, one per evaluated proposal) to the batch's pools:
/// `pooled.1` those of grammar-forced proposals (`forced_bits` bit i: proposal i was forced), `pooled.0` the others.
fn pool_acceptance(accept_probs: &[f32], forced_bits: u64, pooled: &mut (Vec<f32>, Vec<f32>)) {
    for (i, &a) in accept_probs.iter().enumerate() {
        if is_forced(forced_bits, i) {
            pooled.1.push(a);
        } else {
            pooled.0.push(a);
        }
    }
}

impl RequestEngine for BatchEngine {
    fn add_with(
        &mut self,
        id: u64,
        prompt: &[u32],
        cfg: GenerationConfig,
        constraint: Option<Box<dyn Constraint>>,
    ) -> Result<()> {
        BatchEngine::add_with(self, id, prompt, cfg, constraint)
    }

    fn step(&mut self) -> Result<Vec<RowStep>> {
        BatchEngine::step(self).map(<[RowStep]>::to_vec)
    }

    fn cancel(&mut self, id: u64) -> Result<bool> {
        BatchEngine::cancel(self, id)
    }

    fn stop_at(&mut self, id: u64, n_keep: usize) -> Result<()> {
        BatchEngine::stop_at(self, id, n_keep)
    }

    fn take_output(&mut self, id: u64) -> Option<GenerationOutput> {
        BatchEngine::take_output(self, id)
    }

    fn prompt_logprobs(&self, id: u64) -> Option<&PromptLogprobs> {
        BatchEngine::prompt_logprobs(self, id)
    }

    fn stats(&self, id: u64) -> Option<&Stats> {
        BatchEngine::stats(self, id)
    }

    fn vocab_size(&self) -> usize {
        BatchEngine::vocab_size(self)
    }

    fn has_draft(&self) -> bool {
        BatchEngine::has_draft(self)
    }

    fn max_seq_len(&self) -> usize {
        BatchEngine::max_seq_len(self)
    }

    fn max_batch(&self) -> usize {
        BatchEngine::max_batch(self)
    }

    fn n_running(&self) -> usize {
        BatchEngine::n_running(self)
    }

    fn prefix_cache_usage(&self) -> (usize, usize) {
        BatchEngine::prefix_cache_usage(self)
    }

    fn set_suffix_cache(&mut self, cache: Option<std::sync::Arc<SuffixCache>>) {
        BatchEngine::set_suffix_cache(self, cache);
    }

    fn n_waiting(&self) -> usize {
        BatchEngine::n_waiting(self)
    }

    fn is_idle(&self) -> bool {
        BatchEngine::is_idle(self)
    }
}
