//! Adaptive K: choose the number of draft tokens each round from running estimates of the cost model's terms.
//!
//! The seed's cost model (Leviathan et al. 2023, arXiv:2211.17192, section 3.4): with per-token acceptance `a`, a round
//! of K drafts emits `E(K) = (1 - a^(K+1)) / (1 - a)` tokens on average and costs `K c_q + c_verify(K + 1)`, where
//! `c_verify(n)` is the target's cost of scoring `n` tokens in one pass (`c_verify(1) = c_p`). The controller picks
//! the K in `0..=k_max` that maximises expected tokens per unit time, `E(K) / (K c_q + c_verify(K + 1))`; K = 0 (a
//! plain target step, `1 / c_p`) wins when no K is predicted to help, and then a round with drafts (a *probe*) is
//! still run every [`AutoK::probe_every`] rounds so the acceptance estimate stays current; the interval doubles after
//! each probe that leaves K = 0 the choice (up to [`MAX_PROBE_BACKOFF`] doublings) and is back to `probe_every` once
//! the estimates choose K > 0, so a load where speculation loses pays for ever fewer probes (each may carry a draft
//! catch-up of every row's backlog in a batch). No probe runs where no K would win even at an acceptance
//! [`PROBE_ACCEPTANCE_MARGIN`] above the estimate (the costs alone rule speculation out: a compute-bound batch).
//! A pass length not yet timed costs the longest timed pass plus a per-token slope that a long single-row pass (a
//! prompt's prefill) gives ([`KController::observe_long_pass`]), so a compute-bound CPU target is not assumed to
//! verify a block of 8 for the price of 2.
//!
//! Prompt-lookup (n-gram) proposals cost no draft pass (c_q = 0) and have their own acceptance estimates, kept for a
//! match's first position and for the positions after an accepted one (copies are bursty: they fail at once or run
//! on; [`KController::rate_ngram`]): when a match offers tokens, [`KController::choose_ngram`] verifies the prefix
//! length that maximises `E(K) / c_verify(K + 1)` under that two-state model, or none of it when the draft model (or a plain target step) is predicted to do
//! better; declined matches are still tried every [`AutoK::probe_every`] times.
//!
//! Whether to take an n-gram match or let the draft model draft is decided from *observed* throughput (emitted
//! tokens per ms of each kind of round, running averages) once both kinds have run: the geometric model's per-token
//! acceptance overstates bursty proposers (an n-gram on prose either copies a long run or fails at its first token),
//! and this choice is between two proposers, not two K. With pinned costs the model alone decides (no timings).
//!
//! The draft model must first read every committed token it has not seen (its *backlog*: tokens that n-gram rounds
//! or plain target steps committed). On a bandwidth-bound CPU model that catch-up pass costs about one pass; on a
//! compute-bound (int4) one it grows with the backlog. The controller measures the catch-up cost per token and adds
//! `backlog * c_catchup / CATCHUP_HORIZON` to the cost of any drafting round: the catch-up is paid once and then
//! serves the following rounds, so it is amortised over [`CATCHUP_HORIZON`] rounds — except with n-gram proposals on,
//! where the draft model may not run again soon and the round that needs the catch-up is charged all of it. The
//! draft's prompt prefill gives the first per-token estimate; probes are skipped while the catch-up would cost more
//! than [`PROBE_MAX_CATCHUP`] target passes, or, when the caller says how many tokens are left to generate
//! ([`KController::set_remaining`]), more than [`PROBE_REMAINING_SHARE`] of the plain decoding left: a draft whose
//! prompt was never read (a batch that started with plain rounds) is then still tried once when the requests are long
//! enough to repay it.
//!
//! Grammar-forced proposals (structured output, `docs/structured-output.md`): a constrained round first proposes
//! the `f` tokens its constraint forces ([`KController::set_forced`]), then K draft tokens. Forced tokens cost no draft
//! pass but a verification row each, and are accepted at their own rate `a_f` (the target's masked probability of
//! the forced token), kept apart from the draft's `a` ([`KController::observe_with_forced`]) so that forced
//! acceptances never inflate the draft's estimate. Such a round emits `E_f(K) = (1 + a_f + ... + a_f^(f-1)) +
//! a_f^f E(K)` tokens for `K c_q + c_verify(K + f + 1)`, and the controller picks the K maximising their ratio
//! (K counts model drafts only; K = 0 is then a forced-only round).
//!
//! K is chosen before the round draws any random number, so every round is lossless whatever K is. With measured
//! costs the choice depends on timings (not reproducible run to run); with [`PinnedCosts`] it depends only on the
//! seeded acceptance history, so the same seed gives the same tokens.

use crate::cost::expected_tokens;
use crate::error::{Result, SpecError};

/// Rounds over which a draft catch-up pass is amortised when choosing K (see the module docs).
pub const CATCHUP_HORIZON: f64 = 8.0;

/// Probes while K = 0 stays the choice come every `probe_every * 2^n` rounds after the n-th one, n at most this.
pub const MAX_PROBE_BACKOFF: u32 = 4;

/// A single-row target pass over at least this many tokens more than the batch's rows (a prompt's prefill chunk)
/// gives the per-token slope of a pass's cost ([`KController::observe_long_pass`]).
pub const LONG_PASS_MIN_SPAN: usize = 8;

/// A probe round is skipped when no K would beat a plain round even at an acceptance this much above the estimate
/// (about one standard error of a 32-position window at acceptance 0.7).
pub const PROBE_ACCEPTANCE_MARGIN: f64 = 0.1;

/// A probe round is skipped while catching the draft model up would cost more than this many target passes.
pub const PROBE_MAX_CATCHUP: f64 = 4.0;

/// ... or, with the tokens left to generate known, while it would cost more than this share of the plain decoding
/// left (`remaining * c_verify(1)`).
pub const PROBE_REMAINING_SHARE: f64 = 0.1;

/// Costs to use instead of measured timings (for runs that must repeat exactly). Units are arbitrary but shared.
#[derive(Clone, Debug, PartialEq)]
pub struct PinnedCosts {
    /// Cost of one draft forward pass (c_q). Pinned costs count no catch-up cost.
    pub c_draft: f64,
    /// `c_verify[n - 1]`: the target's cost of scoring `n` tokens in one pass, for `n = 1..=k_max + 1`.
    pub c_verify: Vec<f64>,
}

/// Settings of adaptive K.
#[derive(Clone, Debug, PartialEq)]
pub struct AutoK {
    /// Largest K considered (1..=64).
    pub k_max: usize,
    /// Acceptance rate assumed before the first round (0..1).
    pub prior_acceptance: f64,
    /// Acceptance rate of n-gram proposals assumed before the first n-gram round (0..1).
    pub prior_acceptance_ngram: f64,
    /// Weight of the newest observation in the running averages of timings and throughput (0..=1); larger = recent
    /// rounds count more.
    pub ewma_weight: f64,
    /// Evaluated draft positions the acceptance estimate averages over (the most recent ones; 1..=4096).
    pub acceptance_window: usize,
    /// Pseudo-count of the prior acceptance in that average (>= 0): the estimate is `(sum of the window's min(1,
    /// p/q) + w0 prior) / (n + w0)`, so the first observations move it quickly and a full window dominates it.
    pub prior_weight: f64,
    /// While K = 0 is chosen, run a round with drafts every this many rounds (>= 1), doubling after each such probe
    /// that leaves K = 0 the choice ([`MAX_PROBE_BACKOFF`] times at most; back to this once K > 0 is chosen).
    pub probe_every: usize,
    /// Use these costs instead of measuring.
    pub pinned: Option<PinnedCosts>,
}

impl Default for AutoK {
    fn default() -> Self {
        Self {
            k_max: 8,
            prior_acceptance: 0.7,
            prior_acceptance_ngram: 0.6,
            ewma_weight: 0.15,
            acceptance_window: 32,
            prior_weight: 2.0,
            probe_every: 16,
            pinned: None,
        }
    }
}

impl AutoK {
    /// Check the settings.
    ///
    /// Errors: [`SpecError::Config`] naming the bad value and the allowed range.
    pub fn validate(&self) -> Result<()> {
        if !(1..=crate::verify::MAX_DRAFT_TOKENS).contains(&self.k_max) {
            return Err(SpecError::Config(format!(
                "auto K k_max {} is invalid (expected 1 <= k_max <= {})",
                self.k_max,
                crate::verify::MAX_DRAFT_TOKENS
            )));
        }
        if !(0.0..1.0).contains(&self.prior_acceptance) {
            return Err(SpecError::Config(format!(
                "auto K prior_acceptance {} is invalid (expected 0 <= a < 1)",
                self.prior_acceptance
            )));
        }
        if !(0.0..1.0).contains(&self.prior_acceptance_ngram) {
            return Err(SpecError::Config(format!(
                "auto K prior_acceptance_ngram {} is invalid (expected 0 <= a < 1)",
                self.prior_acceptance_ngram
            )));
        }
        if !(self.ewma_weight > 0.0 && self.ewma_weight <= 1.0) {
            return Err(SpecError::Config(format!(
                "auto K ewma_weight {} is invalid (expected 0 < w <= 1)",
                self.ewma_weight
            )));
        }
        if !(1..=4096).contains(&self.acceptance_window) {
            return Err(SpecError::Config(format!(
                "auto K acceptance_window {} is invalid (expected 1..=4096)",
                self.acceptance_window
            )));
        }
        if !(self.prior_weight.is_finite() && self.prior_weight >= 0.0) {
            return Err(SpecError::Config(format!(
                "auto K prior_weight {} is invalid (expected a finite value >= 0)",
                self.prior_weight
            )));
        }
        if self.probe_every == 0 {
            return Err(SpecError::Config(
                "auto K probe_every 0 is invalid (expected >= 1)".to_owned(),
            ));
        }
        if let Some(p) = &self.pinned {
            if p.c_verify.len() < self.k_max + 1 {
                return Err(SpecError::setting(
                    "pinned_costs",
                    format!(
                        "pinned c_verify has {} entries, expected k_max + 1 = {}",
                        p.c_verify.len(),
                        self.k_max + 1
                    ),
                ));
            }
            if !(p.c_draft.is_finite() && p.c_draft >= 0.0)
                || p.c_verify.iter().any(|c| !(c.is_finite() && *c > 0.0))
            {
                return Err(SpecError::setting(
                    "pinned_costs",
                    "pinned costs must be finite, c_draft >= 0 and every c_verify > 0",
                ));
            }
        }
        Ok(())
    }
}

/// Per-token acceptance: the mean of `min(1, p/q)` over the last `window` evaluated draft positions, with the prior
/// counted as `prior_weight` pseudo-observations.
///
/// An exponential average (weight 0.15) of values that are 0 or 1 at temperature 0 moved by 0.15 on every rejection:
/// a stream that accepted 97% of its drafts read as 0.83 after each rejection, and chose short blocks for the next
/// rounds (auto K 12% behind the best fixed K on such a prompt). Over a window of 32 one rejection moves the
/// estimate by 1/32; a change of regime is followed within the window.
#[derive(Clone, Debug)]
struct AcceptanceEstimate {
    prior: f64,
    prior_weight: f64,
    window: std::collections::VecDeque<f32>,
    capacity: usize,
    sum: f64,
}

impl AcceptanceEstimate {
    fn new(prior: f64, prior_weight: f64, capacity: usize) -> Self {
        Self {
            prior,
            prior_weight,
            window: std::collections::VecDeque::with_capacity(capacity),
            capacity,
            sum: 0.0,
        }
    }

    fn push(&mut self, a: f32) {
        if self.window.len() == self.capacity {
            if let Some(old) = self.window.pop_front() {
                self.sum -= f64::from(old);
            }
        }
        self.window.push_back(a);
        self.sum += f64::from(a);
    }

    fn value(&self) -> f64 {
        // A running f64 sum of values in [0, 1]: its rounding drift stays far below anything the choice can see.
        let n = self.window.len() as f64;
        if n + self.prior_weight <= 0.0 {
            return self.prior; // nothing observed and no weight on the prior: the prior still stands
        }
        ((self.sum + self.prior_weight * self.prior) / (n + self.prior_weight)).clamp(0.0, 1.0)
    }
}

/// Running estimates and the per-round choice of K.
#[derive(Clone, Debug)]
pub struct KController {
    cfg: AutoK,
    // Per-token acceptance estimate (mean of min(1, p/q) over evaluated draft positions).
    alpha: AcceptanceEstimate,
    // The same for n-gram proposals (p(x) per evaluated position: q is a point mass).
    alpha_ngram: AcceptanceEstimate,
    // n-gram proposals are bursty (a copy either fails at once or runs on): p(x) of a match's first position, and of
    // the positions after an accepted one ([`KController::rate_ngram`]).
    ngram_first: AcceptanceEstimate,
    ngram_next: AcceptanceEstimate,
    // The same for grammar-forced proposals (p(x) of the masked target row), and the forced tokens the next round
    // proposes before its drafts.
    alpha_forced: AcceptanceEstimate,
    n_forced: usize,
    // ms per draft pass; None until measured.
    c_draft: Option<f64>,
    c_draft_seen: u32,
    // [k_max + 1] ms for a target pass over n = index + 1 tokens; None until measured.
    c_verify: Vec<Option<f64>>,
    // [k_max + 1] how many passes of each length were timed.
    c_verify_seen: Vec<u32>,
    // [k_max + 1] a larger batch size's confirmed costs (see `inherit_target_costs`), kept apart from this
    // controller's own timings; None where nothing was inherited.
    c_verify_inherited: Vec<Option<f64>>,
    rounds_since_draft: usize,
    // Probes since the estimates last chose K > 0 (the probe interval's doublings, at most MAX_PROBE_BACKOFF).
    probe_backoff: u32,
    // ms per extra token fed to a draft catch-up pass; None until measured.
    c_catchup: Option<f64>,
    // Committed tokens the draft model has not read, beyond the one every drafting round feeds.
    backlog: usize,
    // Rounds over which the current backlog's catch-up is amortised.
    catchup_horizon: f64,
    // Tokens the requests still have to generate (plain rounds left); 0 = not known.
    remaining: usize,
    // n-gram matches declined since the last n-gram round.
    ngram_declined: usize,
    // Observed tokens per ms of n-gram rounds and of draft-model rounds (running averages); None until seen.
    tput_ngram: Option<f64>,
    tput_draft: Option<f64>,
    // Rows of the batch this controller chooses for (1 for one stream).
    rows: usize,
    // The latest long single-row target pass: (tokens, ms); see `observe_long_pass`.
    long_pass: Option<(usize, f64)>,
}

/// Fold a timing `x` (ms) into a running estimate. The first timing of a pass shape is provisional and the second
/// replaces it: a first pass often carries one-time warm-up (CUDA kernel selection and arena growth, first-touch page
/// faults), and averaging it in (EWMA, weight `w`) kept a shape's cost inflated for dozens of rounds, so the
/// controller avoided the K that shape belongs to (short blocks on a GPU at full acceptance). Later timings are
/// averaged with weight `w`.
fn fold_timing(slot: &mut Option<f64>, seen: &mut u32, x: f64, w: f64) {
    *slot = Some(match *slot {
        Some(old) if *seen >= 2 => old + w * (x - old),
        _ => x,
    });
    *seen = seen.saturating_add(1);
}

/// Which proposer a finished round used (for [`KController::observe_round`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RoundKind {
    /// K = 0: a plain target step.
    Plain,
    /// Drafts from the draft model.
    Draft,
    /// Drafts from an n-gram match.
    Ngram,
}

impl KController {
    /// A controller with the prior estimates of `cfg` (validated).
    ///
    /// Errors: as [`AutoK::validate`].
    pub fn new(cfg: AutoK) -> Result<Self> {
        cfg.validate()?;
        let n = cfg.k_max + 1;
        Ok(Self {
            alpha: AcceptanceEstimate::new(
                cfg.prior_acceptance,
                cfg.prior_weight,
                cfg.acceptance_window,
            ),
            c_draft: None,
            c_draft_seen: 0,
            c_verify: vec![None; n],
            c_verify_seen: vec![0; n],
            c_verify_inherited: vec![None; n],
            rounds_since_draft: 0,
            probe_backoff: 0,
            c_catchup: None,
            backlog: 0,
            catchup_horizon: CATCHUP_HORIZON,
            remaining: 0,
            ngram_declined: 0,
            tput_ngram: None,
            tput_draft: None,
            rows: 1,
            long_pass: None,
            alpha_ngram: AcceptanceEstimate::new(
                cfg.prior_acceptance_ngram,
                cfg.prior_weight,
                cfg.acceptance_window,
            ),
            ngram_first: AcceptanceEstimate::new(
                cfg.prior_acceptance_ngram,
                cfg.prior_weight,
                cfg.acceptance_window,
            ),
            ngram_next: AcceptanceEstimate::new(
                cfg.prior_acceptance_ngram,
                cfg.prior_weight,
                cfg.acceptance_window,
            ),
            // (A forced token is the only token its mask allows the draft: the n-gram prior, a point-mass q, fits.)
            alpha_forced: AcceptanceEstimate::new(
                cfg.prior_acceptance_ngram,
                cfg.prior_weight,
                cfg.acceptance_window,
            ),
            n_forced: 0,
            cfg,
        })
    }

    /// Whether the cost of a target pass over `n` tokens has been timed at least twice (a confirmed measurement),
    /// or is pinned.
    #[must_use]
    pub fn verify_cost_known(&self, n: usize) -> bool {
        self.cfg.pinned.is_some()
            || (n >= 1
                && n <= self.c_verify.len()
                && (self.confirmed(n - 1) || self.c_verify_inherited[n - 1].is_some()))
    }

    /// Whether this controller's own cost of a target pass over `index + 1` tokens is confirmed (timed twice).
    fn confirmed(&self, index: usize) -> bool {
        self.c_verify_seen[index] >= 2
    }

    /// The inherited cost of a pass over `index + 1` tokens, brought to this batch size: scaled by the mean ratio of
    /// this size's own confirmed costs to the inherited costs at the same lengths (interpolated between inherited
    /// lengths; lengths beyond them only when no own confirmed length lies among them; 1 while there is none), and
    /// never above this size's own confirmed cost of a longer pass (a pass over more tokens costs no less).
    fn inherited_cost(&self, index: usize) -> Option<f64> {
        let inherited = &self.c_verify_inherited;
        let raw = inherited[index]?;
        let lo = inherited.iter().position(Option::is_some)?;
        let hi = inherited.iter().rposition(Option::is_some)?;
        let point = |i: usize| inherited[i].map(|c| (i, c));
        // The inherited cost curve at length index j + 1: linear between inherited lengths, flat beyond them.
        let curve = |j: usize| -> f64 {
            let below = (0..=j.min(hi)).rev().find_map(point);
            let above = (j.max(lo)..=hi).find_map(point);
            match (below, above) {
                (Some((i0, c0)), Some((i1, c1))) if i1 > i0 => {
                    c0 + (c1 - c0) * (j - i0) as f64 / (i1 - i0) as f64
                }
                (Some((_, c)), _) | (None, Some((_, c))) => c,
                (None, None) => raw,
            }
        };
        // This size's confirmed costs; those among the inherited lengths when there are any.
        let own = |j: &usize| self.confirmed(*j);
        let any_inside = (lo..=hi).any(|j| own(&j));
        let (sum, n) = (0..self.c_verify.len())
            .filter(own)
            .filter(|j| !any_inside || (lo..=hi).contains(j))
            .filter_map(|j| self.c_verify[j].map(|c| c / curve(j)))
            .fold((0.0, 0u32), |(s, n), r| (s + r, n + 1));
        let scale = if n == 0 { 1.0 } else { sum / f64::from(n) };
        let cap = (index + 1..self.c_verify.len())
            .filter(own)
            .filter_map(|j| self.c_verify[j])
            .fold(f64::INFINITY, f64::min);
        Some((raw * scale).min(cap))
    }

    /// Current per-token acceptance estimate.
    #[must_use]
    pub fn alpha(&self) -> f64 {
        self.alpha.value()
    }

    /// Current per-token acceptance estimate of grammar-forced proposals.
    #[must_use]
    pub fn alpha_forced(&self) -> f64 {
        self.alpha_forced.value()
    }

    /// Set the grammar-forced tokens the next round proposes before its drafts (0 without a constraint; kept until
    /// set again). They cost a verification row each and no draft pass ([`KController::rate`]).
    pub fn set_forced(&mut self, n_forced: usize) {
        self.n_forced = n_forced;
    }

    /// Current per-token acceptance estimate of n-gram proposals.
    #[must_use]
    pub fn alpha_ngram(&self) -> f64 {
        self.alpha_ngram.value()
    }

    fn cost_draft(&self) -> f64 {
        match &self.cfg.pinned {
            Some(p) => p.c_draft,
            // Before the first measurement assume a draft pass costs a third of a target pass (typical 3x size
            // ratio); the first drafting round replaces the guess.
            None => self.c_draft.unwrap_or_else(|| self.cost_verify(1) / 3.0),
        }
    }

    /// Cost of a target pass over `n` tokens: pinned, measured, or estimated from the measured passes.
    ///
    /// Between two measured lengths: linear interpolation. Beyond the longest measured pass: that pass's cost plus,
    /// per extra token a row, the slope a long single-row pass gives ([`Self::observe_long_pass`]; about 0 on a GPU,
    /// about a fifth of a pass on a compute-bound CPU), else that pass's cost alone (a longer pass costs at least as
    /// much, and assuming no more makes the controller try it and measure it). Below
    /// the shortest: 5% less per token (a bandwidth-bound pass). Never a least-squares slope extrapolated past the
    /// data: a few noisy points a token apart can give a steep slope that prices long blocks out, so they are never
    /// tried and never measured.
    fn cost_verify(&self, n: usize) -> f64 {
        if let Some(p) = &self.cfg.pinned {
            // (Beyond the table, reached by forced tokens on top of K: its longest pass.)
            return p.c_verify[(n - 1).min(p.c_verify.len() - 1)];
        }
        if n > self.c_verify.len() {
            // Beyond the timed lengths (forced tokens on top of k_max): the longest pass's cost, as below.
            return self.cost_verify(self.c_verify.len());
        }
        // Confirmed timings (a shape timed twice or more) decide; a lone first timing may be a warm-up outlier, so
        // it stands in only where nothing is confirmed yet (and is replaced when the shape runs again).
        // A larger batch size's costs (inherited, scaled to this size) stand in where this size has no confirmed
        // timing of its own.
        let any_confirmed = (0..self.c_verify.len())
            .any(|i| self.confirmed(i) || self.c_verify_inherited[i].is_some());
        let usable = |i: usize| -> Option<f64> {
            if self.confirmed(i) {
                self.c_verify[i]
            } else if let Some(c) = self.inherited_cost(i) {
                Some(c)
            } else if !any_confirmed {
                self.c_verify[i]
            } else {
                None
            }
        };
        if let Some(c) = usable(n - 1) {
            return c;
        }
        let below = (0..n - 1).rev().find_map(|i| usable(i).map(|c| (i + 1, c)));
        let above = (n..self.c_verify.len()).find_map(|i| usable(i).map(|c| (i + 1, c)));
        match (below, above) {
            (Some((n0, c0)), Some((n1, c1))) => c0 + (c1 - c0) * (n - n0) as f64 / (n1 - n0) as f64,
            (Some((n0, c0)), None) => c0 + self.position_cost().unwrap_or(0.0) * (n - n0) as f64,
            (None, Some((n1, c1))) => c1 * (1.0 - 0.05 * (n1 - n) as f64).max(0.5),
            (None, None) => 1.0 + 0.05 * (n as f64 - 1.0),
        }
    }

    /// Set the rows of the batch this controller chooses for (1 for one stream; the engines set it).
    pub fn set_rows(&mut self, rows: usize) {
        self.rows = rows.max(1);
    }

    /// Record a target pass over `n_tokens` new tokens of one row in `ms` (a prompt's prefill or prefill chunk).
    /// With this batch size's plain pass `C(B, 1)` it gives the cost of one more token a row in a pass: a pass costs
    /// `F + s * tokens` (a fixed part, mostly reading the weights, and `s` per token fed), so `s = (C(1, n) - C(B,
    /// 1)) / (n - B)` and a pass over `n` tokens a row costs `s * B` per token beyond the longest pass timed. Kept
    /// when `n_tokens > LONG_PASS_MIN_SPAN`; used at a batch of B rows when `n_tokens >= B + LONG_PASS_MIN_SPAN`.
    pub fn observe_long_pass(&mut self, n_tokens: usize, ms: f64) {
        if n_tokens > LONG_PASS_MIN_SPAN && ms.is_finite() && ms > 0.0 {
            self.long_pass = Some((n_tokens, ms));
        }
    }

    /// The cost (ms) of one more token a row in a pass of this batch size, from the latest long single-row pass and
    /// this size's plain pass as the controller prices it ([`Self::cost_verify`]); None with pinned costs or
    /// without a long pass spanning `rows + LONG_PASS_MIN_SPAN` tokens.
    fn position_cost(&self) -> Option<f64> {
        if self.cfg.pinned.is_some() {
            return None;
        }
        let (n, ms) = self.long_pass?;
        if n < self.rows + LONG_PASS_MIN_SPAN {
            return None;
        }
        // (cost_verify(1) never reaches this: a plain pass has no shorter timed pass below it.)
        let c1 = self.cost_verify(1);
        Some(((ms - c1) / (n - self.rows) as f64).max(0.0) * self.rows as f64)
    }

    /// Amortised cost of the catch-up pass a drafting round would need now (0 with pinned costs).
    ///
    /// Over [`CATCHUP_HORIZON`] rounds even when many more are left: choosing to speculate on priors alone would
    /// then look cheap and pay a large catch-up at a load where speculation loses (a lazily prefilled draft in a
    /// batch); the tokens left decide whether a *probe* may pay it instead ([`Self::set_remaining`]), and the probe's
    /// measurements decide what follows.
    fn cost_catchup(&self) -> f64 {
        if self.cfg.pinned.is_some() || self.backlog == 0 {
            return 0.0;
        }
        self.catchup_total() / self.catchup_horizon
    }

    /// Unamortised cost of catching the draft model up now.
    fn catchup_total(&self) -> f64 {
        // Before a measurement assume a bandwidth-bound pass: each extra token adds 5% of a draft pass.
        let per_token = self.c_catchup.unwrap_or_else(|| 0.05 * self.cost_draft());
        self.backlog as f64 * per_token
    }

    /// Set the draft model's backlog for the next choice: `unseen` = committed tokens its next pass must read (1 when
    /// it is in step: the last committed token). `ngram_active`: n-gram proposals are on, so the draft model may not
    /// draft again soon and a catch-up is charged in full to the round that needs it (no amortisation).
    pub fn set_draft_backlog(&mut self, unseen: usize, ngram_active: bool) {
        self.backlog = unseen.saturating_sub(1);
        self.catchup_horizon = if ngram_active { 1.0 } else { CATCHUP_HORIZON };
    }

    /// Start from `other`'s acceptance estimates and its draft-pass and catch-up costs (another batch size serving
    /// the same requests). The draft cost comes in as a provisional timing, replaced by this controller's first own
    /// measurement; target-pass costs are not taken (they depend most on the batch size). With pinned costs: no-op.
    pub fn inherit_estimates(&mut self, other: &KController) {
        if self.cfg.pinned.is_some() {
            return;
        }
        self.alpha = other.alpha.clone();
        self.alpha_ngram = other.alpha_ngram.clone();
        self.ngram_first = other.ngram_first.clone();
        self.ngram_next = other.ngram_next.clone();
        self.alpha_forced = other.alpha_forced.clone();
        if let Some(c) = other.c_draft {
            self.c_draft = Some(c);
            self.c_draft_seen = 1;
        }
        self.c_catchup = other.c_catchup;
    }

    /// Start from a *larger* batch size's confirmed target-pass costs (`other` runs more rows per pass), so a batch
    /// that shrinks (rows finishing) keeps its choice instead of timing plain passes again. They are kept apart from
    /// this controller's own timings and stand in for a length until this size has confirmed its own cost of it
    /// (two timings, as for any new shape: a first timing may carry warm-up), scaled by the ratio of this size's
    /// confirmed costs to the larger size's at the lengths both have, and capped by this size's confirmed cost of
    /// any longer pass. So the plain pass's cost, which is not re-timed while this size speculates, follows this
    /// size's level, and a plain round runs (and is timed) once the scaled costs say speculation does not pay.
    /// Sound in this direction only: a pass over fewer rows costs no more, and a smaller batch gains more from
    /// speculation (RESULTS, the crossover batch size); a smaller size's costs would understate a compute-bound
    /// pass, which the plain-first rule guards against. With pinned costs: no-op.
    pub fn inherit_target_costs(&mut self, other: &KController) {
        if self.cfg.pinned.is_some() {
            return;
        }
        let n = self.c_verify.len().min(other.c_verify.len());
        for i in 0..n {
            self.c_verify_inherited[i] = if other.confirmed(i) {
                other.c_verify[i]
            } else {
                other.inherited_cost(i)
            };
        }
    }

    /// Set how many plain rounds the requests have left (the longest remaining `max_new_tokens` budget; 0 = unknown).
    /// A probe may then pay a catch-up of up to [`PROBE_REMAINING_SHARE`] of that plain decoding.
    pub fn set_remaining(&mut self, tokens: usize) {
        self.remaining = tokens;
    }

    /// Predicted tokens per unit time for `k` drafts (with the amortised catch-up cost when `k > 0`) after the
    /// round's `f` forced tokens ([`KController::set_forced`]): `E_f(k) / (k c_q + c_verify(k + f + 1))` (module
    /// docs).
    #[must_use]
    pub fn rate(&self, k: usize) -> f64 {
        self.rate_at(k, self.alpha(), true)
    }

    /// [`KController::rate`] at draft acceptance `alpha` instead of the estimate, with or without the catch-up.
    fn rate_at(&self, k: usize, alpha: f64, with_catchup: bool) -> f64 {
        let e = expected_tokens(alpha.min(0.999_999), k).unwrap_or(1.0);
        let f = self.n_forced;
        let e = if f == 0 {
            e
        } else {
            let af = self.alpha_forced().min(0.999_999);
            let lead = expected_tokens(af, f - 1).unwrap_or(1.0);
            #[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]
            let all = af.powi(f as i32);
            lead + all * e
        };
        let catchup = if k > 0 && with_catchup {
            self.cost_catchup()
        } else {
            0.0
        };
        e / (k as f64 * self.cost_draft() + catchup + self.cost_verify(k + f + 1))
    }

    /// Record the first draft pass of a round when it fed `n_input > 1` tokens (a catch-up pass) in `ms`: updates
    /// the per-token catch-up cost. Pass such a round's other passes to [`Self::observe`] without this one.
    /// The draft model's prompt prefill is such a pass too (the first estimate of a request).
    pub fn observe_catchup(&mut self, ms: f64, n_input: usize) {
        if n_input < 2 {
            return;
        }
        let one_pass = if self.cfg.pinned.is_none() {
            self.c_draft.unwrap_or(0.0)
        } else {
            0.0
        };
        let per_token = ((ms - one_pass) / (n_input - 1) as f64).max(0.0);
        let w = self.cfg.ewma_weight;
        self.c_catchup = Some(
            self.c_catchup
                .map_or(per_token, |old| old + w * (per_token - old)),
        );
    }

    /// Predicted tokens per unit time for verifying `k` n-gram tokens (no draft pass). Copies are bursty, so the
    /// expected tokens are a two-state (Markov) model rather than the geometric one: the first position accepted
    /// with probability `a1` (the estimate over matches' first positions), every later one, given its predecessor
    /// was, with `c` (over the positions after an accepted one): `E(k) = 1 + a1 (1 - c^k) / (1 - c)`, which is the
    /// geometric `(1 - a^(k+1)) / (1 - a)` when `a1 = c = a` (as the priors are, before any n-gram round).
    #[must_use]
    pub fn rate_ngram(&self, k: usize) -> f64 {
        self.expected_ngram(k) / self.cost_verify(k + 1)
    }

    /// `E(k)` of [`KController::rate_ngram`]'s two-state model.
    fn expected_ngram(&self, k: usize) -> f64 {
        let a1 = self.ngram_first.value();
        let c = self.ngram_next.value().min(0.999_999);
        #[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]
        let run = (1.0 - c.powi(k as i32)) / (1.0 - c);
        1.0 + a1 * run
    }

    /// How many of the `n_offered` tokens of an n-gram match to verify this round (0 = decline the match and use
    /// the draft model or a plain target step). `draft_k_cap`: the largest K the draft model could draft this round
    /// (0 when there is no usable draft model). The alternative is the best of a plain target step and the draft
    /// model at its best K; a declined match is verified anyway (at its best length) every `probe_every`-th time,
    /// so the n-gram acceptance estimate stays current.
    #[must_use]
    pub fn choose_ngram(&mut self, n_offered: usize, draft_k_cap: usize) -> usize {
        let n = n_offered.min(self.cfg.k_max);
        // The round the controller would run instead: the draft model at its best K, or a plain step (K = 0).
        let (alt_k, alternative) = (0..=draft_k_cap.min(self.cfg.k_max))
            .map(|k| (k, self.rate(k)))
            .fold((0, f64::NEG_INFINITY), |b, x| if x.1 > b.1 { x } else { b });
        let best = (1..=n).max_by(|&a, &b| self.rate_ngram(a).total_cmp(&self.rate_ngram(b)));
        let Some(best) = best else { return 0 };
        let take = match (self.cfg.pinned.is_none(), self.tput_ngram) {
            // Between two proposers, their real throughput when known (a plain step's from the measured
            // c_verify(1)); only when the draft model is what would run instead: a draft that once did well but is
            // now priced below a plain step (its catch-up, a costly CPU verification) would otherwise keep
            // declining matches in favour of plain steps.
            (true, Some(observed)) if alt_k > 0 => {
                observed > self.tput_draft.map_or(alternative, |d| d.max(self.rate(0)))
            }
            // Against a plain step, the two-state model over the last matches (a running average of bursty round
            // throughputs swings with each run or miss, and a few misses in a row would decline matches for
            // probe_every rounds).
            _ => self.rate_ngram(best) > alternative,
        };
        if take {
            self.ngram_declined = 0;
            return best;
        }
        self.ngram_declined += 1;
        if self.ngram_declined >= self.cfg.probe_every {
            self.ngram_declined = 0;
            return best;
        }
        0
    }

    /// Record a finished round's throughput: `emitted` tokens for `ms` of draft and target time.
    pub fn observe_round(&mut self, kind: RoundKind, emitted: usize, ms: f64) {
        if ms <= 0.0 {
            return;
        }
        let t = emitted as f64 / ms;
        let w = self.cfg.ewma_weight;
        let slot = match kind {
            RoundKind::Plain => return,
            RoundKind::Draft => &mut self.tput_draft,
            RoundKind::Ngram => &mut self.tput_ngram,
        };
        *slot = Some(slot.map_or(t, |old| old + w * (t - old)));
    }

    /// Record a finished n-gram round: `k` tokens verified, their acceptance probabilities `p(x)` (one per evaluated
    /// position) and the target pass over `k + 1` tokens (ms).
    pub fn observe_ngram(&mut self, k: usize, accept_probs: &[f32], target_ms: f64) {
        for &a in accept_probs {
            self.alpha_ngram.push(a);
        }
        if let Some((&first, rest)) = accept_probs.split_first() {
            self.ngram_first.push(first);
            for &a in rest {
                self.ngram_next.push(a);
            }
        }
        self.observe(k, &[], 0.0, 0, target_ms);
    }

    /// The K for the next round, at most `k_cap` (the request's remaining budget).
    #[must_use]
    pub fn choose(&mut self, k_cap: usize) -> usize {
        let k_cap = k_cap.min(self.cfg.k_max);
        let (mut best_k, mut best) = (0, self.rate(0));
        for k in 1..=k_cap {
            let r = self.rate(k);
            if r > best {
                (best_k, best) = (k, r);
            }
        }
        if best_k > 0 || k_cap == 0 {
            self.rounds_since_draft = 0;
            if best_k > 0 {
                self.probe_backoff = 0;
            }
            return best_k;
        }
        self.rounds_since_draft += 1;
        // Probe: a drafting round (the best K > 0) refreshes the acceptance and draft-cost estimates (at once while
        // the draft's cost has never been measured: priors alone should not rule speculation out); not when the
        // draft model is so far behind that catching it up costs more than a few target passes.
        let max_catchup = PROBE_MAX_CATCHUP.max(PROBE_REMAINING_SHARE * self.remaining as f64);
        let interval = self.cfg.probe_every.saturating_mul(1 << self.probe_backoff);
        let unmeasured = self.c_draft.is_none() && self.cfg.pinned.is_none();
        let due = self.rounds_since_draft >= interval || unmeasured;
        // Nor when no K could win at an acceptance above the estimate by PROBE_ACCEPTANCE_MARGIN, a caught-up
        // draft assumed (the catch-up is a one-time cost, bounded below): what a probe would learn could not change
        // the choice (a compute-bound batch verifying on a CPU).
        let hope = (self.alpha() + PROBE_ACCEPTANCE_MARGIN).min(1.0);
        let could_win =
            unmeasured || (1..=k_cap).any(|k| self.rate_at(k, hope, false) > self.rate(0));
        if due && could_win && self.catchup_total() <= max_catchup * self.cost_verify(1) {
            self.rounds_since_draft = 0;
            self.probe_backoff = (self.probe_backoff + 1).min(MAX_PROBE_BACKOFF);
            return (1..=k_cap)
                .max_by(|&a, &b| self.rate(a).total_cmp(&self.rate(b)))
                .unwrap_or(1);
        }
        0
    }

    /// Record a finished round: `k` drafts, their acceptance probabilities `min(1, p/q)` (one per evaluated
    /// position), draft time over `n_draft_passes` passes (ms) and the target pass over `k + 1` tokens (ms).
    pub fn observe(
        &mut self,
        k: usize,
        accept_probs: &[f32],
        draft_ms: f64,
        n_draft_passes: usize,
        target_ms: f64,
    ) {
        self.observe_with_forced(k, accept_probs, 0, draft_ms, n_draft_passes, target_ms);
    }

    /// Record the acceptance probabilities of grammar-forced proposals only (the draft's estimate is untouched).
    pub fn observe_forced(&mut self, accept_probs: &[f32]) {
        for &a in accept_probs {
            self.alpha_forced.push(a);
        }
    }

    /// [`KController::observe`] of a constrained round: `k` proposals (forced and drafted; the target pass is over
    /// `k + 1` tokens), `forced_bits` bit i set when proposal i was grammar-forced. The acceptance of forced
    /// positions goes to the forced estimate, the others' to the draft's.
    pub fn observe_with_forced(
        &mut self,
        k: usize,
        accept_probs: &[f32],
        forced_bits: u64,
        draft_ms: f64,
        n_draft_passes: usize,
        target_ms: f64,
    ) {
        let w = self.cfg.ewma_weight;
        for (i, &a) in accept_probs.iter().enumerate() {
            if is_forced(forced_bits, i) {
                self.alpha_forced.push(a);
            } else {
                self.alpha.push(a);
            }
        }
        if n_draft_passes > 0 {
            let c = draft_ms / n_draft_passes as f64;
            fold_timing(&mut self.c_draft, &mut self.c_draft_seen, c, w);
        }
        if let (Some(slot), Some(seen)) = (self.c_verify.get_mut(k), self.c_verify_seen.get_mut(k))
        {
            fold_timing(slot, seen, target_ms, w);
        }
    }
}

/// Whether proposal `i` of a round was grammar-forced (`forced_bits`: bit i set; positions from 64 on never are).
pub(crate) fn is_forced(forced_bits: u64, i: usize) -> bool {
    i < 64 && forced_bits >> i & 1 == 1
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `E_f(k) / (k c_q + c_verify(k + f + 1))` written out (module docs), for the pinned-cost tests.
    fn forced_rate(a: f64, af: f64, f: usize, k: usize, c_q: f64, c_verify: &[f64]) -> f64 {
        let lead: f64 = (0..f).map(|j| af.powi(j as i32)).sum();
        let e: f64 = (0..=k).map(|j| a.powi(j as i32)).sum();
        (lead + af.powi(f as i32) * e)
            / (k as f64 * c_q + c_verify[(k + f).min(c_verify.len() - 1)])
    }

    #[test]
    fn forced_positions_cost_a_verification_row_each_and_no_draft_pass() {
        // c_q = 2, c_verify(n) = 10 (1 + 0.15 (n - 1)) for n up to 25 (K up to 8, 16 forced on top).
        let c_verify: Vec<f64> = (0..25)
            .map(|i| 10.0 * (1.0 + 0.15 * f64::from(i)))
            .collect();
        let cfg = AutoK {
            prior_acceptance: 0.8,
            prior_acceptance_ngram: 0.95,
            pinned: Some(PinnedCosts {
                c_draft: 2.0,
                c_verify: c_verify.clone(),
            }),
            ..AutoK::default()
        };
        let mut c = KController::new(cfg).unwrap();
        let (a, af) = (c.alpha(), c.alpha_forced());
        let best = |f: usize| {
            (0..=8)
                .max_by(|&x, &y| {
                    forced_rate(a, af, f, x, 2.0, &c_verify)
                        .total_cmp(&forced_rate(a, af, f, y, 2.0, &c_verify))
                })
                .unwrap()
        };
        let mut chosen = Vec::new();
        for f in [0, 1, 3, 6, 12] {
            c.set_forced(f);
            let k = c.choose(8);
            assert_eq!(k, best(f), "f = {f}");
            assert!((c.rate(k) - forced_rate(a, af, f, k, 2.0, &c_verify)).abs() < 1e-12);
            chosen.push(k);
        }
        // Forced rows make verification dearer: K shrinks as they grow (the formula is not vacuous here).
        assert!(chosen[0] > chosen[4], "{chosen:?}");
        assert!(chosen.windows(2).all(|w| w[0] >= w[1]), "{chosen:?}");
    }

    #[test]
    fn forced_acceptances_do_not_move_the_draft_acceptance_estimate() {
        let mut a = KController::new(AutoK::default()).unwrap();
        let mut b = KController::new(AutoK::default()).unwrap();
        // Proposals 0, 1 and 3 forced (accepted), 2 and 4 drafted.
        a.observe_with_forced(5, &[1.0, 1.0, 0.25, 1.0, 0.5], 0b1011, 4.0, 2, 10.0);
        b.observe(2, &[0.25, 0.5], 4.0, 2, 10.0);
        assert_eq!(a.alpha(), b.alpha());
        assert!(a.alpha() < AutoK::default().prior_acceptance);
        assert!(a.alpha_forced() > b.alpha_forced());
        // The forced estimate moves with forced acceptances only.
        let before = a.alpha_forced();
        a.observe(1, &[0.0], 1.0, 1, 10.0);
        assert_eq!(a.alpha_forced(), before);
        a.observe_forced(&[0.0, 0.0]);
        assert!(a.alpha_forced() < before);
        assert_eq!(
            b.alpha_forced(),
            KController::new(AutoK::default()).unwrap().alpha_forced()
        );
    }

    fn pinned(c_draft: f64, per_token: f64) -> AutoK {
        AutoK {
            pinned: Some(PinnedCosts {
                c_draft,
                c_verify: (0..9)
                    .map(|i| 10.0 * (1.0 + per_token * f64::from(i)))
                    .collect(),
            }),
            ..AutoK::default()
        }
    }

    #[test]
    fn picks_the_seed_optimum_with_flat_verify_cost() {
        // a = 0.7, c_q = 1, c_p = 10, c_verify flat: the seed's exercise, optimum K = 4 (1.981x).
        let mut c = KController::new(AutoK {
            prior_acceptance: 0.7,
            ..pinned(1.0, 0.0)
        })
        .unwrap();
        assert_eq!(c.choose(8), 4);
    }

    #[test]
    fn a_long_single_row_pass_prices_the_unmeasured_lengths() {
        // Measured costs (no pins): plain passes timed twice, a draft pass of 25 ms, acceptance held at `a`.
        let timed = |rows: usize, c1: f64, a: f64| {
            let mut c = KController::new(AutoK {
                prior_acceptance: a,
                prior_weight: 1e6,
                ..AutoK::default()
            })
            .unwrap();
            c.set_rows(rows);
            c.observe(0, &[], 0.0, 0, c1);
            c.observe(0, &[], 0.0, 0, c1);
            c.observe(1, &[a as f32], 25.0, 1, c1);
            c
        };
        // Without a long pass every unmeasured length costs the longest timed pass (flat): at a = 0.9, K = 4.
        let mut flat = timed(1, 60.0, 0.9);
        assert!((flat.cost_verify(9) - flat.cost_verify(2)).abs() < 1e-9);
        let k_flat = flat.choose(8);
        // A 13-token prefill of one row in 204 ms: 12 ms per token beyond a 60 ms plain pass.
        let mut one = timed(1, 60.0, 0.9);
        one.observe_long_pass(13, 204.0);
        let c2 = one.cost_verify(2);
        assert!((c2 - 72.0).abs() < 1e-9, "{c2}");
        assert!((one.cost_verify(9) - (c2 + 7.0 * 12.0)).abs() < 1e-9);
        // The seed's formula with 12 ms a token peaks at K = 2 (flat: 4).
        assert_eq!((k_flat, one.choose(8)), (4, 2));
        // Four rows: C(4, 1) = 100 ms, the same 13-token pass: s = (204 - 100) / (13 - 4), times 4 rows a position.
        let mut four = timed(4, 100.0, 0.7);
        four.observe_long_pass(13, 204.0);
        let s = (204.0 - 100.0) / 9.0 * 4.0;
        assert!((four.cost_verify(3) - (four.cost_verify(2) + s)).abs() < 1e-9);
        assert_eq!(
            four.choose(8),
            0,
            "a compute-bound batch of four does not draft at a = 0.7"
        );
        let mut four_flat = timed(4, 100.0, 0.7);
        assert!(four_flat.choose(8) > 0, "flat costs would draft");
        // A pass too short for the batch (fewer than rows + LONG_PASS_MIN_SPAN tokens) gives no slope.
        let mut eight = timed(8, 100.0, 0.7);
        eight.observe_long_pass(13, 204.0);
        assert!((eight.cost_verify(9) - eight.cost_verify(2)).abs() < 1e-9);
        // Pinned costs ignore it.
        let mut pinned_c = KController::new(pinned(3.0, 0.1)).unwrap();
        let before = pinned_c.cost_verify(5);
        pinned_c.observe_long_pass(40, 1e4);
        assert!((pinned_c.cost_verify(5) - before).abs() < 1e-12);
    }

    #[test]
    fn chooses_no_speculation_when_verify_cost_grows_fast_and_probes_later() {
        // int4-like: each verified token adds 50% of c_p; a poor draft (a = 0.3) never pays, and would not at
        // 0.4 either: no probe at all.
        let mut hopeless = KController::new(AutoK {
            prior_acceptance: 0.3,
            probe_every: 4,
            ..pinned(3.5, 0.5)
        })
        .unwrap();
        assert!((1..=200).all(|_| hopeless.choose(8) == 0));
        // A cheap draft (c_q 1) at a = 0.55: K = 1 pays above a = 0.6 (1 + a > 1.6), so K = 0 with probes.
        let cfg = AutoK {
            prior_acceptance: 0.55,
            probe_every: 4,
            ..pinned(1.0, 0.5)
        };
        let mut c = KController::new(cfg).unwrap();
        let probes: Vec<usize> = (1..=200).filter(|_| c.choose(8) > 0).collect();
        assert_eq!(
            probes,
            vec![4, 12, 28, 60, 124, 188],
            "K = 0 with probes after 4, 8, 16, 32, 64, 64 rounds (backoff capped at 2^4)"
        );
        // Once the estimates choose K > 0 the interval is back to probe_every.
        for _ in 0..40 {
            c.observe(4, &[1.0; 4], 4.0, 4, 10.0);
        }
        assert!(c.choose(8) > 0);
        // Back below the break-even (a = 0.52; a probe could still win at 0.62).
        for _ in 0..40 {
            c.observe(4, &[0.52], 4.0, 4, 10.0);
        }
        let ks: Vec<usize> = (0..4).map(|_| c.choose(8)).collect();
        assert_eq!(&ks[..3], &[0, 0, 0]);
        assert!(ks[3] > 0, "a probe after probe_every rounds again: {ks:?}");
    }

    #[test]
    fn acceptance_estimate_follows_observations() {
        let mut c = KController::new(pinned(1.0, 0.0)).unwrap();
        // Window 32, prior 0.7 counted twice: (sum + 1.4) / (n + 2).
        let w0 = 2.0 * 0.7;
        c.observe(4, &[1.0, 1.0, 1.0, 1.0], 4.0, 4, 10.0);
        assert!((c.alpha() - (4.0 + w0) / 6.0).abs() < 1e-12);
        for _ in 0..50 {
            c.observe(4, &[1.0, 1.0, 1.0, 1.0], 4.0, 4, 10.0);
        }
        let full = (32.0 + w0) / 34.0;
        assert!((c.alpha() - full).abs() < 1e-12, "{}", c.alpha());
        assert_eq!(c.choose(8), 8);
        // One rejection in a full window moves the estimate by 1/34, not by an EWMA weight: K stays long.
        c.observe(4, &[1.0, 1.0, 0.0], 4.0, 4, 10.0);
        assert!((c.alpha() - (31.0 + w0) / 34.0).abs() < 1e-12);
        assert_eq!(c.choose(8), 8);
        // A change of regime is followed within the window.
        for _ in 0..32 {
            c.observe(4, &[0.0], 4.0, 4, 10.0);
        }
        assert!((c.alpha() - w0 / 34.0).abs() < 1e-12);
        assert_eq!(c.choose(8), 0);
    }

    #[test]
    fn acceptance_window_and_prior_weight_are_validated() {
        for bad in [0, 4097] {
            let e = KController::new(AutoK {
                acceptance_window: bad,
                ..AutoK::default()
            })
            .unwrap_err();
            assert!(
                e.to_string().contains(&format!("acceptance_window {bad}")),
                "{e}"
            );
        }
        for bad in [-1.0, f64::NAN, f64::INFINITY] {
            let e = KController::new(AutoK {
                prior_weight: bad,
                ..AutoK::default()
            })
            .unwrap_err();
            assert!(e.to_string().contains("prior_weight"), "{e}");
        }
        // prior_weight 0: the mean of the window alone (the prior only until the first observation).
        let mut c = KController::new(AutoK {
            prior_weight: 0.0,
            ..pinned(1.0, 0.0)
        })
        .unwrap();
        assert!((c.alpha() - 0.7).abs() < 1e-12);
        c.observe(2, &[1.0, 0.5], 2.0, 2, 10.0);
        assert!((c.alpha() - 0.75).abs() < 1e-12);
    }

    #[test]
    fn bursty_ngram_matches_are_priced_by_their_first_position_and_their_runs() {
        // Compute-bound verification (c_verify(n) = 10 (1 + 0.3 (n - 1))), no draft model: the alternative is a
        // plain step. Half the matches fail at once, half copy all 8 tokens: per position 0.89 accepted, so the
        // geometric model would verify 4 (its best E / cost); the runs make every further token nearly free of
        // risk, so the two-state model verifies the whole match.
        let cfg = AutoK {
            acceptance_window: 4096,
            ..pinned(1.0, 0.3)
        };
        let mut c = KController::new(cfg.clone()).unwrap();
        for i in 0..40 {
            if i % 2 == 0 {
                c.observe_ngram(1, &[0.0], 10.0);
            } else {
                c.observe_ngram(8, &[1.0; 8], 31.0);
            }
        }
        let a = c.alpha_ngram();
        let geometric = (1..=8usize)
            .max_by(|&x, &y| {
                let r =
                    |k: usize| expected_tokens(a, k).unwrap() / (10.0 * (1.0 + 0.3 * (k as f64)));
                r(x).total_cmp(&r(y))
            })
            .unwrap();
        assert!(
            geometric < 8,
            "the geometric model stops short: {geometric}"
        );
        assert_eq!(c.choose_ngram(8, 0), 8);
        // Three of four matches fail at once: per position still 0.73 (the geometric model would verify 2, at a
        // predicted 1.41 tokens per plain step's time), but a match pays only a quarter of the time: E(2) = 1.5 for
        // 1.6 plain steps. Declined (until the probe of every probe_every-th match).
        let mut c = KController::new(cfg).unwrap();
        for i in 0..40 {
            if i % 4 == 0 {
                c.observe_ngram(8, &[1.0; 8], 31.0);
            } else {
                c.observe_ngram(1, &[0.0], 10.0);
            }
        }
        assert!(c.alpha_ngram() > 0.7);
        assert_eq!(c.choose_ngram(8, 0), 0);
    }

    #[test]
    fn ngram_matches_are_verified_only_when_they_beat_the_alternative() {
        // Flat verify cost (fp32-like): a good n-gram acceptance takes the whole offer.
        let mut c = KController::new(AutoK {
            prior_acceptance_ngram: 0.9,
            ..pinned(1.0, 0.0)
        })
        .unwrap();
        assert_eq!(c.choose_ngram(8, 8), 8);
        // Poor n-gram acceptance, costly verification (int4-like), a good draft: decline, except every
        // probe_every-th match.
        let mut c = KController::new(AutoK {
            prior_acceptance: 0.9,
            prior_acceptance_ngram: 0.2,
            probe_every: 3,
            ..pinned(1.0, 0.3)
        })
        .unwrap();
        let picks: Vec<usize> = (0..6).map(|_| c.choose_ngram(8, 8)).collect();
        assert_eq!(picks[..2], [0, 0]);
        assert!(
            picks[2] >= 1,
            "probe on the third declined match: {picks:?}"
        );
        assert_eq!(picks[3..5], [0, 0]);
        // Without a draft model the alternative is a plain target step: a = 0.2 still wins one token at this cost?
        // E(1) = 1.2 for 1.3 c_p: no.
        assert_eq!(c.choose_ngram(8, 0), 0);
        // Observed n-gram rounds move the estimate; the draft estimate is untouched.
        for _ in 0..60 {
            c.observe_ngram(8, &[1.0; 8], 10.0);
        }
        let full = (32.0 + 2.0 * 0.2) / 34.0; // a full window of 1s, the prior 0.2 counted twice
        assert!((c.alpha_ngram() - full).abs() < 1e-12 && (c.alpha() - 0.9).abs() < 1e-12);
        assert_eq!(c.choose_ngram(8, 8), 8);
        assert_eq!(c.choose_ngram(3, 8), 3, "never more than offered");
    }

    /// Runs `rounds` rounds of choose / observe against true costs (`c_verify(n)` ms for n tokens, `c_draft` ms per
    /// pass) with every draft accepted, timings perturbed by a fixed +-`noise` ms pattern; returns the chosen Ks.
    fn simulate(
        c_verify: impl Fn(usize) -> f64,
        c_draft: f64,
        noise: f64,
        rounds: usize,
    ) -> Vec<usize> {
        let mut c = KController::new(AutoK::default()).unwrap();
        let mut ks = Vec::new();
        let mut seen = [false; 9];
        let mut draft_seen = false;
        for r in 0..rounds {
            let k = c.choose(8);
            let jitter = if r % 3 == 0 { noise } else { -noise / 2.0 };
            // The first pass of each shape but the first round's pays a one-time warm-up of 20x (CUDA kernel
            // selection and arena growth for a shape not seen before).
            let warm = |seen: &mut bool| {
                if std::mem::replace(seen, true) || r == 0 {
                    1.0
                } else {
                    20.0
                }
            };
            let t = c_verify(k + 1) * warm(&mut seen[k]) + jitter;
            let d = if k > 0 {
                k as f64 * c_draft * warm(&mut draft_seen)
            } else {
                0.0
            };
            c.set_draft_backlog(1, false);
            c.observe(k, &vec![1.0; k], d, k, t);
            ks.push(k);
        }
        ks
    }

    #[test]
    fn auto_k_reaches_long_blocks_at_full_acceptance_despite_noisy_gpu_timings() {
        // The H200 shape of the CUDA issue: t(1) = 3.25 ms, t(n) grows ~0.1 ms per token, a cheap truncated draft
        // (0.55 ms a pass), every draft accepted, timer noise of 0.3 ms. Best fixed K is k_max = 8.
        let t = |n: usize| 3.25 + 0.1 * (n as f64 - 1.0);
        let ks = simulate(t, 0.55, 0.3, 200);
        let tail = &ks[30..];
        assert!(
            tail.iter().all(|&k| k == 8),
            "auto K should settle at 8 within 30 rounds: {:?}",
            &ks[..60]
        );
        // And with a draft slower than the target (c_q = 1.2 t(1)), K = 0 wins even at full acceptance.
        let ks = simulate(t, 1.2 * 3.25, 0.3, 200);
        let drafting = ks[100..].iter().filter(|&&k| k > 0).count();
        assert!(ks[100..].contains(&0));
        assert!(
            drafting <= 100 / 16 + 1,
            "mostly K = 0 with probes: {drafting} drafting rounds"
        );
    }

    /// A controller with measured target costs: `c_verify(k)` ms for a pass over `k + 1` tokens, k = 0..=8.
    fn measured(cfg: AutoK, c_verify: impl Fn(usize) -> f64) -> KController {
        let mut c = KController::new(cfg).unwrap();
        // Twice: a shape's first timing is provisional (it may carry warm-up), the second confirms it.
        for _ in 0..2 {
            for k in 0..9 {
                c.observe(k, &[], 0.0, 0, c_verify(k));
            }
        }
        c
    }

    #[test]
    fn a_costly_draft_backlog_makes_k_zero_win_until_it_is_small() {
        // Measured costs: target 10 ms for any n, draft 1 ms per pass, catch-up 3 ms per token (int4-like).
        let mut c = measured(
            AutoK {
                prior_acceptance: 0.8,
                ..AutoK::default()
            },
            |_| 10.0,
        );
        c.observe(2, &[0.8, 0.8], 2.0, 2, 10.0);
        c.observe_catchup(1.0 + 3.0 * 99.0, 100);
        c.set_draft_backlog(1, false);
        assert!(c.choose(8) > 0, "in step: draft");
        c.set_draft_backlog(200, false);
        assert_eq!(
            c.choose(8),
            0,
            "a 200-token catch-up costs more than drafting gains"
        );
        // Many tokens left do not change the choice itself (only whether a probe may pay the catch-up).
        c.set_remaining(2000);
        assert_eq!(c.choose(8), 0);
        c.set_remaining(0);
        // The n-gram choice sees the same alternative: a mediocre match now beats catching the draft up.
        let mut g = measured(
            AutoK {
                prior_acceptance: 0.8,
                prior_acceptance_ngram: 0.5,
                ..AutoK::default()
            },
            |_| 10.0,
        );
        g.observe(2, &[0.8, 0.8], 2.0, 2, 10.0);
        g.observe_catchup(298.0, 100);
        g.set_draft_backlog(1, true);
        assert_eq!(
            g.choose_ngram(8, 8),
            0,
            "in step, the draft (a = 0.8) beats a = 0.5 matches"
        );
        g.set_draft_backlog(200, true);
        assert!(g.choose_ngram(8, 8) > 0);
    }

    #[test]
    fn observed_throughput_decides_between_ngram_and_draft() {
        // The model alone would take these matches (a_ngram 0.6, flat verify cost, no draft cost to beat)...
        let mut c = measured(
            AutoK {
                prior_acceptance: 0.6,
                prior_acceptance_ngram: 0.6,
                ..AutoK::default()
            },
            |_| 10.0,
        );
        c.observe(4, &[0.6; 4], 12.0, 4, 10.0);
        c.set_draft_backlog(1, true);
        assert!(c.choose_ngram(8, 8) > 0);
        // ...but n-gram rounds were seen to yield 1.2 tokens per 11 ms and draft rounds 3.9 per 22 ms: decline.
        c.observe_round(RoundKind::Ngram, 6, 55.0);
        c.observe_round(RoundKind::Draft, 39, 220.0);
        assert_eq!(c.choose_ngram(8, 8), 0);
        // Without a draft model the alternative is a plain step (0.1 tokens/ms): 0.11 wins.
        assert!(c.choose_ngram(8, 0) > 0);
        // Pinned costs ignore timings.
        let mut p = KController::new(AutoK {
            prior_acceptance_ngram: 0.9,
            ..pinned(1.0, 0.0)
        })
        .unwrap();
        p.observe_round(RoundKind::Ngram, 1, 1000.0);
        p.observe_round(RoundKind::Draft, 100, 1.0);
        assert_eq!(p.choose_ngram(8, 8), 8);
    }

    #[test]
    fn a_draft_priced_below_a_plain_step_does_not_decline_matches() {
        // Draft rounds were once seen at 0.18 tokens/ms, n-gram rounds at 0.11, a plain step costs 10 ms (0.1).
        let mut c = measured(
            AutoK {
                prior_acceptance: 0.6,
                prior_acceptance_ngram: 0.6,
                ..AutoK::default()
            },
            |_| 10.0,
        );
        c.observe(4, &[0.6; 4], 12.0, 4, 10.0);
        c.observe_round(RoundKind::Ngram, 6, 55.0);
        c.observe_round(RoundKind::Draft, 39, 220.0);
        c.set_draft_backlog(1, true);
        assert_eq!(
            c.choose_ngram(8, 8),
            0,
            "in step, the draft model is the better round"
        );
        // Now the draft model is far behind (3 ms per token to catch up on 500): the round instead of a match
        // would be a plain step, which the match beats.
        c.observe_catchup(300.0, 100);
        c.set_draft_backlog(500, true);
        assert_eq!(c.choose(8), 0);
        assert!(c.choose_ngram(8, 8) > 0);
    }

    #[test]
    fn probes_wait_while_the_draft_model_is_far_behind() {
        // K = 1 pays above a = 0.625 with a caught-up draft (1 + a > 1.625): at 0.55 K = 0 wins, with probes.
        let mut c = measured(
            AutoK {
                prior_acceptance: 0.55,
                probe_every: 2,
                ..AutoK::default()
            },
            |k| 10.0 * (1.0 + 0.05 * k as f64),
        );
        c.observe(1, &[0.55], 3.5, 1, 10.5);
        c.observe_catchup(3.5 + 99.0 * 2.0, 100); // 2 ms per catch-up token
        c.set_draft_backlog(10, false); // 18 ms of catch-up <= 4 target passes: probe
        assert_eq!((0..2).map(|_| c.choose(8)).filter(|&k| k > 0).count(), 1);
        c.set_draft_backlog(100, false); // 198 ms > 40 ms: no probe
        assert!((0..6).all(|_| c.choose(8) == 0));
        // 400 tokens left to generate = 4,000 ms of plain decoding: 198 ms of catch-up is under a tenth of it.
        c.set_remaining(400);
        assert_eq!((0..2).map(|_| c.choose(8)).filter(|&k| k > 0).count(), 1);
        c.set_remaining(40); // 0.1 x 40 x 10 ms = 40 ms < 198 ms: no probe
        assert!((0..6).all(|_| c.choose(8) == 0));
    }

    #[test]
    fn a_new_controller_inherits_acceptance_and_draft_cost_but_not_target_costs() {
        let mut a = measured(AutoK::default(), |k| 10.0 * (1.0 + 0.1 * k as f64));
        a.observe(4, &[1.0; 40], 8.0, 4, 14.0);
        a.observe_catchup(2.0 + 99.0 * 0.5, 100);
        let mut b = KController::new(AutoK::default()).unwrap();
        b.inherit_estimates(&a);
        assert!((b.alpha() - a.alpha()).abs() < 1e-12 && b.alpha() > 0.9);
        assert_eq!(b.c_draft, Some(2.0));
        assert_eq!(b.c_catchup, a.c_catchup);
        assert!(!b.verify_cost_known(1));
        // The inherited draft cost is provisional: the first own timing replaces it.
        b.observe(1, &[], 5.0, 1, 10.0);
        assert_eq!(b.c_draft, Some(5.0));
    }

    /// A size-4 controller: plain passes 200 ms and 3-token passes 280 ms (both confirmed), a 5-token pass timed
    /// once (provisional), draft passes 30 ms, everything accepted.
    fn larger_batch() -> KController {
        let mut big = KController::new(AutoK::default()).unwrap();
        for _ in 0..2 {
            big.observe(0, &[], 0.0, 0, 200.0);
            big.observe(2, &[1.0; 8], 60.0, 2, 280.0);
        }
        big.observe(4, &[], 0.0, 0, 400.0);
        big
    }

    #[test]
    fn a_smaller_batch_starts_from_the_larger_ones_target_costs_until_it_times_its_own() {
        let big = larger_batch();
        let mut small = KController::new(AutoK::default()).unwrap();
        small.inherit_estimates(&big);
        assert!(!small.verify_cost_known(1));
        small.inherit_target_costs(&big);
        // Confirmed costs are inherited, the provisional one is not; own timings stay empty.
        assert!(small.verify_cost_known(1) && small.verify_cost_known(3));
        assert!(!small.verify_cost_known(5));
        assert!(small.c_verify.iter().all(Option::is_none));
        assert_eq!(small.cost_verify(1), 200.0);
        assert_eq!(small.cost_verify(3), 280.0);
        assert_eq!(small.choose(4), big.clone().choose(4));
        // A first own timing is provisional (it may carry warm-up): the inherited cost still stands.
        small.observe(2, &[1.0; 2], 30.0, 2, 2000.0);
        assert_eq!(small.cost_verify(3), 280.0);
        // The second confirms this size's cost, and the inherited ones follow it: 140 / 280 = half the larger
        // size's, so its plain pass is priced at 100 ms (it is not re-timed while this size speculates).
        small.observe(2, &[1.0; 2], 30.0, 2, 140.0);
        assert_eq!(small.cost_verify(3), 140.0);
        assert!((small.cost_verify(1) - 100.0).abs() < 1e-9);
        // Pinned controllers ignore inheritance.
        let mut p = KController::new(pinned(1.0, 0.0)).unwrap();
        p.inherit_target_costs(&big);
        assert!(p.c_verify_inherited.iter().all(Option::is_none));
    }

    #[test]
    fn inherited_costs_never_price_a_pass_above_a_longer_own_one_and_let_plain_rounds_return() {
        // Size 4's costs inherited; this size really costs 60 + 10 ms per token, and its drafts are almost always
        // rejected (acceptance 0.1), so plain rounds are best. Its first drafting rounds time a pass the larger size
        // never ran (no common length to scale by): the inherited costs are capped by it, and the controller goes
        // back to plain rounds, re-times the plain pass, and stays there (probing now and then).
        let big = larger_batch();
        let mut c = KController::new(AutoK::default()).unwrap();
        c.inherit_estimates(&big);
        c.inherit_target_costs(&big);
        let mut ks = Vec::new();
        for _ in 0..100 {
            let k = c.choose(8);
            let accepted = vec![0.1_f32; k];
            c.observe(
                k,
                &accepted,
                5.0 * k as f64,
                k,
                60.0 + 10.0 * (k + 1) as f64,
            );
            ks.push(k);
            if ks.len() == 2 {
                // Two rounds of K = 8 (the 9-token pass priced at the longest inherited one): 150 ms confirmed, and
                // no shorter pass is priced above it.
                assert_eq!(ks, [8, 8]);
                assert!((1..=9).all(|n| c.cost_verify(n) <= 150.0 + 1e-9));
            }
        }
        assert!(c.confirmed(0), "the plain pass was re-timed: {ks:?}");
        assert!((c.cost_verify(1) - 70.0).abs() < 1.0);
        let plain = ks[50..].iter().filter(|&&k| k == 0).count();
        assert!(
            plain >= 40,
            "mostly plain rounds once acceptance is known: {ks:?}"
        );
    }

    #[test]
    fn a_smaller_batch_passes_inherited_costs_on() {
        // 4 -> 3 -> 2: size 2 inherits size 3's costs, which are size 4's (scaled, when size 3 has its own).
        let big = larger_batch();
        let mut three = KController::new(AutoK::default()).unwrap();
        three.inherit_target_costs(&big);
        let mut two = KController::new(AutoK::default()).unwrap();
        two.inherit_target_costs(&three);
        assert_eq!(two.cost_verify(1), 200.0);
        for _ in 0..2 {
            three.observe(2, &[1.0; 2], 30.0, 2, 210.0);
        }
        let mut two = KController::new(AutoK::default()).unwrap();
        two.inherit_target_costs(&three);
        assert_eq!(two.cost_verify(3), 210.0);
        assert!((two.cost_verify(1) - 150.0).abs() < 1e-9);
    }

    #[test]
    fn bad_settings_are_errors() {
        assert!(KController::new(AutoK {
            k_max: 0,
            ..AutoK::default()
        })
        .is_err());
        assert!(KController::new(AutoK {
            prior_acceptance: 1.0,
            ..AutoK::default()
        })
        .is_err());
        let mut p = pinned(1.0, 0.0);
        p.pinned.as_mut().unwrap().c_verify.pop();
        assert!(KController::new(p).is_err());
    }
}
