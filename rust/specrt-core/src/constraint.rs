//! Constrained decoding (structured output): a per-request [`Constraint`] says which tokens may come next, and the
//! engine masks the target's and the draft's logits with it.
//!
//! The mask applies to the logits after penalties and before temperature / top-k / top-p / min-p, so top-k chooses
//! among the allowed tokens (penalties are elementwise and keep `-inf` at `-inf`, so masking the raw logits is the
//! same as masking the penalised ones). The distributions `p` (target) and `q` (draft) that verification compares
//! are both the masked ones, and verification is the unchanged rule (`verify.rs`): the output is distributed
//! exactly as target-only constrained decoding (the argument is in `docs/structured-output.md`).
//!
//! The core knows no grammar library: `specrt-grammar` implements the trait on llguidance, `testing` has a small
//! automaton for tests.
//!
//! Masks are bitsets over the vocabulary: `[mask_words(vocab)] u32`, bit `t % 32` of word `t / 32` set iff token
//! `t` is allowed (llguidance's `SimpleVob` layout).

use crate::error::{Result, SpecError};

/// Words of a token bitset over `vocab` tokens: `ceil(vocab / 32)`.
#[must_use]
pub fn mask_words(vocab: usize) -> usize {
    vocab.div_ceil(32)
}

/// Whether bit `token` is set in `mask` (false beyond its end).
#[inline]
#[must_use]
pub fn mask_allows(mask: &[u32], token: u32) -> bool {
    mask.get(token as usize / 32)
        .is_some_and(|w| w >> (token % 32) & 1 == 1)
}

/// Set (`allowed`) or clear bit `token` of `mask` (no-op beyond its end).
#[inline]
pub fn mask_set(mask: &mut [u32], token: u32, allowed: bool) {
    if let Some(w) = mask.get_mut(token as usize / 32) {
        let bit = 1u32 << (token % 32);
        if allowed {
            *w |= bit;
        } else {
            *w &= !bit;
        }
    }
}

/// `out[t] = logits[t]` where `mask` allows `t`, else `-inf`. Inputs: `logits` `[vocab] float32`, `mask`
/// `[mask_words(vocab)] u32`; output `out` `[vocab] float32`. Returns whether any allowed logit is above `-inf`
/// (false: the masked row has no mass).
///
/// Errors: [`SpecError::Shape`] if the lengths disagree.
pub fn apply_mask(logits: &[f32], mask: &[u32], out: &mut [f32]) -> Result<bool> {
    let vocab = logits.len();
    if out.len() != vocab || mask.len() != mask_words(vocab) {
        return Err(SpecError::Shape(format!(
            "apply_mask: logits [{vocab}], out [{}], mask [{}] words (expected [{vocab}], [{vocab}], [{}])",
            out.len(),
            mask.len(),
            mask_words(vocab)
        )));
    }
    let mut any = false;
    for (w, (x, o)) in mask.iter().zip(logits.chunks(32).zip(out.chunks_mut(32))) {
        for (b, (&xv, ov)) in x.iter().zip(o.iter_mut()).enumerate() {
            let v = if w >> b & 1 == 1 {
                xv
            } else {
                f32::NEG_INFINITY
            };
            any |= v > f32::NEG_INFINITY;
            *ov = v;
        }
    }
    Ok(any)
}

/// The mask of the next position from `constraint` in its current state (`mask`: `[mask_words(vocab)] u32`): the
/// tokens it allows, with the bits of `eos_token_ids` set exactly where it accepts and cleared under `ignore_eos`.
/// The one definition of the EOS rule: the engine masks its rows with it, and `specrt certify` (through the Python
/// binding) scores constrained outputs with it.
///
/// Errors: [`SpecError::Config`] if the constraint allows no token; the constraint's own errors.
pub fn next_mask(
    constraint: &mut dyn Constraint,
    eos_token_ids: &[u32],
    ignore_eos: bool,
    mask: &mut [u32],
) -> Result<()> {
    constraint.fill_mask(mask)?;
    let eos_ok = !ignore_eos && constraint.is_accepting()?;
    for &e in eos_token_ids {
        mask_set(mask, e, eos_ok);
    }
    if mask.iter().all(|&w| w == 0) {
        return Err(SpecError::Config(format!(
            "the constraint allows no token after {} generated tokens (accepting: {eos_ok}, ignore_eos: {ignore_eos})",
            constraint.len()
        )));
    }
    Ok(())
}

/// A per-request constraint on the generated tokens (a grammar matcher), over the committed output tokens plus
/// any draft tokens it was advanced through. The engine advances it through a round's proposals, truncates it back
/// to the committed length after verification, and re-advances it through the emitted tokens (the penalty
/// context's push-then-truncate).
///
/// End of sequence is the engine's: the model's EOS ids are never passed to [`Constraint::advance`], their bits in
/// [`Constraint::fill_mask`]'s output are overwritten (set where [`Constraint::is_accepting`], unless the request
/// ignores EOS), and an emitted EOS ends the request.
pub trait Constraint: Send {
    /// Tokens consumed so far (committed plus tentatively advanced).
    fn len(&self) -> usize;

    /// True when no token was consumed.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Write the tokens allowed next into `mask` (`[mask_words(vocab)] u32`, every word written).
    ///
    /// Errors: [`SpecError::Shape`] for a wrong length; [`SpecError::Config`] if the matcher failed (the message
    /// says why).
    fn fill_mask(&mut self, mask: &mut [u32]) -> Result<()>;

    /// Consume `token`.
    ///
    /// Errors: [`SpecError::Config`] if the constraint refuses it (the state is then unchanged).
    fn advance(&mut self, token: u32) -> Result<()>;

    /// Forget the tokens consumed after the first `len` (undo of [`Constraint::advance`]).
    ///
    /// Errors: [`SpecError::Config`] if `len` exceeds [`Constraint::len`] or the matcher cannot go back that far.
    fn truncate(&mut self, len: usize) -> Result<()>;

    /// Whether the tokens consumed form a complete match (end of sequence allowed here).
    ///
    /// Errors: matcher errors, as [`Constraint::fill_mask`].
    fn is_accepting(&mut self) -> Result<bool>;

    /// Whether nothing can follow but the end (the request ends here, also when EOS is ignored).
    ///
    /// Errors: matcher errors, as [`Constraint::fill_mask`].
    fn is_complete(&mut self) -> Result<bool>;

    /// The tokens the constraint forces next (the only continuation it allows, possibly empty), into `out`
    /// (cleared first). The default forces nothing.
    ///
    /// Errors: matcher errors, as [`Constraint::fill_mask`].
    fn forced_tokens(&mut self, out: &mut Vec<u32>) -> Result<()> {
        out.clear();
        Ok(())
    }

    /// How many leading tokens of `tokens` the constraint would accept from its current state, without changing
    /// it. The default advances and truncates back.
    ///
    /// Errors: matcher errors, as [`Constraint::fill_mask`].
    fn validate_tokens(&mut self, tokens: &[u32]) -> Result<usize> {
        let base = self.len();
        let mut n = 0;
        for &t in tokens {
            if self.advance(t).is_err() {
                break;
            }
            n += 1;
        }
        self.truncate(base)?;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_bits_round_trip_and_apply_mask_keeps_only_allowed_logits() {
        let vocab = 70;
        let mut m = vec![0u32; mask_words(vocab)];
        assert_eq!(m.len(), 3);
        for t in [0u32, 31, 32, 69] {
            mask_set(&mut m, t, true);
        }
        assert!(mask_allows(&m, 31) && mask_allows(&m, 32) && mask_allows(&m, 69));
        assert!(!mask_allows(&m, 1) && !mask_allows(&m, 70));
        mask_set(&mut m, 31, false);
        assert!(!mask_allows(&m, 31));
        #[allow(clippy::cast_precision_loss)]
        let logits: Vec<f32> = (0..vocab).map(|i| i as f32).collect();
        let mut out = vec![0f32; vocab];
        assert!(apply_mask(&logits, &m, &mut out).unwrap());
        for (t, &v) in out.iter().enumerate() {
            #[allow(clippy::cast_possible_truncation)]
            let allowed = mask_allows(&m, t as u32);
            assert_eq!(
                v,
                if allowed {
                    logits[t]
                } else {
                    f32::NEG_INFINITY
                }
            );
        }
        let none = vec![0u32; 3];
        assert!(!apply_mask(&logits, &none, &mut out).unwrap());
        assert!(apply_mask(&logits, &none[..2], &mut out).is_err());
    }
}
