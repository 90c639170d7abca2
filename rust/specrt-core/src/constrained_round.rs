//! The round logic of constrained requests, shared by the single-request [`crate::Engine`] and the batched
//! [`crate::BatchEngine`] (one definition of a constrained round; `docs/structured-output.md`).
//!
//! A constrained round proposes, at each position, the tokens the constraint forces (free drafts: no draft pass, a
//! one-hot `q` row) and otherwise, while fewer than `k_draft` came from it, the draft model's sample from its masked
//! `q`. [`Proposer`] is that loop made resumable at each draft pass, so the batch engine can run the passes of all
//! its rows together: [`Proposer::run_until_pass`] pushes forced tokens until a pass is needed, the caller runs the
//! pass over [`ConstrainedScratch::input`] at [`Proposer::n_past`], and [`Proposer::take_pass`] reads its logits.

use std::time::Instant;

use crate::constraint::{apply_mask, mask_allows, mask_words, Constraint};
use crate::error::{Result, SpecError};
use crate::request::{ms_since, FinishReason, Request, MAX_FORCED_PER_ROUND};
use crate::sampling::{Fault, Sampler};
use crate::verify::MAX_DRAFT_TOKENS;

/// Scratch of a constrained request's rounds (sized by [`ConstrainedScratch::prepare`], reused).
#[derive(Default)]
pub(crate) struct ConstrainedScratch {
    // [rows, mask_words(vocab)] the mask of each target row of the round (row i: after the first i proposals).
    pub(crate) masks: Vec<u32>,
    // [rows, vocab] the masked target rows verification reads.
    pub(crate) masked_tgt: Vec<f32>,
    // [vocab] the masked draft row; [vocab] the unmasked q of the `MaskTargetOnly` test fault.
    masked_dft: Vec<f32>,
    q_fault: Vec<f32>,
    // The tokens the constraint forces at the current position.
    forced: Vec<u32>,
    // The draft model's next input: committed tokens it has not read, then proposals since its last pass.
    pub(crate) input: Vec<u32>,
}

impl ConstrainedScratch {
    /// Size the buffers for `req`'s largest round (K drafts plus up to [`MAX_FORCED_PER_ROUND`] forced tokens, and
    /// the bonus row); returns that row count (`q` rows needed: one less).
    pub(crate) fn prepare(&mut self, req: &Request, vocab: usize) -> usize {
        let rows = (req.k_max() + MAX_FORCED_PER_ROUND)
            .min(MAX_DRAFT_TOKENS)
            .min(req.cfg.max_new_tokens)
            + 1;
        self.masks.resize(rows * mask_words(vocab), 0);
        self.masked_tgt.resize(rows * vocab, 0.0);
        self.masked_dft.resize(vocab, 0.0);
        if req.cfg.fault == Some(Fault::MaskTargetOnly) {
            self.q_fault.resize(vocab, 0.0);
        }
        rows
    }

    /// Write the mask of the bonus row `k` when the proposals wrote `n_masks == k` rows (a refusal or a draft
    /// without mass wrote it already): all ones after an end (`ended`: nothing after it is ever emitted), else the
    /// constraint's mask after the proposals.
    ///
    /// Errors: matcher errors, as [`Request::next_mask`].
    pub(crate) fn bonus_mask(
        &mut self,
        req: &mut Request,
        k: usize,
        n_masks: usize,
        ended: bool,
        vocab: usize,
    ) -> Result<()> {
        if n_masks != k {
            return Ok(());
        }
        let words = mask_words(vocab);
        let row = &mut self.masks[k * words..(k + 1) * words];
        if ended {
            row.fill(u32::MAX);
            Ok(())
        } else {
            req.next_mask(row)
        }
    }

    /// The masked target rows verification reads (`[k + 1, vocab]`, from `logits_tgt` `[>= k + 1, vocab]`): each row
    /// under its mask; log-probabilities stay the raw rows'. Under the `ForcedUnverified` test fault a forced
    /// proposal's row is its point mass.
    ///
    /// Errors: [`SpecError::Shape`] for mismatched lengths.
    pub(crate) fn mask_target(
        &mut self,
        req: &Request,
        logits_tgt: &[f32],
        tokens: &[u32],
        vocab: usize,
    ) -> Result<&[f32]> {
        let words = mask_words(vocab);
        let k = tokens.len();
        for j in 0..=k {
            apply_mask(
                &logits_tgt[j * vocab..(j + 1) * vocab],
                &self.masks[j * words..(j + 1) * words],
                &mut self.masked_tgt[j * vocab..(j + 1) * vocab],
            )?;
            if req.cfg.fault == Some(Fault::ForcedUnverified) && req.forced_bits >> j & 1 == 1 {
                // The broken variant: a forced token is taken as certain (p = its point mass).
                let row = &mut self.masked_tgt[j * vocab..(j + 1) * vocab];
                row.fill(f32::NEG_INFINITY);
                row[tokens[j] as usize] = 0.0;
            }
        }
        Ok(&self.masked_tgt[..(k + 1) * vocab])
    }
}

impl Request {
    /// Attach `constraint` to a request about to start: it must be fresh (no token consumed); one already complete
    /// finishes the request with [`FinishReason::Grammar`] before any token.
    ///
    /// Errors: [`SpecError::Config`] for a constraint that consumed tokens; matcher errors.
    pub(crate) fn set_constraint(&mut self, mut c: Box<dyn Constraint>) -> Result<()> {
        if !c.is_empty() {
            return Err(SpecError::Config(format!(
                "the constraint has consumed {} tokens already (expected a fresh one)",
                c.len()
            )));
        }
        if c.is_complete()? {
            // Nothing may be generated at all.
            self.finish_reason = Some(FinishReason::Grammar);
        }
        self.constraint = Some(c);
        Ok(())
    }

    /// The grammar-forced tokens the next round proposes first (at most [`MAX_FORCED_PER_ROUND`]; 0 without a
    /// constraint), for auto K's choice ([`crate::KController::set_forced`]). `sc`: the scratch it uses.
    ///
    /// Errors: matcher errors.
    pub(crate) fn forced_ahead(&mut self, sc: &mut ConstrainedScratch) -> Result<usize> {
        let Some(c) = self.constraint.as_mut() else {
            return Ok(0);
        };
        let t0 = Instant::now();
        let out = c.forced_tokens(&mut sc.forced);
        self.stats.mask_ms += ms_since(t0);
        out?;
        Ok(sc.forced.len().min(MAX_FORCED_PER_ROUND))
    }

    /// Most proposals of a constrained round that drafts at most `k_fixed` model tokens and may propose `k_cap`:
    /// the forced tokens come on top of K, up to [`MAX_FORCED_PER_ROUND`].
    pub(crate) fn constrained_cap(k_fixed: usize, k_cap: usize) -> usize {
        (k_fixed + MAX_FORCED_PER_ROUND)
            .min(k_cap)
            .min(MAX_DRAFT_TOKENS)
    }
}

/// What a [`Proposer`] proposed (the tokens themselves are in the caller's `tokens_dft`).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ConstrainedProposal {
    // Mask rows written (row i = the state after the first i proposals).
    pub(crate) n_masks: usize,
    // The proposals end the sequence (an EOS or a completing token).
    pub(crate) ended: bool,
    // Draft passes run, proposals the draft model read, and (ms, input tokens) of the first pass.
    pub(crate) n_passes: usize,
    pub(crate) n_fed: usize,
    pub(crate) first_pass: (f64, usize),
}

/// The proposals of one constrained round, at most `cap`: at each position the tokens the constraint forces
/// (proposed without a draft pass, with a one-hot `q` row: the stochastic rule on a one-hot row is the deterministic
/// rule), otherwise, while fewer than `k_draft` came from it, the draft model's sample from its masked `q` (its pass
/// reads every proposal since its previous pass, forced ones included). The constraint advances through the
/// proposals and each row's mask is written to the scratch's `masks`; drafting stops at an EOS, at completion, or
/// where the draft's masked row has no mass (that position becomes the bonus row). [`Proposer::finish`] restores
/// the penalties and sets `req.n_past_dft` to what the draft cache holds; `req.forced_bits` marks the forced
/// proposals.
pub(crate) struct Proposer {
    k_draft: usize,
    cap: usize,
    has_draft: bool,
    n_model: usize,
    n_committed: usize,
    /// The draft cache's length before the next pass (its input starts there).
    pub(crate) n_past: usize,
    done: bool,
    out: ConstrainedProposal,
}

impl Proposer {
    /// Start a round of `req` (the draft model, if `has_draft`, reads `sc.input` from `req.n_past_dft` on).
    pub(crate) fn begin(
        req: &mut Request,
        sc: &mut ConstrainedScratch,
        k_draft: usize,
        cap: usize,
        has_draft: bool,
    ) -> Self {
        req.forced_bits = 0;
        sc.input.clear();
        sc.input.extend_from_slice(&req.tokens[req.n_past_dft..]);
        Self {
            k_draft,
            cap,
            has_draft,
            n_model: 0,
            n_committed: req.penalties.len(),
            n_past: req.n_past_dft,
            done: false,
            out: ConstrainedProposal::default(),
        }
    }

    /// Propose forced tokens until the next position needs a draft pass (returns true: run it over `sc.input` at
    /// [`Proposer::n_past`], then call [`Proposer::take_pass`]) or the round's proposals are complete (false).
    ///
    /// Errors: matcher errors; [`SpecError::Internal`] if the constraint forces a token its own mask refuses.
    pub(crate) fn run_until_pass(
        &mut self,
        req: &mut Request,
        sc: &mut ConstrainedScratch,
        probs_dft: &mut [f32],
        tokens_dft: &mut Vec<u32>,
        vocab: usize,
    ) -> Result<bool> {
        let words = mask_words(vocab);
        let use_penalties = req.cfg.sampling.has_penalties();
        loop {
            if self.done || tokens_dft.len() >= self.cap || self.out.ended {
                self.done = true;
                return Ok(false);
            }
            let t0 = Instant::now();
            let c = req.constraint.as_mut().expect("constrained");
            c.forced_tokens(&mut sc.forced)?;
            req.stats.mask_ms += ms_since(t0);
            if sc.forced.is_empty() {
                if !self.has_draft || self.n_model >= self.k_draft {
                    self.done = true;
                }
                return Ok(!self.done);
            }
            for fi in 0..sc.forced.len() {
                let i = tokens_dft.len();
                if i >= self.cap {
                    self.done = true;
                    return Ok(false);
                }
                let f = sc.forced[fi];
                let mask = &mut sc.masks[i * words..(i + 1) * words];
                req.next_mask(mask)?;
                self.out.n_masks = i + 1;
                if !mask_allows(mask, f) {
                    return Err(SpecError::Internal(format!(
                        "the constraint forces token {f} at proposal {i} but its mask refuses it"
                    )));
                }
                let q_row = &mut probs_dft[i * vocab..(i + 1) * vocab];
                q_row.fill(0.0);
                q_row[f as usize] = 1.0;
                tokens_dft.push(f);
                sc.input.push(f);
                req.forced_bits |= 1 << i;
                if use_penalties {
                    req.penalties.push(f)?;
                }
                if advance_proposal(req, f)? {
                    self.out.ended = true;
                    self.done = true;
                    return Ok(false);
                }
            }
        }
    }

    /// Read the draft pass's `logits` (`[vocab]`, the row after `sc.input`; `pass_ms`: the pass's time): the
    /// masked draft row's choice becomes the next proposal, or drafting stops there if that row has no mass.
    ///
    /// Errors: logits processing and matcher errors.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn take_pass(
        &mut self,
        req: &mut Request,
        sc: &mut ConstrainedScratch,
        logits: &[f32],
        pass_ms: f64,
        sampler_dft: &mut Sampler,
        probs_dft: &mut [f32],
        tokens_dft: &mut Vec<u32>,
        vocab: usize,
    ) -> Result<()> {
        let words = mask_words(vocab);
        let i = tokens_dft.len();
        self.n_past += sc.input.len();
        self.out.n_passes += 1;
        self.out.n_fed = i;
        if self.out.n_passes == 1 {
            self.out.first_pass = (pass_ms, sc.input.len());
        }
        sc.input.clear();
        // The mask of draft position i is the one target row i needs.
        let mask = &mut sc.masks[i * words..(i + 1) * words];
        req.next_mask(mask)?;
        self.out.n_masks = i + 1;
        if !apply_mask(logits, mask, &mut sc.masked_dft)? {
            // The draft gives every allowed token probability 0 (a pruned vocabulary): it stops here, and this
            // position is the target's bonus row.
            self.done = true;
            return Ok(());
        }
        let q_row = &mut probs_dft[i * vocab..(i + 1) * vocab];
        let fault = req.cfg.fault == Some(Fault::MaskTargetOnly);
        if fault {
            let params = req.cfg.sampling;
            let ctx = params.has_penalties().then_some(&req.penalties);
            sampler_dft.process(logits, 0, &params, ctx)?;
            sampler_dft.write_probs(&mut sc.q_fault)?;
        }
        let d = req.draft_choice(sampler_dft, &sc.masked_dft, i, q_row)?;
        if fault {
            q_row.copy_from_slice(&sc.q_fault);
        }
        tokens_dft.push(d);
        sc.input.push(d);
        self.n_model += 1;
        if advance_proposal(req, d)? {
            self.out.ended = true;
            self.done = true;
        }
        Ok(())
    }

    /// End the round's proposals (also after an error): a rejected proposal leaves no trace in the penalties, and
    /// `req.n_past_dft` is what the draft cache holds.
    pub(crate) fn finish(self, req: &mut Request) -> ConstrainedProposal {
        req.penalties.truncate(self.n_committed);
        if self.out.n_passes > 0 {
            req.n_past_dft = self.n_past;
        }
        self.out
    }
}

/// Advance a constrained request's constraint by proposal `d`; returns whether the sequence ends with it (an EOS
/// id, which the constraint never consumes, or a token that completes it).
///
/// Errors: matcher errors (a refusal included).
fn advance_proposal(req: &mut Request, d: u32) -> Result<bool> {
    if req.is_eos(d) {
        return Ok(true);
    }
    let t0 = Instant::now();
    let c = req.constraint.as_mut().expect("constrained");
    c.advance(d)?;
    let complete = c.is_complete()?;
    req.stats.mask_ms += ms_since(t0);
    Ok(complete)
}
