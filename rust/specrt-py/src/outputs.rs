//! Engine outputs as Python dicts (statistics, a round's tokens, a prompt's scores): the shapes the driver's events
//! carry to `specrt.Decoder`, the `Scheduler` and `specrt serve`.

use pyo3::prelude::*;
use pyo3::types::PyDict;
use specrt_core::{Stats, StepOutput};

/// The statistics of a generation as a dict (counts, rates, timings in ms, tokens/s).
pub(crate) fn stats_dict<'py>(py: Python<'py>, s: &Stats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("n_prompt_tokens", s.n_prompt_tokens)?;
    d.set_item("n_cached_tokens", s.n_cached_tokens)?;
    d.set_item("n_cached_tokens_dft", s.n_cached_tokens_dft)?;
    d.set_item("prefix_cache_hit", s.prefix_cache_hit())?;
    d.set_item("n_rounds", s.n_rounds)?;
    d.set_item("n_drafted", s.n_drafted)?;
    d.set_item("n_accepted", s.n_accepted)?;
    d.set_item("n_recovered", s.n_recovered)?;
    d.set_item("n_bonus", s.n_bonus)?;
    d.set_item("n_emitted", s.n_emitted())?;
    d.set_item("accepted_at", s.accepted_at.clone())?;
    d.set_item("n_drafted_ngram", s.n_drafted_ngram)?;
    d.set_item("n_accepted_ngram", s.n_accepted_ngram)?;
    d.set_item("n_drafted_forced", s.n_drafted_forced)?;
    d.set_item("n_accepted_forced", s.n_accepted_forced)?;
    d.set_item("mask_ms", s.mask_ms)?;
    d.set_item("rounds_by_k", s.rounds_by_k.clone())?;
    d.set_item("acceptance_rate", s.acceptance_rate())?;
    d.set_item("mean_tokens_per_round", s.mean_tokens_per_round())?;
    d.set_item("prefill_ms", s.prefill_ms)?;
    d.set_item("draft_ms", s.draft_ms)?;
    d.set_item("target_ms", s.target_ms)?;
    d.set_item("core_ms", s.core_ms)?;
    d.set_item("decode_ms", s.decode_ms())?;
    d.set_item("decode_tokens_per_s", s.decode_tokens_per_s())?;
    d.set_item("tokens_per_s", s.tokens_per_s())?;
    Ok(d)
}

/// ``{"logprobs": [float], "top_logprobs": [[(int, float)]]}`` of a prompt's scores (entry j: prompt token j + 1).
pub(crate) fn prompt_dict<'py>(
    py: Python<'py>,
    p: &specrt_core::PromptLogprobs,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("logprobs", p.logprobs.clone())?;
    d.set_item("top_logprobs", p.top_logprobs.clone())?;
    Ok(d)
}

pub(crate) fn step_dict<'py>(py: Python<'py>, out: &StepOutput) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("tokens", out.tokens.clone())?;
    d.set_item(
        "sources",
        out.sources.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
    )?;
    d.set_item("logprobs", out.logprobs.clone())?;
    d.set_item("top_logprobs", out.top_logprobs.clone())?;
    d.set_item("n_drafted", out.n_drafted)?;
    d.set_item("finish_reason", out.finish_reason.map(|r| r.as_str()))?;
    Ok(d)
}
