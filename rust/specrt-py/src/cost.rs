//! Python wrappers of the cost model `specrt_core::cost`. Convert, call the core, convert back.

use pyo3::prelude::*;
use specrt_core::cost;
use specrt_core::SpecError;

use crate::errors::to_pyerr;

/// The best K and its speedup (K = 0 means "don't speculate").
#[pyclass(module = "specrt._specrt", name = "OptimalK", frozen, get_all)]
pub struct PyOptimalK {
    /// Best number of draft tokens.
    k: usize,
    /// Its speedup over target-only decoding.
    speedup: f64,
}

#[pymethods]
impl PyOptimalK {
    fn __repr__(&self) -> String {
        format!("OptimalK(k={}, speedup={:.4})", self.k, self.speedup)
    }
}

/// Speedups of two drafts at the same K.
#[pyclass(module = "specrt._specrt", name = "DraftComparison", frozen, get_all)]
pub struct PyDraftComparison {
    /// Speedup with draft A.
    speedup_a: f64,
    /// Speedup with draft B.
    speedup_b: f64,
    /// True when B is strictly faster.
    b_wins: bool,
}

#[pymethods]
impl PyDraftComparison {
    fn __repr__(&self) -> String {
        format!(
            "DraftComparison(speedup_a={:.4}, speedup_b={:.4}, b_wins={})",
            self.speedup_a,
            self.speedup_b,
            if self.b_wins { "True" } else { "False" }
        )
    }
}

/// Acceptance probability `min(1, p / q)` of a proposed token.
///
/// Args:
///     p: target probability in [0, 1].
///     q: draft probability in (0, 1].
///
/// Returns:
///     float in [0, 1].
///
/// Raises:
///     ConfigError: a value out of range.
#[pyfunction]
#[pyo3(text_signature = "(p, q)")]
pub fn acceptance_prob(p: f64, q: f64) -> PyResult<f64> {
    cost::acceptance_prob(p, q).map_err(to_pyerr)
}

/// Expected tokens per round `(1 - a**(k+1)) / (1 - a)` (k + 1 at a = 1).
///
/// Args:
///     a: per-token acceptance rate in [0, 1].
///     k: draft tokens per round.
///
/// Returns:
///     float in [1, k + 1].
///
/// Raises:
///     ConfigError: `a` out of range.
#[pyfunction]
#[pyo3(text_signature = "(a, k)")]
pub fn expected_tokens(a: f64, k: usize) -> PyResult<f64> {
    cost::expected_tokens(a, k).map_err(to_pyerr)
}

/// Cost of one round `k * c_q + c_verify` (`c_verify` defaults to `c_p`).
///
/// Raises:
///     ConfigError: a negative or non-finite cost.
#[pyfunction]
#[pyo3(signature = (k, c_q, c_p, c_verify=None))]
pub fn cycle_cost(k: usize, c_q: f64, c_p: f64, c_verify: Option<f64>) -> PyResult<f64> {
    cost::cycle_cost(k, c_q, c_p, c_verify).map_err(to_pyerr)
}

/// Speedup over target-only decoding `c_p * E / (k * c_q + c_verify)` (`c_verify` defaults to `c_p`).
///
/// Raises:
///     ConfigError: a value out of range.
#[pyfunction]
#[pyo3(signature = (a, k, c_q, c_p, c_verify=None))]
pub fn speedup(a: f64, k: usize, c_q: f64, c_p: f64, c_verify: Option<f64>) -> PyResult<f64> {
    cost::speedup(a, k, c_q, c_p, c_verify).map_err(to_pyerr)
}

const _: () = assert!(
    cost::DEFAULT_K_MAX == 64,
    "update optimal_k's text_signature and _specrt.pyi"
);

/// Exact integer search for the K in 0..=k_max maximising the speedup.
///
/// Args:
///     a, c_q, c_p: as `speedup`.
///     k_max: largest K considered (default 64).
///     c_verify: cost of verifying K drafts: a callable `K -> float` or a sequence indexed by K (length > k_max);
///         None = c_p for every K.
///
/// Returns:
///     OptimalK (smallest K on ties; K = 0 = no speculation).
///
/// Raises:
///     ConfigError: a value out of range or a too short c_verify table.
#[pyfunction]
// The text signature spells the default out (pyo3 shows a non-literal default as `...`); the assertion above keeps
// it equal to the constant.
#[pyo3(
    signature = (a, c_q, c_p, *, k_max=cost::DEFAULT_K_MAX, c_verify=None),
    text_signature = "(a, c_q, c_p, *, k_max=64, c_verify=None)"
)]
pub fn optimal_k(
    a: f64,
    c_q: f64,
    c_p: f64,
    k_max: usize,
    c_verify: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyOptimalK> {
    // Before calling `c_verify` k_max + 1 times.
    cost::check_k_max(k_max).map_err(to_pyerr)?;
    let table: Option<Vec<f64>> = match c_verify {
        None => None,
        Some(f) if f.is_callable() => Some(
            (0..=k_max)
                .map(|k| f.call1((k,))?.extract::<f64>())
                .collect::<PyResult<_>>()?,
        ),
        Some(seq) => {
            let t: Vec<f64> = seq.extract().map_err(|_| {
                to_pyerr(SpecError::Config(
                    "c_verify must be a callable K -> float or a sequence of floats indexed by K"
                        .to_owned(),
                ))
            })?;
            if t.len() <= k_max {
                return Err(to_pyerr(SpecError::Config(format!(
                    "c_verify table has {} entries, expected k_max + 1 = {} (one per K in 0..=k_max)",
                    t.len(),
                    k_max + 1
                ))));
            }
            Some(t)
        }
    };
    let f = table.map(|t| move |k: usize| t[k]);
    let best = cost::optimal_k(
        a,
        c_q,
        c_p,
        k_max,
        f.as_ref().map(|f| f as &dyn Fn(usize) -> f64),
    )
    .map_err(to_pyerr)?;
    Ok(PyOptimalK {
        k: best.k,
        speedup: best.speedup,
    })
}

/// Compare two drafts (A: `a_a`, `c_q_a`; B: `a_b`, `c_q_b`) at the same K and target cost.
///
/// Raises:
///     ConfigError: a value out of range.
#[pyfunction]
#[pyo3(signature = (a_a, c_q_a, a_b, c_q_b, *, k, c_p, c_verify=None))]
pub fn compare_drafts(
    a_a: f64,
    c_q_a: f64,
    a_b: f64,
    c_q_b: f64,
    k: usize,
    c_p: f64,
    c_verify: Option<f64>,
) -> PyResult<PyDraftComparison> {
    let c = cost::compare_drafts(
        cost::DraftModel { a: a_a, c_q: c_q_a },
        cost::DraftModel { a: a_b, c_q: c_q_b },
        k,
        c_p,
        c_verify,
    )
    .map_err(to_pyerr)?;
    Ok(PyDraftComparison {
        speedup_a: c.speedup_a,
        speedup_b: c.speedup_b,
        b_wins: c.b_wins,
    })
}

/// The per-token `a` of the geometric model that gives a measured mean tokens per round (bisection).
///
/// Args:
///     tokens_per_round: measured mean emitted tokens per round, in [1, k + 1].
///     k: draft tokens per round, >= 1.
///
/// Returns:
///     float in [0, 1].
///
/// Raises:
///     ConfigError: out of range.
#[pyfunction]
#[pyo3(text_signature = "(tokens_per_round, k)")]
pub fn alpha_from_tokens_per_round(tokens_per_round: f64, k: usize) -> PyResult<f64> {
    cost::alpha_from_tokens_per_round(tokens_per_round, k).map_err(to_pyerr)
}

/// Register this file's classes and functions.
///
/// # Errors
/// If registration fails.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyOptimalK>()?;
    m.add_class::<PyDraftComparison>()?;
    m.add_function(wrap_pyfunction!(acceptance_prob, m)?)?;
    m.add_function(wrap_pyfunction!(expected_tokens, m)?)?;
    m.add_function(wrap_pyfunction!(cycle_cost, m)?)?;
    m.add_function(wrap_pyfunction!(speedup, m)?)?;
    m.add_function(wrap_pyfunction!(optimal_k, m)?)?;
    m.add_function(wrap_pyfunction!(compare_drafts, m)?)?;
    m.add_function(wrap_pyfunction!(alpha_from_tokens_per_round, m)?)?;
    Ok(())
}
