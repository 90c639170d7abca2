//! Coupled sampling kernels (wrap `specrt_core::coupled`), for tests against the NumPy twin and for diagnostics.
//! Converts and forwards, nothing more.

use numpy::PyArray1;
use pyo3::prelude::*;
use specrt_core::coupled::{choose, CoupledNoise};
use specrt_core::SpecError;

use crate::arrays::{as_slice, f32_1d};
use crate::errors::to_pyerr;

/// The coupled noise ``u_{position, i}`` of ``seed`` for token ids ``0 .. vocab``.
///
/// Args:
///     seed: the request seed (int, 0 .. 2**64 - 1).
///     position: 0-based index of the output token in the whole sequence (prompt included).
///     vocab: number of token ids.
///
/// Returns:
///     ``[vocab] float64`` uniforms in (0, 1] (SplitMix64 at counter ``(position << 32) | i``).
#[pyfunction]
#[pyo3(text_signature = "(seed, position, vocab)")]
fn coupled_uniforms(
    py: Python<'_>,
    seed: u64,
    position: u64,
    vocab: u32,
) -> Bound<'_, PyArray1<f64>> {
    let noise = CoupledNoise::new(seed);
    let u: Vec<f64> = (0..vocab).map(|i| noise.uniform(position, i)).collect();
    PyArray1::from_vec(py, u)
}

/// The coupled choice from a row of weights: ``argmin_i -ln(u_i) / w_i`` over ``w_i > 0`` (an exponential race,
/// the Gumbel-max trick), an exact sample of ``w / sum(w)`` whose randomness depends on ``(seed, position)`` alone.
///
/// Args:
///     weights: ``[vocab] float32`` non-negative weights (probabilities or unnormalised).
///     seed, position: as for ``coupled_uniforms``.
///
/// Returns:
///     The chosen token id (int).
///
/// Raises:
///     ShapeError: ``weights`` is not a 1-D float32 array. ConfigError: no positive weight.
#[pyfunction]
#[pyo3(text_signature = "(weights, seed, position)")]
fn coupled_choice(weights: &Bound<'_, PyAny>, seed: u64, position: u64) -> PyResult<u32> {
    let arr = f32_1d(weights, "weights", "[vocab] float32", None)?;
    let w = as_slice(&arr)?;
    if let Some((i, &x)) = w
        .iter()
        .enumerate()
        .find(|(_, &x)| !(x >= 0.0 && x.is_finite()))
    {
        return Err(to_pyerr(SpecError::Config(format!(
            "weights[{i}] = {x} is invalid (expected finite and >= 0)"
        ))));
    }
    choose(&CoupledNoise::new(seed), position, w).ok_or_else(|| {
        to_pyerr(SpecError::Config(
            "weights has no positive entry (expected at least one weight > 0)".to_owned(),
        ))
    })
}

/// Register the functions of this module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(coupled_uniforms, m)?)?;
    m.add_function(wrap_pyfunction!(coupled_choice, m)?)
}
