//! Pruned-vocabulary drafts: a draft that scores only a subset of the vocabulary.
//!
//! The draft's output layer is most of a small model's work (Qwen2.5 0.5B: 896 x 151936, about a quarter of its CPU
//! time), and most of those tokens are rarely proposed. A draft whose head keeps only `N` token ids (the most frequent
//! ones, chosen from data when the model is converted) samples from a `q` that is zero outside the subset. Modified
//! rejection sampling needs nothing from `q` but that it is the distribution the draft token was drawn from, so
//! verification against the full target `p` stays exactly lossless: tokens outside the subset come from the residual
//! `norm(max(0, p - q))`, which holds all of their mass. Only acceptance can drop (by at most the target's mass
//! outside the subset).
//!
//! [`VocabSubset`] expands `[rows, N]` logits into `[rows, vocab]` rows with `-inf` outside the subset;
//! [`SubsetBackend`] wraps any [`Backend`] that way (its inner model may score `N` ids, or the full vocabulary, of
//! which it keeps the subset's columns: a mask, for tests).

use crate::backend::Backend;
use crate::error::{Result, SpecError};

/// The token ids a pruned draft scores, and a reused `[rows, vocab]` buffer to expand its logits into.
#[derive(Clone, Debug)]
pub struct VocabSubset {
    // [n] ascending token ids, each < full_vocab.
    ids: Vec<u32>,
    full_vocab: usize,
    // [rows_alloc, full_vocab]: -inf outside `ids` (never written there), logits at `ids`.
    buf: Vec<f32>,
}

impl VocabSubset {
    /// A subset of `ids` (strictly ascending, each `< full_vocab`, at least one).
    ///
    /// Errors: [`SpecError::Config`] naming the offending id or position.
    pub fn new(ids: Vec<u32>, full_vocab: usize) -> Result<Self> {
        if ids.is_empty() {
            return Err(SpecError::Config(
                "vocabulary subset is empty (expected at least one token id)".into(),
            ));
        }
        if let Some(i) = ids.windows(2).position(|w| w[0] >= w[1]) {
            return Err(SpecError::Config(format!(
                "vocabulary subset ids are not strictly ascending at position {}: {} then {}",
                i + 1,
                ids[i],
                ids[i + 1]
            )));
        }
        let last = *ids.last().expect("non-empty");
        if last as usize >= full_vocab {
            return Err(SpecError::Config(format!(
                "vocabulary subset id {last} is out of range (expected < vocab size {full_vocab})"
            )));
        }
        Ok(Self {
            ids,
            full_vocab,
            buf: Vec::new(),
        })
    }

    /// Number of ids kept (`N`).
    #[must_use]
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether the subset is empty (never: [`VocabSubset::new`] refuses that).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The full vocabulary size the expanded rows have.
    #[must_use]
    pub fn full_vocab(&self) -> usize {
        self.full_vocab
    }

    /// The kept ids (ascending).
    #[must_use]
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    fn grow(&mut self, rows: usize) {
        let need = rows * self.full_vocab;
        if self.buf.len() < need {
            // New rows are -inf everywhere; the subset's columns are overwritten on every call.
            self.buf.resize(need, f32::NEG_INFINITY);
        }
    }

    /// Expand `logits` (`[rows, width] float32`, row-major) into `[rows, vocab]`: `-inf` outside the subset. `width`
    /// is `N` (the pruned head's logits, in subset order) or the full vocabulary (the subset's columns are kept).
    ///
    /// Errors: [`SpecError::Shape`] if `logits.len()` is not a multiple of `N` or of the full vocabulary.
    pub fn expand(&mut self, logits: &[f32], rows: usize) -> Result<&[f32]> {
        let n = self.ids.len();
        let width = if rows > 0 && logits.len() == rows * n {
            n
        } else if rows > 0 && logits.len() == rows * self.full_vocab {
            self.full_vocab
        } else {
            return Err(SpecError::Shape(format!(
                "draft logits have {} values, expected [rows, N] = [{rows}, {n}] or [rows, vocab] = [{rows}, {}]",
                logits.len(),
                self.full_vocab
            )));
        };
        self.grow(rows);
        let v = self.full_vocab;
        for r in 0..rows {
            let src = &logits[r * width..(r + 1) * width];
            let dst = &mut self.buf[r * v..(r + 1) * v];
            if width == n {
                for (&id, &x) in self.ids.iter().zip(src) {
                    dst[id as usize] = x;
                }
            } else {
                for &id in &self.ids {
                    dst[id as usize] = src[id as usize];
                }
            }
        }
        Ok(&self.buf[..rows * v])
    }
}

/// A [`Backend`] whose rows are `-inf` outside a [`VocabSubset`]: a pruned-vocabulary draft.
pub struct SubsetBackend<B: Backend> {
    inner: B,
    subset: VocabSubset,
}

impl<B: Backend> SubsetBackend<B> {
    /// Wrap `inner`, whose logits are `[rows, N]` (a pruned head, ids in `subset` order) or `[rows, vocab]`
    /// (masked to the subset).
    ///
    /// Errors: [`SpecError::Vocab`] when `inner.vocab_size()` is neither `N` nor the subset's full vocabulary.
    pub fn new(inner: B, subset: VocabSubset) -> Result<Self> {
        let w = inner.vocab_size();
        if w != subset.len() && w != subset.full_vocab() {
            return Err(SpecError::Vocab(format!(
                "model scores {w} tokens, expected the subset's {} or the full vocabulary {}",
                subset.len(),
                subset.full_vocab()
            )));
        }
        Ok(Self { inner, subset })
    }
}

impl<B: Backend> Backend for SubsetBackend<B> {
    fn vocab_size(&self) -> usize {
        self.subset.full_vocab()
    }

    fn max_seq_len(&self) -> usize {
        self.inner.max_seq_len()
    }

    fn forward(&mut self, tokens: &[u32], n_past: usize, n_logits: usize) -> Result<&[f32]> {
        let logits = self.inner.forward(tokens, n_past, n_logits)?;
        self.subset.expand(logits, n_logits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expand_scatters_pruned_rows_and_masks_full_rows() {
        let mut s = VocabSubset::new(vec![1, 3], 5).unwrap();
        let ninf = f32::NEG_INFINITY;
        assert_eq!(
            s.expand(&[0.5, 2.0, -1.0, 4.0], 2).unwrap(),
            &[ninf, 0.5, ninf, 2.0, ninf, ninf, -1.0, ninf, 4.0, ninf]
        );
        assert_eq!(
            s.expand(&[9.0, 8.0, 7.0, 6.0, 5.0], 1).unwrap(),
            &[ninf, 8.0, ninf, 6.0, ninf]
        );
        assert!(matches!(s.expand(&[1.0; 3], 1), Err(SpecError::Shape(_))));
    }

    #[test]
    fn bad_subsets_are_clear_errors() {
        assert!(
            matches!(VocabSubset::new(vec![], 4), Err(SpecError::Config(m)) if m.contains("empty"))
        );
        assert!(
            matches!(VocabSubset::new(vec![2, 2], 4), Err(SpecError::Config(m)) if m.contains("ascending at position 1"))
        );
        assert!(
            matches!(VocabSubset::new(vec![1, 4], 4), Err(SpecError::Config(m)) if m.contains("id 4 is out of range"))
        );
    }
}
