//! The one error type of specrt. Every fallible function in every crate returns [`Result`]; the Python
//! binding maps each variant to one exception class (no wildcard arm), see `rust/specrt-py/src/errors.rs`.

/// Every error specrt can report. Messages name the bad value and what is allowed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SpecError {
    /// An argument of a lower-level API outside its contract, or a call out of order: a kernel's input (draft
    /// probabilities that are not a distribution, a vocabulary subset that is not ascending), a cost-model or
    /// controller parameter, a mock backend's misuse, `step` before `start` (e.g. `q 1.5 is invalid (expected a
    /// probability in [0, 1])`). A setting of a request or a decoder is [`SpecError::Setting`] instead. Python:
    /// `ConfigError` with `field` None.
    #[error("{0}")]
    Config(String),
    /// A request or decoder setting outside its allowed range, naming the setting: `field` is specrt's own name of
    /// it (`temperature`, `max_new_tokens`, `stop`, `response_format.json_schema.name`, ...), `message` the text
    /// (e.g. `temperature -1 is invalid (expected a finite value >= 0; 0 = greedy)`). Python: `ConfigError` with
    /// the attribute `field`.
    #[error("{message}")]
    Setting {
        /// The setting's name, as the message names it.
        field: String,
        /// The whole message.
        message: String,
    },
    /// A tensor or slice with the wrong shape or length
    /// (e.g. `target logits have 10 values, expected [k + 1, vocab] = [3, 4] = 12`).
    #[error("{0}")]
    Shape(String),
    /// Draft and target (or tokens and model) disagree on the vocabulary.
    #[error("{0}")]
    Vocab(String),
    /// A model produced NaN or infinite logits, or a row with no finite value.
    #[error("non-finite logits at row {row}, token {token}: {value} ({what})")]
    NonFinite {
        /// Row of the `[n, vocab]` logits block (0-based).
        row: usize,
        /// Column (token id) of the first bad value.
        token: usize,
        /// The offending value, printed.
        value: String,
        /// What was wrong, e.g. "NaN", "+inf", "all -inf".
        what: String,
    },
    /// The sequence would exceed the model's or the cache's maximum length.
    #[error("{0}")]
    Length(String),
    /// The model runtime (ONNX Runtime) failed; `code` is its error code name.
    #[error("backend error ({code}): {message}")]
    Backend {
        /// Error code name reported by the runtime (e.g. "InvalidArgument", "NoSuchFile").
        code: String,
        /// The runtime's message.
        message: String,
    },
    /// A requested execution provider (e.g. CUDA) could not be loaded.
    #[error("{0}")]
    Provider(String),
    /// A file or folder that does not exist (a model, a tokenizer, the ONNX Runtime library); the message names the
    /// path. Python: `ModelFileNotFoundError`.
    #[error("{0}")]
    NotFound(String),
    /// A file that exists but cannot be read (permissions, a folder where a file belongs, a failed read); the
    /// message names the path. Python: `ModelFileError`.
    #[error("{0}")]
    Io(String),
    /// A file that was read but is malformed: not valid JSON, a field of the wrong type, a tokenizer `tokenizers`
    /// cannot load, a model or chat template that breaks the contract specrt runs. Python: `ModelFileError`.
    #[error("{0}")]
    ModelFormat(String),
    /// Generation was cancelled by the caller (e.g. KeyboardInterrupt).
    #[error("generation cancelled")]
    Cancelled,
    /// A bug in specrt: an invariant did not hold. Please report it.
    #[error("internal error: {0}")]
    Internal(String),
}

impl SpecError {
    /// A refused setting: [`SpecError::Setting`] naming `field`.
    pub fn setting(field: impl Into<String>, message: impl Into<String>) -> Self {
        SpecError::Setting {
            field: field.into(),
            message: message.into(),
        }
    }

    /// The error of a failed file operation: [`SpecError::NotFound`] when `err` says the file does not exist, else
    /// [`SpecError::Io`]; the message is `"{context}: {err}"` (`context` names the path).
    pub fn io(context: impl std::fmt::Display, err: &std::io::Error) -> Self {
        let message = format!("{context}: {err}");
        if err.kind() == std::io::ErrorKind::NotFound {
            SpecError::NotFound(message)
        } else {
            SpecError::Io(message)
        }
    }

    /// The setting a [`SpecError::Setting`] names (`None` for every other variant).
    #[must_use]
    pub fn field(&self) -> Option<&str> {
        match self {
            SpecError::Setting { field, .. } => Some(field),
            _ => None,
        }
    }
}

/// `Result` with [`SpecError`].
pub type Result<T> = std::result::Result<T, SpecError>;
