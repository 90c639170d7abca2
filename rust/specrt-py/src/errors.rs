//! The Python exception hierarchy and the one exhaustive `SpecError -> PyErr` mapping.
//!
//! ```text
//! SpecrtError(Exception)
//! ├── ConfigError(SpecrtError, ValueError)            SpecError::Config (attribute field None), SpecError::Setting
//! │                                                   (attribute field: the setting's name)
//! ├── ShapeError(SpecrtError, ValueError)             SpecError::Shape
//! ├── VocabError(SpecrtError, ValueError)             SpecError::Vocab
//! ├── NonFiniteLogitsError(SpecrtError, ValueError)   SpecError::NonFinite (attributes row, token, value, what)
//! ├── SequenceLengthError(SpecrtError, ValueError)    SpecError::Length
//! ├── BackendError(SpecrtError, RuntimeError)         SpecError::Backend (attributes code, message)
//! ├── ProviderError(SpecrtError, RuntimeError)        SpecError::Provider
//! ├── ModelFileError(SpecrtError, OSError)            SpecError::Io, SpecError::ModelFormat
//! │   └── ModelFileNotFoundError(ModelFileError, FileNotFoundError)  SpecError::NotFound
//! ├── GenerationCancelled(SpecrtError)                SpecError::Cancelled
//! └── InternalError(SpecrtError, RuntimeError)        SpecError::Internal, and any Rust panic
//! ```
//!
//! The class is chosen by the variant alone, never by the message text. Other binding files convert with
//! [`to_pyerr`] (or `.map_err(to_pyerr)`) and run kernels with [`run_kernel`], which releases the GIL and turns a
//! panic into `InternalError` instead of letting it cross into Python. [`error_for`] exposes the mapping to tests.

use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};
use specrt_core::SpecError;

/// The exception classes, created once per interpreter.
pub struct Exceptions {
    /// `SpecrtError(Exception)`.
    pub specrt: Py<PyType>,
    /// `ConfigError(SpecrtError, ValueError)`.
    pub config: Py<PyType>,
    /// `ShapeError(SpecrtError, ValueError)`.
    pub shape: Py<PyType>,
    /// `VocabError(SpecrtError, ValueError)`.
    pub vocab: Py<PyType>,
    /// `NonFiniteLogitsError(SpecrtError, ValueError)`.
    pub non_finite: Py<PyType>,
    /// `SequenceLengthError(SpecrtError, ValueError)`.
    pub length: Py<PyType>,
    /// `BackendError(SpecrtError, RuntimeError)`.
    pub backend: Py<PyType>,
    /// `ProviderError(SpecrtError, RuntimeError)`.
    pub provider: Py<PyType>,
    /// `ModelFileError(SpecrtError, OSError)`.
    pub model_file: Py<PyType>,
    /// `ModelFileNotFoundError(ModelFileError, FileNotFoundError)`.
    pub model_file_not_found: Py<PyType>,
    /// `GenerationCancelled(SpecrtError)`.
    pub cancelled: Py<PyType>,
    /// `InternalError(SpecrtError, RuntimeError)`.
    pub internal: Py<PyType>,
}

static EXCEPTIONS: PyOnceLock<Exceptions> = PyOnceLock::new();

fn make_class(
    py: Python<'_>,
    name: &str,
    bases: &[Bound<'_, PyAny>],
    doc: &str,
) -> PyResult<Py<PyType>> {
    make_class_with(py, name, bases, doc, &[])
}

/// A class with class attributes `attrs` (defaults its instances may override).
fn make_class_with(
    py: Python<'_>,
    name: &str,
    bases: &[Bound<'_, PyAny>],
    doc: &str,
    attrs: &[(&str, Py<PyAny>)],
) -> PyResult<Py<PyType>> {
    let ns = PyDict::new(py);
    ns.set_item("__module__", "specrt.errors")?;
    ns.set_item("__doc__", doc)?;
    for (k, v) in attrs {
        ns.set_item(*k, v)?;
    }
    let bases = PyTuple::new(py, bases)?;
    let cls = py
        .get_type::<PyType>()
        .call1((name, bases, ns))?
        .cast_into::<PyType>()?;
    Ok(cls.unbind())
}

fn create(py: Python<'_>) -> PyResult<Exceptions> {
    let builtins = py.import("builtins")?;
    let b = |n: &str| builtins.getattr(n);
    let specrt = make_class(
        py,
        "SpecrtError",
        &[b("Exception")?],
        "Base class of every specrt error.",
    )?;
    let base = specrt.bind(py).clone().into_any();
    let sub = |name: &str, builtin: &str, doc: &str| {
        make_class(py, name, &[base.clone(), b(builtin)?], doc)
    };
    let model_file = sub(
        "ModelFileError",
        "OSError",
        "A model file could not be read or is malformed.",
    )?;
    let model_file_not_found = make_class(
        py,
        "ModelFileNotFoundError",
        &[
            model_file.bind(py).clone().into_any(),
            b("FileNotFoundError")?,
        ],
        "A model file does not exist.",
    )?;
    Ok(Exceptions {
        config: make_class_with(
            py,
            "ConfigError",
            &[base.clone(), b("ValueError")?],
            "An argument or setting outside its allowed range. Attribute: field, the setting's name (e.g. \
             'temperature', 'max_new_tokens', 'stop', 'response_format.json_schema.name') when the error is about \
             one request or decoder setting, else None.",
            &[("field", py.None())],
        )?,
        shape: sub(
            "ShapeError",
            "ValueError",
            "An array with the wrong shape, dtype or layout.",
        )?,
        vocab: sub(
            "VocabError",
            "ValueError",
            "A token id or vocabulary size mismatch.",
        )?,
        non_finite: sub(
            "NonFiniteLogitsError",
            "ValueError",
            "NaN / +inf logits or a row of only -inf. Attributes: row, token, value, what.",
        )?,
        length: sub(
            "SequenceLengthError",
            "ValueError",
            "The sequence would exceed the maximum length.",
        )?,
        backend: sub(
            "BackendError",
            "RuntimeError",
            "The model runtime failed. Attributes: code, message.",
        )?,
        provider: sub(
            "ProviderError",
            "RuntimeError",
            "An execution provider could not be loaded.",
        )?,
        internal: sub(
            "InternalError",
            "RuntimeError",
            "A bug in specrt (an invariant or a Rust panic).",
        )?,
        cancelled: make_class(
            py,
            "GenerationCancelled",
            std::slice::from_ref(&base),
            "Generation was cancelled.",
        )?,
        model_file,
        model_file_not_found,
        specrt,
    })
}

/// The exception classes (created on first use).
///
/// # Panics
/// Only if the interpreter cannot create a class with `type(name, bases, ns)`, which does not happen.
pub fn exceptions(py: Python<'_>) -> &Exceptions {
    EXCEPTIONS.get_or_init(py, || {
        create(py).expect("creating specrt exception classes")
    })
}

fn raise(py: Python<'_>, cls: &Py<PyType>, msg: String, attrs: &[(&str, Py<PyAny>)]) -> PyErr {
    let build = || -> PyResult<PyErr> {
        let inst = cls.bind(py).call1((msg.clone(),))?;
        for (k, v) in attrs {
            inst.setattr(*k, v)?;
        }
        Ok(PyErr::from_value(inst))
    };
    build().unwrap_or_else(|e| e)
}

/// Convert a core error into its Python exception. Exhaustive: a new `SpecError` variant will not compile until
/// it is mapped here.
pub fn to_pyerr(err: SpecError) -> PyErr {
    Python::attach(|py| {
        let ex = exceptions(py);
        let msg = err.to_string();
        match err {
            SpecError::Config(_) => raise(py, &ex.config, msg, &[]),
            SpecError::Setting { field, .. } => {
                let attrs: Vec<(&str, Py<PyAny>)> = field
                    .into_pyobject(py)
                    .map(|v| vec![("field", v.into_any().unbind())])
                    .unwrap_or_default();
                raise(py, &ex.config, msg, &attrs)
            }
            SpecError::Shape(_) => raise(py, &ex.shape, msg, &[]),
            SpecError::Vocab(_) => raise(py, &ex.vocab, msg, &[]),
            SpecError::NonFinite {
                row,
                token,
                value,
                what,
            } => {
                let attrs = [
                    ("row", row.into_pyobject(py).map(|v| v.into_any().unbind())),
                    (
                        "token",
                        token.into_pyobject(py).map(|v| v.into_any().unbind()),
                    ),
                    (
                        "value",
                        value.into_pyobject(py).map(|v| v.into_any().unbind()),
                    ),
                    (
                        "what",
                        what.into_pyobject(py).map(|v| v.into_any().unbind()),
                    ),
                ];
                let attrs: Vec<(&str, Py<PyAny>)> = attrs
                    .into_iter()
                    .filter_map(|(k, v)| v.ok().map(|v| (k, v)))
                    .collect();
                raise(py, &ex.non_finite, msg, &attrs)
            }
            SpecError::Length(_) => raise(py, &ex.length, msg, &[]),
            SpecError::Backend { code, message } => {
                let attrs: Vec<(&str, Py<PyAny>)> = [("code", code), ("message", message)]
                    .into_iter()
                    .filter_map(|(k, v)| {
                        v.into_pyobject(py).ok().map(|v| (k, v.into_any().unbind()))
                    })
                    .collect();
                raise(py, &ex.backend, msg, &attrs)
            }
            SpecError::Provider(_) => raise(py, &ex.provider, msg, &[]),
            SpecError::NotFound(_) => raise(py, &ex.model_file_not_found, msg, &[]),
            SpecError::Io(_) | SpecError::ModelFormat(_) => raise(py, &ex.model_file, msg, &[]),
            SpecError::Cancelled => raise(py, &ex.cancelled, msg, &[]),
            SpecError::Internal(_) => raise(py, &ex.internal, msg, &[]),
        }
    })
}

/// The names [`error_for`] accepts: one per `SpecError` variant.
const VARIANTS: [&str; 14] = [
    "Config",
    "Setting",
    "Shape",
    "Vocab",
    "NonFinite",
    "Length",
    "Backend",
    "Provider",
    "NotFound",
    "Io",
    "ModelFormat",
    "Cancelled",
    "Internal",
    "Panic",
];

/// The exception ``to_pyerr`` makes of one Rust error variant (for tests of the mapping and tools that check it).
///
/// Args:
///     variant: the ``SpecError`` variant's name (``"Config"``, ``"Setting"``, ``"Shape"``, ``"Vocab"``,
///         ``"NonFinite"``, ``"Length"``, ``"Backend"``, ``"Provider"``, ``"NotFound"``, ``"Io"``, ``"ModelFormat"``,
///         ``"Cancelled"``, ``"Internal"``; or ``"Panic"``: a Rust panic inside a kernel).
///     message: the error's message (``Setting``: also its ``field`` is ``"field"``; ``Backend``: its ``code`` is
///         ``"Code"``; ``NonFinite``: its ``what``).
///
/// Returns:
///     The exception instance (not raised).
///
/// Raises:
///     ValueError: an unknown variant name.
#[pyfunction]
#[pyo3(signature = (variant, message))]
pub fn error_for(py: Python<'_>, variant: &str, message: &str) -> PyResult<Py<PyAny>> {
    let m = message.to_owned();
    let err = match variant {
        "Config" => SpecError::Config(m),
        "Setting" => SpecError::setting("field", m),
        "Shape" => SpecError::Shape(m),
        "Vocab" => SpecError::Vocab(m),
        "NonFinite" => SpecError::NonFinite {
            row: 0,
            token: 0,
            value: "NaN".to_owned(),
            what: m,
        },
        "Length" => SpecError::Length(m),
        "Backend" => SpecError::Backend {
            code: "Code".to_owned(),
            message: m,
        },
        "Provider" => SpecError::Provider(m),
        "NotFound" => SpecError::NotFound(m),
        "Io" => SpecError::Io(m),
        "ModelFormat" => SpecError::ModelFormat(m),
        "Cancelled" => SpecError::Cancelled,
        "Internal" => SpecError::Internal(m),
        "Panic" => {
            let e = run_kernel(py, || -> specrt_core::Result<()> { panic!("{m}") }).unwrap_err();
            return Ok(e.into_value(py).into_any());
        }
        other => {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "variant {other:?} is invalid (expected one of: {})",
                VARIANTS.join(", ")
            )))
        }
    };
    Ok(to_pyerr(err).into_value(py).into_any())
}

/// Run a core kernel with the GIL released; a `SpecError` becomes its exception, a panic becomes `InternalError`
/// (it never unwinds into Python).
///
/// # Errors
/// The mapped error of `f`, or `InternalError` if `f` panicked.
pub fn run_kernel<T, F>(py: Python<'_>, f: F) -> PyResult<T>
where
    F: FnOnce() -> specrt_core::Result<T> + Send,
    T: Send,
{
    let out = py.detach(|| catch_unwind(AssertUnwindSafe(f)));
    match out {
        Ok(r) => r.map_err(to_pyerr),
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_owned());
            Err(to_pyerr(SpecError::Internal(format!("Rust panic: {what}"))))
        }
    }
}

/// Add the exception classes to the module.
///
/// # Errors
/// If adding an attribute fails.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let ex = exceptions(py);
    for (name, cls) in [
        ("SpecrtError", &ex.specrt),
        ("ConfigError", &ex.config),
        ("ShapeError", &ex.shape),
        ("VocabError", &ex.vocab),
        ("NonFiniteLogitsError", &ex.non_finite),
        ("SequenceLengthError", &ex.length),
        ("BackendError", &ex.backend),
        ("ProviderError", &ex.provider),
        ("ModelFileError", &ex.model_file),
        ("ModelFileNotFoundError", &ex.model_file_not_found),
        ("GenerationCancelled", &ex.cancelled),
        ("InternalError", &ex.internal),
    ] {
        m.add(name, cls.clone_ref(py))?;
    }
    m.add("ERROR_VARIANTS", VARIANTS.to_vec())?;
    m.add_function(wrap_pyfunction!(error_for, m)?)?;
    Ok(())
}
