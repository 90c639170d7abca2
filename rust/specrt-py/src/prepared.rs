//! `PreparedRequest`: a request resolved and checked once, at submission (`Driver.prepare`), queued as it is
//! (`Driver.submit`).

use pyo3::prelude::*;
use specrt_ort::PreparedRequest;

use crate::request_config::RequestConfig;

/// One generation request, resolved and checked against the driver that made it (``Driver.prepare``): its
/// prompt ids, the engine's settings, its stop strings. ``Driver.submit`` queues it without resolving it again
/// (a prepared request may be submitted more than once).
#[pyclass(module = "specrt._specrt", name = "PreparedRequest", frozen)]
pub struct PyPreparedRequest(pub PreparedRequest);

#[pymethods]
impl PyPreparedRequest {
    /// The prompt's token ids (``list[int]``, each ``< vocab_size``).
    #[getter]
    fn prompt_ids(&self) -> Vec<u32> {
        self.0.prompt_ids.clone()
    }

    /// The engine's settings the request resolved to (the folder's defaults filled in).
    #[getter]
    fn config(&self) -> RequestConfig {
        RequestConfig {
            cfg: self.0.config.clone(),
            constraint: self.0.request.constraint.clone(),
        }
    }

    /// The stop strings (``list[str]``).
    #[getter]
    fn stop(&self) -> Vec<String> {
        self.0.request.stop.clone()
    }

    /// Whether the prompt is scored (``prompt_logprobs`` was given).
    #[getter]
    fn scored(&self) -> bool {
        self.0.config.prompt_logprobs.is_some()
    }

    fn __repr__(&self) -> String {
        format!(
            "PreparedRequest(prompt_ids=<{} ids>, max_new_tokens={})",
            self.0.prompt_ids.len(),
            self.0.config.max_new_tokens
        )
    }
}
