//! Argument conversions shared by the binding's entry points (`sample`, `sample_draft`, `process_logits`,
//! `log_softmax_at`, `verify`, `Driver`): Python keyword values -> core types, each written once with its error
//! message.

use numpy::PyReadonlyArray1;
use pyo3::prelude::*;
use specrt_core::{PenaltyContext, Rng, SamplingParams, SpecError};
use specrt_ort::{OrtOptions, Provider};

use crate::arrays::{f32_1d, token_ids};
use crate::errors::to_pyerr;
use crate::rng::PyRng;

/// How the sampling functions word the valid `top_k` range in their `ConfigError`.
pub const TOP_K_RANGE: &str = "an integer 0 <= top_k < 2**32; 0 = off";

/// The sampling keyword arguments (`temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0,
/// frequency_penalty=0.0, presence_penalty=0.0`) as Python passed them.
pub struct SamplingArgs {
    pub temperature: f64,
    pub top_k: i64,
    pub top_p: f64,
    pub min_p: f64,
    pub repetition_penalty: f64,
    pub frequency_penalty: f64,
    pub presence_penalty: f64,
}

impl SamplingArgs {
    /// The core parameters, not validated: floats narrowed to `f32`, `top_k` to `u32`.
    ///
    /// # Errors
    /// `ConfigError` "top_k {top_k} is invalid (expected {top_k_range})" for a `top_k` outside `0..2**32`.
    #[allow(clippy::cast_possible_truncation)]
    pub fn convert(&self, top_k_range: &str) -> PyResult<SamplingParams> {
        let top_k = self.top_k;
        let top_k = u32::try_from(top_k).map_err(|_| {
            to_pyerr(SpecError::setting(
                "top_k",
                format!("top_k {top_k} is invalid (expected {top_k_range})"),
            ))
        })?;
        Ok(SamplingParams {
            temperature: self.temperature as f32,
            top_k,
            top_p: self.top_p as f32,
            min_p: self.min_p as f32,
            repetition_penalty: self.repetition_penalty as f32,
            frequency_penalty: self.frequency_penalty as f32,
            presence_penalty: self.presence_penalty as f32,
            min_tokens: 0, // a request setting (RequestConfig), not one of the one-row functions'
        })
    }

    /// The core parameters, validated.
    ///
    /// # Errors
    /// `ConfigError` naming the bad value and its range.
    pub fn validate(&self) -> PyResult<SamplingParams> {
        let params = self.convert(TOP_K_RANGE)?;
        params.validate().map_err(to_pyerr)?;
        Ok(params)
    }
}

/// Borrow the `logits` argument of the one-row functions as a `[vocab] float32` C-contiguous array.
///
/// # Errors
/// `ShapeError` naming the expected dtype, shape and layout.
pub fn logits_row<'py>(logits: &Bound<'py, PyAny>) -> PyResult<PyReadonlyArray1<'py, f32>> {
    f32_1d(logits, "logits", "[vocab]", None)
}

/// A penalty context from optional prompt / output token sequences.
///
/// # Errors
/// `ShapeError` / `VocabError` for bad token inputs.
pub fn penalties_from(
    vocab: usize,
    prompt_tokens: Option<&Bound<'_, PyAny>>,
    output_tokens: Option<&Bound<'_, PyAny>>,
) -> PyResult<PenaltyContext> {
    let mut ctx = PenaltyContext::new(vocab);
    if let Some(p) = prompt_tokens {
        ctx.add_prompt(&token_ids(p, "prompt_tokens", vocab)?)
            .map_err(to_pyerr)?;
    }
    if let Some(o) = output_tokens {
        for t in token_ids(o, "output_tokens", vocab)? {
            ctx.push(t).map_err(to_pyerr)?;
        }
    }
    Ok(ctx)
}

/// The stream to use: `rng` (advanced in place), a fresh one from `seed`, or none for greedy.
///
/// # Errors
/// `ConfigError` if both are given, or neither while sampling needs random numbers.
fn resolve_rng(seed: Option<u64>, rng: Option<Rng>, needed: bool) -> PyResult<Option<Rng>> {
    match (seed, rng) {
        (Some(_), Some(_)) => Err(to_pyerr(SpecError::Config(
            "pass either seed= or rng=, not both".to_owned(),
        ))),
        (Some(s), None) => Ok(Some(Rng::seed_from_u64(s))),
        (None, Some(r)) => Ok(Some(r)),
        (None, None) if needed => Err(to_pyerr(SpecError::Config(
            "sampling needs an explicit random stream: pass seed=<int> or rng=specrt.Rng(seed) (temperature 0 needs \
             neither)"
                .to_owned(),
        ))),
        (None, None) => Ok(None),
    }
}

/// Run `f` with the call's random stream (from `seed=` or `rng=`; a fixed unused one when `params` is greedy and
/// neither is given), then write the advanced stream back into `rng`. On an error `rng` is left as it was.
///
/// # Errors
/// `ConfigError` if both `seed` and `rng` are given, or neither while `params` samples; else the error of `f`.
pub fn with_stream<T>(
    seed: Option<u64>,
    rng: Option<&Bound<'_, PyRng>>,
    params: &SamplingParams,
    f: impl FnOnce(&mut Rng) -> PyResult<T>,
) -> PyResult<T> {
    let mut stream = resolve_rng(
        seed,
        rng.map(|r| r.borrow().inner.clone()),
        !params.is_greedy(),
    )?
    .unwrap_or_else(|| Rng::seed_from_u64(0));
    let out = f(&mut stream)?;
    if let Some(r) = rng {
        r.borrow_mut().inner = stream;
    }
    Ok(out)
}

/// Prompt token ids as Python ints -> `u32` (the upper bound, the vocab size, is checked by the core).
///
/// # Errors
/// `VocabError` "prompt token {t} at position {i} is out of range (expected >= 0)".
pub fn prompt_ids(prompt: &[i64]) -> PyResult<Vec<u32>> {
    prompt
        .iter()
        .enumerate()
        .map(|(i, &t)| {
            u32::try_from(t).map_err(|_| {
                to_pyerr(SpecError::Vocab(format!(
                    "prompt token {t} at position {i} is out of range (expected >= 0)"
                )))
            })
        })
        .collect()
}

/// ONNX Runtime session options from the model constructors' keyword arguments (`provider` already parsed).
pub fn ort_options(
    ort_library: std::path::PathBuf,
    provider: Provider,
    device_id: i32,
    max_seq_len: Option<usize>,
    intra_op_threads: Option<usize>,
    allow_fallback: bool,
    cuda_graph: bool,
) -> OrtOptions {
    let mut options = OrtOptions::new(ort_library);
    options.provider = provider;
    options.device_id = device_id;
    options.max_seq_len = max_seq_len;
    options.intra_op_threads = intra_op_threads;
    options.allow_fallback = allow_fallback;
    options.cuda_graph = cuda_graph;
    options
}
