//! `check_decoder_options`: a `Decoder`'s own options (Python values -> `specrt_ort::DecoderOptions`, each wrong
//! type a `ConfigError` naming the option), checked by the one Rust definition before any model is pulled.

use pyo3::prelude::*;
use specrt_core::SpecError;
use specrt_ort::{DecoderOptions, Provider};

use crate::errors::to_pyerr;
use crate::request_config::{as_int, boolean, invalid};

/// An int option (`None` passes through when `optional`); a non-int is a `ConfigError` naming it and `expected`.
fn int_option(name: &str, value: &Bound<'_, PyAny>, expected: &str) -> PyResult<i64> {
    let v = as_int(value).ok_or_else(|| invalid(name, value, expected))?;
    // Beyond i64: saturate, the range check then names the value as given.
    Ok(i64::try_from(v).unwrap_or(if v < 0 { i64::MIN } else { i64::MAX }))
}

fn opt_int_option(name: &str, value: &Bound<'_, PyAny>, expected: &str) -> PyResult<Option<i64>> {
    if value.is_none() {
        return Ok(None);
    }
    int_option(name, value, expected).map(Some)
}

/// Check a Decoder's options and return the attention layout its models need (``"gqa"``, ``"gqa-graph"`` or
/// ``"batched"``: ``specrt convert --attention``).
///
/// Raises:
///     ConfigError: an option of the wrong type or out of range (named, with its allowed values); ``cuda_graph``
///         without provider ``"cuda"`` or with ``max_batch`` > 1; an unknown provider; a ``prefix_caching`` that is
///         not a bool.
#[pyfunction]
#[pyo3(signature = (
    *, provider, device_id, max_seq_len, intra_op_threads, allow_fallback, cuda_graph, max_batch, prefill_chunk,
    prefix_caching=None, max_prefill_tokens=None, suffix_cache_tokens=None
))]
#[allow(clippy::too_many_arguments)]
pub fn check_decoder_options(
    provider: &Bound<'_, PyAny>,
    device_id: &Bound<'_, PyAny>,
    max_seq_len: &Bound<'_, PyAny>,
    intra_op_threads: &Bound<'_, PyAny>,
    allow_fallback: &Bound<'_, PyAny>,
    cuda_graph: &Bound<'_, PyAny>,
    max_batch: &Bound<'_, PyAny>,
    prefill_chunk: &Bound<'_, PyAny>,
    prefix_caching: Option<&Bound<'_, PyAny>>,
    max_prefill_tokens: Option<&Bound<'_, PyAny>>,
    suffix_cache_tokens: Option<&Bound<'_, PyAny>>,
) -> PyResult<&'static str> {
    let options = DecoderOptions {
        provider: match provider.extract::<String>() {
            Ok(p) => p.parse::<Provider>().map_err(to_pyerr)?,
            Err(_) => return Err(invalid("provider", provider, "one of: 'cpu', 'cuda'")),
        },
        intra_op_threads: opt_int_option(
            "intra_op_threads",
            intra_op_threads,
            DecoderOptions::INTRA_OP_THREADS,
        )?,
        max_seq_len: opt_int_option("max_seq_len", max_seq_len, DecoderOptions::MAX_SEQ_LEN)?,
        device_id: int_option("device_id", device_id, DecoderOptions::DEVICE_ID)?,
        cuda_graph: boolean("cuda_graph", cuda_graph)?,
        max_batch: int_option("max_batch", max_batch, &specrt_ort::max_batch_expected())?,
        prefill_chunk: int_option(
            "prefill_chunk",
            prefill_chunk,
            DecoderOptions::PREFILL_CHUNK,
        )?,
        max_prefill_tokens: match max_prefill_tokens {
            Some(v) => opt_int_option(
                "max_prefill_tokens",
                v,
                specrt_core::BatchOptions::MAX_PREFILL_TOKENS,
            )?,
            None => None,
        },
        suffix_cache_tokens: match suffix_cache_tokens {
            Some(v) => int_option(
                "suffix_cache_tokens",
                v,
                &specrt_core::suffix_cache_tokens_expected(),
            )?,
            None => 0,
        },
    };
    boolean("allow_fallback", allow_fallback)?;
    if let Some(v) = prefix_caching {
        boolean("prefix_caching", v)?;
    }
    options
        .check()
        .map(specrt_ort::Attention::as_str)
        .map_err(|e: SpecError| to_pyerr(e))
}
