//! [`RequestEngine`]: the one interface the driver (`specrt_ort::Driver`: text, stop strings, events) runs
//! every generation through, single-stream or batched: requests are added under an id, each [`RequestEngine::step`]
//! runs one round and reports what each request committed ([`RowStep`]), a request is cut at a stop string with
//! [`RequestEngine::stop_at`], and a finished one's output is taken with [`RequestEngine::take_output`].
//!
//! Two engines implement it: [`crate::BatchEngine`] (many rows per round) and [`crate::SingleStream`] (one request
//! at a time on an [`crate::Engine`]: structured output, CUDA graphs and prefix reuse between generations as the
//! single-stream engine has them; later requests wait their turn).

use crate::constraint::Constraint;
use crate::error::{Result, SpecError};
use crate::request::{GenerationConfig, GenerationOutput, PromptLogprobs, StepOutput};
use crate::stats::Stats;

/// What one row committed in a round.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RowStep {
    /// The request's id (as given to [`BatchEngine::add`]).
    pub id: u64,
    /// The committed tokens (empty when the row failed).
    pub out: StepOutput,
    /// Set when this row failed in the round (it has left the batch).
    pub error: Option<SpecError>,
}

/// An engine of requests under ids (see the module docs). Ids are the caller's, unique among requests not yet
/// taken with [`RequestEngine::take_output`] or cancelled.
pub trait RequestEngine: Send {
    /// Queue a request (validated now: settings, prompt ids, length); it runs from a later
    /// [`RequestEngine::step`].
    ///
    /// Errors: [`crate::SpecError::Config`] (a duplicate id, an empty prompt, bad settings, a used constraint),
    /// [`crate::SpecError::Vocab`], [`crate::SpecError::Length`]. Nothing is queued on an error.
    fn add_with(
        &mut self,
        id: u64,
        prompt: &[u32],
        cfg: GenerationConfig,
        constraint: Option<Box<dyn Constraint>>,
    ) -> Result<()>;

    /// Run one round; returns what each request that ran committed (a failed request's step carries its error and
    /// the request is gone). Requests that finished wait for [`RequestEngine::take_output`].
    ///
    /// Errors: a failure of the round itself (every running request is then dropped).
    fn step(&mut self) -> Result<Vec<RowStep>>;

    /// Remove a running, waiting or finished request now; returns whether `id` was known.
    ///
    /// Errors: [`crate::SpecError::Backend`] when freeing its cache slot fails.
    fn cancel(&mut self, id: u64) -> Result<bool>;

    /// Keep the first `n_keep` generated tokens of request `id` and finish it with
    /// [`crate::FinishReason::Stop`] (its caller matched a stop string).
    ///
    /// Errors: [`crate::SpecError::Config`] for an id neither running nor finished, or `n_keep` beyond its count.
    fn stop_at(&mut self, id: u64, n_keep: usize) -> Result<()>;

    /// The output of finished request `id`, removed from the engine (`None` if not finished or unknown).
    fn take_output(&mut self, id: u64) -> Option<GenerationOutput>;

    /// The prompt scores of a running or finished request (complete from its first emitted token on).
    fn prompt_logprobs(&self, id: u64) -> Option<&PromptLogprobs>;

    /// Statistics so far of a running or finished request.
    fn stats(&self, id: u64) -> Option<&Stats>;

    /// Statistics of the request run last, even one cancelled or failed since (the single-stream engine keeps them
    /// until its next request starts; `None` for engines that do not, as the batched one).
    fn last_stats(&self) -> Option<&Stats> {
        None
    }

    /// The target's logits width.
    fn vocab_size(&self) -> usize;

    /// Whether a draft model is attached.
    fn has_draft(&self) -> bool;

    /// Longest prompt + new tokens of a request.
    fn max_seq_len(&self) -> usize;

    /// Requests that run in one round at most (1 for [`crate::SingleStream`]).
    fn max_batch(&self) -> usize;

    /// Requests running now.
    fn n_running(&self) -> usize;

    /// Requests waiting for their turn.
    fn n_waiting(&self) -> usize;

    /// Prefixes kept in the prefix store and the bytes of their KV copies (both models); (0, 0) for an engine
    /// without a store ([`crate::SingleStream`] reuses the KV its last request left in place, no copies).
    fn prefix_cache_usage(&self) -> (usize, usize) {
        (0, 0)
    }

    /// Share suffix decoding's cache of earlier requests ([`crate::suffix`]; `None`: each request drafts from its
    /// own text). Requests that ask for suffix decoding read it and publish their text to it when they end.
    fn set_suffix_cache(&mut self, cache: Option<std::sync::Arc<crate::SuffixCache>>);

    /// Whether nothing is running or waiting.
    fn is_idle(&self) -> bool {
        self.n_running() == 0 && self.n_waiting() == 0
    }
}

/// The error of an `add` under an id already taken (every [`RequestEngine`] gives it).
pub(crate) fn id_in_use(id: u64) -> SpecError {
    SpecError::Config(format!(
        "request id {id} is already in use (expected an id not yet taken)"
    ))
}
