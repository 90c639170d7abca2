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

    /// Run like [`Backend::forward`] and write only the greedy choice of each of the last `n_logits` positions
    /// into `out` (`[n_logits]` token ids, cleared first): the first maximum of each row, which is what
    /// [`crate::Sampler::argmax`] picks without penalties. Greedy decoding without penalties or log-probabilities
    /// needs nothing else (ARCHITECTURE.md, "Graph form").
    ///
    /// The default runs [`Backend::forward`] and scans each row, checking it for NaN / inf. A backend whose model
    /// computes the argmax on its device overrides this so that only the ids leave the device; its rows are then
    /// not checked.
    ///
    /// Errors: as [`Backend::forward`]; [`crate::SpecError::NonFinite`] for a row with NaN, +inf or only -inf
    /// (default implementation).
    fn forward_argmax(
        &mut self,
        tokens: &[u32],
        n_past: usize,
        n_logits: usize,
        out: &mut Vec<u32>,
    ) -> Result<()> {
        argmax_of_forward(self, tokens, n_past, n_logits, out)
    }
}

/// [`Backend::forward_argmax`]'s default: [`Backend::forward`], then the first maximum of each row
/// ([`crate::sampling::argmax_rows`], which checks every row for NaN / inf). For backends that override it and fall
/// back to it for some models.
///
/// Errors: as [`Backend::forward_argmax`].
pub fn argmax_of_forward<B: Backend + ?Sized>(
    backend: &mut B,
    tokens: &[u32],
    n_past: usize,
    n_logits: usize,
    out: &mut Vec<u32>,
) -> Result<()> {
    let vocab = backend.vocab_size();
    let logits = backend.forward(tokens, n_past, n_logits)?;
    crate::sampling::argmax_rows(logits, vocab, out)
}

/// One row of a batched pass ([`BatchBackend::forward_rows`]).
#[derive(Clone, Copy, Debug)]
pub struct BatchRow<'a> {
    /// The row's new tokens. Empty: the row sits this pass out (its cache is left as it is; its logits rows hold
    /// nothing meaningful).
    pub tokens: &'a [u32],
    /// Valid cached positions of the row's slot; the tokens are written after them.
    pub n_past: usize,
}

impl BatchRow<'_> {
    /// A row that sits the pass out.
    pub const EMPTY: BatchRow<'static> = BatchRow {
        tokens: &[],
        n_past: 0,
    };
}

/// A model that runs several sequences ("rows") in one pass, each on its own KV cache slot (ARCHITECTURE.md,
/// "Batched rounds"). Like [`Backend`], it holds no positions: each call names every row's `n_past`, so a rollback is
/// a smaller `n_past` on the next call.
pub trait BatchBackend: Send {
    /// Number of logits per row (the model's output width).
    fn vocab_size(&self) -> usize;

    /// Largest total sequence (cached + new tokens) one slot can hold.
    fn max_seq_len(&self) -> usize;

    /// Number of cache slots: the largest batch.
    fn max_batch(&self) -> usize;

    /// Run `rows[r]` on slot `first_slot + r` (a contiguous range of slots), every row right-padded to
    /// `s = max(tokens.len())` tokens, and return the logits of the last `n_logits` of the `s` padded positions:
    /// `[rows.len(), n_logits, vocab] float32`, row-major, borrowed until the next call. Row `r`'s token `j` (for
    /// `j >= s - n_logits`) has its logits at `((r * n_logits) + j - (s - n_logits)) * vocab`.
    ///
    /// Errors: [`crate::SpecError::Config`] if `rows` is empty, every row is empty, the slots run past
    /// [`BatchBackend::max_batch`], or `n_logits` is 0 or above `s`; [`crate::SpecError::Length`] if a row's
    /// `n_past + tokens.len()` exceeds [`BatchBackend::max_seq_len`]; [`crate::SpecError::Backend`] if the runtime
    /// fails.
    fn forward_rows(
        &mut self,
        first_slot: usize,
        rows: &[BatchRow<'_>],
        n_logits: usize,
    ) -> Result<&[f32]>;

    /// Copy the first `n_valid` cached positions of slot `from` into slot `to` (the engine keeps its rows in
    /// contiguous slots: when a row leaves, the last row moves into its slot).
    ///
    /// Errors: [`crate::SpecError::Config`] for a slot `>= max_batch` or `n_valid > max_seq_len`.
    fn move_slot(&mut self, from: usize, to: usize, n_valid: usize) -> Result<()>;

    /// Bytes one cached position of one slot takes (keys and values of every layer): what a kept prefix costs in
    /// the prefix store's budget ([`crate::BatchOptions::prefix_cache_bytes`]).
    fn kv_bytes_per_token(&self) -> usize;

    /// Copy the first `n` cached positions of `slot` into the prefix store under `key` (prefix caching: the
    /// engine keeps a finished row's KV for later requests that begin with the same tokens). A key already stored
    /// is replaced.
    ///
    /// Errors: [`crate::SpecError::Config`] for a slot `>= max_batch` or `n` beyond the positions cached in it.
    fn store_prefix(&mut self, key: u64, slot: usize, n: usize) -> Result<()>;

    /// Copy the first `n` positions stored under `key` into `slot` (which then holds them as valid KV).
    ///
    /// Errors: [`crate::SpecError::Config`] for an unknown key, `n` beyond the stored positions, or a slot
    /// `>= max_batch`.
    fn load_prefix(&mut self, key: u64, slot: usize, n: usize) -> Result<()>;

    /// Free what is stored under `key` (an unknown key is ignored).
    fn drop_prefix(&mut self, key: u64);
}
