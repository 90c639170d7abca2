//! Python wrappers of `specrt_core::sampling`: `sample`, `sample_draft`, `process_logits`, `log_softmax_at`.
//! Convert, call the core, convert back.

use numpy::PyArray1;
use pyo3::prelude::*;
use specrt_core::{Sampler, SpecError};

use crate::args::{logits_row, penalties_from, with_stream, SamplingArgs};
use crate::arrays::as_slice;
use crate::errors::{run_kernel, to_pyerr};
use crate::rng::PyRng;

/// Sample one token from a row of logits (a target-only step).
///
/// Args:
///     logits: `[vocab] float32` raw logits, C-contiguous.
///     temperature, top_k, top_p, min_p, repetition_penalty, frequency_penalty, presence_penalty: see
///         `specrt.SamplingParams` docs in `_specrt.pyi`; temperature 0 = greedy.
///     prompt_tokens, output_tokens: seen tokens for the penalties.
///     seed / rng: the random stream (exactly one unless greedy); `rng` is advanced.
///
/// Returns:
///     The token id.
///
/// Raises:
///     ShapeError, ConfigError, VocabError, NonFiniteLogitsError (row 0, with the token id).
#[pyfunction]
#[pyo3(signature = (logits, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0,
    frequency_penalty=0.0, presence_penalty=0.0, prompt_tokens=None, output_tokens=None, seed=None, rng=None))]
#[allow(clippy::too_many_arguments)]
pub fn sample(
    py: Python<'_>,
    logits: &Bound<'_, PyAny>,
    temperature: f64,
    top_k: i64,
    top_p: f64,
    min_p: f64,
    repetition_penalty: f64,
    frequency_penalty: f64,
    presence_penalty: f64,
    prompt_tokens: Option<&Bound<'_, PyAny>>,
    output_tokens: Option<&Bound<'_, PyAny>>,
    seed: Option<u64>,
    rng: Option<Bound<'_, PyRng>>,
) -> PyResult<u32> {
    let params = SamplingArgs {
        temperature,
        top_k,
        top_p,
        min_p,
        repetition_penalty,
        frequency_penalty,
        presence_penalty,
    }
    .validate()?;
    let arr = logits_row(logits)?;
    let row = as_slice(&arr)?;
    let ctx = penalties_from(row.len(), prompt_tokens, output_tokens)?;
    with_stream(seed, rng.as_ref(), &params, |stream| {
        run_kernel(py, || {
            let mut s = Sampler::new(row.len());
            s.sample(row, &params, Some(&ctx), stream)
        })
    })
}

/// The draft's step: process a row, return the token and the exact distribution it was drawn from (the `q` row
/// for `verify`).
///
/// Args:
///     logits: `[vocab] float32` raw draft logits. Other arguments as `sample`.
///
/// Returns:
///     `(token, probs)`: the token id and `[vocab] float32` probabilities (sum ~1; a one-hot row when greedy).
///
/// Raises:
///     ShapeError, ConfigError, VocabError, NonFiniteLogitsError.
#[pyfunction]
#[pyo3(signature = (logits, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0,
    frequency_penalty=0.0, presence_penalty=0.0, prompt_tokens=None, output_tokens=None, seed=None, rng=None))]
#[allow(clippy::too_many_arguments)]
pub fn sample_draft<'py>(
    py: Python<'py>,
    logits: &Bound<'py, PyAny>,
    temperature: f64,
    top_k: i64,
    top_p: f64,
    min_p: f64,
    repetition_penalty: f64,
    frequency_penalty: f64,
    presence_penalty: f64,
    prompt_tokens: Option<&Bound<'py, PyAny>>,
    output_tokens: Option<&Bound<'py, PyAny>>,
    seed: Option<u64>,
    rng: Option<Bound<'py, PyRng>>,
) -> PyResult<(u32, Bound<'py, PyArray1<f32>>)> {
    let params = SamplingArgs {
        temperature,
        top_k,
        top_p,
        min_p,
        repetition_penalty,
        frequency_penalty,
        presence_penalty,
    }
    .validate()?;
    let arr = logits_row(logits)?;
    let row = as_slice(&arr)?;
    let ctx = penalties_from(row.len(), prompt_tokens, output_tokens)?;
    let (tok, probs) = with_stream(seed, rng.as_ref(), &params, |stream| {
        run_kernel(py, || {
            let mut s = Sampler::new(row.len());
            let mut probs = vec![0f32; row.len()];
            let t = s.sample_draft(row, &params, Some(&ctx), stream, &mut probs)?;
            Ok((t, probs))
        })
    })?;
    Ok((tok, PyArray1::from_vec(py, probs)))
}

/// The processed distribution of a row (penalties, temperature, top-k, top-p, min-p), without sampling.
///
/// Args:
///     logits: `[vocab] float32` raw logits. Other arguments as `sample` (no random stream).
///
/// Returns:
///     `[vocab] float32` probabilities summing to ~1 (one-hot at the argmax when temperature is 0).
///
/// Raises:
///     ShapeError, ConfigError, VocabError, NonFiniteLogitsError.
#[pyfunction]
#[pyo3(signature = (logits, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0,
    frequency_penalty=0.0, presence_penalty=0.0, prompt_tokens=None, output_tokens=None))]
#[allow(clippy::too_many_arguments)]
pub fn process_logits<'py>(
    py: Python<'py>,
    logits: &Bound<'py, PyAny>,
    temperature: f64,
    top_k: i64,
    top_p: f64,
    min_p: f64,
    repetition_penalty: f64,
    frequency_penalty: f64,
    presence_penalty: f64,
    prompt_tokens: Option<&Bound<'py, PyAny>>,
    output_tokens: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyArray1<f32>>> {
    let params = SamplingArgs {
        temperature,
        top_k,
        top_p,
        min_p,
        repetition_penalty,
        frequency_penalty,
        presence_penalty,
    }
    .validate()?;
    let arr = logits_row(logits)?;
    let row = as_slice(&arr)?;
    let ctx = penalties_from(row.len(), prompt_tokens, output_tokens)?;
    let probs = run_kernel(py, || {
        let mut s = Sampler::new(row.len());
        s.process(row, 0, &params, Some(&ctx))?;
        let mut probs = vec![0f32; row.len()];
        s.write_probs(&mut probs)?;
        Ok(probs)
    })?;
    Ok(PyArray1::from_vec(py, probs))
}

/// Log-softmax of a raw row at one token (temperature 1, no penalties): the log-probability the target assigns.
///
/// Args:
///     logits: `[vocab] float32` raw logits.
///     token: token id in [0, vocab).
///
/// Returns:
///     float in (-inf, 0].
///
/// Raises:
///     ShapeError, VocabError, NonFiniteLogitsError.
#[pyfunction]
#[pyo3(text_signature = "(logits, token)")]
pub fn log_softmax_at(py: Python<'_>, logits: &Bound<'_, PyAny>, token: i64) -> PyResult<f32> {
    let arr = logits_row(logits)?;
    let row = as_slice(&arr)?;
    let Ok(t) = u32::try_from(token) else {
        return Err(to_pyerr(SpecError::Vocab(format!(
            "token id {token} is out of range (expected 0 <= id < vocab size {})",
            row.len()
        ))));
    };
    run_kernel(py, || specrt_core::sampling::log_softmax_at(row, t, 0))
}

/// Register this file's classes and functions.
///
/// # Errors
/// If registration fails.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyRng>()?;
    m.add_function(wrap_pyfunction!(sample, m)?)?;
    m.add_function(wrap_pyfunction!(sample_draft, m)?)?;
    m.add_function(wrap_pyfunction!(process_logits, m)?)?;
    m.add_function(wrap_pyfunction!(log_softmax_at, m)?)?;
    Ok(())
}
