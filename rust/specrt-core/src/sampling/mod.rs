//! Logits processing and sampling of one row, in Hugging Face's order:
//! penalties (repetition as HF; frequency / presence as OpenAI / vLLM), then temperature, top-k, top-p, min-p.
//!
//! The hot path ([`Sampler`]) allocates nothing per call: one `Sampler` per vocabulary size holds reusable buffers.
//! A processed row is kept as unnormalised weights `w` (`exp((x - max) / T)`, so the top token has weight exactly
//! 1), a keep-threshold and the f64 total of the kept weights:
//! `p(x) = (w[x] >= threshold ? w[x] : 0) / total`. Exact zeros (masked, `-inf` logits, or `exp` below `e^-87`,
//! i.e. probability < 1.7e-38 relative to the top token) are never emitted.
//!
//! Exact definitions (mirrored by `python/specrt/reference_sampling.py`):
//! - penalties, for every token `t` seen so far (prompt or output): repetition (HF
//!   `RepetitionPenaltyLogitsProcessor`): `x < 0 ? x * r : x / r` if `t` is in the prompt or the output; then
//!   (vLLM / OpenAI) `x -= count_out(t) * frequency + (count_out(t) > 0) * presence`, counting output tokens only.
//! - temperature `T`: `w = exp((x - max) * (1 / T))`; `T < MIN_TEMPERATURE` means greedy (argmax, lowest id on ties).
//! - top-k (HF `TopKLogitsWarper`): keep tokens whose logit is >= the k-th largest logit (ties at the boundary kept).
//! - top-p (HF `TopPLogitsWarper`): keep a token iff the mass of the tokens strictly more probable than it is < p,
//!   i.e. walk the tokens in descending order until the cumulative mass reaches `p`; all tokens tied with the last
//!   one walked are kept too.
//! - min-p (HF `MinPLogitsWarper`): keep tokens with `p >= min_p * p_max`, i.e. `w >= min_p` (the top weight is 1).
//! - sampling with a uniform `u` in `[0, 1)`: the first token `i` whose running (f64) sum of kept weights exceeds
//!   `u * total` (inverse CDF, no sort).

mod kernels;
mod params;
mod penalties;

pub use kernels::*;
pub use params::*;
pub use penalties::*;

use crate::error::{Result, SpecError};
use crate::rng::Rng;

/// Reusable scratch for processing and sampling rows of one vocabulary size. Holds the last processed row.
///
/// A processed row is stored densely (`w`, all `vocab` weights) or, when top-p / min-p / top-k leave few tokens,
/// sparsely: only the kept tokens (ascending ids) and their weights, found without writing `vocab` weights.
/// Both give the same distribution and the same draws.
#[derive(Clone, Debug)]
pub struct Sampler {
    vocab: usize,
    // [vocab] weights of the last processed row when dense.
    w: Vec<f32>,
    // [vocab] penalised copy of the logits.
    logits: Vec<f32>,
    // [vocab] residual max(0, p - q) (dense rows).
    resid: Vec<f32>,
    // Min-heap of the top-k logits.
    heap: Vec<f32>,
    // Candidate weights for top-p (selection scratch).
    cand: Vec<f32>,
    // [ceil(vocab / MAX_BLOCK)] block maxima of the last max pass.
    bmax: Vec<f32>,
    // Sparse row: true when the last processed row is `(kidx, kw)` rather than `w`.
    sparse: bool,
    // Kept token ids (ascending) and their weights, for a sparse row.
    kidx: Vec<u32>,
    kw: Vec<f32>,
    // Residual weights over `kidx` (sparse rows).
    rw: Vec<f32>,
    // Keep-threshold on `w` and f64 total of kept weights, for the last processed row.
    threshold: f32,
    total: f64,
    // Log-softmax normaliser of the last processed row, when it was raw logits at temperature 1 without top-k.
    norm: Option<RowNorm>,
    // A deliberate fault (tests of the tests only): see `Sampler::inject_fault`.
    fault: Option<Fault>,
}

/// Deliberate sampler faults, to show that a statistical test catches them. Never set outside tests.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// On rejection, sample the recovered token from the draft row `q` instead of `norm(max(0, p - q))` (a real
    /// bug class: the output is then no longer distributed as `p`).
    ResidualFromDraft,
    /// Constrained decoding: the draft samples from its masked `q`, but verification is given the unmasked `q` (the
    /// mask applied to the target's `p` only).
    MaskTargetOnly,
    /// Constrained decoding: the constraint is not truncated back to the committed tokens after verification
    /// (refusals of the emitted tokens are then ignored).
    NoConstraintRollback,
    /// Constrained decoding: grammar-forced tokens are emitted without verification.
    ForcedUnverified,
}

impl Sampler {
    /// Scratch for rows of `vocab` logits (allocates `3 * vocab` floats once).
    #[must_use]
    pub fn new(vocab: usize) -> Self {
        Self {
            vocab,
            w: vec![0.0; vocab],
            logits: vec![0.0; vocab],
            resid: vec![0.0; vocab],
            heap: Vec::new(),
            // Sparse-row scratch sized once for the largest candidate set, so rounds never reallocate.
            cand: Vec::with_capacity(vocab.min(MAX_CAND) + 1),
            bmax: vec![f32::NEG_INFINITY; n_blocks(vocab)],
            sparse: false,
            kidx: Vec::with_capacity(vocab.min(MAX_CAND) + 1),
            kw: Vec::with_capacity(vocab.min(MAX_CAND) + 1),
            rw: Vec::with_capacity(vocab.min(MAX_CAND) + 1),
            threshold: 0.0,
            total: 0.0,
            norm: None,
            fault: None,
        }
    }

    /// Set or clear a deliberate fault (tests of the tests only: [`Fault`]).
    #[doc(hidden)]
    pub fn inject_fault(&mut self, fault: Option<Fault>) {
        self.fault = fault;
    }

    /// The vocabulary size this scratch serves.
    #[must_use]
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// The log-softmax normaliser of the last row given to [`Sampler::process`], when that row was used as is
    /// (no penalty changed it), at temperature 1 and without top-k; `None` otherwise (also after a greedy row).
    /// With it, [`log_softmax_with`] gives [`log_softmax_at`] of that row without another pass over it.
    #[must_use]
    pub fn row_norm(&self) -> Option<RowNorm> {
        self.norm
    }

    fn check_row(&self, logits: &[f32]) -> Result<()> {
        if logits.len() != self.vocab {
            return Err(SpecError::Shape(format!(
                "logits row has {} values, expected [vocab] = [{}]",
                logits.len(),
                self.vocab
            )));
        }
        Ok(())
    }

    /// The logits to use for a row: the input, or a penalised copy of it.
    fn penalised<'a>(
        logits_buf: &'a mut [f32],
        logits: &'a [f32],
        params: &SamplingParams,
        penalties: Option<&PenaltyContext>,
    ) -> &'a [f32] {
        match penalties {
            Some(ctx) if params.has_penalties() && ctx.acts() => {
                logits_buf.copy_from_slice(logits);
                ctx.apply(params, logits_buf);
                logits_buf
            }
            _ => logits,
        }
    }

    /// Greedy choice for a row: argmax of the penalised logits (lowest id on ties). One pass over the row.
    ///
    /// Errors: [`SpecError::Shape`], [`SpecError::NonFinite`] (checked on the penalised logits).
    pub fn argmax(
        &mut self,
        logits: &[f32],
        row: usize,
        params: &SamplingParams,
        penalties: Option<&PenaltyContext>,
    ) -> Result<u32> {
        self.check_row(logits)?;
        let x = Self::penalised(&mut self.logits, logits, params, penalties);
        let m = checked_max_blocks(x, row, &mut self.bmax)?;
        Ok(argmax_from_blocks(x, &self.bmax, m))
    }

    /// Process one row of logits (`[vocab] float32`) into the stored distribution (see the module docs), readable
    /// with [`Sampler::prob`], [`Sampler::write_probs`], [`Sampler::sample_processed`].
    ///
    /// For a greedy `params` the distribution is the point mass on [`Sampler::argmax`].
    ///
    /// Errors: [`SpecError::Shape`] (length != vocab), [`SpecError::NonFinite`] (NaN, +inf or all -inf, reported
    /// with `row` and the token id). `params` is assumed validated ([`SamplingParams::validate`]).
    pub fn process(
        &mut self,
        logits: &[f32],
        row: usize,
        params: &SamplingParams,
        penalties: Option<&PenaltyContext>,
    ) -> Result<()> {
        self.check_row(logits)?;
        self.norm = None;
        let penalised = matches!(penalties, Some(ctx) if params.has_penalties() && ctx.acts());
        let x = Self::penalised(&mut self.logits, logits, params, penalties);
        let m = checked_max_blocks(x, row, &mut self.bmax)?;
        if params.is_greedy() {
            let a = argmax_from_blocks(x, &self.bmax, m);
            self.set_sparse_point(a);
            return Ok(());
        }
        let kth = if params.top_k > 0 && (params.top_k as usize) < x.len() {
            kth_largest(x, params.top_k as usize, &mut self.heap)
        } else {
            f32::NEG_INFINITY
        };
        let inv_t = 1.0 / params.temperature;
        // Candidate levels (as -ln of the smallest candidate weight) for the sparse path, if it may pay.
        let min_p_level = (params.min_p > 0.0).then(|| -params.min_p.ln() + 1e-3);
        let levels: &[f32] = if params.top_p < 1.0 {
            &NUCLEUS_LOG_LEVELS
        } else if min_p_level.is_some() || kth > f32::NEG_INFINITY {
            &[f32::INFINITY]
        } else {
            &[]
        };
        let sparse_done = if levels.is_empty() {
            false
        } else {
            let total = exp_total(x, m, inv_t, kth);
            if params.temperature == 1.0 && !penalised && kth == f32::NEG_INFINITY {
                self.norm = Some(RowNorm {
                    max: m,
                    log_sum: total.ln(),
                });
            }
            let mut levels = levels;
            let single;
            if params.top_p >= 1.0 {
                if let Some(c) = min_p_level {
                    single = [c];
                    levels = &single;
                }
            }
            let sp = SparseScratch {
                bmax: &self.bmax,
                kidx: &mut self.kidx,
                kw: &mut self.kw,
                cand: &mut self.cand,
            };
            match sp.run(x, m, inv_t, kth, total, params, levels) {
                Some((thr, kept_total)) => {
                    self.sparse = true;
                    self.threshold = thr;
                    self.total = kept_total;
                    true
                }
                None => false,
            }
        };
        if sparse_done {
            return Ok(());
        }
        self.sparse = false;
        let mut total = exp_pass(x, m, inv_t, kth, &mut self.w);
        if params.temperature == 1.0 && !penalised && kth == f32::NEG_INFINITY {
            self.norm = Some(RowNorm {
                max: m,
                log_sum: total.ln(),
            });
        }
        let mut thr = 0.0f32;
        if params.top_p < 1.0 {
            (thr, total) = nucleus(&self.w, total, f64::from(params.top_p), &mut self.cand);
        }
        if params.min_p > 0.0 && params.min_p > thr {
            thr = params.min_p;
            total = masked_sum(&self.w, thr);
        }
        self.threshold = thr;
        self.total = total;
        Ok(())
    }

    /// Store the point mass on `a`.
    fn set_sparse_point(&mut self, a: u32) {
        self.sparse = true;
        self.kidx.clear();
        self.kw.clear();
        self.kidx.push(a);
        self.kw.push(1.0);
        self.threshold = 0.0;
        self.total = 1.0;
    }

    /// Position of `token` in the sparse kept list.
    fn sparse_pos(&self, token: u32) -> Option<usize> {
        self.kidx.binary_search(&token).ok()
    }

    /// Probability of `token` in the last processed row, in [0, 1] (f64 of f32 weights).
    #[must_use]
    pub fn prob(&self, token: u32) -> f64 {
        if self.sparse {
            return self
                .sparse_pos(token)
                .map_or(0.0, |i| f64::from(self.kw[i]) / self.total);
        }
        let w = self.w.get(token as usize).copied().unwrap_or(0.0);
        if w >= self.threshold {
            f64::from(w) / self.total
        } else {
            0.0
        }
    }

    /// Write the last processed row, normalised, into `out` (`[vocab] float32`) and return its f64 sum (~1).
    ///
    /// Errors: [`SpecError::Shape`] if `out.len() != vocab`.
    pub fn write_probs(&self, out: &mut [f32]) -> Result<f64> {
        if out.len() != self.vocab {
            return Err(SpecError::Shape(format!(
                "probability row has {} values, expected [vocab] = [{}]",
                out.len(),
                self.vocab
            )));
        }
        #[allow(clippy::cast_possible_truncation)]
        let inv = (1.0 / self.total) as f32;
        if self.sparse {
            out.fill(0.0);
            let mut sum = 0.0f64;
            for (&i, &wv) in self.kidx.iter().zip(&self.kw) {
                let v = wv * inv;
                out[i as usize] = v;
                sum += f64::from(v);
            }
            return Ok(sum);
        }
        Ok(normalise_into(&self.w, self.threshold, inv, out))
    }

    /// The coupled choice from the last processed row at output `position` (an exponential race over the kept
    /// weights with the noise of `(seed, position)`, see [`crate::coupled`]): an exact sample of the row whose
    /// randomness depends on the position alone. For a greedy row (a point mass) it is the argmax.
    #[must_use]
    pub fn coupled_choice(&self, noise: &crate::coupled::CoupledNoise, position: u64) -> u32 {
        let mut race = crate::coupled::Race::new(position);
        if self.sparse {
            for (&i, &w) in self.kidx.iter().zip(&self.kw) {
                if w > 0.0 {
                    race.offer(noise, i, f64::from(w));
                }
            }
        } else {
            let thr = self.threshold;
            for (i, &w) in self.w.iter().enumerate() {
                if w > 0.0 && w >= thr {
                    #[allow(clippy::cast_possible_truncation)] // vocab < 2^32
                    race.offer(noise, i as u32, f64::from(w));
                }
            }
        }
        // A processed row always keeps at least one token of positive weight (its maximum).
        race.winner()
            .unwrap_or(self.kidx.first().copied().unwrap_or(0))
    }

    /// Sample from the last processed row with a uniform `u` in [0, 1) (inverse CDF over kept weights).
    #[must_use]
    pub fn sample_processed(&self, u: f64) -> u32 {
        if self.sparse {
            return inverse_cdf_sparse(&self.kidx, &self.kw, self.total, u, u32::MAX);
        }
        inverse_cdf(&self.w, self.threshold, self.total, u)
    }

    /// Process a row and sample one token from it (a target-only step, K = 0). Draws one uniform unless greedy.
    ///
    /// Errors: as [`Sampler::process`].
    pub fn sample(
        &mut self,
        logits: &[f32],
        params: &SamplingParams,
        penalties: Option<&PenaltyContext>,
        rng: &mut Rng,
    ) -> Result<u32> {
        if params.is_greedy() {
            return self.argmax(logits, 0, params, penalties);
        }
        self.process(logits, 0, params, penalties)?;
        Ok(self.sample_processed(rng.next_f64()))
    }

    /// The draft's step: process a row, write the normalised distribution into `probs_out` (`[vocab] float32`,
    /// the `q` row that `verify` needs) and sample the token from exactly that row. Draws one uniform unless greedy
    /// (then `probs_out` is the point mass on the argmax).
    ///
    /// Errors: as [`Sampler::process`]; [`SpecError::Shape`] if `probs_out.len() != vocab`.
    pub fn sample_draft(
        &mut self,
        logits: &[f32],
        params: &SamplingParams,
        penalties: Option<&PenaltyContext>,
        rng: &mut Rng,
        probs_out: &mut [f32],
    ) -> Result<u32> {
        self.process(logits, 0, params, penalties)?;
        let sum = self.write_probs(probs_out)?;
        if params.is_greedy() {
            return Ok(self.kidx[0]);
        }
        let u = rng.next_f64();
        if self.sparse {
            // The non-zero entries of `probs_out`, in id order: the same walk as over the whole row.
            #[allow(clippy::cast_possible_truncation)]
            let inv = (1.0 / self.total) as f32;
            let target = u * sum;
            let mut acc = 0.0f64;
            let mut last = self.kidx[0];
            for (&i, &wv) in self.kidx.iter().zip(&self.kw) {
                let v = wv * inv;
                if v <= 0.0 {
                    continue;
                }
                acc += f64::from(v);
                last = i;
                if acc > target {
                    return Ok(i);
                }
            }
            return Ok(last);
        }
        Ok(inverse_cdf(probs_out, 0.0, sum, u))
    }

    /// After [`Sampler::process`] of a target row: sample from the residual `norm(max(0, p - q))` with uniform `u`
    /// (Leviathan et al. 2023, arXiv:2211.17192, Algorithm 1; Chen et al. 2023, arXiv:2302.01318, eq. 1).
    ///
    /// `p` is the processed row in f32 (`w * f32(1 / total)`), `q` the draft row (`[vocab] float32`).
    /// If the residual mass is zero or below the smallest normal f32 (only possible through round-off: the
    /// residual mass equals the rejection probability `1 - sum min(p, q)`, so a true zero means the rejection
    /// that led here has probability 0), sample from `p` instead; this changes the output distribution by at most
    /// that (round-off sized) rejection probability.
    ///
    /// `q` is checked first: a value outside [0, 1] (or NaN) is not a probability, and a negative one would put
    /// residual mass on tokens the target cannot produce (`p = 0`), so it is an error, not a sample. With `q`
    /// valid the residual is 0 wherever `p` is, so a sparse row computes it over its kept tokens only.
    ///
    /// Errors: [`SpecError::NonFinite`] (`what = "draft probability"`) for a NaN / inf value of `q`,
    /// [`SpecError::Config`] for a finite value outside [0, 1]; `row` (the draft row index) goes into both.
    pub(crate) fn sample_residual(&mut self, q: &[f32], row: usize, u: f64) -> Result<u32> {
        if !q_all_in_range(q) {
            return Err(bad_q_error(q, row));
        }
        if self.fault == Some(Fault::ResidualFromDraft) {
            let q_total: f64 = q.iter().map(|&x| f64::from(x)).sum();
            return Ok(inverse_cdf(q, 0.0, q_total, u));
        }
        #[allow(clippy::cast_possible_truncation)]
        let inv = (1.0 / self.total) as f32;
        if self.sparse {
            self.rw.clear();
            let mut r_total = 0.0f64;
            for (&i, &wv) in self.kidx.iter().zip(&self.kw) {
                let d = wv * inv - q[i as usize];
                let r = if d > 0.0 { d } else { 0.0 };
                self.rw.push(r);
                r_total += f64::from(r);
            }
            if r_total < f64::from(f32::MIN_POSITIVE) {
                return Ok(self.sample_processed(u));
            }
            return Ok(inverse_cdf_sparse(
                &self.kidx,
                &self.rw,
                r_total,
                u,
                u32::MAX,
            ));
        }
        let r_total = residual_into(&self.w, self.threshold, inv, q, &mut self.resid);
        if r_total < f64::from(f32::MIN_POSITIVE) {
            return Ok(self.sample_processed(u));
        }
        Ok(inverse_cdf(&self.resid, 0.0, r_total, u))
    }

    /// After [`Sampler::process`]: sample from the processed row with `token` removed, renormalised (the residual of
    /// a point-mass draft, `norm(max(0, p - onehot(token)))`). Falls back to `p` when the remaining mass is
    /// round-off sized, as [`Sampler::sample_residual`].
    pub(crate) fn sample_excluding(&mut self, token: u32, u: f64) -> u32 {
        let wt = if self.sparse {
            self.sparse_pos(token)
                .map_or(0.0, |i| f64::from(self.kw[i]))
        } else {
            let t = token as usize;
            if self.w[t] >= self.threshold {
                f64::from(self.w[t])
            } else {
                0.0
            }
        };
        let rest = self.total - wt;
        if rest < self.total * f64::from(f32::EPSILON) * 1e-3 || rest <= 0.0 {
            return self.sample_processed(u);
        }
        if self.sparse {
            return inverse_cdf_sparse(&self.kidx, &self.kw, rest, u, token);
        }
        let t = token as usize;
        let saved = self.w[t];
        self.w[t] = 0.0;
        let tok = inverse_cdf(&self.w, self.threshold, rest, u);
        self.w[t] = saved;
        tok
    }
}

/// Borrowed scratch of the sparse path of [`Sampler::process`] (the logits may live in the sampler too).
pub(crate) struct SparseScratch<'a> {
    bmax: &'a [f32],
    kidx: &'a mut Vec<u32>,
    kw: &'a mut Vec<f32>,
    cand: &'a mut Vec<f32>,
}

impl SparseScratch<'_> {
    /// The sparse path of [`Sampler::process`]: collect the candidate tokens (weight >= `e^-level`, from the blocks
    /// whose max can reach it), apply top-p / min-p on them, keep the survivors. Returns `None` when
    /// no level gives a usable candidate set (too many candidates, or top-p mass not reached): process densely.
    #[allow(clippy::too_many_arguments)]
    fn run(
        self,
        x: &[f32],
        m: f32,
        inv_t: f32,
        kth: f32,
        total: f64,
        params: &SamplingParams,
        levels: &[f32],
    ) -> Option<(f32, f64)> {
        let target = f64::from(params.top_p) * total;
        for &level in levels {
            let lo = -level;
            self.kidx.clear();
            self.kw.clear();
            let mut mass = 0.0f64;
            let mut too_many = false;
            for (b, &bm) in self.bmax[..n_blocks(x.len())].iter().enumerate() {
                if !((bm - m) * inv_t >= lo && bm >= kth) {
                    continue;
                }
                let start = b * MAX_BLOCK;
                let end = (start + MAX_BLOCK).min(x.len());
                // 16 values at a time: scan one by one only a chunk whose max can be a candidate (the test is
                // monotone in x, so it holds for some value iff it holds for the chunk max).
                for (ci, c) in x[start..end].chunks(16).enumerate() {
                    let cm = c
                        .iter()
                        .fold(f32::NEG_INFINITY, |a, &v| if v > a { v } else { a });
                    if !((cm - m) * inv_t >= lo && cm >= kth) {
                        continue;
                    }
                    for (j, &xv) in c.iter().enumerate() {
                        if (xv - m) * inv_t >= lo && xv >= kth {
                            let wv = weight(xv, m, inv_t, kth);
                            if wv > 0.0 {
                                #[allow(clippy::cast_possible_truncation)]
                                self.kidx.push((start + ci * 16 + j) as u32);
                                self.kw.push(wv);
                                mass += f64::from(wv);
                            }
                        }
                    }
                }
                if self.kidx.len() > MAX_CAND {
                    too_many = true;
                    break;
                }
            }
            if too_many {
                return None;
            }
            let mut thr = 0.0f32;
            let mut kept_total = mass;
            if params.top_p < 1.0 {
                // Every token at least as likely as the weakest candidate is a candidate, so once the candidates
                // hold `target` mass the nucleus lies inside them.
                if self.kidx.is_empty() || mass < target {
                    continue;
                }
                self.cand.clear();
                self.cand.extend_from_slice(self.kw);
                thr = weighted_select(self.cand, target);
            }
            if params.min_p > 0.0 && params.min_p > thr {
                thr = params.min_p;
            }
            if thr > 0.0 {
                // Keep the candidates >= thr (in place, ids stay ascending).
                let mut n = 0;
                kept_total = 0.0;
                for i in 0..self.kidx.len() {
                    let wv = self.kw[i];
                    if wv >= thr {
                        self.kidx[n] = self.kidx[i];
                        self.kw[n] = wv;
                        kept_total += f64::from(wv);
                        n += 1;
                    }
                }
                self.kidx.truncate(n);
                self.kw.truncate(n);
            }
            if self.kidx.is_empty() {
                return None;
            }
            return Some((thr, kept_total));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn top_logprobs_are_the_log_softmax_of_the_k_largest_first_argmax_first() {
        let row = [1.0_f32, 3.0, 3.0, 0.0, -2.0];
        let top = top_logprobs(&row, 3, 0).unwrap();
        let ids: Vec<u32> = top.iter().map(|t| t.0).collect();
        assert_eq!(ids, vec![1, 2, 0]);
        let mut greedy = Vec::new();
        argmax_rows(&row, row.len(), &mut greedy).unwrap();
        assert_eq!(greedy[0], ids[0]);
        for &(id, lp) in &top {
            assert!((lp - log_softmax_at(&row, id, 0).unwrap()).abs() < 1e-6);
        }
        // k beyond the row, and k = 0.
        assert_eq!(top_logprobs(&row, 9, 0).unwrap().len(), 5);
        assert!(top_logprobs(&row, 0, 0).unwrap().is_empty());
        assert!(top_logprobs(&[f32::NAN, 1.0], 1, 4).is_err());
    }

    use super::*;

    fn probs(logits: &[f32], params: &SamplingParams, ctx: Option<&PenaltyContext>) -> Vec<f32> {
        let mut s = Sampler::new(logits.len());
        s.process(logits, 0, params, ctx).unwrap();
        let mut out = vec![0.0; logits.len()];
        s.write_probs(&mut out).unwrap();
        out
    }

    fn softmax(x: &[f64]) -> Vec<f64> {
        let m = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = x.iter().map(|v| (v - m).exp()).collect();
        let s: f64 = e.iter().sum();
        e.iter().map(|v| v / s).collect()
    }

    #[test]
    fn fast_exp_is_accurate() {
        let mut worst = 0.0f64;
        let mut x = -87.0f32;
        while x <= 0.0 {
            let got = f64::from(exp_nonpos(x));
            let want = f64::from(x).exp();
            worst = worst.max((got - want).abs() / want);
            x += 0.001_3;
        }
        assert!(worst < 3e-7, "worst relative error {worst}");
        assert_eq!(exp_nonpos(0.0), 1.0);
        assert_eq!(exp_nonpos(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_nonpos(-90.0), 0.0);
    }

    #[test]
    fn plain_softmax_matches_f64() {
        let logits = [1.0f32, 2.0, 3.0, -1.0, 0.5];
        let p = probs(&logits, &SamplingParams::default(), None);
        let want = softmax(&logits.map(f64::from));
        for (a, b) in p.iter().zip(&want) {
            assert!((f64::from(*a) - b).abs() < 1e-6);
        }
    }

    #[test]
    fn top_k_keeps_ties_at_boundary() {
        let logits = [1.0f32, 3.0, 2.0, 2.0, 0.0];
        let params = SamplingParams {
            top_k: 2,
            ..SamplingParams::default()
        };
        let p = probs(&logits, &params, None);
        // 2nd largest logit is 2.0, tied: tokens 1, 2, 3 kept.
        assert_eq!(p[0], 0.0);
        assert_eq!(p[4], 0.0);
        assert!(p[1] > 0.0 && p[2] > 0.0 && p[3] > 0.0);
    }

    #[test]
    fn top_p_walks_descending_until_mass_reached() {
        // p = [0.5, 0.3, 0.15, 0.05] (as logits of the probabilities).
        let logits = [0.5f32, 0.3, 0.15, 0.05].map(f32::ln);
        for (top_p, kept) in [
            (0.45f32, 1usize),
            (0.6, 2),
            (0.75, 2),
            (0.85, 3),
            (0.9, 3),
            (0.97, 4),
        ] {
            let params = SamplingParams {
                top_p,
                ..SamplingParams::default()
            };
            let p = probs(&logits, &params, None);
            let n = p.iter().filter(|&&v| v > 0.0).count();
            assert_eq!(n, kept, "top_p {top_p}: {p:?}");
        }
    }

    #[test]
    fn top_p_on_large_flat_vocab_uses_fallback_levels() {
        let logits = vec![0.0f32; 100_000];
        let params = SamplingParams {
            top_p: 0.5,
            ..SamplingParams::default()
        };
        let p = probs(&logits, &params, None);
        // Every token tied: all are kept.
        assert!(p.iter().all(|&v| v > 0.0));
    }

    #[test]
    fn min_p_threshold_is_relative_to_top() {
        let logits = [0.5f32, 0.3, 0.15, 0.05].map(f32::ln);
        let params = SamplingParams {
            min_p: 0.3,
            ..SamplingParams::default()
        };
        let p = probs(&logits, &params, None);
        // Threshold 0.3 * 0.5 = 0.15: tokens 0..=2 kept.
        assert!(p[2] > 0.0 && p[3] == 0.0);
    }

    #[test]
    fn non_finite_logits_are_reported_with_position() {
        let mut s = Sampler::new(40);
        let mut row = vec![0.0f32; 40];
        row[33] = f32::NAN;
        let e = s
            .process(&row, 3, &SamplingParams::default(), None)
            .unwrap_err();
        assert!(
            matches!(
                e,
                SpecError::NonFinite {
                    row: 3,
                    token: 33,
                    ..
                }
            ),
            "{e}"
        );
        row[33] = f32::INFINITY;
        let e = s
            .process(&row, 1, &SamplingParams::default(), None)
            .unwrap_err();
        assert!(
            matches!(e, SpecError::NonFinite { row: 1, token: 33, ref what, .. } if what == "+inf")
        );
        let row = vec![f32::NEG_INFINITY; 40];
        let e = s
            .process(&row, 0, &SamplingParams::default(), None)
            .unwrap_err();
        assert!(matches!(e, SpecError::NonFinite { ref what, .. } if what == "all -inf"));
    }

    #[test]
    fn validate_names_value_and_range() {
        let bad = [
            (
                "temperature",
                SamplingParams {
                    temperature: -1.0,
                    ..SamplingParams::default()
                },
            ),
            (
                "top_p",
                SamplingParams {
                    top_p: 0.0,
                    ..SamplingParams::default()
                },
            ),
            (
                "top_p",
                SamplingParams {
                    top_p: 1.5,
                    ..SamplingParams::default()
                },
            ),
            (
                "min_p",
                SamplingParams {
                    min_p: -0.1,
                    ..SamplingParams::default()
                },
            ),
            (
                "repetition_penalty",
                SamplingParams {
                    repetition_penalty: 0.0,
                    ..SamplingParams::default()
                },
            ),
            (
                "frequency_penalty",
                SamplingParams {
                    frequency_penalty: f32::NAN,
                    ..SamplingParams::default()
                },
            ),
            (
                "presence_penalty",
                SamplingParams {
                    presence_penalty: f32::INFINITY,
                    ..SamplingParams::default()
                },
            ),
        ];
        for (field, p) in bad {
            let e = p.validate().unwrap_err();
            // The error names its setting (the field the message starts with).
            assert_eq!(e.field(), Some(field), "{e}");
            assert!(
                matches!(e, SpecError::Setting { ref message, .. }
                    if message.contains("expected") && message.starts_with(&format!("{field} "))),
                "{e}"
            );
        }
        SamplingParams::default().validate().unwrap();
        SamplingParams::greedy().validate().unwrap();
    }

    #[test]
    fn inverse_cdf_never_returns_zero_weight() {
        let w = [0.0f32, 1.0, 0.0, 2.0, 0.0];
        assert_eq!(inverse_cdf(&w, 0.0, 3.0, 0.0), 1);
        assert_eq!(inverse_cdf(&w, 0.0, 3.0, 0.34), 3);
        assert_eq!(inverse_cdf(&w, 0.0, 3.0, 0.999_999_999), 3);
        // Round-off beyond the total: last kept token.
        assert_eq!(inverse_cdf(&w, 0.0, 3.1, 0.999_999), 3);
    }

    #[test]
    fn log_softmax_matches_f64() {
        let logits = [1.0f32, 2.0, 3.0];
        let want = softmax(&[1.0, 2.0, 3.0])[1].ln();
        let got = log_softmax_at(&logits, 1, 0).unwrap();
        assert!((f64::from(got) - want).abs() < 1e-6);
    }
}
