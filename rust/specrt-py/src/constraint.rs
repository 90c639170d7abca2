//! `ConstraintMasks`: a request's output constraint as masks over the vocabulary, position by position (wraps
//! `specrt_ort::ConstraintCompiler` and `specrt_core::next_mask`, the engine's own mask and EOS rule). `specrt
//! certify` scores constrained outputs with them.

use std::path::PathBuf;
use std::sync::Mutex;

use numpy::{PyArray1, PyArray2, PyArrayMethods};
use pyo3::prelude::*;
use specrt_core::{mask_allows, mask_words, next_mask, SpecError};
use specrt_ort::specrt_grammar::OutputConstraint;
use specrt_ort::ConstraintCompiler;

use crate::args::prompt_ids;
use crate::errors::{run_kernel, to_pyerr};
use crate::request_config::RequestConfig;

/// The masks a constrained request's rows get, position by position: the tokens its output constraint allows, with
/// the EOS ids allowed exactly where it accepts (never under ``ignore_eos``), as the engine masks the target's and
/// the draft's logits (after penalties, before temperature / top-k / top-p / min-p).
///
/// Args:
///     target: the target model folder (its ``tokenizer.json`` is the constraint's vocabulary).
///     config: the request's settings from ``resolve_request`` (its constraint, EOS ids and ``ignore_eos``).
///     vocab_size: the model's logits width (``Decoder.vocab_size``).
///
/// Raises:
///     ConfigError: ``config`` has no constraint, the folder has no tokenizer.json, or the constraint does not
///         compile. FileNotFoundError / ModelFileError: an unreadable tokenizer.json.
#[pyclass(module = "specrt._specrt", name = "ConstraintMasks")]
pub struct PyConstraintMasks {
    compiler: Mutex<ConstraintCompiler>,
    spec: OutputConstraint,
    ignore_eos: bool,
    vocab_size: usize,
}

#[pymethods]
impl PyConstraintMasks {
    #[new]
    fn new(
        py: Python<'_>,
        target: PathBuf,
        config: PyRef<'_, RequestConfig>,
        vocab_size: usize,
    ) -> PyResult<Self> {
        let spec = config.constraint.clone().ok_or_else(|| {
            to_pyerr(SpecError::Config(
                "ConstraintMasks needs a request with an output constraint (response_format, json_schema, regex, \
                 grammar or choice); this one has none"
                    .to_owned(),
            ))
        })?;
        let eos = config.cfg.eos_token_ids.clone();
        let ignore_eos = config.cfg.ignore_eos;
        let compiler = run_kernel(py, || {
            let mut c = ConstraintCompiler::from_folder(&target, vocab_size, eos)?;
            c.compile(&spec)?; // refused now rather than at the first masks() call
            Ok(c)
        })?;
        Ok(Self {
            compiler: Mutex::new(compiler),
            spec,
            ignore_eos,
            vocab_size,
        })
    }

    /// The mask of each position of ``output_ids`` (GIL released): row ``t`` allows the tokens that may follow
    /// ``output_ids[:t]``.
    ///
    /// Args:
    ///     output_ids: ``[n]`` generated token ids (an EOS id may end them).
    ///
    /// Returns:
    ///     ``[n, vocab] bool`` numpy array (True = allowed).
    ///
    /// Raises:
    ///     ConfigError: a token the constraint refuses, or one after the constraint is complete (its position
    ///         named).
    ///     VocabError: a negative id.
    fn masks<'py>(
        &self,
        py: Python<'py>,
        output_ids: Vec<i64>,
    ) -> PyResult<Bound<'py, PyArray2<bool>>> {
        let ids = prompt_ids(&output_ids)?;
        let vocab = self.vocab_size;
        let rows = run_kernel(py, || {
            let mut compiler = self
                .compiler
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let eos = compiler.eos_token_ids().to_vec();
            let mut c = compiler.compile(&self.spec)?;
            let mut words = vec![0u32; mask_words(vocab)];
            let mut out = vec![false; ids.len() * vocab];
            for (t, &tok) in ids.iter().enumerate() {
                if c.is_complete()? {
                    // The engine ends a request here (finish reason "grammar"): nothing is ever emitted after it.
                    return Err(SpecError::Config(format!(
                        "output token {tok} at position {t} follows the end of the constraint (complete after {t} \
                         tokens)"
                    )));
                }
                next_mask(c.as_mut(), &eos, self.ignore_eos, &mut words)?;
                for (i, o) in out[t * vocab..(t + 1) * vocab].iter_mut().enumerate() {
                    #[allow(clippy::cast_possible_truncation)]
                    let allowed = mask_allows(&words, i as u32);
                    *o = allowed;
                }
                if eos.contains(&tok) {
                    if t + 1 < ids.len() {
                        return Err(SpecError::Config(format!(
                            "output token {tok} at position {t} is an EOS id, but tokens follow it"
                        )));
                    }
                } else {
                    // Every other token advances the constraint (a refused one is named).
                    c.advance(tok).map_err(|e| {
                        SpecError::Config(format!("output token {tok} at position {t}: {e}"))
                    })?;
                }
            }
            Ok(out)
        })?;
        PyArray1::from_vec(py, rows).reshape([ids.len(), vocab])
    }

    /// The constraint's kind (``"json_schema"``, ``"json_object"``, ``"regex"``, ``"grammar"``, ``"choice"``).
    #[getter]
    fn kind(&self) -> &'static str {
        self.spec.kind()
    }
}
