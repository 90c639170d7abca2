//! Statistics of one generation, defined as vLLM defines them: every emitted token is exactly one of
//! accepted (a draft token the target kept), recovered (sampled from the residual after a rejection) or bonus
//! (sampled from the target's last row when all drafts were accepted; a K = 0 step's token is a bonus token too).

/// Counters and timings of one generation. Only emitted tokens are counted as accepted / recovered / bonus.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stats {
    /// Prompt length in tokens.
    pub n_prompt_tokens: u64,
    /// Of `n_prompt_tokens`, those whose target KV was reused from an earlier generation instead of prefilled
    /// (prefix caching; OpenAI's `usage.prompt_tokens_details.cached_tokens`). 0 = a prefix-cache miss.
    pub n_cached_tokens: u64,
    /// Of `n_prompt_tokens`, those whose draft KV was reused (0 when the request does not run the draft).
    pub n_cached_tokens_dft: u64,
    /// Verification rounds run (each is one target forward pass over K + 1 tokens).
    pub n_rounds: u64,
    /// Draft tokens proposed and verified (sum of K over rounds).
    pub n_drafted: u64,
    /// Emitted draft tokens the target accepted.
    pub n_accepted: u64,
    /// Emitted tokens sampled from the residual norm(max(0, p - q)) after a rejection.
    pub n_recovered: u64,
    /// Emitted tokens sampled from the target's last row after all drafts were accepted (or K = 0).
    pub n_bonus: u64,
    /// Of `n_drafted`, tokens proposed by prompt lookup (n-gram); the rest came from the draft model.
    pub n_drafted_ngram: u64,
    /// Of `n_accepted`, tokens proposed by prompt lookup (n-gram).
    pub n_accepted_ngram: u64,
    /// Of `n_drafted`, grammar-forced tokens of a constrained request (proposed without a draft pass).
    pub n_drafted_forced: u64,
    /// Of `n_accepted`, grammar-forced tokens.
    pub n_accepted_forced: u64,
    /// `rounds_by_k[k]`: rounds that verified `k` draft tokens (how often each K was chosen).
    pub rounds_by_k: Vec<u64>,
    /// `accepted_at[i]`: rounds in which draft position `i` (0-based) was accepted and emitted.
    pub accepted_at: Vec<u64>,
    /// Wall time of the prompt prefill (both models), ms.
    pub prefill_ms: f64,
    /// Wall time in draft forward passes and draft sampling after prefill, ms.
    pub draft_ms: f64,
    /// Wall time in target forward passes after prefill, ms.
    pub target_ms: f64,
    /// Wall time in verification, log-probabilities and bookkeeping (everything but the models), ms.
    pub core_ms: f64,
    /// Of the draft and core time, wall time in the request's constraint (masks, forced tokens, advancing through
    /// proposals), ms; 0 without one.
    pub mask_ms: f64,
}

impl Stats {
    /// Whether the target reused a cached prefix of the prompt (a prefix-cache hit; a miss otherwise).
    #[must_use]
    pub fn prefix_cache_hit(&self) -> bool {
        self.n_cached_tokens > 0
    }

    /// Emitted tokens: accepted + recovered + bonus.
    #[must_use]
    pub fn n_emitted(&self) -> u64 {
        self.n_accepted + self.n_recovered + self.n_bonus
    }

    /// Acceptance rate, accepted / drafted (vLLM's definition), in [0, 1]; `None` when nothing was drafted.
    #[must_use]
    pub fn acceptance_rate(&self) -> Option<f64> {
        (self.n_drafted > 0).then(|| self.n_accepted as f64 / self.n_drafted as f64)
    }

    /// Mean emitted tokens per round (the seed's E); `None` before the first round.
    #[must_use]
    pub fn mean_tokens_per_round(&self) -> Option<f64> {
        (self.n_rounds > 0).then(|| self.n_emitted() as f64 / self.n_rounds as f64)
    }

    /// Decode time after prefill, ms.
    #[must_use]
    pub fn decode_ms(&self) -> f64 {
        self.draft_ms + self.target_ms + self.core_ms
    }

    /// Decode throughput after prefill, tokens/s; `None` before any decode time elapsed.
    #[must_use]
    pub fn decode_tokens_per_s(&self) -> Option<f64> {
        let ms = self.decode_ms();
        (ms > 0.0).then(|| self.n_emitted() as f64 * 1000.0 / ms)
    }

    /// End-to-end throughput including prefill, tokens/s.
    #[must_use]
    pub fn tokens_per_s(&self) -> Option<f64> {
        let ms = self.decode_ms() + self.prefill_ms;
        (ms > 0.0).then(|| self.n_emitted() as f64 * 1000.0 / ms)
    }
}
