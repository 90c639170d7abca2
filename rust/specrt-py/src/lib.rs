//! `specrt._specrt`: the Python extension module. Converts and registers, nothing more.
use pyo3::prelude::*;

mod args;
pub mod arrays;
mod chat;
mod constraint;
mod cost;
mod coupled;
mod driver;
pub mod errors;
mod options;
mod ort_model;
mod outputs;
mod prepared;
mod quant;
mod request_config;
mod rng;
mod runtime;
mod sampling;
mod text;
mod verify;

/// The extension module.
#[pymodule]
fn _specrt(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    errors::register(m)?;
    sampling::register(m)?;
    verify::register(m)?;
    cost::register(m)?;
    runtime::register(m)?;
    coupled::register(m)?;
    quant::register(m)?;
    m.add_class::<ort_model::PyOrtModel>()?;
    m.add_class::<constraint::PyConstraintMasks>()?;
    m.add_class::<driver::PyDriver>()?;
    m.add_class::<request_config::RequestConfig>()?;
    m.add_class::<prepared::PyPreparedRequest>()?;
    m.add_class::<request_config::PyFolderDefaults>()?;
    m.add_function(wrap_pyfunction!(options::check_decoder_options, m)?)?;
    m.add_function(wrap_pyfunction!(request_config::resolve_request, m)?)?;
    m.add_function(wrap_pyfunction!(request_config::request_defaults, m)?)?;
    m.add_function(wrap_pyfunction!(request_config::check_token_ids, m)?)?;
    m.add("DEFAULT_MAX_SEQ_LEN", specrt_ort::DEFAULT_MAX_SEQ_LEN)?;
    // Limits the server's request schema and the CLI read (one definition: the constants the Rust validators use).
    m.add("MAX_TOP_LOGPROBS", specrt_core::MAX_TOP_LOGPROBS)?;
    m.add("AUTO_K_MAX", specrt_ort::AUTO_K_MAX)?;
    m.add("MAX_BATCH", specrt_ort::MAX_BATCH)?;
    m.add(
        "PROPOSERS",
        specrt_ort::Proposer::ALL
            .iter()
            .map(|p| p.as_str())
            .collect::<Vec<_>>(),
    )?;
    m.add(
        "DEFAULT_PREFIX_CACHING",
        specrt_core::DEFAULT_PREFIX_CACHING,
    )?;
    m.add(
        "DEFAULT_MAX_PREFILL_TOKENS",
        specrt_core::DEFAULT_MAX_PREFILL_TOKENS,
    )?;
    m.add(
        "DEFAULT_PREFIX_CACHE_BYTES",
        specrt_core::DEFAULT_PREFIX_CACHE_BYTES,
    )?;
    m.add_class::<text::PyTokenizer>()?;
    m.add_class::<text::PyEncoding>()?;
    m.add_class::<text::PyTextAssembler>()?;
    m.add_class::<text::PyTextDelta>()?;
    m.add_class::<chat::PyChatTemplate>()?;
    Ok(())
}
