//! Python wrapper of `specrt_text::chat`: `_specrt.ChatTemplate`. Converts Python messages / tools / documents /
//! keyword arguments to JSON values, renders with the GIL released, converts back.

use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyMapping, PyString, PyTuple};
use serde_json::{Map, Number, Value as Json};
use specrt_core::SpecError;
use specrt_text::chat::{ChatTemplate, ChatTime};

use crate::errors::{run_kernel, to_pyerr};

/// Deepest nesting of a message converted to JSON (deeper is an error, not a stack overflow).
const MAX_DEPTH: usize = 256;

/// A chat template rendered exactly as Hugging Face transformers'
/// ``apply_chat_template(messages, tokenize=False)`` renders it (minijinja in Rust; see ``rust/specrt-text/src/chat.rs``).
///
/// Args:
///     source: the Jinja template.
///     special_tokens: name -> string passed to every rendering, as transformers passes ``special_tokens_map``
///         (e.g. ``{"bos_token": "<s>", "eos_token": "</s>"}``); None: none.
///     now: the ``datetime`` that ``strftime_now`` formats; None: the current time (UTC) at each rendering.
///
/// Raises:
///     ConfigError: minijinja cannot compile the template (the message names the construct and the line), a
///         special token is not a string, or ``now`` is not a datetime.
#[pyclass(module = "specrt._specrt", name = "ChatTemplate", frozen)]
pub struct PyChatTemplate {
    inner: ChatTemplate,
}

fn config(msg: String) -> PyErr {
    to_pyerr(SpecError::Config(msg))
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map_or_else(|_| "?".to_owned(), |n| n.to_string())
}

/// A Python value as JSON, as transformers' ``_plain_template_data`` sees it: None, bool, int, float, str, lists
/// and tuples, mappings with str keys, pydantic models (``model_dump()``); anything else becomes the placeholder
/// string ``"<TypeName>"``. A value it cannot take is a `ConfigError` whose `field` is `field` (the argument:
/// ``kwargs``, ``tools``, ``response_format``, ...), its message naming the path inside it.
pub(crate) fn to_json(obj: &Bound<'_, PyAny>, field: &str) -> PyResult<Json> {
    json_at(obj, field, field, 0)
}

/// [`to_json`] of the value at `path` (`depth` levels) inside the argument `field`.
fn json_at(obj: &Bound<'_, PyAny>, field: &str, path: &str, depth: usize) -> PyResult<Json> {
    let refused = |msg: String| to_pyerr(SpecError::setting(field, msg));
    if depth > MAX_DEPTH {
        return Err(refused(format!(
            "{path}: nested deeper than {MAX_DEPTH} levels"
        )));
    }
    if obj.is_none() {
        return Ok(Json::Null);
    }
    if let Ok(b) = obj.cast::<PyBool>() {
        return Ok(Json::Bool(b.is_true()));
    }
    if obj.is_instance_of::<PyInt>() {
        if let Ok(v) = obj.extract::<i64>() {
            return Ok(Json::Number(v.into()));
        }
        if let Ok(v) = obj.extract::<u64>() {
            return Ok(Json::Number(v.into()));
        }
        return Err(refused(format!(
            "{path}: the int {} is out of range for a chat template (expected -2**63 <= value < 2**64)",
            obj.str().map_or_else(|_| "?".to_owned(), |s| s.to_string())
        )));
    }
    if obj.is_instance_of::<PyFloat>() {
        let v: f64 = obj.extract()?;
        return Number::from_f64(v).map(Json::Number).ok_or_else(|| {
            refused(format!(
                "{path}: the float {v} is not finite (a chat template takes finite numbers)"
            ))
        });
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(Json::String(s.to_str()?.to_owned()));
    }
    if obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>() {
        let mut out = Vec::new();
        for (i, item) in obj.try_iter()?.enumerate() {
            out.push(json_at(&item?, field, &format!("{path}[{i}]"), depth + 1)?);
        }
        return Ok(Json::Array(out));
    }
    if obj.is_instance_of::<PyDict>() || obj.cast::<PyMapping>().is_ok() {
        let mapping = obj.cast::<PyMapping>()?;
        let mut out = Map::new();
        for item in mapping.items()?.iter() {
            let (k, v): (Bound<'_, PyAny>, Bound<'_, PyAny>) = item.extract()?;
            let Ok(key) = k.cast::<PyString>() else {
                return Err(refused(format!(
                    "{path}: key {} is a {}, expected str",
                    k.repr().map_or_else(|_| "?".to_owned(), |s| s.to_string()),
                    type_name(&k)
                )));
            };
            let key = key.to_str()?.to_owned();
            let value = json_at(&v, field, &format!("{path}[{key:?}]"), depth + 1)?;
            out.insert(key, value);
        }
        return Ok(Json::Object(out));
    }
    if let Ok(dump) = obj.getattr("model_dump") {
        if dump.is_callable() {
            return json_at(&dump.call0()?, field, path, depth + 1);
        }
    }
    Ok(Json::String(format!("<{}>", type_name(obj))))
}

/// A list of values (``messages``, ``tools``, ``documents``) as JSON; a `ConfigError` refusing it has the field
/// `name`.
fn to_json_list(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Vec<Json>> {
    let refused = |msg: String| to_pyerr(SpecError::setting(name, msg));
    if obj.is_instance_of::<PyString>() || obj.cast::<PyMapping>().is_ok() {
        return Err(refused(format!(
            "{name} is a {}, expected a list",
            type_name(obj)
        )));
    }
    let Ok(iter) = obj.try_iter() else {
        return Err(refused(format!(
            "{name} is a {}, expected a list",
            type_name(obj)
        )));
    };
    let mut out = Vec::new();
    for (i, item) in iter.enumerate() {
        out.push(json_at(&item?, name, &format!("{name}[{i}]"), 1)?);
    }
    Ok(out)
}

/// A ``datetime.datetime`` (its fields; any time zone is ignored, as ``strftime`` of a naive one) as [`ChatTime`].
fn to_time(now: &Bound<'_, PyAny>) -> PyResult<ChatTime> {
    let field = |name: &str| -> PyResult<i64> {
        now.getattr(name)
            .and_then(|v| v.extract::<i64>())
            .map_err(|_| {
                config(format!(
                    "now is a {}, expected a datetime.datetime (no attribute {name})",
                    type_name(now)
                ))
            })
    };
    let (y, mo, d, h, mi, s) = (
        field("year")?,
        field("month")?,
        field("day")?,
        field("hour")?,
        field("minute")?,
        field("second")?,
    );
    let u = |v: i64| u32::try_from(v).unwrap_or(u32::MAX);
    ChatTime::new(
        i32::try_from(y).unwrap_or(i32::MAX),
        u(mo),
        u(d),
        u(h),
        u(mi),
        u(s),
    )
    .map_err(to_pyerr)
}

fn special_map(special_tokens: Option<&Bound<'_, PyAny>>) -> PyResult<Map<String, Json>> {
    match special_tokens {
        None => Ok(Map::new()),
        Some(obj) if obj.is_none() => Ok(Map::new()),
        Some(obj) => match to_json(obj, "special_tokens")? {
            Json::Object(m) => Ok(m),
            _ => Err(config(format!(
                "special_tokens is a {}, expected a dict of str -> str",
                type_name(obj)
            ))),
        },
    }
}

#[pymethods]
impl PyChatTemplate {
    #[new]
    #[pyo3(signature = (source, special_tokens=None, *, now=None))]
    #[pyo3(text_signature = "(source, special_tokens=None, *, now=None)")]
    fn new(
        py: Python<'_>,
        source: String,
        special_tokens: Option<&Bound<'_, PyAny>>,
        now: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let special = special_map(special_tokens)?;
        let now = now.filter(|n| !n.is_none()).map(to_time).transpose()?;
        let inner = run_kernel(py, move || {
            ChatTemplate::new(source, special).and_then(|t| t.with_now(now))
        })?;
        Ok(Self { inner })
    }

    /// The template of a folder written by ``specrt convert``: ``chat_template.jinja`` and the special tokens of
    /// ``tokenizer_config.json`` (else ``specrt_config.json``'s ids named through ``tokenizer.json``).
    ///
    /// Args:
    ///     path: the model folder.
    ///     now: as in the constructor.
    ///
    /// Returns:
    ///     ChatTemplate.
    ///
    /// Raises:
    ///     ModelFileNotFoundError: the folder has no chat template.
    ///     ModelFileError: a file is unreadable or malformed.
    ///     ConfigError: as the constructor.
    #[staticmethod]
    #[pyo3(signature = (path, *, now=None))]
    #[pyo3(text_signature = "(path, *, now=None)")]
    fn from_folder(
        py: Python<'_>,
        path: PathBuf,
        now: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let now = now.filter(|n| !n.is_none()).map(to_time).transpose()?;
        let inner = run_kernel(py, move || {
            ChatTemplate::from_folder(&path).and_then(|t| t.with_now(now))
        })?;
        Ok(Self { inner })
    }

    /// The template's source text.
    #[getter]
    fn source(&self) -> &str {
        self.inner.source()
    }

    /// The special-token strings passed to every rendering (name -> string).
    #[getter]
    fn special_tokens(&self) -> std::collections::BTreeMap<String, String> {
        self.inner
            .special_tokens()
            .iter()
            .filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_owned())))
            .collect()
    }

    /// Render chat messages as transformers' ``apply_chat_template(messages, tools=tools, documents=documents,
    /// add_generation_prompt=add_generation_prompt, tokenize=False, **kwargs)`` does.
    ///
    /// Args:
    ///     messages: ``[{"role": ..., "content": ...}, ...]`` (keys whose value is None are dropped, as
    ///         transformers does).
    ///     add_generation_prompt: end with the header of an assistant turn.
    ///     tools: JSON schemas (``[{"type": "function", "function": {...}}]``), or None.
    ///     documents: ``[{"title": ..., "text": ...}]`` for retrieval templates, or None.
    ///     **kwargs: more template variables (e.g. ``enable_thinking=False``); they override special tokens.
    ///
    /// Returns:
    ///     str: the rendered prompt.
    ///
    /// Raises:
    ///     ConfigError: a value that is not JSON-like, the template's ``raise_exception(message)``
    ///         (``chat template failed: <message>``), or a construct minijinja cannot render (named, with its line).
    #[pyo3(signature = (messages, add_generation_prompt=false, tools=None, documents=None, **kwargs))]
    #[pyo3(
        text_signature = "(self, messages, add_generation_prompt=False, tools=None, documents=None, **kwargs)"
    )]
    fn render(
        &self,
        py: Python<'_>,
        messages: &Bound<'_, PyAny>,
        add_generation_prompt: bool,
        tools: Option<&Bound<'_, PyAny>>,
        documents: Option<&Bound<'_, PyAny>>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<String> {
        let messages = to_json_list(messages, "messages")?;
        let tools = tools
            .filter(|t| !t.is_none())
            .map(|t| to_json_list(t, "tools"))
            .transpose()?;
        let documents = documents
            .filter(|d| !d.is_none())
            .map(|d| to_json_list(d, "documents"))
            .transpose()?;
        let extra = match kwargs {
            Some(k) => match to_json(k.as_any(), "kwargs")? {
                Json::Object(m) => m,
                _ => Map::new(),
            },
            None => Map::new(),
        };
        let inner = &self.inner;
        run_kernel(py, || {
            inner.render(
                &messages,
                add_generation_prompt,
                tools.as_deref(),
                documents.as_deref(),
                &extra,
            )
        })
    }

    fn __repr__(&self) -> String {
        format!(
            "ChatTemplate({} characters, special_tokens={:?})",
            self.inner.source().chars().count(),
            self.special_tokens()
        )
    }
}
