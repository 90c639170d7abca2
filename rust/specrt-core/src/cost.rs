//! The cost model of speculative decoding (`shared/seed/speculative-decoding-exercises.txt`; Leviathan et al. 2023,
//! arXiv:2211.17192, section 3).
//!
//! Terms: `a` = per-token acceptance rate of the geometric model (each draft token accepted independently with
//! probability `a`); `K` = draft tokens per round; `c_q`, `c_p` = cost of one draft / one target forward pass
//! (any unit, e.g. ms); `c_verify(K)` = cost of the target pass that verifies `K` drafts (`K + 1` positions),
//! which the simple model takes to be `c_p`.
//!
//! Note that `a` is not vLLM's "acceptance rate" (accepted / drafted): for a measured mean tokens per round, use
//! [`alpha_from_tokens_per_round`] to get the `a` the geometric model needs.
//!
//! The seed's claims, checked by the tests of this module: accept prob 1 for p/q = 3, 0.25 for q = 0.6, p = 0.15;
//! cycle cost 11 for K = 3, c_q = 1, c_p = 8; E = 2.773 for a = 0.7, K = 4; speedup 1.98x at c_q = 1, c_p = 10;
//! model A 1.647x vs model B 2.060x; E -> K + 1 as a -> 1. **One claim is off**: the seed says the speedup for
//! a = 0.7, c_q = 1, c_p = 10 "peaks around K = 5-6"; the exact integer search gives `K_opt = 4` (1.981x;
//! K = 5 gives 1.961x, K = 6 gives 1.912x).

use crate::error::{Result, SpecError};

/// Largest K the optimisers consider by default.
pub const DEFAULT_K_MAX: usize = 64;

/// Largest `k_max` [`optimal_k`] searches (the search is exact, one [`speedup`] per K; the engine drafts at most
/// 64 tokens per round anyway).
pub const MAX_K_MAX: usize = 1024;

/// Up to this K, `1 + a + ... + a^K` is summed term by term; beyond it, the closed form is used (a loop over an
/// arbitrary `usize` K would not finish).
const GEOMETRIC_LOOP_MAX: usize = 4096;

/// Acceptance probability of a proposed token: `min(1, p / q)`.
///
/// Inputs: `p` target probability in [0, 1], `q` draft probability in (0, 1] (a proposed token has `q > 0`).
/// Output: in [0, 1]. Example: `p = 0.15, q = 0.6 -> 0.25`; `p = 0.9, q = 0.3 -> 1`.
///
/// Errors: [`SpecError::Config`] if `q <= 0` or a value is outside [0, 1].
pub fn acceptance_prob(p: f64, q: f64) -> Result<f64> {
    check_unit("p", p)?;
    check_unit("q", q)?;
    if q <= 0.0 {
        return Err(SpecError::Config(format!(
            "q {q} is invalid (expected 0 < q <= 1: a proposed token has positive draft probability)"
        )));
    }
    Ok((p / q).min(1.0))
}

fn check_unit(name: &str, v: f64) -> Result<()> {
    if !(0.0..=1.0).contains(&v) {
        return Err(SpecError::Config(format!(
            "{name} {v} is invalid (expected 0 <= {name} <= 1)"
        )));
    }
    Ok(())
}

fn check_cost(name: &str, v: f64) -> Result<()> {
    if !(v.is_finite() && v >= 0.0) {
        return Err(SpecError::Config(format!(
            "{name} {v} is invalid (expected a finite cost >= 0)"
        )));
    }
    Ok(())
}

/// Expected tokens emitted per round: `E = (1 - a^(K+1)) / (1 - a) = 1 + a + ... + a^K`.
///
/// Inputs: `a` in [0, 1], `k` draft tokens. Output: in [1, K + 1] (`K + 1` exactly at `a = 1`, the limit).
/// Example: `a = 0.7, K = 4 -> 2.773`.
///
/// Errors: [`SpecError::Config`] if `a` is outside [0, 1].
pub fn expected_tokens(a: f64, k: usize) -> Result<f64> {
    check_unit("a", a)?;
    Ok(geometric_sum(a, k))
}

/// `1 + a + ... + a^k`, summed directly (exact at a = 1, no cancellation near 1) up to [`GEOMETRIC_LOOP_MAX`]
/// terms; beyond that `(1 - a^(k+1)) / (1 - a)` (or `k + 1` at `a = 1`). `a` in [0, 1].
fn geometric_sum(a: f64, k: usize) -> f64 {
    #[allow(clippy::cast_precision_loss)]
    let kf = k as f64;
    if a >= 1.0 {
        return kf + 1.0;
    }
    if k > GEOMETRIC_LOOP_MAX {
        return (1.0 - a.powf(kf + 1.0)) / (1.0 - a);
    }
    let mut s = 0.0;
    let mut term = 1.0;
    for _ in 0..=k {
        s += term;
        term *= a;
    }
    s
}

/// Cost of one round: `K c_q + c_verify`, with `c_verify = c_p` when `None`.
/// Example: `K = 3, c_q = 1, c_p = 8 -> 11`.
///
/// Errors: [`SpecError::Config`] for a negative or non-finite cost.
pub fn cycle_cost(k: usize, c_q: f64, c_p: f64, c_verify: Option<f64>) -> Result<f64> {
    check_cost("c_q", c_q)?;
    check_cost("c_p", c_p)?;
    let cv = c_verify.unwrap_or(c_p);
    check_cost("c_verify", cv)?;
    #[allow(clippy::cast_precision_loss)]
    let kf = k as f64;
    Ok(kf * c_q + cv)
}

/// Speedup over target-only decoding: `c_p E / (K c_q + c_verify)` (`c_verify = c_p` when `None`).
///
/// Output: > 0, a ratio (1 = no gain). Example: `a = 0.7, K = 4, c_q = 1, c_p = 10 -> 1.981`.
///
/// Errors: [`SpecError::Config`] for `a` outside [0, 1], a bad cost, or a zero cycle cost.
pub fn speedup(a: f64, k: usize, c_q: f64, c_p: f64, c_verify: Option<f64>) -> Result<f64> {
    let e = expected_tokens(a, k)?;
    let cost = cycle_cost(k, c_q, c_p, c_verify)?;
    if cost <= 0.0 {
        return Err(SpecError::Config(format!(
            "cycle cost {cost} is invalid (expected > 0)"
        )));
    }
    Ok(c_p * e / cost)
}

/// The best K and its speedup.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OptimalK {
    /// The K with the highest speedup (smallest such K on ties); 0 means "don't speculate".
    pub k: usize,
    /// Its speedup (1 for K = 0 when `c_verify(0) = c_p`).
    pub speedup: f64,
}

/// Exact integer search for the K in `0..=k_max` that maximises [`speedup`].
///
/// `c_verify`: cost of verifying K drafts as a function of K (e.g. a measured table); `None` = `c_p` for every K.
/// K = 0 is included, so a draft that cannot pay for itself gives `k = 0`.
/// Example: `a = 0.7, c_q = 1, c_p = 10 -> K = 4, 1.981x` (the seed's "around 5-6" is off).
///
/// Errors: as [`speedup`], for any K; [`SpecError::Config`] for `k_max > MAX_K_MAX`.
pub fn optimal_k(
    a: f64,
    c_q: f64,
    c_p: f64,
    k_max: usize,
    c_verify: Option<&dyn Fn(usize) -> f64>,
) -> Result<OptimalK> {
    check_k_max(k_max)?;
    let mut best = OptimalK {
        k: 0,
        speedup: f64::NEG_INFINITY,
    };
    for k in 0..=k_max {
        let s = speedup(a, k, c_q, c_p, c_verify.map(|f| f(k)))?;
        if s > best.speedup {
            best = OptimalK { k, speedup: s };
        }
    }
    Ok(best)
}

/// Check the search range of [`optimal_k`].
///
/// Errors: [`SpecError::Config`] for `k_max > MAX_K_MAX`.
pub fn check_k_max(k_max: usize) -> Result<()> {
    if k_max > MAX_K_MAX {
        return Err(SpecError::Config(format!(
            "k_max {k_max} is invalid (expected 0 <= k_max <= {MAX_K_MAX})"
        )));
    }
    Ok(())
}

/// One draft model in a comparison.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DraftModel {
    /// Per-token acceptance rate `a` in [0, 1].
    pub a: f64,
    /// Cost of one draft pass.
    pub c_q: f64,
}

/// Result of [`compare_drafts`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DraftComparison {
    /// Speedup with draft A.
    pub speedup_a: f64,
    /// Speedup with draft B.
    pub speedup_b: f64,
    /// True when B is strictly faster than A.
    pub b_wins: bool,
}

/// Compare two drafts at the same K and target cost.
/// Example: A (a = 0.6, c_q = 1) vs B (a = 0.85, c_q = 2), K = 4, c_p = 10 -> 1.647x vs 2.060x, B wins.
///
/// Errors: as [`speedup`].
pub fn compare_drafts(
    draft_a: DraftModel,
    draft_b: DraftModel,
    k: usize,
    c_p: f64,
    c_verify: Option<f64>,
) -> Result<DraftComparison> {
    let speedup_a = speedup(draft_a.a, k, draft_a.c_q, c_p, c_verify)?;
    let speedup_b = speedup(draft_b.a, k, draft_b.c_q, c_p, c_verify)?;
    Ok(DraftComparison {
        speedup_a,
        speedup_b,
        b_wins: speedup_b > speedup_a,
    })
}

/// The per-token `a` whose geometric model gives a measured mean tokens per round `e` at K draft tokens: solves
/// `1 + a + ... + a^K = e` by bisection (the left side is increasing in `a` on [0, 1]).
///
/// Inputs: `e` in [1, K + 1], `k >= 1`. Output: `a` in [0, 1], to ~1e-15.
/// Example: `e = 2.773, K = 4 -> a ~ 0.7`.
///
/// Errors: [`SpecError::Config`] if `k = 0` or `e` is outside [1, K + 1].
pub fn alpha_from_tokens_per_round(e: f64, k: usize) -> Result<f64> {
    if k == 0 {
        return Err(SpecError::Config(
            "k 0 is invalid (expected k >= 1: with no drafts every round emits exactly 1 token)"
                .to_owned(),
        ));
    }
    // Not `(k + 1) as f64`: k + 1 overflows for k = usize::MAX.
    #[allow(clippy::cast_precision_loss)]
    let top = k as f64 + 1.0;
    if !(1.0..=top).contains(&e) {
        return Err(SpecError::Config(format!(
            "tokens per round {e} is invalid (expected 1 <= e <= k + 1 = {top})"
        )));
    }
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if mid <= lo || mid >= hi {
            break;
        }
        if geometric_sum(mid, k) < e {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(0.5 * (lo + hi))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }

    #[test]
    fn seed_acceptance_probabilities() {
        assert_eq!(acceptance_prob(0.9, 0.3).unwrap(), 1.0);
        assert!(close(acceptance_prob(0.15, 0.6).unwrap(), 0.25, 1e-12));
        assert!(acceptance_prob(0.5, 0.0).is_err());
    }

    #[test]
    fn seed_cycle_cost() {
        assert_eq!(cycle_cost(3, 1.0, 8.0, None).unwrap(), 11.0);
        assert_eq!(cycle_cost(3, 1.0, 8.0, Some(9.5)).unwrap(), 12.5);
    }

    #[test]
    fn seed_expected_tokens_and_limit() {
        assert!(close(expected_tokens(0.7, 4).unwrap(), 2.773_1, 1e-4));
        assert_eq!(expected_tokens(1.0, 4).unwrap(), 5.0);
        assert!(close(expected_tokens(1.0 - 1e-12, 4).unwrap(), 5.0, 1e-9));
        assert_eq!(expected_tokens(0.0, 4).unwrap(), 1.0);
    }

    #[test]
    fn seed_speedup() {
        assert!(close(speedup(0.7, 4, 1.0, 10.0, None).unwrap(), 1.98, 5e-3));
        // c_verify(4) = 1.2 c_p (bandwidth-bound target): 10 * 2.7731 / (4 + 12).
        assert!(close(
            speedup(0.7, 4, 1.0, 10.0, Some(12.0)).unwrap(),
            1.733,
            1e-3
        ));
    }

    #[test]
    fn seed_model_a_vs_b() {
        let c = compare_drafts(
            DraftModel { a: 0.6, c_q: 1.0 },
            DraftModel { a: 0.85, c_q: 2.0 },
            4,
            10.0,
            None,
        )
        .unwrap();
        assert!(close(c.speedup_a, 1.647, 5e-4), "{}", c.speedup_a);
        assert!(close(c.speedup_b, 2.060, 5e-4), "{}", c.speedup_b);
        assert!(c.b_wins);
    }

    #[test]
    fn optimal_k_for_seed_example_is_4_not_5_or_6() {
        // Speedups: K=3 1.948, K=4 1.981, K=5 1.961, K=6 1.912. The seed's "peaks around K = 5-6" is off.
        let best = optimal_k(0.7, 1.0, 10.0, DEFAULT_K_MAX, None).unwrap();
        assert_eq!(best.k, 4);
        assert!(close(best.speedup, 1.981, 5e-4));
        assert!(speedup(0.7, 5, 1.0, 10.0, None).unwrap() < best.speedup);
    }

    #[test]
    fn optimal_k_can_choose_no_speculation() {
        // Compute-bound verify: c_verify(K) = c_p (1 + K).
        let cv = |k: usize| 10.0 * (1.0 + k as f64);
        let best = optimal_k(0.5, 3.0, 10.0, 16, Some(&cv)).unwrap();
        assert_eq!(best.k, 0);
        assert_eq!(best.speedup, 1.0);
    }

    #[test]
    fn alpha_round_trips_through_expected_tokens() {
        for &a in &[0.0, 0.1, 0.5, 0.7, 0.87, 0.99, 1.0] {
            for k in [1, 4, 8] {
                let e = expected_tokens(a, k).unwrap();
                let back = alpha_from_tokens_per_round(e, k).unwrap();
                assert!(close(back, a, 1e-9), "a {a} k {k} -> {back}");
            }
        }
        assert!(alpha_from_tokens_per_round(6.0, 4).is_err());
        assert!(alpha_from_tokens_per_round(0.5, 4).is_err());
    }
}
