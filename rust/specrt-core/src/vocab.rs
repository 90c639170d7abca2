//! A draft and a target of one tokenizer whose logits widths differ by padding rows.
//!
//! Qwen2.5's 7B / 14B / 32B heads have 152064 rows, its 0.5B / 1.5B / 3B heads 151936, and their one tokenizer
//! about 151665 ids: the rows beyond the tokenizer are padding that no token maps to. Such a pair is usable as it
//! is, exactly: [`check_draft_width`] is the one rule that accepts it, and [`FittedDraft`] /
//! [`FittedBatchDraft`] give the draft the target's width.
//!
//! Fitting the draft to the target (never the reverse) keeps the pair's vocabulary the target's: prompts, stop ids,
//! constraint masks and outputs are checked against the target's width as without a draft, and the target is never
//! fed an id beyond its own rows. The draft's `q` is its softmax with `-inf` on the target's rows it lacks (q = 0
//! there: those tokens come only from the residual `norm(max(0, p - q))` or the bonus row, the seed's q = 0 case)
//! and without its own rows beyond the target's (their tokens are never proposed; `q` is renormalised over the
//! rest). Modified rejection sampling needs nothing of `q` but that the draft token was drawn from it, so the
//! output keeps the target's distribution; greedy drafts are proposals only. A token the draft lacks (one the
//! target emitted from its padding rows) is fed to the draft as its own last row: that changes the draft's later
//! proposals, never the output.

use crate::backend::{argmax_of_forward, Backend, BatchBackend, BatchRow};
use crate::error::{Result, SpecError};

/// The one rule for a draft's logits width against its target's: equal widths, or widths that differ only in
/// padding rows, i.e. both at least `tokenizer_vocab`, the size of the tokenizer both models share (its largest
/// id + 1; `None` when it is not known: then the widths must be equal). The tokenizers' equality is the caller's
/// to check (`specrt-ort` compares the folders' `tokenizer.json`).
///
/// Errors: [`SpecError::Vocab`] naming both widths and the tokenizer's size.
pub fn check_draft_width(
    target: usize,
    draft: usize,
    tokenizer_vocab: Option<usize>,
) -> Result<()> {
    if target == draft {
        return Ok(());
    }
    match tokenizer_vocab {
        Some(n) if target >= n && draft >= n => Ok(()),
        Some(n) => Err(SpecError::Vocab(format!(
            "draft vocab size {draft} != target vocab size {target}, and {} below the tokenizer's \
             vocabulary size {n} (logits widths may differ only in padding rows beyond the tokenizer's ids)",
            if draft < n && target < n {
                "both are"
            } else if draft < n {
                "the draft's is"
            } else {
                "the target's is"
            }
        ))),
        None => Err(SpecError::Vocab(format!(
            "draft vocab size {draft} != target vocab size {target}, and the tokenizer's vocabulary size is not \
             known (logits widths may differ only in padding rows beyond the tokenizer's ids: give its size)"
        ))),
    }
}

/// Fit row-major `[rows, from]` logits into `out` as `[rows, to]`: `-inf` on the columns `from..to`, the columns
/// beyond `to` dropped.
fn fit_rows(logits: &[f32], from: usize, to: usize, out: &mut Vec<f32>) {
    let rows = logits.len() / from;
    out.clear();
    out.reserve(rows * to);
    let keep = from.min(to);
    for row in logits.chunks_exact(from) {
        out.extend_from_slice(&row[..keep]);
        out.resize(out.len() + (to - keep), f32::NEG_INFINITY);
    }
}

/// `tokens` with every id `>= width` replaced by `width - 1` (into `buf`), or `tokens` itself when none is.
fn clamp_ids<'a>(tokens: &'a [u32], width: usize, buf: &'a mut Vec<u32>) -> &'a [u32] {
    let last = u32::try_from(width - 1).unwrap_or(u32::MAX);
    if tokens.iter().all(|&t| t <= last) {
        return tokens;
    }
    buf.clear();
    buf.extend(tokens.iter().map(|&t| t.min(last)));
    buf
}

/// A draft [`Backend`] fitted to the target's logits width (module docs): rows `[n, width]` with `-inf` on the
/// columns it lacks, its columns beyond `width` dropped, ids beyond its own rows fed as its last row.
/// [`Backend::forward_argmax`] passes the inner model's ids through (a device argmax stays on the device) unless
/// one is `>= width`, when the pass is rerun and the fitted rows scanned.
pub struct FittedDraft {
    inner: Box<dyn Backend>,
    inner_width: usize,
    width: usize,
    // [n, width] the fitted rows of the last call.
    out: Vec<f32>,
    // Input ids with those beyond the inner model's rows replaced.
    ids: Vec<u32>,
}

impl FittedDraft {
    /// Wrap `inner` to give rows of `width` logits.
    #[must_use]
    pub fn new(inner: Box<dyn Backend>, width: usize) -> Self {
        let inner_width = inner.vocab_size();
        Self {
            inner,
            inner_width,
            width,
            out: Vec::new(),
            ids: Vec::new(),
        }
    }

    /// `draft` as the engines take it with a target of `target` logits: checked with [`check_draft_width`], then
    /// wrapped in a [`FittedDraft`] when the widths differ.
    ///
    /// Errors: as [`check_draft_width`].
    pub fn fit(
        draft: Box<dyn Backend>,
        target: usize,
        tokenizer_vocab: Option<usize>,
    ) -> Result<Box<dyn Backend>> {
        let w = draft.vocab_size();
        check_draft_width(target, w, tokenizer_vocab)?;
        Ok(if w == target {
            draft
        } else {
            Box::new(Self::new(draft, target))
        })
    }
}

impl Backend for FittedDraft {
    fn vocab_size(&self) -> usize {
        self.width
    }

    fn max_seq_len(&self) -> usize {
        self.inner.max_seq_len()
    }

    fn forward(&mut self, tokens: &[u32], n_past: usize, n_logits: usize) -> Result<&[f32]> {
        let tokens = clamp_ids(tokens, self.inner_width, &mut self.ids);
        let logits = self.inner.forward(tokens, n_past, n_logits)?;
        fit_rows(logits, self.inner_width, self.width, &mut self.out);
        Ok(&self.out)
    }

    fn forward_argmax(
        &mut self,
        tokens: &[u32],
        n_past: usize,
        n_logits: usize,
        out: &mut Vec<u32>,
    ) -> Result<()> {
        {
            let tokens = clamp_ids(tokens, self.inner_width, &mut self.ids);
            self.inner.forward_argmax(tokens, n_past, n_logits, out)?;
        }
        if out.iter().all(|&t| (t as usize) < self.width) {
            return Ok(());
        }
        // The inner argmax is one of its rows beyond the target's: the same pass again (it rewrites the same cache
        // positions), scanned over the fitted rows.
        let tokens = tokens.to_vec();
        argmax_of_forward(self, &tokens, n_past, n_logits, out)
    }
}

/// A draft [`BatchBackend`] fitted to the target's logits width, as [`FittedDraft`].
pub struct FittedBatchDraft {
    inner: Box<dyn BatchBackend>,
    inner_width: usize,
    width: usize,
    out: Vec<f32>,
}

impl FittedBatchDraft {
    /// Wrap `inner` to give rows of `width` logits.
    #[must_use]
    pub fn new(inner: Box<dyn BatchBackend>, width: usize) -> Self {
        let inner_width = inner.vocab_size();
        Self {
            inner,
            inner_width,
            width,
            out: Vec::new(),
        }
    }

    /// `draft` as the batched engine takes it with a target of `target` logits: checked with
    /// [`check_draft_width`], then wrapped when the widths differ.
    ///
    /// Errors: as [`check_draft_width`].
    pub fn fit(
        draft: Box<dyn BatchBackend>,
        target: usize,
        tokenizer_vocab: Option<usize>,
    ) -> Result<Box<dyn BatchBackend>> {
        let w = draft.vocab_size();
        check_draft_width(target, w, tokenizer_vocab)?;
        Ok(if w == target {
            draft
        } else {
            Box::new(Self::new(draft, target))
        })
    }
}

impl BatchBackend for FittedBatchDraft {
    fn vocab_size(&self) -> usize {
        self.width
    }

    fn max_seq_len(&self) -> usize {
        self.inner.max_seq_len()
    }

    fn max_batch(&self) -> usize {
        self.inner.max_batch()
    }

    fn forward_rows(
        &mut self,
        first_slot: usize,
        rows: &[BatchRow<'_>],
        n_logits: usize,
    ) -> Result<&[f32]> {
        let w = self.inner_width;
        let logits = if rows
            .iter()
            .all(|r| r.tokens.iter().all(|&t| (t as usize) < w))
        {
            self.inner.forward_rows(first_slot, rows, n_logits)?
        } else {
            let mut bufs: Vec<Vec<u32>> = vec![Vec::new(); rows.len()];
            let fixed: Vec<BatchRow<'_>> = rows
                .iter()
                .zip(bufs.iter_mut())
                .map(|(r, buf)| BatchRow {
                    tokens: clamp_ids(r.tokens, w, buf),
                    n_past: r.n_past,
                })
                .collect();
            self.inner.forward_rows(first_slot, &fixed, n_logits)?
        };
        fit_rows(logits, w, self.width, &mut self.out);
        Ok(&self.out)
    }

    fn move_slot(&mut self, from: usize, to: usize, n_valid: usize) -> Result<()> {
        self.inner.move_slot(from, to, n_valid)
    }

    fn kv_bytes_per_token(&self) -> usize {
        self.inner.kv_bytes_per_token()
    }

    fn store_prefix(&mut self, key: u64, slot: usize, n: usize) -> Result<()> {
        self.inner.store_prefix(key, slot, n)
    }

    fn load_prefix(&mut self, key: u64, slot: usize, n: usize) -> Result<()> {
        self.inner.load_prefix(key, slot, n)
    }

    fn drop_prefix(&mut self, key: u64) {
        self.inner.drop_prefix(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::MockModel;

    #[test]
    fn the_width_rule_accepts_padding_only() {
        check_draft_width(8, 8, None).unwrap();
        check_draft_width(8, 8, Some(10)).unwrap();
        check_draft_width(152_064, 151_936, Some(151_665)).unwrap();
        check_draft_width(151_936, 152_064, Some(151_665)).unwrap();
        check_draft_width(152_064, 151_665, Some(151_665)).unwrap();
        let msg = |t, d, n| match check_draft_width(t, d, n) {
            Err(SpecError::Vocab(m)) => m,
            other => panic!("{other:?}"),
        };
        let m = msg(152_064, 151_000, Some(151_665));
        assert!(
            m.contains("draft vocab size 151000 != target vocab size 152064")
                && m.contains("draft's is below the tokenizer's vocabulary size 151665"),
            "{m}"
        );
        let m = msg(151_000, 152_064, Some(151_665));
        assert!(m.contains("target's is below"), "{m}");
        let m = msg(100, 90, Some(120));
        assert!(
            m.contains("both are below the tokenizer's vocabulary size 120"),
            "{m}"
        );
        let m = msg(8, 6, None);
        assert!(
            m.contains("draft vocab size 6 != target vocab size 8") && m.contains("not known"),
            "{m}"
        );
    }

    #[test]
    fn fitted_rows_are_padded_with_minus_infinity_or_cut() {
        let ninf = f32::NEG_INFINITY;
        let mut out = Vec::new();
        fit_rows(&[1.0, 2.0, 3.0, 4.0], 2, 3, &mut out);
        assert_eq!(out, [1.0, 2.0, ninf, 3.0, 4.0, ninf]);
        fit_rows(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 3, 2, &mut out);
        assert_eq!(out, [1.0, 2.0, 4.0, 5.0]);
        let mut buf = Vec::new();
        assert_eq!(clamp_ids(&[0, 5, 9], 6, &mut buf), [0, 5, 5]);
        assert_eq!(clamp_ids(&[0, 5], 6, &mut buf), [0, 5]);
    }

    #[test]
    fn a_fitted_draft_gives_the_inner_rows_at_the_targets_width() {
        let inner = MockModel::new(6, 32, 3, 2.0);
        let mut fitted = FittedDraft::new(Box::new(inner.clone()), 8);
        assert_eq!(fitted.vocab_size(), 8);
        let mut row = [0f32; 6];
        inner.row(&[1, 2], &mut row);
        let got = fitted.forward(&[1, 2], 0, 1).unwrap();
        assert_eq!(&got[..6], &row);
        assert!(got[6..].iter().all(|&x| x == f32::NEG_INFINITY));
        // An id beyond its rows is fed as its last row.
        inner.row(&[1, 5], &mut row);
        assert_eq!(&fitted.forward(&[7], 1, 1).unwrap()[..6], &row);
        // A wider draft is cut to the target's width; its argmax never lands beyond it.
        let wide = MockModel::new(8, 32, 3, 2.0).with_boost(7, 50.0);
        let mut fitted = FittedDraft::new(Box::new(wide), 6);
        let mut ids = Vec::new();
        fitted.forward_argmax(&[1, 2, 3], 0, 3, &mut ids).unwrap();
        assert_eq!(ids.len(), 3);
        assert!(ids.iter().all(|&t| t < 6), "{ids:?}");
    }
}
