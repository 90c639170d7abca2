//! One verification round of speculative sampling: accept a prefix of the K draft tokens and emit exactly one more
//! token (recovered at the first rejection, or a bonus token when all K are accepted).
//!
//! Stochastic mode is speculative sampling (Leviathan, Kalman, Matias 2023, "Fast Inference from Transformers via
//! Speculative Decoding", arXiv:2211.17192, Algorithm 1; Chen et al. 2023, "Accelerating Large Language Model
//! Decoding with Speculative Sampling", arXiv:2302.01318, Algorithm 2): accept draft token `x` drawn from `q` with
//! probability `min(1, p(x) / q(x))`; at the first rejection sample from `norm(max(0, p - q))`. The emitted tokens
//! are then distributed exactly as tokens sampled from the target alone ("lossless"): the accept branch emits `x`
//! with probability `min(p(x), q(x))`, the reject branch with `R * max(0, p(x) - q(x)) / Z`, and the rejection
//! probability `R` equals the residual mass `Z = 1 - sum min(p, q)`, so the two add up to `p(x)`.
//!
//! Random draws, in order (the NumPy reference `specrt.reference_sampling.verify` draws the same):
//! one uniform per evaluated draft position (drawn even when acceptance is certain, so the stream position does
//! not depend on the values), then one uniform for the recovered or bonus token. Greedy mode draws nothing.

use crate::coupled::CoupledNoise;
use crate::error::{Result, SpecError};
use crate::rng::Rng;
use crate::sampling::{PenaltyContext, RowNorm, Sampler, SamplingParams};

/// Largest number of draft tokens per round.
pub const MAX_DRAFT_TOKENS: usize = 64;

/// The one check of a kernel's draft token count `k` (the verifiers, the binding's `verify`).
///
/// Errors: [`SpecError::Config`] when `k > MAX_DRAFT_TOKENS`.
pub fn check_draft_count(k: usize) -> Result<()> {
    if k > MAX_DRAFT_TOKENS {
        return Err(SpecError::Config(format!(
            "{k} draft tokens is invalid (expected 0 <= k <= {MAX_DRAFT_TOKENS})"
        )));
    }
    Ok(())
}

/// How the draft tokens were proposed, i.e. which acceptance rule is lossless.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VerifyMode {
    /// Drafts sampled from the `q` rows given (a draft model): accept with `min(1, p/q)`, residual
    /// `norm(max(0, p - q))`, bonus from the last target row.
    Stochastic,
    /// Temperature 0: accept while the draft token equals the target argmax; the target argmax is the
    /// correction / bonus. No random draws; draft rows are not read.
    Greedy,
    /// Point-mass drafts (n-gram / prompt lookup): `q = onehot(x)`, accept with probability `p(x)`, on rejection
    /// sample from `p` with `x` removed, renormalised. Draft rows are not read.
    Deterministic,
}

impl VerifyMode {
    /// The mode actually run: any mode is [`VerifyMode::Greedy`] when `params` is greedy (at temperature 0 `p` is a
    /// point mass on the argmax and both stochastic rules reduce to argmax matching).
    #[must_use]
    pub fn effective(self, params: &SamplingParams) -> Self {
        if params.is_greedy() {
            Self::Greedy
        } else {
            self
        }
    }
}

/// What the last emitted token of a round is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LastToken {
    /// Sampled from the residual at the first rejected position (or the target argmax in greedy mode).
    #[default]
    Recovered,
    /// All K draft tokens were accepted; sampled from target row K.
    Bonus,
}

/// The result of one round. Output tokens = accepted + one recovered or bonus token.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Verification {
    /// Number of draft tokens proposed (K).
    pub n_draft: usize,
    /// Number of draft tokens accepted, in `0..=K`.
    pub n_accepted: usize,
    /// `[n_accepted + 1]` emitted token ids: the accepted draft tokens, then the recovered or bonus token.
    pub tokens: Vec<u32>,
    /// Whether `tokens.last()` is recovered or bonus.
    pub last: LastToken,
    /// `[n evaluated draft positions]` acceptance probabilities `min(1, p(x)/q(x))` (greedy: 1 or 0), one per draft
    /// position evaluated (`n_accepted`, plus the rejected one if any). Their mean estimates the per-token
    /// acceptance rate with less variance than the accept counts.
    pub accept_probs: Vec<f32>,
    /// `[n_accepted + 1]`: for each emitted token, the log-softmax normaliser of the raw target row it came from,
    /// when verification computed it (rows processed at temperature 1 with no penalty and no top-k); `None`
    /// otherwise (always in greedy mode). `sampling::log_softmax_with(row, token, norm)` then equals
    /// `sampling::log_softmax_at(row, token, _)` (to f32 rounding of the sum) without another pass over the row.
    pub row_norms: Vec<Option<RowNorm>>,
}

fn check_inputs(
    vocab: usize,
    logits_tgt: &[f32],
    probs_dft: &[f32],
    tokens_dft: &[u32],
    mode: VerifyMode,
) -> Result<()> {
    let k = tokens_dft.len();
    check_draft_count(k)?;
    if logits_tgt.len() != (k + 1) * vocab {
        return Err(SpecError::Shape(format!(
            "target logits have {} values, expected [k + 1, vocab] = [{}, {vocab}] = {}",
            logits_tgt.len(),
            k + 1,
            (k + 1) * vocab
        )));
    }
    if mode == VerifyMode::Stochastic && probs_dft.len() != k * vocab {
        return Err(SpecError::Shape(format!(
            "draft probabilities have {} values, expected [k, vocab] = [{k}, {vocab}] = {}",
            probs_dft.len(),
            k * vocab
        )));
    }
    if let Some((i, &t)) = tokens_dft
        .iter()
        .enumerate()
        .find(|(_, &t)| t as usize >= vocab)
    {
        return Err(SpecError::Vocab(format!(
            "draft token {t} at position {i} is out of range (expected < vocab size {vocab})"
        )));
    }
    Ok(())
}

/// Run one verification round.
///
/// Inputs:
/// - `sampler`: scratch for this vocabulary (`sampler.vocab()` is the vocab size).
/// - `logits_tgt`: `[k + 1, vocab] float32` raw target logits; row `i` scores the token after `d_1 .. d_i`.
/// - `probs_dft`: `[k, vocab] float32` probabilities, row `i` exactly the distribution `d_{i+1}` was sampled from
///   (as written by [`Sampler::sample_draft`]). Only read in [`VerifyMode::Stochastic`]; may be empty otherwise.
/// - `tokens_dft`: `[k]` draft token ids, `0 <= k <= MAX_DRAFT_TOKENS`.
/// - `params`: validated sampling parameters, applied to every target row.
/// - `mode`: see [`VerifyMode`] (greedy `params` force [`VerifyMode::Greedy`]).
/// - `penalties`: committed tokens; row `i` sees them plus `d_1 .. d_i`. Restored to its length on entry before
///   returning (also on error).
/// - `rng`: advanced as described in the module docs.
///
/// Rows are processed lazily (row `i + 1` only if `d_{i+1}` was accepted); the residual only at a rejection.
///
/// Output: [`Verification`] with `1 <= tokens.len() = n_accepted + 1 <= k + 1`.
///
/// Errors: [`SpecError::Config`] (k > 64, a draft token with `q = 0` / `q > 1`, or a value outside [0, 1] in the
/// draft row of a rejection), [`SpecError::Shape`], [`SpecError::Vocab`], [`SpecError::NonFinite`] (NaN / inf
/// target logits of an evaluated row, or a non-finite `q(d_i)` / value in the draft row of a rejection; `row` is
/// the target row, `token` the id). Draft rows are checked where they are read: `q(d_i)` at every evaluated
/// position, the whole row at a rejection.
#[allow(clippy::too_many_arguments)]
pub fn verify(
    sampler: &mut Sampler,
    logits_tgt: &[f32],
    probs_dft: &[f32],
    tokens_dft: &[u32],
    params: &SamplingParams,
    mode: VerifyMode,
    penalties: &mut PenaltyContext,
    rng: &mut Rng,
) -> Result<Verification> {
    let mut out = Verification::default();
    verify_into(
        sampler, logits_tgt, probs_dft, tokens_dft, params, mode, penalties, rng, &mut out,
    )?;
    Ok(out)
}

/// [`verify`] writing into `out` (its vectors are cleared and reused: no allocation once they have grown to
/// `k + 1` entries). Same inputs, outputs and errors; on error `out` is unspecified.
#[allow(clippy::too_many_arguments)]
pub fn verify_into(
    sampler: &mut Sampler,
    logits_tgt: &[f32],
    probs_dft: &[f32],
    tokens_dft: &[u32],
    params: &SamplingParams,
    mode: VerifyMode,
    penalties: &mut PenaltyContext,
    rng: &mut Rng,
    out: &mut Verification,
) -> Result<()> {
    let vocab = sampler.vocab();
    if mode == VerifyMode::Greedy && !params.is_greedy() {
        return Err(SpecError::Config(format!(
            "mode greedy needs temperature 0, got temperature {}",
            params.temperature
        )));
    }
    let mode = mode.effective(params);
    check_inputs(vocab, logits_tgt, probs_dft, tokens_dft, mode)?;
    let committed = penalties.len();
    let res = verify_rows(
        sampler, logits_tgt, probs_dft, tokens_dft, params, mode, penalties, rng, out,
    );
    // A rejected draft leaves no trace: drop the draft tokens pushed for later rows, even on error.
    penalties.truncate(committed);
    res
}

/// Coupled verification of one round ([`crate::coupled`]): the target's choice at each position is the coupled
/// choice of its processed row, so the emitted tokens are exactly what target-only coupled decoding emits.
///
/// Inputs:
/// - `sampler`, `logits_tgt` (`[k + 1, vocab] float32`), `tokens_dft` (`[k]`, drafts proposed with the same noise,
///   or any other proposal: n-gram continuations), `params`, `penalties`: as for [`verify_into`].
/// - `noise`: the request's [`CoupledNoise`]; `position`: the 0-based sequence index of the first token this round
///   emits (the committed length). Row `i` chooses the token at `position + i`.
///
/// Accept `d_{i+1}` while it equals the target's choice `y_i`; at the first mismatch emit `y_i` (recovered); after K
/// accepts emit `y_K` (bonus). No random stream is read. `accept_probs` holds 1 / 0 per evaluated position.
///
/// Output and errors: as [`verify_into`] (no draft rows are read).
#[allow(clippy::too_many_arguments)]
pub fn verify_coupled_into(
    sampler: &mut Sampler,
    logits_tgt: &[f32],
    tokens_dft: &[u32],
    params: &SamplingParams,
    penalties: &mut PenaltyContext,
    noise: &CoupledNoise,
    position: u64,
    out: &mut Verification,
) -> Result<()> {
    let vocab = sampler.vocab();
    check_inputs(
        vocab,
        logits_tgt,
        &[],
        tokens_dft,
        VerifyMode::Deterministic,
    )?;
    let k = tokens_dft.len();
    let use_penalties = params.has_penalties();
    out.n_draft = k;
    out.tokens.clear();
    out.accept_probs.clear();
    out.row_norms.clear();
    let committed = penalties.len();
    // The rows run in a closure so that the penalties are restored on every path, errors included.
    let mut rows = || -> Result<LastToken> {
        for i in 0..=k {
            // [vocab] target row i: the choice at position + i given the committed tokens and d_1 .. d_i.
            let row = &logits_tgt[i * vocab..(i + 1) * vocab];
            let ctx = use_penalties.then_some(&*penalties);
            sampler.process(row, i, params, ctx)?;
            out.row_norms.push(sampler.row_norm());
            let y = sampler.coupled_choice(noise, position + i as u64);
            out.tokens.push(y);
            if i == k {
                break;
            }
            if y != tokens_dft[i] {
                out.accept_probs.push(0.0);
                return Ok(LastToken::Recovered);
            }
            out.accept_probs.push(1.0);
            if use_penalties {
                penalties.push(y)?;
            }
        }
        Ok(LastToken::Bonus)
    };
    let last = rows();
    penalties.truncate(committed);
    done(out, last?)
}

/// Greedy verification from the target's argmax ids alone (no logits): accept `d_{i+1}` while it equals
/// `target_ids[i]`; at the first mismatch emit `target_ids[i]` (recovered); after K accepts emit `target_ids[K]`
/// (bonus). The same tokens, sources and acceptance record as [`verify_into`] at temperature 0 without penalties
/// given the rows these ids are the argmax of (`row_norms` are all `None`). No random stream is read.
///
/// Inputs: `target_ids` `[k + 1]` (the greedy choice of each target row, [`crate::Backend::forward_argmax`]),
/// `tokens_dft` `[k]`, `vocab` (ids must be below it).
///
/// Errors: [`SpecError::Config`] for k > 64; [`SpecError::Shape`] if `target_ids.len() != k + 1`;
/// [`SpecError::Vocab`] for an id `>= vocab`.
pub fn verify_greedy_ids_into(
    target_ids: &[u32],
    tokens_dft: &[u32],
    vocab: usize,
    out: &mut Verification,
) -> Result<()> {
    let k = tokens_dft.len();
    check_draft_count(k)?;
    if target_ids.len() != k + 1 {
        return Err(SpecError::Shape(format!(
            "target ids have {} entries, expected k + 1 = {}",
            target_ids.len(),
            k + 1
        )));
    }
    if let Some((i, &t)) = tokens_dft
        .iter()
        .chain(target_ids)
        .enumerate()
        .find(|(_, &t)| t as usize >= vocab)
    {
        return Err(SpecError::Vocab(format!(
            "token {t} at position {i} of the drafts then the target ids is out of range (expected < vocab size \
             {vocab})"
        )));
    }
    out.n_draft = k;
    out.tokens.clear();
    out.accept_probs.clear();
    out.row_norms.clear();
    for (&d, &y) in tokens_dft.iter().zip(target_ids) {
        out.tokens.push(y);
        out.row_norms.push(None);
        if y != d {
            out.accept_probs.push(0.0);
            return done(out, LastToken::Recovered);
        }
        out.accept_probs.push(1.0);
    }
    out.tokens.push(target_ids[k]);
    out.row_norms.push(None);
    done(out, LastToken::Bonus)
}

#[allow(clippy::too_many_arguments)]
fn verify_rows(
    sampler: &mut Sampler,
    logits_tgt: &[f32],
    probs_dft: &[f32],
    tokens_dft: &[u32],
    params: &SamplingParams,
    mode: VerifyMode,
    penalties: &mut PenaltyContext,
    rng: &mut Rng,
    out: &mut Verification,
) -> Result<()> {
    let vocab = sampler.vocab();
    let k = tokens_dft.len();
    let use_penalties = params.has_penalties();
    out.n_draft = k;
    out.tokens.clear();
    out.accept_probs.clear();
    out.row_norms.clear();
    for (i, &d) in tokens_dft.iter().enumerate() {
        // [vocab] target row i: scores d_{i+1} given the committed tokens and d_1 .. d_i.
        let row = &logits_tgt[i * vocab..(i + 1) * vocab];
        let ctx = use_penalties.then_some(&*penalties);
        match mode {
            VerifyMode::Greedy => {
                let a = sampler.argmax(row, i, params, ctx)?;
                out.row_norms.push(None);
                if a != d {
                    out.accept_probs.push(0.0);
                    out.tokens.push(a);
                    return done(out, LastToken::Recovered);
                }
                out.accept_probs.push(1.0);
            }
            VerifyMode::Stochastic | VerifyMode::Deterministic => {
                sampler.process(row, i, params, ctx)?;
                out.row_norms.push(sampler.row_norm());
                let p = sampler.prob(d);
                let q = if mode == VerifyMode::Stochastic {
                    draft_prob(probs_dft, i, vocab, d)?
                } else {
                    1.0
                };
                let u = rng.next_f64();
                #[allow(clippy::cast_possible_truncation)]
                out.accept_probs.push((p / q).min(1.0) as f32);
                // Accept with probability min(1, p/q); `u < 1`, so p >= q always accepts. No division: q > 0.
                if u * q >= p {
                    let u = rng.next_f64();
                    let t = if mode == VerifyMode::Stochastic {
                        let q_row = &probs_dft[i * vocab..(i + 1) * vocab];
                        sampler.sample_residual(q_row, i, u)?
                    } else {
                        sampler.sample_excluding(d, u)
                    };
                    // `norms[i]` (row i) is the recovered token's row too.
                    out.tokens.push(t);
                    return done(out, LastToken::Recovered);
                }
            }
        }
        out.tokens.push(d);
        if use_penalties {
            penalties.push(d)?;
        }
    }
    // All K accepted: bonus token from target row K.
    let row = &logits_tgt[k * vocab..(k + 1) * vocab];
    let ctx = use_penalties.then_some(&*penalties);
    let t = if mode == VerifyMode::Greedy {
        out.row_norms.push(None);
        sampler.argmax(row, k, params, ctx)?
    } else {
        sampler.process(row, k, params, ctx)?;
        out.row_norms.push(sampler.row_norm());
        sampler.sample_processed(rng.next_f64())
    };
    out.tokens.push(t);
    done(out, LastToken::Bonus)
}

#[allow(clippy::unnecessary_wraps)]
fn done(out: &mut Verification, last: LastToken) -> Result<()> {
    debug_assert_eq!(out.row_norms.len(), out.tokens.len());
    out.n_accepted = out.tokens.len() - 1;
    out.last = last;
    Ok(())
}

/// `q(d)` from draft row `i`, checked: a proposed token must have had positive probability.
fn draft_prob(probs_dft: &[f32], i: usize, vocab: usize, d: u32) -> Result<f64> {
    let q = probs_dft[i * vocab + d as usize];
    if !q.is_finite() {
        return Err(SpecError::NonFinite {
            row: i,
            token: d as usize,
            value: format!("{q}"),
            what: "draft probability".to_owned(),
        });
    }
    if !(q > 0.0 && q <= 1.0 + 1e-3) {
        return Err(SpecError::Config(format!(
            "draft_probs[{i}, {d}] = {q} is invalid for proposed token {d} (expected 0 < q <= 1: a proposed token \
             must have positive draft probability)"
        )));
    }
    Ok(f64::from(q))
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// Verification from argmax ids gives exactly what greedy verification of the rows gives (tokens, sources,
        /// acceptance record), ties included (small integer logits tie often).
        #[test]
        fn greedy_ids_verification_equals_greedy_row_verification(
            vocab in 2usize..9,
            k in 0usize..6,
            seed in 0u64..1_000,
        ) {
            let mut rng = Rng::seed_from_u64(seed);
            #[allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]
            let logits: Vec<f32> = (0..(k + 1) * vocab).map(|_| (rng.next_f64() * 3.0).floor() as f32).collect();
            let mut ids = Vec::new();
            crate::sampling::argmax_rows(&logits, vocab, &mut ids).unwrap();
            // Drafts that follow the target for a while, then (maybe) differ.
            let cut = (seed as usize) % (k + 1);
            #[allow(clippy::cast_possible_truncation)]
            let drafts: Vec<u32> = (0..k)
                .map(|i| if i < cut { ids[i] } else { (ids[i] + 1) % vocab as u32 })
                .collect();
            let mut s = Sampler::new(vocab);
            let mut ctx = PenaltyContext::new(vocab);
            let want = verify(
                &mut s, &logits, &[], &drafts, &SamplingParams::greedy(), VerifyMode::Greedy, &mut ctx, &mut rng,
            )
            .unwrap();
            let mut got = Verification::default();
            verify_greedy_ids_into(&ids, &drafts, vocab, &mut got).unwrap();
            proptest::prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn greedy_ids_verification_checks_its_inputs() {
        let mut v = Verification::default();
        let err = verify_greedy_ids_into(&[1, 2], &[1, 2], 4, &mut v).unwrap_err();
        assert!(err.to_string().contains("expected k + 1 = 3"), "{err}");
        let err = verify_greedy_ids_into(&[1, 9], &[1], 4, &mut v).unwrap_err();
        assert!(err.to_string().contains("token 9"), "{err}");
        let err = verify_greedy_ids_into(&[0; 66], &[0; 65], 4, &mut v).unwrap_err();
        assert!(err.to_string().contains("65 draft tokens"), "{err}");
    }

    #[test]
    fn argmax_rows_takes_the_first_maximum_and_refuses_nan() {
        let mut out = Vec::new();
        crate::sampling::argmax_rows(&[1.0, 3.0, 3.0, 0.0, -1.0, -2.0], 3, &mut out).unwrap();
        assert_eq!(out, vec![1, 0]);
        let err = crate::sampling::argmax_rows(&[1.0, f32::NAN, 0.0], 3, &mut out).unwrap_err();
        assert!(matches!(err, SpecError::NonFinite { .. }), "{err}");
        assert!(crate::sampling::argmax_rows(&[1.0, 2.0], 3, &mut out).is_err());
    }

    #[test]
    fn k_zero_is_one_target_sample() {
        let mut s = Sampler::new(4);
        let mut ctx = PenaltyContext::new(4);
        let mut rng = Rng::seed_from_u64(1);
        let logits = [
            0.0f32,
            f32::NEG_INFINITY,
            f32::NEG_INFINITY,
            f32::NEG_INFINITY,
        ];
        let v = verify(
            &mut s,
            &logits,
            &[],
            &[],
            &SamplingParams::default(),
            VerifyMode::Stochastic,
            &mut ctx,
            &mut rng,
        )
        .unwrap();
        assert_eq!(v.tokens, vec![0]);
        assert_eq!(v.last, LastToken::Bonus);
        assert_eq!(v.n_accepted, 0);
    }

    #[test]
    fn p_equal_q_always_accepts() {
        let vocab = 3;
        let logits = [1.0f32, 2.0, 3.0];
        let mut s = Sampler::new(vocab);
        let params = SamplingParams::default();
        s.process(&logits, 0, &params, None).unwrap();
        let mut q = vec![0.0; vocab];
        s.write_probs(&mut q).unwrap();
        let mut rng = Rng::seed_from_u64(3);
        let mut ctx = PenaltyContext::new(vocab);
        let logits2: Vec<f32> = logits.iter().chain(&logits).copied().collect();
        for d in 0..3 {
            let v = verify(
                &mut s,
                &logits2,
                &q,
                &[d],
                &params,
                VerifyMode::Stochastic,
                &mut ctx,
                &mut rng,
            )
            .unwrap();
            assert_eq!(v.n_accepted, 1);
        }
    }

    #[test]
    fn zero_draft_prob_for_proposed_token_is_an_error() {
        let mut s = Sampler::new(2);
        let mut ctx = PenaltyContext::new(2);
        let mut rng = Rng::seed_from_u64(0);
        let e = verify(
            &mut s,
            &[0.0; 4],
            &[1.0, 0.0],
            &[1],
            &SamplingParams::default(),
            VerifyMode::Stochastic,
            &mut ctx,
            &mut rng,
        )
        .unwrap_err();
        assert!(
            matches!(e, SpecError::Config(ref m) if m.contains("draft_probs[0, 1]")),
            "{e}"
        );
    }

    #[test]
    fn too_many_draft_tokens_is_an_error() {
        let mut s = Sampler::new(2);
        let mut ctx = PenaltyContext::new(2);
        let mut rng = Rng::seed_from_u64(0);
        let toks = vec![0u32; 65];
        let e = verify(
            &mut s,
            &vec![0.0; 66 * 2],
            &vec![0.5; 65 * 2],
            &toks,
            &SamplingParams::default(),
            VerifyMode::Stochastic,
            &mut ctx,
            &mut rng,
        )
        .unwrap_err();
        assert!(
            matches!(e, SpecError::Config(ref m) if m.contains("65 draft tokens")),
            "{e}"
        );
    }

    #[test]
    fn penalties_see_accepted_drafts_and_are_restored() {
        // Row 1 has token 0 on top by a small margin; the accepted draft token 0 is penalised away in row 1.
        let vocab = 2;
        let logits = [5.0f32, 0.0, 0.1, 0.0];
        let params = SamplingParams {
            temperature: 0.0,
            presence_penalty: 1.0,
            ..SamplingParams::default()
        };
        let mut s = Sampler::new(vocab);
        let mut ctx = PenaltyContext::new(vocab);
        let mut rng = Rng::seed_from_u64(0);
        let v = verify(
            &mut s,
            &logits,
            &[],
            &[0],
            &params,
            VerifyMode::Greedy,
            &mut ctx,
            &mut rng,
        )
        .unwrap();
        assert_eq!(v.tokens, vec![0, 1]);
        assert_eq!(ctx.len(), 0);
        assert_eq!(ctx.count(0), 0);
    }

    #[test]
    fn row_norms_give_log_softmax_at_exactly() {
        use crate::sampling::{log_softmax_at, log_softmax_with};
        let vocab = 3000;
        let mut g = Rng::seed_from_u64(5);
        #[allow(clippy::cast_possible_truncation)]
        let logits: Vec<f32> = (0..3 * vocab)
            .map(|_| (g.next_f64() * 8.0) as f32)
            .collect();
        let params = SamplingParams {
            top_p: 0.9,
            ..SamplingParams::default()
        };
        let mut s = Sampler::new(vocab);
        let mut ctx = PenaltyContext::new(vocab);
        for seed in 0..20 {
            let mut rng = Rng::seed_from_u64(seed);
            let v = verify(
                &mut s,
                &logits,
                &[],
                &[1, 2],
                &params,
                VerifyMode::Deterministic,
                &mut ctx,
                &mut rng,
            )
            .unwrap();
            assert_eq!(v.row_norms.len(), v.tokens.len());
            for (i, &t) in v.tokens.iter().enumerate() {
                let row = &logits[i * vocab..(i + 1) * vocab];
                let want = log_softmax_at(row, t, i).unwrap();
                assert_eq!(
                    log_softmax_with(row, t, v.row_norms[i].unwrap()),
                    Some(want)
                );
            }
        }
    }
}
