//! `RequestConfig`: the settings of one generation request, resolved by the one resolver (`specrt_ort::resolve_request`).

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyInt, PyString};
use specrt_core::sampling::Fault;
use specrt_core::{
    check_prompt, num_speculative_tokens_expected, AutoK, GenerationConfig, NgramConfig,
    PinnedCosts, SpecError,
};
use specrt_ort::specrt_grammar::{ConstraintFields, OutputConstraint, CONSTRAINT_FIELDS};
use specrt_ort::{
    resolve_request as resolve_request_rs, FolderDefaults, GenerationRequest, Proposer,
    SpeculativeTokens, TextOptions,
};

use crate::args::SamplingArgs;
use crate::errors::to_pyerr;

/// The settings of one generation request (``specrt.Decoder`` builds it from its keyword arguments).
#[pyclass(module = "specrt._specrt", name = "RequestConfig", frozen)]
pub struct RequestConfig {
    /// The engine's settings.
    pub cfg: GenerationConfig,
    /// The output constraint (structured output; only `resolve_request` sets one).
    pub constraint: Option<OutputConstraint>,
}

#[pymethods]
impl RequestConfig {
    /// Settings of one request, checked in full (``GenerationConfig::validate``); needs no model.
    ///
    /// Args:
    ///     max_new_tokens: most tokens to emit (>= 1).
    ///     num_speculative_tokens: K, draft tokens per round, 0 <= K <= MAX_DRAFT_TOKENS (0 = plain target decoding).
    ///     temperature, top_k, top_p, min_p: logits processing (0 = greedy; top_k 0, top_p 1, min_p 0 = off).
    ///     repetition_penalty, frequency_penalty, presence_penalty: penalties (1, 0, 0 = off).
    ///     seed: seed of the request's random stream.
    ///     eos_token_ids, stop_token_ids: ids that end generation (emitted); ignore_eos: go on past EOS ids.
    ///     auto_k: choose K each round (up to ``num_speculative_tokens``) from measured costs and acceptance.
    ///     pinned_c_draft, pinned_c_verify: with ``auto_k``, costs to use instead of timings (reproducible runs):
    ///         one draft pass, and a target pass over n = 1..=K+1 tokens (list of K + 1 values).
    ///     prompt_lookup_min, prompt_lookup_max: enable n-gram (prompt lookup) proposals with these match lengths.
    ///     use_draft_model: draft with the draft model (when attached).
    ///     coupled: coupled sampling: the choice at each position depends on (seed, position) alone, so the output
    ///         equals target-only coupled decoding with the same seed for every K and proposer.
    ///     logprobs: return the target's log-probability of each emitted token (off: none are returned, and a
    ///         greedy request without penalties reads only the models' argmax ids).
    ///     top_logprobs: alternatives per emitted token, 0..=20: the most likely tokens of the target's
    ///         verification row of its position with their log-probabilities (0 = none).
    ///     min_tokens: no EOS or stop token id before this many tokens (vLLM's; 0 = off, <= max_new_tokens).
    ///     prompt_logprobs: score the prompt with this many alternatives per position, 0..=20 (None = off): the
    ///         target's log-probability of each prompt token after the first, from the prefill pass.
    ///
    /// Raises:
    ///     ConfigError: a setting out of range, or pinned costs given by halves.
    #[new]
    #[pyo3(signature = (
        *, max_new_tokens, num_speculative_tokens=4, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0,
        repetition_penalty=1.0, frequency_penalty=0.0, presence_penalty=0.0, seed=0, eos_token_ids=vec![],
        stop_token_ids=vec![], ignore_eos=false, auto_k=false, pinned_c_draft=None, pinned_c_verify=None,
        prompt_lookup_min=None, prompt_lookup_max=None, use_draft_model=true, coupled=false, logprobs=true,
        top_logprobs=0, prompt_logprobs=None, min_tokens=0, _fault=None
    ),
    // Spelled out because pyo3 shows the `vec![]` defaults as `...`: keep it in step with `signature` (stubtest
    // compares it with `_specrt.pyi`, tests/cli/test_stubs.py).
    text_signature = "(*, max_new_tokens, num_speculative_tokens=4, temperature=1.0, top_k=0, top_p=1.0, \
        min_p=0.0, repetition_penalty=1.0, frequency_penalty=0.0, presence_penalty=0.0, seed=0, eos_token_ids=(), \
        stop_token_ids=(), ignore_eos=False, auto_k=False, pinned_c_draft=None, pinned_c_verify=None, \
        prompt_lookup_min=None, prompt_lookup_max=None, use_draft_model=True, coupled=False, logprobs=True, \
        top_logprobs=0, prompt_logprobs=None, min_tokens=0, _fault=None)"
    )]
    #[allow(clippy::too_many_arguments)]
    fn new(
        max_new_tokens: usize,
        num_speculative_tokens: usize,
        temperature: f64,
        top_k: i64,
        top_p: f64,
        min_p: f64,
        repetition_penalty: f64,
        frequency_penalty: f64,
        presence_penalty: f64,
        seed: u64,
        eos_token_ids: Vec<u32>,
        stop_token_ids: Vec<u32>,
        ignore_eos: bool,
        auto_k: bool,
        pinned_c_draft: Option<f64>,
        pinned_c_verify: Option<Vec<f64>>,
        prompt_lookup_min: Option<usize>,
        prompt_lookup_max: Option<usize>,
        use_draft_model: bool,
        coupled: bool,
        logprobs: bool,
        top_logprobs: usize,
        prompt_logprobs: Option<usize>,
        min_tokens: u32,
        _fault: Option<&str>,
    ) -> PyResult<Self> {
        let mut sampling = SamplingArgs {
            temperature,
            top_k,
            top_p,
            min_p,
            repetition_penalty,
            frequency_penalty,
            presence_penalty,
        }
        .convert("an integer >= 0; 0 = off")?;
        sampling.min_tokens = min_tokens;
        if auto_k && (pinned_c_draft.is_some() != pinned_c_verify.is_some()) {
            let missing = if pinned_c_draft.is_none() {
                "pinned_c_draft"
            } else {
                "pinned_c_verify"
            };
            return Err(to_pyerr(SpecError::setting(
                missing,
                "pinned costs need both pinned_c_draft and pinned_c_verify",
            )));
        }
        let cfg = GenerationConfig {
            max_new_tokens,
            num_speculative_tokens,
            sampling,
            seed,
            eos_token_ids,
            stop_token_ids,
            ignore_eos,
            auto_k: auto_k.then(|| AutoK {
                k_max: num_speculative_tokens.max(1),
                pinned: match (pinned_c_draft, pinned_c_verify) {
                    (Some(c_draft), Some(c_verify)) => Some(PinnedCosts { c_draft, c_verify }),
                    _ => None,
                },
                ..AutoK::default()
            }),
            ngram: match (prompt_lookup_min, prompt_lookup_max) {
                (None, None) => None,
                (lo, hi) => {
                    let hi = hi.or(lo).unwrap_or(1);
                    Some(NgramConfig {
                        prompt_lookup_min: lo.unwrap_or(1).min(hi),
                        prompt_lookup_max: hi,
                        method: specrt_core::LookupMethod::PromptLookup,
                    })
                }
            },
            use_draft_model,
            coupled,
            logprobs,
            top_logprobs,
            prompt_logprobs,
            fault: match _fault {
                None => None,
                Some("residual_from_draft") => Some(Fault::ResidualFromDraft),
                Some(other) => {
                    return Err(to_pyerr(SpecError::setting(
                        "_fault",
                        format!(
                            "_fault {other:?} is invalid (expected None or \"residual_from_draft\")"
                        ),
                    )));
                }
            },
        };
        // Checked here, so a bad setting is refused before a request queues or a model loads (the engines check
        // again at start: one definition, `GenerationConfig::validate`).
        cfg.validate().map_err(to_pyerr)?;
        Ok(Self {
            cfg,
            constraint: None,
        })
    }

    /// Most tokens to emit.
    #[getter]
    fn max_new_tokens(&self) -> usize {
        self.cfg.max_new_tokens
    }

    /// Score-the-prompt setting: alternatives per prompt position, or None (off).
    #[getter]
    fn prompt_logprobs(&self) -> Option<usize> {
        self.cfg.prompt_logprobs
    }

    /// The kind of the request's output constraint (``"json_schema"``, ``"json_object"``, ``"regex"``,
    /// ``"grammar"``, ``"choice"``), or None for free text.
    #[getter]
    fn constraint_kind(&self) -> Option<&'static str> {
        self.constraint.as_ref().map(OutputConstraint::kind)
    }

    /// The logits processing in force (folder defaults filled in): ``temperature``, ``top_k``, ``top_p``,
    /// ``min_p``, ``repetition_penalty``, ``frequency_penalty``, ``presence_penalty`` (floats; ``top_k`` an int).
    #[getter]
    fn sampling<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = &self.cfg.sampling;
        let d = PyDict::new(py);
        d.set_item("temperature", f64::from(s.temperature))?;
        d.set_item("top_k", s.top_k)?;
        d.set_item("top_p", f64::from(s.top_p))?;
        d.set_item("min_p", f64::from(s.min_p))?;
        d.set_item("repetition_penalty", f64::from(s.repetition_penalty))?;
        d.set_item("frequency_penalty", f64::from(s.frequency_penalty))?;
        d.set_item("presence_penalty", f64::from(s.presence_penalty))?;
        Ok(d)
    }

    fn __repr__(&self) -> String {
        format!(
            "RequestConfig({:?}, constraint={:?})",
            self.cfg, self.constraint
        )
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The one resolver, from Python: `Decoder.stream()`'s keyword arguments -> `RequestConfig` (through
// `specrt_ort::resolve_request`, which the Rust `Pipeline` uses too). This file only converts Python values,
// naming the parameter in every error.

/// A `ConfigError` "`{name} {value!r} is invalid (expected {expected})`" whose `field` is `name`.
pub(crate) fn invalid(name: &str, value: &Bound<'_, PyAny>, expected: &str) -> PyErr {
    let shown = value
        .repr()
        .map_or_else(|_| "<unprintable>".to_owned(), |r| r.to_string());
    to_pyerr(SpecError::setting(
        name,
        format!("{name} {shown} is invalid (expected {expected})"),
    ))
}

/// A Python int (not a bool) as `i128`; `None` for a non-int, `Some(Err)` never: ints beyond `i128` saturate.
pub(crate) fn as_int(value: &Bound<'_, PyAny>) -> Option<i128> {
    if value.is_instance_of::<PyBool>() || !value.is_instance_of::<PyInt>() {
        return None;
    }
    match value.extract::<i128>() {
        Ok(v) => Some(v),
        // Beyond i128: its sign decides the side it saturates to.
        Err(_) => Some(if value.lt(0).unwrap_or(false) {
            i128::MIN
        } else {
            i128::MAX
        }),
    }
}

/// An int in `lo..=hi` or a `ConfigError` naming `name` and `expected`.
fn int_in(
    name: &str,
    value: &Bound<'_, PyAny>,
    lo: i128,
    hi: i128,
    expected: &str,
) -> PyResult<i128> {
    match as_int(value) {
        Some(v) if (lo..=hi).contains(&v) => Ok(v),
        _ => Err(invalid(name, value, expected)),
    }
}

fn float(name: &str, value: &Bound<'_, PyAny>) -> PyResult<f64> {
    if value.is_instance_of::<PyString>() {
        return Err(invalid(name, value, "a number"));
    }
    value
        .extract::<f64>()
        .map_err(|_| invalid(name, value, "a number"))
}

#[allow(clippy::cast_possible_truncation)]
fn opt_f32(name: &str, value: Option<&Bound<'_, PyAny>>) -> PyResult<Option<f32>> {
    value.map(|v| float(name, v).map(|x| x as f32)).transpose()
}

pub(crate) fn boolean(name: &str, value: &Bound<'_, PyAny>) -> PyResult<bool> {
    if !value.is_instance_of::<PyBool>() {
        return Err(invalid(name, value, "True or False"));
    }
    value.extract::<bool>()
}

/// Token ids from a Python sequence: each an int (`TypeError` otherwise, as `operator.index`), each in
/// `0 <= id < vocab` (`VocabError` naming the first bad one and its position; `vocab` `None` = `2**32`).
pub(crate) fn ids_of(
    name: &str,
    value: &Bound<'_, PyAny>,
    vocab: Option<usize>,
) -> PyResult<Vec<u32>> {
    let limit = vocab.map_or(1_i128 << 32, |v| v as i128);
    let mut out = Vec::new();
    for (i, item) in value.try_iter()?.enumerate() {
        let item = item?;
        let Some(t) = as_int(&item).or_else(|| {
            // operator.index accepts what implements __index__ (numpy ints).
            item.call_method0("__index__").ok().and_then(|x| as_int(&x))
        }) else {
            return Err(PyTypeError::new_err(format!(
                "{name} token {} at position {i} is not an integer",
                item.repr()?
            )));
        };
        if !(0..limit).contains(&t) {
            let shown = item.str()?.to_string();
            let expected = vocab.map_or("0 <= id < 2**32".to_owned(), |v| {
                format!("0 <= id < vocab size {v}")
            });
            return Err(to_pyerr(SpecError::Vocab(format!(
                "{name} token {shown} at position {i} is out of range (expected {expected})"
            ))));
        }
        #[allow(clippy::cast_sign_loss, clippy::cast_possible_truncation)]
        out.push(t as u32);
    }
    Ok(out)
}

/// The request's settings as `GenerationRequest` (Python names -> Rust fields, types checked, every error naming
/// its parameter); values are range-checked by `resolve_request`.
#[allow(
    clippy::too_many_lines,
    clippy::cast_sign_loss,
    clippy::cast_possible_truncation
)]
pub(crate) fn request_of(
    settings: &Bound<'_, PyDict>,
    vocab: Option<usize>,
) -> PyResult<GenerationRequest> {
    let mut r = GenerationRequest::default();
    let mut bad_lookup = false; // an n-gram length that is not a non-negative int
    let mut lookup_values: Vec<(&'static str, Bound<'_, PyAny>)> = Vec::new();
    let mut constraint = ConstraintFields::default();
    for (key, value) in settings.iter() {
        let key: String = key.extract()?;
        if CONSTRAINT_FIELDS.contains(&key.as_str()) {
            // Types and shapes are checked by `ConstraintFields::resolve` (the one translation, named errors).
            constraint.set(&key, crate::chat::to_json(&value, &key)?);
            continue;
        }
        let v = (!value.is_none()).then_some(&value);
        match key.as_str() {
            "max_new_tokens" => {
                // Huge values saturate: the length check then names them (SequenceLengthError).
                let n = int_in("max_new_tokens", &value, 1, i128::MAX, "an integer >= 1")?;
                r.max_new_tokens = usize::try_from(n).unwrap_or(usize::MAX);
            }
            "num_speculative_tokens" => {
                r.num_speculative_tokens = if value.is_instance_of::<PyString>() {
                    let s: String = value.extract()?;
                    if s != "auto" {
                        return Err(invalid(&key, &value, &num_speculative_tokens_expected()));
                    }
                    SpeculativeTokens::Auto
                } else {
                    let k = int_in(
                        &key,
                        &value,
                        0,
                        i128::MAX,
                        &num_speculative_tokens_expected(),
                    )?;
                    SpeculativeTokens::Fixed(usize::try_from(k).unwrap_or(usize::MAX))
                };
            }
            "proposer" => {
                r.proposer = match v {
                    None => None,
                    Some(p) => {
                        let s: String = p.extract().map_err(|_| {
                            let names: Vec<String> = Proposer::ALL
                                .iter()
                                .map(|p| format!("'{}'", p.as_str()))
                                .collect();
                            invalid(&key, p, &format!("one of: {}", names.join(", ")))
                        })?;
                        Some(s.parse::<Proposer>().map_err(to_pyerr)?)
                    }
                };
            }
            "prompt_lookup_min" | "prompt_lookup_max" => {
                let name = if key == "prompt_lookup_min" {
                    "prompt_lookup_min"
                } else {
                    "prompt_lookup_max"
                };
                lookup_values.push((name, value.clone()));
                match as_int(&value).and_then(|n| usize::try_from(n).ok()) {
                    Some(n) if name == "prompt_lookup_min" => r.prompt_lookup_min = n,
                    Some(n) => r.prompt_lookup_max = n,
                    None => bad_lookup = true,
                }
            }
            "pinned_costs" => {
                r.pinned_costs = match v {
                    None => None,
                    Some(p) => Some(pinned_of(p)?),
                };
            }
            "temperature" => r.temperature = opt_f32(&key, v)?,
            "top_p" => r.top_p = opt_f32(&key, v)?,
            "min_p" => r.min_p = opt_f32(&key, v)?,
            "repetition_penalty" => r.repetition_penalty = opt_f32(&key, v)?,
            "top_k" => {
                r.top_k = match v {
                    None => None,
                    Some(k) => {
                        Some(int_in(&key, k, 0, (1 << 32) - 1, crate::args::TOP_K_RANGE)? as u32)
                    }
                };
            }
            "frequency_penalty" => r.frequency_penalty = float(&key, &value)? as f32,
            "presence_penalty" => r.presence_penalty = float(&key, &value)? as f32,
            "seed" => {
                r.seed = int_in(
                    &key,
                    &value,
                    0,
                    (1 << 64) - 1,
                    "an integer 0 <= seed < 2**64",
                )? as u64;
            }
            "stop" => {
                r.stop = match v {
                    None => Vec::new(),
                    Some(s) if s.is_instance_of::<PyString>() => vec![s.extract()?],
                    Some(s) => s
                        .try_iter()
                        .and_then(|it| {
                            it.map(|x| x?.extract::<String>())
                                .collect::<PyResult<Vec<_>>>()
                        })
                        .map_err(|_| invalid(&key, s, "a string or a list of strings"))?,
                };
            }
            "stop_token_ids" => {
                r.stop_token_ids = match v {
                    None => Vec::new(),
                    Some(ids) => ids_of("stop_token_ids", ids, vocab)?,
                };
            }
            "ignore_eos" => r.ignore_eos = boolean(&key, &value)?,
            "skip_special_tokens" => r.text.skip_special_tokens = boolean(&key, &value)?,
            "include_stop_str_in_output" => {
                r.text.include_stop_str_in_output = boolean(&key, &value)?;
            }
            "coupled" => r.coupled = boolean(&key, &value)?,
            "logprobs" => r.logprobs = boolean(&key, &value)?,
            "top_logprobs" => {
                r.top_logprobs = int_in(
                    &key,
                    &value,
                    0,
                    i128::from(u32::MAX),
                    "a non-negative integer",
                )? as usize;
            }
            "min_tokens" => {
                r.min_tokens = int_in(
                    &key,
                    &value,
                    0,
                    i128::from(u32::MAX),
                    "a non-negative integer",
                )? as u32;
            }
            "prompt_logprobs" => {
                r.prompt_logprobs = match v {
                    None => None,
                    Some(k) => Some(int_in(
                        &key,
                        k,
                        0,
                        i128::from(u32::MAX),
                        "a non-negative integer or None",
                    )? as usize),
                };
            }
            "_fault" => {
                r.fault = match v {
                    None => None,
                    Some(f) => match f.extract::<String>().ok().as_deref() {
                        Some("residual_from_draft") => Some(Fault::ResidualFromDraft),
                        _ => return Err(invalid(&key, f, "None or \"residual_from_draft\"")),
                    },
                };
            }
            other => {
                return Err(PyTypeError::new_err(format!(
                    "unexpected request setting {other:?}"
                )));
            }
        }
    }
    // n-gram lengths that are not non-negative ints matter only to a proposer that looks n-grams up.
    if bad_lookup && r.proposer.is_some_and(|p| p.lookup().is_some()) {
        let shown: Vec<String> = lookup_values
            .iter()
            .map(|(n, v)| {
                format!(
                    "{n} = {}",
                    v.repr().map_or_else(|_| "?".into(), |s| s.to_string())
                )
            })
            .collect();
        // The field: the first length that is not a non-negative int.
        let field = lookup_values
            .iter()
            .find(|(_, v)| as_int(v).and_then(|n| usize::try_from(n).ok()).is_none())
            .map_or("prompt_lookup_min", |(n, _)| *n);
        return Err(to_pyerr(SpecError::setting(
            field,
            format!(
                "n-gram lengths {} are invalid (expected integers 1 <= prompt_lookup_min <= prompt_lookup_max <= 32)",
                shown.join(", ")
            ),
        )));
    }
    r.constraint = constraint.resolve().map_err(to_pyerr)?;
    Ok(r)
}

/// `{"c_draft": float, "c_verify": [floats]}` as `PinnedCosts`.
fn pinned_of(p: &Bound<'_, PyAny>) -> PyResult<PinnedCosts> {
    let expected = "{'c_draft': float, 'c_verify': [floats]}";
    let parse = || -> Option<PinnedCosts> {
        let d = p.cast::<PyDict>().ok()?;
        if d.len() != 2 {
            return None;
        }
        let c_draft = d.get_item("c_draft").ok()??;
        let c_verify = d.get_item("c_verify").ok()??;
        if c_draft.is_instance_of::<PyString>() || c_verify.is_instance_of::<PyString>() {
            return None;
        }
        Some(PinnedCosts {
            c_draft: c_draft.extract().ok()?,
            c_verify: c_verify.extract().ok()?,
        })
    };
    parse().ok_or_else(|| invalid("pinned_costs", p, expected))
}

/// The generation defaults of a model folder (``generation_config.json``, and ``specrt_config.json`` for the
/// EOS ids), read as the Rust ``Pipeline`` reads them: a missing file is empty, a ``null`` value is unset.
///
/// Args:
///     path: a model folder (or a ``.onnx`` file in one).
///
/// Raises:
///     ModelFileError: a file that exists but is not a JSON object or has a field of the wrong type.
///     ConfigError: a negative ``top_k``.
#[pyclass(module = "specrt._specrt", name = "FolderDefaults", frozen)]
pub struct PyFolderDefaults(pub FolderDefaults);

#[pymethods]
impl PyFolderDefaults {
    #[new]
    fn new(path: std::path::PathBuf) -> PyResult<Self> {
        FolderDefaults::read(&path).map(Self).map_err(to_pyerr)
    }

    /// The sampling defaults the folder sets (``temperature``, ``top_k``, ``top_p``, ``min_p``,
    /// ``repetition_penalty``; absent keys left out), as a dict.
    fn sampling<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        let f = &self.0;
        for (name, v) in [
            ("temperature", f.temperature),
            ("top_p", f.top_p),
            ("min_p", f.min_p),
            ("repetition_penalty", f.repetition_penalty),
        ] {
            if let Some(x) = v {
                d.set_item(name, f64::from(x))?;
            }
        }
        if let Some(k) = f.top_k {
            d.set_item("top_k", k)?;
        }
        Ok(d)
    }

    /// End-of-sequence ids (``eos_token_id`` of generation_config.json, else ``specrt_config.json``'s).
    #[getter]
    fn eos_token_ids(&self) -> Vec<u32> {
        self.0.eos_token_ids.clone()
    }

    fn __repr__(&self) -> String {
        format!("FolderDefaults({:?})", self.0)
    }
}

/// The defaults of ``Decoder.stream()``'s request settings (``GenerationRequest::default()`` in Rust, the one
/// definition): a dict of Python names to values. The struct is destructured without ``..``, so a field added to
/// ``GenerationRequest`` does not compile until it is named here (and the tests then compare this dict with
/// ``Decoder.stream``'s signature and with what ``request_of`` accepts).
#[pyfunction]
pub fn request_defaults(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let GenerationRequest {
        max_new_tokens,
        num_speculative_tokens,
        proposer,
        prompt_lookup_min,
        prompt_lookup_max,
        pinned_costs,
        temperature,
        top_k,
        top_p,
        min_p,
        repetition_penalty,
        frequency_penalty,
        presence_penalty,
        seed,
        stop,
        stop_token_ids,
        text:
            TextOptions {
                skip_special_tokens,
                include_stop_str_in_output,
            },
        ignore_eos,
        coupled,
        logprobs,
        top_logprobs,
        prompt_logprobs,
        min_tokens,
        constraint,
        fault: _, // a test hook (``_fault``), not a setting
    } = GenerationRequest::default();
    let d = PyDict::new(py);
    d.set_item("max_new_tokens", max_new_tokens)?;
    match num_speculative_tokens {
        SpeculativeTokens::Fixed(k) => d.set_item("num_speculative_tokens", k)?,
        SpeculativeTokens::Auto => d.set_item("num_speculative_tokens", "auto")?,
    }
    d.set_item("proposer", proposer.map(Proposer::as_str))?;
    d.set_item("prompt_lookup_min", prompt_lookup_min)?;
    d.set_item("prompt_lookup_max", prompt_lookup_max)?;
    // Empty lists and absent values are Python's None (no pinned costs, no stop strings or extra stop ids).
    debug_assert!(pinned_costs.is_none() && stop.is_empty() && stop_token_ids.is_empty());
    d.set_item("pinned_costs", py.None())?;
    d.set_item("temperature", temperature)?;
    d.set_item("top_k", top_k)?;
    d.set_item("top_p", top_p)?;
    d.set_item("min_p", min_p)?;
    d.set_item("repetition_penalty", repetition_penalty)?;
    d.set_item("frequency_penalty", f64::from(frequency_penalty))?;
    d.set_item("presence_penalty", f64::from(presence_penalty))?;
    d.set_item("seed", seed)?;
    d.set_item("stop", py.None())?;
    d.set_item("stop_token_ids", py.None())?;
    d.set_item("ignore_eos", ignore_eos)?;
    d.set_item("coupled", coupled)?;
    d.set_item("logprobs", logprobs)?;
    d.set_item("top_logprobs", top_logprobs)?;
    d.set_item("prompt_logprobs", prompt_logprobs)?;
    d.set_item("min_tokens", min_tokens)?;
    d.set_item("skip_special_tokens", skip_special_tokens)?;
    d.set_item("include_stop_str_in_output", include_stop_str_in_output)?;
    debug_assert!(constraint.is_none());
    for name in CONSTRAINT_FIELDS {
        d.set_item(name, py.None())?; // no constraint (GenerationRequest::constraint None)
    }
    Ok(d)
}

/// Resolve one request: ``Decoder.stream()``'s settings -> the engine's ``RequestConfig`` and the stop strings,
/// with the one resolver the Rust ``Pipeline`` uses (``specrt_ort::resolve_request``): the folder's defaults
/// for unset sampling values, K and the proposer, every range check; with ``prompt_ids``, the prompt checked
/// against the vocabulary and ``max_seq_len`` too (``specrt_core::check_prompt``).
///
/// Args:
///     settings: ``Decoder.stream()``'s keyword arguments except ``prompt`` / ``messages`` (name -> value).
///     has_draft: whether a draft model is loaded.
///     defaults: the target folder's ``FolderDefaults`` (None: none, as without a model).
///     vocab_size: the models' vocabulary (None: ids checked against ``2**32``).
///     prompt_ids: the prompt's token ids (a sequence of ints), or None to check no prompt.
///     max_seq_len: the KV capacity (with ``prompt_ids``).
///     eos_token_ids: the EOS ids to use instead of the folder's (``Decoder.eos_token_ids``, which a caller may
///         set).
///
/// Returns:
///     ``(RequestConfig, stop strings: list[str], prompt ids: list[int] | None)``.
///
/// Raises:
///     ConfigError: a setting of the wrong type or out of range (named, with the allowed set), an empty prompt.
///     VocabError: a prompt or stop token id outside ``0 <= id < vocab_size`` (position named).
///     SequenceLengthError: prompt + ``max_new_tokens`` beyond ``max_seq_len``.
///     TypeError: a token id that is not an integer, or a setting ``stream()`` does not take.
#[pyfunction]
#[pyo3(signature = (
    settings, *, has_draft, defaults=None, vocab_size=None, prompt_ids=None, max_seq_len=None, eos_token_ids=None
))]
#[allow(clippy::type_complexity)]
pub fn resolve_request(
    settings: &Bound<'_, PyDict>,
    has_draft: bool,
    defaults: Option<&PyFolderDefaults>,
    vocab_size: Option<usize>,
    prompt_ids: Option<&Bound<'_, PyAny>>,
    max_seq_len: Option<usize>,
    eos_token_ids: Option<&Bound<'_, PyAny>>,
) -> PyResult<(RequestConfig, Vec<String>, Option<Vec<u32>>)> {
    let request = request_of(settings, vocab_size)?;
    let mut defaults = defaults.map_or_else(FolderDefaults::default, |d| d.0.clone());
    if let Some(eos) = eos_token_ids {
        defaults.eos_token_ids = ids_of("eos_token_ids", eos, vocab_size)?;
    }
    let cfg = resolve_request_rs(&request, &defaults, has_draft, vocab_size).map_err(to_pyerr)?;
    let ids = match prompt_ids {
        None => None,
        Some(p) => {
            let ids = ids_of("prompt", p, vocab_size)?;
            check_prompt(
                &ids,
                cfg.max_new_tokens,
                vocab_size.unwrap_or(usize::MAX),
                max_seq_len.unwrap_or(usize::MAX),
            )
            .map_err(to_pyerr)?;
            Some(ids)
        }
    };
    Ok((
        RequestConfig {
            cfg,
            constraint: request.constraint,
        },
        request.stop,
        ids,
    ))
}

/// Token ids as a list of ints, each in ``0 <= id < vocab_size`` (the check every request's prompt gets).
///
/// Args:
///     name: what the ids are, for the messages (``"prompt"``).
///     ids: a sequence of ints.
///     vocab_size: the models' vocabulary.
///
/// Raises:
///     VocabError: an id out of range (value and position named).
///     TypeError: an id that is not an integer.
#[pyfunction]
pub fn check_token_ids(
    name: &str,
    ids: &Bound<'_, PyAny>,
    vocab_size: usize,
) -> PyResult<Vec<u32>> {
    ids_of(name, ids, Some(vocab_size))
}
