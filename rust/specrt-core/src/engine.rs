//! The draft/verify loop: prefill, then rounds of propose (draft model) -> score K + 1 positions (target) ->
//! verify -> commit, with KV bookkeeping by length (see ARCHITECTURE.md, "Authoritative state").
//!
//! Speculative sampling after Leviathan et al. 2023 (arXiv:2211.17192) and Chen et al. 2023 (arXiv:2302.01318).
//! Target-only decoding is the same loop with K = 0: one target row per round, its token counted as a bonus token.
//!
//! The draft never spends an extra pass catching up: the committed tokens it has not seen (the recovered or bonus
//! token, and the last draft token when all K were accepted) are the input of its first pass of the next round.

use std::time::Instant;

use crate::adaptive::{AutoK, KController, RoundKind};
use crate::backend::Backend;
use crate::constrained::{ConstrainedScratch, Proposer};
use crate::constraint::{mask_allows, mask_words, next_mask, Constraint};
use crate::coupled::CoupledNoise;
use crate::error::{Result, SpecError};
use crate::ngram::NgramProposer;
use crate::prefix::{PrefixReuse, DEFAULT_PREFIX_CACHING};
use crate::rng::Rng;
use crate::sampling::{
    log_softmax_at, log_softmax_with, top_logprobs, Fault, PenaltyContext, Sampler, SamplingParams,
    MAX_TOP_LOGPROBS,
};
use crate::stats::Stats;
use crate::verify::{
    verify_coupled_into, verify_greedy_ids_into, verify_into, LastToken, Verification, VerifyMode,
    MAX_DRAFT_TOKENS,
};
use crate::vocab::FittedDraft;

/// Settings of one generation request.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerationConfig {
    /// Most tokens to emit (>= 1).
    pub max_new_tokens: usize,
    /// K, draft tokens per round, `0..=64`; 0 (or no draft model) is plain target decoding. Capped each round so
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

/// Settings of prompt-lookup drafting (vLLM's names).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NgramConfig {
    /// Shortest suffix n-gram to match (>= 1).
    pub prompt_lookup_min: usize,
    /// Longest suffix n-gram to match (>= prompt_lookup_min, <= 32).
    pub prompt_lookup_max: usize,
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
        if self.num_speculative_tokens > MAX_DRAFT_TOKENS {
            return Err(SpecError::setting(
                "num_speculative_tokens",
                format!(
                    "num_speculative_tokens {} is invalid (expected 0 <= K <= {MAX_DRAFT_TOKENS})",
                    self.num_speculative_tokens
                ),
            ));
        }
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
        ngram: Option<&mut NgramProposer>,
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
        ngram: Option<&mut NgramProposer>,
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
    // Prompt-lookup index over the committed tokens (allocations reused across requests).
    ngram: Option<NgramProposer>,
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
            ngram: None,
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

    /// Start a generation: validate, prefill both caches with all prompt tokens but the last (that one is the
    /// first input of the first round). Any generation in progress is dropped. With prefix caching
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
                let fresh = self.ngram.as_ref().is_none_or(|p| {
                    p.min_n() != ng.prompt_lookup_min || p.max_n() != ng.prompt_lookup_max
                });
                if fresh {
                    self.ngram = Some(NgramProposer::new(
                        ng.prompt_lookup_min,
                        ng.prompt_lookup_max,
                    )?);
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
        let n_past = prompt.len() - 1;
        // A request that never runs the draft model (n-gram only, or K = 0) does not prefill it either.
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
        if req.cfg.prompt_logprobs.is_some() {
            // Scored in chunks, each pass's rows reduced to the values asked for before the next.
            for a in (0..n_past).step_by(PROMPT_LOGPROBS_CHUNK) {
                let b = (a + PROMPT_LOGPROBS_CHUNK).min(n_past);
                let logits = self.target.forward(&prompt[a..b], a, b - a)?;
                req.record_prompt_logprobs(logits, self.vocab, a)?;
            }
        } else if n_past > reuse.n_tgt {
            self.target
                .forward(&prompt[reuse.n_tgt..n_past], reuse.n_tgt, 1)?;
        }
        if use_draft && n_past > reuse.n_dft {
            let d = self.draft.as_mut().expect("use_draft");
            let t_draft = Instant::now();
            d.forward(&prompt[reuse.n_dft..n_past], reuse.n_dft, 1)?;
            // The prefill is the request's first measure of what a draft catch-up pass costs per token.
            if let Some(c) = req.controller.as_mut() {
                c.observe_catchup(ms_since(t_draft), n_past - reuse.n_dft);
            }
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
        req.n_past_tgt = n_past;
        // A draft this request does not run keeps what it held, for a later request to reuse.
        req.n_past_dft = if use_draft { n_past } else { reuse.n_dft };
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
        let ids_only = req.cfg.ids_only() && !constrained;
        // Constrained rounds: mask rows filled so far (row i = the state after d_1 .. d_i), and whether the
        // proposals end the sequence (an EOS or a completing token: no row after it is ever emitted).
        let mut n_masks = 0usize;
        let mut ended = false;
        // K is fixed before any random draw of the round, so the round is lossless whatever K is; it never drafts
        // past max_new_tokens.
        // (A constrained request proposes grammar-forced tokens even without a draft model.)
        let k_cap = if draft_usable || req.cfg.ngram.is_some() || constrained {
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
        let logits_tgt: &[f32] = if ids_only {
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
        if let Some(c) = req.controller.as_mut() {
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
