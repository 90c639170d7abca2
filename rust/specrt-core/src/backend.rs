//! The model backend trait: what the decode loop needs from a model runtime.
//!
//! A backend holds one model and its KV cache. It holds no positions: every [`Backend::forward`] call names
//! `n_past`, the number of cached positions that are valid, so a rollback after a rejected draft is just a smaller
//! `n_past` on the next call (stale cache rows are overwritten).

use crate::error::Result;

/// One model with a KV cache.
pub trait Backend: Send {
    /// Number of logits per row (the model's output width).
    fn vocab_size(&self) -> usize;

    /// Largest total sequence (cached + new tokens) the cache can hold.
    fn max_seq_len(&self) -> usize;

    /// Run `tokens` on top of the first `n_past` cached positions and return the logits of the last `n_logits`
    /// positions: `[n_logits, vocab] float32`, row-major, borrowed until the next call.
    ///
    /// Errors: [`crate::SpecError::Length`] if `n_past + tokens.len()` exceeds [`Backend::max_seq_len`],
    /// [`crate::SpecError::Config`] if `n_logits` is 0 or above `tokens.len()`, [`crate::SpecError::Backend`] if the
    /// runtime fails.
    fn forward(&mut self, tokens: &[u32], n_past: usize, n_logits: usize) -> Result<&[f32]>;
}
