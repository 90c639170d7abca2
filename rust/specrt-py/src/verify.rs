//! Python wrapper of `specrt_core::verify`: `verify(...) -> Verification`. Convert, call the core, convert back.

use pyo3::prelude::*;
use specrt_core::{LastToken, Sampler, SpecError, Verification, VerifyMode};

use crate::args::{penalties_from, with_stream, SamplingArgs};
use crate::arrays::{as_slice, f32_2d, token_ids};
use crate::errors::{run_kernel, to_pyerr};
use crate::rng::PyRng;

/// The result of one verification round. Output tokens = accepted + one recovered or bonus token.
#[pyclass(module = "specrt._specrt", name = "Verification", frozen, get_all)]
pub struct PyVerification {
    /// Number of draft tokens proposed (k).
    n_draft: usize,
    /// Number of draft tokens accepted, 0..=k.
    n_accepted: usize,
    /// Emitted token ids (`n_accepted + 1`): accepted drafts, then the recovered or bonus token.
    tokens: Vec<u32>,
    /// `"recovered"` or `"bonus"`: what the last token is.
    last: &'static str,
    /// Acceptance probabilities `min(1, p/q)` of the evaluated draft positions.
    accept_probs: Vec<f32>,
}

#[pymethods]
impl PyVerification {
    fn __repr__(&self) -> String {
        format!(
            "Verification(n_draft={}, n_accepted={}, tokens={:?}, last={:?})",
            self.n_draft, self.n_accepted, self.tokens, self.last
        )
    }
}

impl From<Verification> for PyVerification {
    fn from(v: Verification) -> Self {
        Self {
            n_draft: v.n_draft,
            n_accepted: v.n_accepted,
            tokens: v.tokens,
            last: match v.last {
                LastToken::Recovered => "recovered",
                LastToken::Bonus => "bonus",
            },
            accept_probs: v.accept_probs,
        }
    }
}

fn parse_mode(mode: &str) -> PyResult<VerifyMode> {
    match mode {
        "stochastic" => Ok(VerifyMode::Stochastic),
        "greedy" => Ok(VerifyMode::Greedy),
        "deterministic" => Ok(VerifyMode::Deterministic),
        other => Err(to_pyerr(SpecError::Config(format!(
            "mode {other:?} is invalid (expected one of: \"stochastic\", \"greedy\", \"deterministic\")"
        )))),
    }
}

/// One verification round of speculative sampling (Leviathan et al. 2023, arXiv:2211.17192; Chen et al. 2023,
/// arXiv:2302.01318).
///
/// Args:
///     target_logits: `[k + 1, vocab] float32` raw target logits, C-contiguous; row i scores the token after
///         d_1..d_i.
///     draft_probs: `[k, vocab] float32`, row i the exact distribution d_{i+1} was drawn from (as returned by
///         `sample_draft`). Read only in mode "stochastic"; may be None otherwise.
///     draft_tokens: `[k]` ids (int array or list), 0 <= k <= 64.
///     temperature, top_k, top_p, min_p, repetition_penalty, frequency_penalty, presence_penalty: as `sample`,
///         applied to every target row.
///     prompt_tokens, output_tokens: committed tokens for the penalties (row i also counts d_1..d_i).
///     seed / rng: the random stream (exactly one unless temperature is 0); `rng` is advanced.
///     mode: "stochastic" (draft model), "deterministic" (point-mass drafts, e.g. n-gram) or "greedy"
///         (needs temperature 0). Temperature 0 always verifies greedily.
///
/// Returns:
///     Verification.
///
/// Raises:
///     ShapeError (dtype / shape / layout), ConfigError (bad parameter, k > 64, a draft token with q = 0),
///     VocabError (token id >= vocab), NonFiniteLogitsError (NaN / inf in an evaluated target row; `.row`, `.token`).
#[pyfunction]
#[pyo3(signature = (target_logits, draft_probs, draft_tokens, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0,
    repetition_penalty=1.0, frequency_penalty=0.0, presence_penalty=0.0, prompt_tokens=None, output_tokens=None,
    seed=None, rng=None, mode="stochastic"))]
#[allow(clippy::too_many_arguments)]
pub fn verify(
    py: Python<'_>,
    target_logits: &Bound<'_, PyAny>,
    draft_probs: Option<&Bound<'_, PyAny>>,
    draft_tokens: &Bound<'_, PyAny>,
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
    mode: &str,
) -> PyResult<PyVerification> {
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
    let mode = parse_mode(mode)?;
    let tgt = f32_2d(target_logits, "target_logits", "[k + 1, vocab]", None, None)?;
    let vocab = tgt.as_array().shape()[1];
    let tokens = token_ids(draft_tokens, "draft_tokens", vocab)?;
    let k = tokens.len();
    specrt_core::check_draft_count(k).map_err(to_pyerr)?;
    let tgt = f32_2d(
        target_logits,
        "target_logits",
        "[k + 1, vocab]",
        Some(k + 1),
        Some(vocab),
    )?;
    let dft = match (mode.effective(&params), draft_probs) {
        (VerifyMode::Stochastic, None) if k > 0 => {
            return Err(to_pyerr(SpecError::Config(
                "mode \"stochastic\" needs draft_probs ([k, vocab] float32)".to_owned(),
            )))
        }
        (VerifyMode::Stochastic, Some(d)) => Some(f32_2d(
            d,
            "draft_probs",
            "[k, vocab]",
            Some(k),
            Some(vocab),
        )?),
        (_, _) => None,
    };
    let logits = as_slice(&tgt)?;
    let probs: &[f32] = match &dft {
        Some(d) => as_slice(d)?,
        None => &[],
    };
    let mut ctx = penalties_from(vocab, prompt_tokens, output_tokens)?;
    let v = with_stream(seed, rng.as_ref(), &params, |stream| {
        run_kernel(py, || {
            let mut s = Sampler::new(vocab);
            specrt_core::verify(
                &mut s, logits, probs, &tokens, &params, mode, &mut ctx, stream,
            )
        })
    })?;
    Ok(v.into())
}

/// Register this file's classes and functions.
///
/// # Errors
/// If registration fails.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyVerification>()?;
    m.add_function(wrap_pyfunction!(verify, m)?)?;
    m.add("MAX_DRAFT_TOKENS", specrt_core::MAX_DRAFT_TOKENS)?;
    Ok(())
}
