//! One generation request: its settings ([`GenerationConfig`]), what it returns ([`StepOutput`] per round,
//! [`GenerationOutput`] at the end), the prompt check every entry point makes ([`check_prompt`]), and its state in
//! progress (`Request`: tokens, KV lengths, penalties, RNG, statistics, constraint), which the single-request
//! [`crate::Engine`] and the batched [`crate::BatchEngine`] both run.

use std::time::Instant;

use crate::adaptive::{AutoK, KController};
use crate::constraint::{mask_allows, next_mask, Constraint};
use crate::coupled::CoupledNoise;
use crate::error::{Result, SpecError};
use crate::lookup::LookupProposer;
use crate::rng::Rng;
use crate::sampling::{
    log_softmax_at, log_softmax_with, top_logprobs, Fault, PenaltyContext, Sampler, SamplingParams,
    MAX_TOP_LOGPROBS,
};
use crate::stats::Stats;
use crate::verify::{
    verify_coupled_into, verify_into, LastToken, Verification, VerifyMode, MAX_DRAFT_TOKENS,
};

/// Settings of one generation request.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerationConfig {
    /// Most tokens to emit (>= 1).
    pub max_new_tokens: usize,
    /// K, draft tokens per round, `0..=`[`crate::MAX_DRAFT_TOKENS`]; 0 (or no draft model) is plain target decoding. Capped each round so
    /// that no round drafts beyond `max_new_tokens`.
    pub num_speculative_tokens: usize,
    /// Logits processing applied to target rows and to the draft's rows alike.
    pub sampling: SamplingParams,
    /// Seed of the request's random stream: the same seed, models and settings give the same tokens.
    pub seed: u64,
    /// End-of-sequence ids (every id the model treats as end of turn); emitted, then generation stops with
    /// [`FinishReason::Eos`] unless `ignore_eos`.
    pub eos_token_ids: Vec<u32>,
    /// Further ids that stop generation ([`FinishReason::Stop`]); the stop token is emitted.
    pub stop_token_ids: Vec<u32>,
    /// Keep generating past EOS ids (stop tokens still stop).
    pub ignore_eos: bool,
    /// Choose K each round from measured costs and acceptance (`num_speculative_tokens="auto"`); `None` = fixed K.
    pub auto_k: Option<AutoK>,
    /// Prompt-lookup (n-gram) proposals; with a draft model they come first and the draft model drafts only
    /// when there is no match.
    pub ngram: Option<NgramConfig>,
    /// Draft with the attached draft model (default true; false = n-gram only or target-only).
    pub use_draft_model: bool,
    /// Coupled sampling ([`crate::coupled`]; default false): the random choice at each output position is fixed by
    /// `(seed, position)` alone, so the output equals target-only coupled decoding with the same seed for every K,
    /// draft model or n-gram proposer. Each position is still an exact sample of the target's processed
    /// distribution; acceptance is lower than with `min(1, p/q)` acceptance.
    pub coupled: bool,
    /// Return the target's log-probability of each emitted token (default true). Off, `logprobs` stay empty, and
    /// a greedy request without penalties needs only the models' argmax ids ([`Backend::forward_argmax`]: on a
    /// device that computes them, a round copies K + 1 ids to the host instead of K + 1 rows of logits).
    pub logprobs: bool,
    /// Alternatives per emitted token: the `top_logprobs` most likely tokens of the target's verification row of
    /// its position (raw logits, as [`crate::sampling::top_logprobs`]), 0..=[`MAX_TOP_LOGPROBS`] (default 0 =
    /// none). Above 0 the models' logits are read every round.
    pub top_logprobs: usize,
    /// Score the prompt: `Some(k)` records the target's log-probability of every prompt token after the first
    /// (from the prefill pass, the row of the position before it) and its `k` most likely alternatives
    /// (0..=[`MAX_TOP_LOGPROBS`]); `None` (default) records nothing. The prefill then reads every row's logits, in
    /// chunks of [`PROMPT_LOGPROBS_CHUNK`] positions, and keeps only the values asked for.
    pub prompt_logprobs: Option<usize>,
    /// A deliberate sampler fault (tests of the tests only; `None` in any real use).
    #[doc(hidden)]
    pub fault: Option<Fault>,
}

/// Settings of model-free drafting (vLLM's names): prompt lookup or suffix decoding ([`crate::LookupProposer`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NgramConfig {
    /// Shortest suffix to match (>= 1; suffix decoding: <= [`crate::SUFFIX_MAX_DEPTH`]).
    pub prompt_lookup_min: usize,
    /// Longest suffix n-gram prompt lookup matches (>= prompt_lookup_min, <= 32; suffix decoding matches up to
    /// [`crate::SUFFIX_MAX_DEPTH`] tokens and ignores it).
    pub prompt_lookup_max: usize,
    /// Which model-free proposer.
    pub method: LookupMethod,
}

/// Which model-free proposer an [`NgramConfig`] asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum LookupMethod {
    /// Prompt lookup ([`crate::NgramProposer`]): the most recent continuation in the request's own text.
    #[default]
    PromptLookup,
    /// Suffix decoding ([`crate::SuffixProposer`]): the most frequent continuation in the request's text and the
    /// engine's shared cache of earlier requests, if it has one.
    Suffix,
}

impl Default for GenerationConfig {
    fn default() -> Self {
        Self {
            max_new_tokens: 128,
            num_speculative_tokens: 4,
            sampling: SamplingParams::default(),
            seed: 0,
            eos_token_ids: Vec::new(),
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            auto_k: None,
            ngram: None,
            use_draft_model: true,
            coupled: false,
            logprobs: true,
            top_logprobs: 0,
            prompt_logprobs: None,
            fault: None,
        }
    }
}

/// What a request's K (`num_speculative_tokens`) may be, as every message says it (from [`MAX_DRAFT_TOKENS`]).
#[must_use]
pub fn num_speculative_tokens_expected() -> String {
    format!("an integer 0 <= K <= {MAX_DRAFT_TOKENS}, or \"auto\"")
}

/// The refusal of `shown` (the value as given, e.g. `65` or `"many"`) as a request's K.
#[must_use]
pub fn invalid_num_speculative_tokens(shown: impl std::fmt::Display) -> SpecError {
    SpecError::setting(
        "num_speculative_tokens",
        format!(
            "num_speculative_tokens {shown} is invalid (expected {})",
            num_speculative_tokens_expected()
        ),
    )
}

/// The one range check of a fixed K (the request resolver and [`GenerationConfig::validate`]).
///
/// Errors: [`SpecError::Setting`] (`num_speculative_tokens`) when `k > MAX_DRAFT_TOKENS`.
pub fn check_num_speculative_tokens(k: usize) -> Result<()> {
    if k > MAX_DRAFT_TOKENS {
        return Err(invalid_num_speculative_tokens(k));
    }
    Ok(())
}

impl GenerationConfig {
    /// Whether a round needs only argmax ids from the models: greedy, no penalties, no log-probabilities, not
    /// coupled (and no test fault).
    #[must_use]
    pub fn ids_only(&self) -> bool {
        self.sampling.is_greedy()
            && !self.sampling.has_penalties()
            && !self.logprobs
            && self.top_logprobs == 0
            && !self.coupled
            && self.fault.is_none()
    }

    /// Check every setting; errors name the bad value and the allowed range.
    ///
    /// Errors: [`SpecError::Setting`] naming the setting.
    pub fn validate(&self) -> Result<()> {
        self.sampling.validate()?;
        check_num_speculative_tokens(self.num_speculative_tokens)?;
        if let Some(a) = &self.auto_k {
            a.validate()?;
        }
        if self.top_logprobs > MAX_TOP_LOGPROBS {
            return Err(SpecError::setting(
                "top_logprobs",
                format!(
                    "top_logprobs {} is invalid (expected 0 <= top_logprobs <= {MAX_TOP_LOGPROBS}; 0 = none)",
                    self.top_logprobs
                ),
            ));
        }
        if let Some(k) = self.prompt_logprobs.filter(|&k| k > MAX_TOP_LOGPROBS) {
            return Err(SpecError::setting(
                "prompt_logprobs",
                format!(
                    "prompt_logprobs {k} is invalid (expected 0 <= prompt_logprobs <= {MAX_TOP_LOGPROBS} \
                     alternatives, or none)"
                ),
            ));
        }
        if self.max_new_tokens == 0 {
            return Err(SpecError::setting(
                "max_new_tokens",
                "max_new_tokens 0 is invalid (expected >= 1)",
            ));
        }
        let min = self.sampling.min_tokens;
        if min as usize > self.max_new_tokens {
            return Err(SpecError::setting(
                "min_tokens",
                format!(
                    "min_tokens {min} is invalid (expected 0 <= min_tokens <= max_new_tokens {})",
                    self.max_new_tokens
                ),
            ));
        }
        Ok(())
    }
}

/// Why a generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An EOS id was emitted.
    Eos,
    /// A stop token id was emitted, or the caller stopped at a stop string.
    Stop,
    /// `max_new_tokens` were emitted.
    Length,
    /// The request's constraint is complete: nothing can follow but the end (no EOS token is emitted).
    Grammar,
}

impl FinishReason {
    /// The name used in APIs: "eos", "stop" or "length".
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Eos => "eos",
            Self::Stop => "stop",
            Self::Length => "length",
            Self::Grammar => "grammar",
        }
    }
}

/// Where an emitted token came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenSource {
    /// A draft token the target accepted.
    Accepted,
    /// Sampled from the residual after a rejection (greedy: the target's argmax at the first mismatch).
    Recovered,
    /// Sampled from the target's last row after all drafts were accepted (every token of a K = 0 round).
    Bonus,
}

impl TokenSource {
    /// The name used in APIs: "accepted", "recovered" or "bonus".
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Accepted => "accepted",
            Self::Recovered => "recovered",
            Self::Bonus => "bonus",
        }
    }
}

/// Tokens committed by one round, in order. Nothing after a stop is included.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepOutput {
    /// `[n]` emitted token ids.
    pub tokens: Vec<u32>,
    /// `[n]` where each token came from.
    pub sources: Vec<TokenSource>,
    /// `[n]` the target's log-probability of each token (log-softmax of the raw target logits, natural log); empty
    /// when the request set [`GenerationConfig::logprobs`] false.
    pub logprobs: Vec<f32>,
    /// `[n]` the alternatives of each token (most likely first, `(id, log-probability)`); empty when the request set
    /// [`GenerationConfig::top_logprobs`] 0.
    pub top_logprobs: Vec<Vec<(u32, f32)>>,
    /// K used in this round (draft tokens proposed).
    pub n_drafted: usize,
    /// Set when the generation ended in this round.
    pub finish_reason: Option<FinishReason>,
}

/// Everything a finished generation returns.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerationOutput {
    /// Emitted token ids (the prompt excluded).
    pub tokens: Vec<u32>,
    /// Where each emitted token came from.
    pub sources: Vec<TokenSource>,
    /// The target's log-probability of each emitted token (empty with [`GenerationConfig::logprobs`] false).
    pub logprobs: Vec<f32>,
    /// The alternatives of each emitted token (empty with [`GenerationConfig::top_logprobs`] 0).
    pub top_logprobs: Vec<Vec<(u32, f32)>>,
    /// The prompt's scores ([`GenerationConfig::prompt_logprobs`]; empty lists without it).
    pub prompt: PromptLogprobs,
    /// Why generation ended.
    pub finish_reason: FinishReason,
    /// Counters and timings.
    pub stats: Stats,
}

/// Rows of logits read per prefill pass when the prompt is scored ([`GenerationConfig::prompt_logprobs`]):
/// bounds the logits a pass returns (`[chunk, vocab] float32`, 155 MB at a vocabulary of 152k).
pub const PROMPT_LOGPROBS_CHUNK: usize = 256;

/// The target's scores of a prompt ([`GenerationConfig::prompt_logprobs`]), for prompt tokens 1.. (the first has
/// no position before it): entry `j` is prompt token `j + 1`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PromptLogprobs {
    /// `[n_prompt - 1]` log-probability of each prompt token after the first (log-softmax of the raw logits).
    pub logprobs: Vec<f32>,
    /// `[n_prompt - 1]` its position's most likely tokens, `(id, log-probability)`, most likely first.
    pub top_logprobs: Vec<Vec<(u32, f32)>>,
}

/// State of one generation in progress (the solo engine's request, a row of the batch engine).
pub(crate) struct Request {
    pub(crate) cfg: GenerationConfig,
    // [n_prompt + n_generated] committed tokens.
    pub(crate) tokens: Vec<u32>,
    pub(crate) n_prompt: usize,
    // Valid KV lengths (prefix of `tokens`) in each cache.
    pub(crate) n_past_tgt: usize,
    pub(crate) n_past_dft: usize,
    pub(crate) penalties: PenaltyContext,
    pub(crate) rng: Rng,
    // The per-position noise when `cfg.coupled` (no draw from `rng` is then made).
    pub(crate) noise: Option<CoupledNoise>,
    pub(crate) stats: Stats,
    // [n_generated] per emitted token.
    pub(crate) sources: Vec<TokenSource>,
    pub(crate) logprobs: Vec<f32>,
    pub(crate) top_logprobs: Vec<Vec<(u32, f32)>>,
    pub(crate) prompt_scores: PromptLogprobs,
    pub(crate) finish_reason: Option<FinishReason>,
    pub(crate) controller: Option<KController>,
    // The request's constraint (structured output), at the committed output tokens between rounds.
    pub(crate) constraint: Option<Box<dyn Constraint>>,
    // Bit i set: proposal i of the last round was a grammar-forced token.
    pub(crate) forced_bits: u64,
    // The last round: generated count before it, draft positions counted in `n_drafted`, and whether they were
    // n-gram proposals (so a stop string can uncount what it cuts off).
    pub(crate) last_round: (usize, u64, bool),
}

/// Check a prompt against a model before anything runs: at least one token, each id `< vocab`, and prompt +
/// `max_new_tokens` within `max_seq` (the KV capacity). Every entry point (the engines, the binding's resolver,
/// the Rust `Pipeline`) checks with this one function.
///
/// Errors: [`SpecError::Setting`] (`prompt`) for an empty prompt, [`SpecError::Vocab`] naming the first bad id and its
/// position, [`SpecError::Length`] naming both lengths and the maximum.
pub fn check_prompt(
    prompt: &[u32],
    max_new_tokens: usize,
    vocab: usize,
    max_seq: usize,
) -> Result<()> {
    if prompt.is_empty() {
        return Err(SpecError::setting(
            "prompt",
            "the prompt is empty (expected at least one token)",
        ));
    }
    if let Some((i, &t)) = prompt
        .iter()
        .enumerate()
        .find(|(_, &t)| t as usize >= vocab)
    {
        return Err(SpecError::Vocab(format!(
            "prompt token {t} at position {i} is out of range (expected 0 <= id < vocab size {vocab})"
        )));
    }
    // Saturating: a huge max_new_tokens must not wrap around and pass the check.
    let total = prompt.len().saturating_add(max_new_tokens);
    if total > max_seq {
        return Err(SpecError::Length(format!(
            "prompt of {} tokens + max_new_tokens {max_new_tokens} = {total} exceeds the maximum sequence length \
             {max_seq}",
            prompt.len(),
        )));
    }
    Ok(())
}

impl Request {
    /// Validate a request (settings, prompt ids, length against `max_seq`) and set up its state; nothing is run.
    /// The caches are empty (`n_past_* = 0`) until the caller prefills them.
    pub(crate) fn new(
        prompt: &[u32],
        cfg: GenerationConfig,
        vocab: usize,
        max_seq: usize,
    ) -> Result<Self> {
        cfg.validate()?;
        check_prompt(prompt, cfg.max_new_tokens, vocab, max_seq)?;
        let controller = cfg.auto_k.clone().map(KController::new).transpose()?;
        let mut penalties = PenaltyContext::new(vocab);
        if cfg.sampling.has_penalties() {
            penalties.add_prompt(prompt)?;
            if cfg.sampling.min_tokens > 0 {
                // vLLM's min_tokens: no EOS (unless ignored anyway) and no stop token id before it.
                if !cfg.ignore_eos {
                    penalties.ban_before_min_tokens(&cfg.eos_token_ids)?;
                }
                penalties.ban_before_min_tokens(&cfg.stop_token_ids)?;
            }
            penalties.reserve(cfg.max_new_tokens + MAX_DRAFT_TOKENS);
        }
        let k_max = cfg
            .auto_k
            .as_ref()
            .map_or(cfg.num_speculative_tokens, |a| a.k_max);
        let stats = Stats {
            n_prompt_tokens: prompt.len() as u64,
            accepted_at: vec![0; k_max],
            rounds_by_k: vec![0; k_max + 1],
            ..Stats::default()
        };
        let mut tokens = Vec::with_capacity(prompt.len() + cfg.max_new_tokens);
        tokens.extend_from_slice(prompt);
        Ok(Self {
            tokens,
            n_prompt: prompt.len(),
            n_past_tgt: 0,
            n_past_dft: 0,
            penalties,
            rng: Rng::seed_from_u64(cfg.seed),
            noise: cfg.coupled.then(|| CoupledNoise::new(cfg.seed)),
            stats,
            sources: Vec::with_capacity(cfg.max_new_tokens),
            logprobs: Vec::with_capacity(cfg.max_new_tokens),
            top_logprobs: Vec::new(),
            prompt_scores: PromptLogprobs::default(),
            finish_reason: None,
            controller,
            constraint: None,
            forced_bits: 0,
            last_round: (0, 0, false),
            cfg,
        })
    }

    /// Whether the request may ever run the draft model (n-gram only or K = 0 never does).
    /// Rows of logits a prefill pass over `n` prompt positions returns: all `n` when the prompt is scored, else the
    /// last one (which nobody reads).
    pub(crate) fn prefill_logits(&self, n: usize) -> usize {
        if self.cfg.prompt_logprobs.is_some() {
            n
        } else {
            1
        }
    }

    /// Record the prompt scores of a prefill pass over prompt positions `start..start + rows` whose logits are
    /// `[rows, vocab]` (row `r` predicts prompt token `start + r + 1`); nothing without
    /// [`GenerationConfig::prompt_logprobs`].
    ///
    /// Errors: [`SpecError::NonFinite`] for a NaN / inf row (named by its prompt position).
    pub(crate) fn record_prompt_logprobs(
        &mut self,
        logits: &[f32],
        vocab: usize,
        start: usize,
    ) -> Result<()> {
        let Some(k) = self.cfg.prompt_logprobs else {
            return Ok(());
        };
        for (r, row) in logits.chunks_exact(vocab).enumerate() {
            let pos = start + r;
            let tok = self.tokens[pos + 1];
            self.prompt_scores
                .logprobs
                .push(log_softmax_at(row, tok, pos)?);
            self.prompt_scores.top_logprobs.push(if k > 0 {
                top_logprobs(row, k, pos)?
            } else {
                Vec::new()
            });
        }
        Ok(())
    }

    pub(crate) fn may_draft(&self) -> bool {
        self.cfg.use_draft_model
            && (self.cfg.auto_k.is_some() || self.cfg.num_speculative_tokens > 0)
    }

    /// Largest K of the request.
    pub(crate) fn k_max(&self) -> usize {
        self.cfg
            .auto_k
            .as_ref()
            .map_or(self.cfg.num_speculative_tokens, |a| a.k_max)
    }

    /// Generated tokens still allowed (`max_new_tokens` minus those emitted).
    pub(crate) fn remaining(&self) -> usize {
        self.cfg.max_new_tokens - (self.tokens.len() - self.n_prompt)
    }

    /// The mask of the next position (`[mask_words(vocab)] u32`) from the constraint in its current state: its
    /// allowed tokens, with the EOS ids allowed exactly where it accepts (never under `ignore_eos`).
    ///
    /// Errors: [`SpecError::Config`] if the constraint allows no token (or there is none); matcher errors.
    pub(crate) fn next_mask(&mut self, mask: &mut [u32]) -> Result<()> {
        let t0 = Instant::now();
        let c = self.constraint.as_mut().ok_or_else(|| {
            SpecError::Internal("next_mask on a request without a constraint".to_owned())
        })?;
        let out = next_mask(
            c.as_mut(),
            &self.cfg.eos_token_ids,
            self.cfg.ignore_eos,
            mask,
        );
        self.stats.mask_ms += ms_since(t0);
        out
    }

    /// Cut deterministic proposals `tokens` (`[k]`, n-gram continuations) at the first one the constraint refuses
    /// (its mask, EOS included), advancing the constraint through the kept ones and writing the mask of each row
    /// into `masks` (`[k + 1, words]`, row i = the state after the first i proposals). Returns `(mask rows written,
    /// whether the kept proposals end the sequence)`: a refusal at i keeps i proposals and writes i + 1 rows (the
    /// last is the bonus row's); an EOS or a completing token at i keeps i + 1 and writes i + 1 rows (the row after
    /// an end is never emitted); all kept writes k rows.
    ///
    /// Errors: matcher errors, as [`Request::next_mask`].
    pub(crate) fn constrain_proposals(
        &mut self,
        tokens: &mut Vec<u32>,
        masks: &mut [u32],
        words: usize,
    ) -> Result<(usize, bool)> {
        for i in 0..tokens.len() {
            let mask = &mut masks[i * words..(i + 1) * words];
            self.next_mask(mask)?;
            let d = tokens[i];
            if !mask_allows(mask, d) {
                tokens.truncate(i);
                return Ok((i + 1, false));
            }
            if self.is_eos(d) {
                tokens.truncate(i + 1);
                return Ok((i + 1, true));
            }
            let c = self.constraint.as_mut().expect("next_mask checked it");
            c.advance(d)?;
            if c.is_complete()? {
                tokens.truncate(i + 1);
                return Ok((i + 1, true));
            }
        }
        Ok((tokens.len(), false))
    }

    /// Whether `tok` is one of the request's EOS ids.
    pub(crate) fn is_eos(&self, tok: u32) -> bool {
        self.cfg.eos_token_ids.contains(&tok)
    }

    /// Choose draft token `i` of a round from the draft's logits `[vocab]` (the round starts at the committed
    /// length): a coupled choice with the noise the target will use at that position, or a sample whose processed
    /// distribution is written to `q_row` `[vocab]`. The token is added to the penalty context (the caller truncates
    /// it back after the round).
    ///
    /// Errors: logits processing errors (non-finite logits, penalties).
    pub(crate) fn draft_choice(
        &mut self,
        sampler: &mut Sampler,
        logits: &[f32],
        i: usize,
        q_row: &mut [f32],
    ) -> Result<u32> {
        let params = self.cfg.sampling;
        let use_penalties = params.has_penalties();
        let ctx = use_penalties.then_some(&self.penalties);
        let d = if let Some(noise) = &self.noise {
            // Coupled: the draft's choice at position len + i uses the noise the target will use there.
            sampler.process(logits, 0, &params, ctx)?;
            sampler.coupled_choice(noise, (self.tokens.len() + i) as u64)
        } else {
            sampler.sample_draft(logits, &params, ctx, &mut self.rng, q_row)?
        };
        if use_penalties {
            self.penalties.push(d)?;
        }
        Ok(d)
    }

    /// Verify a round's drafts against the target rows `logits_tgt` `[k + 1, vocab]` (coupled or modified
    /// rejection sampling, as the request says) into `ver`. `probs_dft`: `[k, vocab]` the draft distributions
    /// (stochastic mode; empty otherwise).
    ///
    /// Errors: as [`verify_into`] / [`verify_coupled_into`].
    pub(crate) fn verify(
        &mut self,
        sampler: &mut Sampler,
        logits_tgt: &[f32],
        probs_dft: &[f32],
        tokens_dft: &[u32],
        mode: VerifyMode,
        ver: &mut Verification,
    ) -> Result<()> {
        let params = self.cfg.sampling;
        if let Some(noise) = &self.noise {
            verify_coupled_into(
                sampler,
                logits_tgt,
                tokens_dft,
                &params,
                &mut self.penalties,
                noise,
                self.tokens.len() as u64,
                ver,
            )
        } else {
            verify_into(
                sampler,
                logits_tgt,
                probs_dft,
                tokens_dft,
                &params,
                mode,
                &mut self.penalties,
                &mut self.rng,
                ver,
            )
        }
    }

    /// Commit a verified round: emit `ver.tokens` up to a stop (EOS, stop token, `max_new_tokens`) into the request
    /// and into `out` (cleared first), with their sources and target log-probabilities (`logits_tgt`: the round's
    /// `[k + 1, vocab]` target rows), and count them in the statistics. `k` drafts were verified in `mode`;
    /// `draft_ms` / `target_ms` are the round's model times. `ngram`: the request's prompt-lookup index, extended
    /// with the emitted tokens. The caller updates the cache lengths.
    ///
    /// Errors: [`SpecError::NonFinite`] from a log-probability of a non-finite row; penalty bookkeeping errors.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn commit(
        &mut self,
        ver: &Verification,
        logits_tgt: &[f32],
        vocab: usize,
        k: usize,
        mode: VerifyMode,
        times: (f64, f64),
        ngram: Option<&mut LookupProposer>,
        out: &mut StepOutput,
    ) -> Result<()> {
        let (draft_ms, target_ms) = times;
        out.tokens.clear();
        out.sources.clear();
        out.logprobs.clear();
        out.top_logprobs.clear();
        out.n_drafted = k;
        out.finish_reason = None;
        let n_acc = ver.n_accepted;
        let use_penalties = self.cfg.sampling.has_penalties();
        let gen_before = self.tokens.len() - self.n_prompt;
        // The constraint was advanced through the round's proposals: back to the committed tokens, then through
        // the emitted ones (the penalty context's push-then-truncate).
        let keep_constraint = self.cfg.fault == Some(Fault::NoConstraintRollback);
        if let (Some(c), false) = (self.constraint.as_mut(), keep_constraint) {
            c.truncate(gen_before)?;
        }
        let stats = &mut self.stats;
        stats.n_rounds += 1;
        stats.draft_ms += draft_ms;
        stats.target_ms += target_ms;
        if stats.accepted_at.len() < k {
            stats.accepted_at.resize(k, 0);
        }
        if stats.rounds_by_k.len() <= k {
            stats.rounds_by_k.resize(k + 1, 0);
        }
        stats.rounds_by_k[k] += 1;
        for (i, &tok) in ver.tokens.iter().enumerate() {
            let source = if i < n_acc {
                TokenSource::Accepted
            } else if ver.last == LastToken::Bonus {
                TokenSource::Bonus
            } else {
                TokenSource::Recovered
            };
            let logprob = if self.cfg.logprobs {
                let row = &logits_tgt[i * vocab..(i + 1) * vocab];
                // The verifier's row normaliser when it computed the plain softmax (T = 1, no penalties/top-k).
                Some(match ver.row_norms.get(i).copied().flatten() {
                    Some(norm) => log_softmax_with(row, tok, norm)
                        .map_or_else(|| log_softmax_at(row, tok, i), Ok)?,
                    None => log_softmax_at(row, tok, i)?,
                })
            } else {
                None
            };
            match source {
                TokenSource::Accepted => {
                    stats.n_accepted += 1;
                    stats.accepted_at[i] += 1;
                    if mode == VerifyMode::Deterministic {
                        stats.n_accepted_ngram += 1;
                    }
                    if self.forced_bits >> i & 1 == 1 {
                        stats.n_accepted_forced += 1;
                    }
                }
                TokenSource::Recovered => stats.n_recovered += 1,
                TokenSource::Bonus => stats.n_bonus += 1,
            }
            self.tokens.push(tok);
            if use_penalties {
                self.penalties.push(tok)?;
            }
            self.sources.push(source);
            if let Some(lp) = logprob {
                self.logprobs.push(lp);
                out.logprobs.push(lp);
            }
            if self.cfg.top_logprobs > 0 {
                let row = &logits_tgt[i * vocab..(i + 1) * vocab];
                let top = top_logprobs(row, self.cfg.top_logprobs, i)?;
                self.top_logprobs.push(top.clone());
                out.top_logprobs.push(top);
            }
            out.tokens.push(tok);
            out.sources.push(source);
            let is_eos = self.cfg.eos_token_ids.contains(&tok);
            let mut complete = false;
            if let (Some(c), false) = (self.constraint.as_mut(), is_eos) {
                match c.advance(tok) {
                    Ok(()) => complete = c.is_complete()?,
                    // The broken variant ignores what its stale state refuses.
                    Err(_) if keep_constraint => {}
                    Err(e) => {
                        return Err(SpecError::Internal(format!(
                            "the constraint refused emitted token {tok} (it was allowed by its mask): {e}"
                        )))
                    }
                }
            }
            let finish = if !self.cfg.ignore_eos && is_eos {
                Some(FinishReason::Eos)
            } else if self.cfg.stop_token_ids.contains(&tok) {
                Some(FinishReason::Stop)
            } else if complete {
                Some(FinishReason::Grammar)
            } else if self.tokens.len() - self.n_prompt >= self.cfg.max_new_tokens {
                Some(FinishReason::Length)
            } else {
                None
            };
            if finish.is_some() {
                // Nothing after a stop is emitted or counted.
                self.finish_reason = finish;
                out.finish_reason = finish;
                break;
            }
        }
        // Draft positions count as drafted up to the last emitted token: a block cut by EOS, a stop token or
        // max_new_tokens counts only the positions before the cut.
        let n_emitted = out.tokens.len();
        let counted = if n_emitted < ver.tokens.len() {
            k.min(n_emitted)
        } else {
            k
        } as u64;
        let ngram_round = mode == VerifyMode::Deterministic;
        stats.n_drafted += counted;
        if ngram_round {
            stats.n_drafted_ngram += counted;
        }
        stats.n_drafted_forced += u64::from(forced_before(self.forced_bits, counted));
        self.last_round = (gen_before, counted, ngram_round);
        if let (Some(ng), true) = (ngram, self.cfg.ngram.is_some()) {
            ng.extend(&out.tokens);
        }
        Ok(())
    }

    /// Keep only the first `n_keep` generated tokens and finish with [`FinishReason::Stop`]; statistics then count
    /// only the kept tokens. `ngram`: the request's prompt-lookup index, cut back likewise.
    ///
    /// Errors: [`SpecError::Config`] if `n_keep` exceeds the generated count.
    pub(crate) fn stop_at(
        &mut self,
        n_keep: usize,
        ngram: Option<&mut LookupProposer>,
    ) -> Result<()> {
        let n_gen = self.sources.len();
        if n_keep > n_gen {
            return Err(SpecError::Config(format!(
                "stop_at({n_keep}) is invalid (expected <= {n_gen} generated tokens)"
            )));
        }
        let (gen_before, counted, ngram_round) = self.last_round;
        let stats = &mut self.stats;
        for (j, src) in self.sources.drain(n_keep..).enumerate() {
            let pos = (n_keep + j).saturating_sub(gen_before);
            match src {
                TokenSource::Accepted => {
                    stats.n_accepted -= 1;
                    if let Some(c) = stats.accepted_at.get_mut(pos) {
                        *c = c.saturating_sub(1);
                    }
                    if ngram_round {
                        stats.n_accepted_ngram -= 1;
                    }
                    if self.forced_bits >> pos & 1 == 1 {
                        stats.n_accepted_forced -= 1;
                    }
                }
                TokenSource::Recovered => stats.n_recovered -= 1,
                TokenSource::Bonus => stats.n_bonus -= 1,
            }
        }
        // The cut falls in the last round (earlier text held no stop): uncount its draft positions past the cut.
        let kept = counted.min(n_keep.saturating_sub(gen_before) as u64);
        stats.n_drafted -= counted - kept;
        if ngram_round {
            stats.n_drafted_ngram -= counted - kept;
        }
        stats.n_drafted_forced -= u64::from(
            forced_before(self.forced_bits, counted) - forced_before(self.forced_bits, kept),
        );
        self.last_round.1 = kept;
        self.logprobs.truncate(n_keep);
        self.top_logprobs.truncate(n_keep);
        self.tokens.truncate(self.n_prompt + n_keep);
        if let Some(c) = self.constraint.as_mut() {
            c.truncate(c.len().min(n_keep))?;
        }
        if let (Some(ng), true) = (ngram, self.cfg.ngram.is_some()) {
            ng.truncate(self.tokens.len());
        }
        self.finish_reason = Some(FinishReason::Stop);
        Ok(())
    }

    /// The result once finished.
    ///
    /// Errors: [`SpecError::Config`] if it has not finished.
    pub(crate) fn output(&self) -> Result<GenerationOutput> {
        let finish_reason = self.finish_reason.ok_or_else(|| {
            SpecError::Config(
                "the generation has not finished (call step until it does)".to_owned(),
            )
        })?;
        Ok(GenerationOutput {
            tokens: self.tokens[self.n_prompt..].to_vec(),
            sources: self.sources.clone(),
            logprobs: self.logprobs.clone(),
            top_logprobs: self.top_logprobs.clone(),
            prompt: self.prompt_scores.clone(),
            finish_reason,
            stats: self.stats.clone(),
        })
    }
}

/// Most grammar-forced tokens a round proposes beyond its K (they cost no draft pass, but a target row each, and
/// the round's buffers are sized for `K + MAX_FORCED_PER_ROUND` rows).
pub const MAX_FORCED_PER_ROUND: usize = 16;

/// Forced proposals among the first `n` of a round (`bits`: bit i = proposal i was forced).
fn forced_before(bits: u64, n: u64) -> u32 {
    let m = if n >= 64 { u64::MAX } else { (1u64 << n) - 1 };
    (bits & m).count_ones()
}

pub(crate) fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}
