//! Python wrappers of `specrt_text`: `Tokenizer` (tokenizer.json), `Encoding`, `TextAssembler` and `TextDelta`.
//! Convert, call the core, convert back.

use std::collections::HashMap;
use std::path::PathBuf;

use pyo3::prelude::*;
use specrt_text::detok::{RoundEnd, TextAssembler, TextDelta, TextOptions};
use specrt_text::tokenizer::Tokenizer;

use crate::errors::{run_kernel, to_pyerr};

/// A model folder's ``tokenizer.json`` (the ``tokenizers`` crate, the same version as the Python package, so ids and
/// text are identical). Safe to share between threads.
#[pyclass(module = "specrt._specrt", name = "Tokenizer", frozen)]
pub struct PyTokenizer(pub Tokenizer);

/// The ids of one encoded text (the part of ``tokenizers.Encoding`` specrt uses).
#[pyclass(module = "specrt._specrt", name = "Encoding", frozen, get_all)]
pub struct PyEncoding {
    /// Token ids, ``list[int]`` (each ``0 <= id < vocab size``).
    ids: Vec<u32>,
}

#[pymethods]
impl PyEncoding {
    fn __len__(&self) -> usize {
        self.ids.len()
    }

    fn __repr__(&self) -> String {
        format!("Encoding(n_ids={})", self.ids.len())
    }
}

#[pymethods]
impl PyTokenizer {
    /// Load a ``tokenizer.json``.
    ///
    /// Args:
    ///     path: the file (``str`` or ``os.PathLike``).
    ///
    /// Returns:
    ///     The tokenizer.
    ///
    /// Raises:
    ///     ModelFileNotFoundError: the file does not exist (also a ``FileNotFoundError``).
    ///     ModelFileError: it cannot be read, or ``tokenizers`` cannot parse it (the path named).
    #[staticmethod]
    #[pyo3(text_signature = "(path)")]
    fn from_file(py: Python<'_>, path: PathBuf) -> PyResult<Self> {
        run_kernel(py, || Tokenizer::from_file(&path)).map(Self)
    }

    /// Parse the JSON text of a ``tokenizer.json``.
    ///
    /// Args:
    ///     json: the file's text.
    ///
    /// Raises:
    ///     ModelFileError: ``tokenizers`` cannot parse it.
    #[staticmethod]
    #[pyo3(text_signature = "(json)")]
    fn from_str(py: Python<'_>, json: &str) -> PyResult<Self> {
        run_kernel(py, || Tokenizer::from_json(json, "<json>")).map(Self)
    }

    /// Token ids of ``text``.
    ///
    /// Args:
    ///     text: the text (``str``).
    ///     add_special_tokens: let the post-processor add BOS / EOS where the model wants them (special tokens
    ///         written in the text are recognised either way).
    ///
    /// Returns:
    ///     An ``Encoding`` (``.ids``: ``list[int]``).
    #[pyo3(signature = (text, add_special_tokens=true), text_signature = "(self, text, add_special_tokens=True)")]
    fn encode(&self, py: Python<'_>, text: &str, add_special_tokens: bool) -> PyResult<PyEncoding> {
        let ids = run_kernel(py, || self.0.encode(text, add_special_tokens))?;
        Ok(PyEncoding { ids })
    }

    /// The text of ``ids``.
    ///
    /// Args:
    ///     ids: token ids (``Sequence[int]``, each ``0 <= id < 2**32``; ids outside the vocabulary are left out, as
    ///         ``tokenizers`` does).
    ///     skip_special_tokens: leave out added tokens marked special.
    ///
    /// Returns:
    ///     ``str``; an incomplete UTF-8 sequence decodes to U+FFFD.
    ///
    /// Raises:
    ///     OverflowError: an id that is negative or >= 2**32.
    #[pyo3(signature = (ids, skip_special_tokens=true), text_signature = "(self, ids, skip_special_tokens=True)")]
    fn decode(&self, py: Python<'_>, ids: Vec<u32>, skip_special_tokens: bool) -> PyResult<String> {
        run_kernel(py, || self.0.decode(&ids, skip_special_tokens))
    }

    /// Number of ids (``int``; ``with_added_tokens``: count the added tokens, as the logits width does).
    #[pyo3(name = "get_vocab_size", signature = (with_added_tokens=true), text_signature = "(self, with_added_tokens=True)")]
    fn vocab_size_with(&self, with_added_tokens: bool) -> usize {
        self.0.vocab_size_with(with_added_tokens)
    }

    /// Token string -> id (``dict[str, int]``; ``with_added_tokens``: include the added tokens).
    #[pyo3(signature = (with_added_tokens=true), text_signature = "(self, with_added_tokens=True)")]
    fn get_vocab(&self, with_added_tokens: bool) -> HashMap<String, u32> {
        self.0.vocab(with_added_tokens)
    }

    /// The token string of ``id`` (an added token's content, else the model's piece such as ``"Ġhello"``), or
    /// None outside the vocabulary.
    #[pyo3(text_signature = "(self, id)")]
    fn id_to_token(&self, id: u32) -> Option<String> {
        self.0.id_to_token(id)
    }

    /// The id of the token string ``token``, or None.
    #[pyo3(text_signature = "(self, token)")]
    fn token_to_id(&self, token: &str) -> Option<u32> {
        self.0.token_to_id(token)
    }

    /// Ids of the added tokens marked special, ascending (``list[int]``): what ``skip_special_tokens`` leaves out.
    #[getter]
    fn special_ids(&self) -> Vec<u32> {
        self.0.special_ids().to_vec()
    }

    /// The ``decoder.type`` of the ``tokenizer.json`` (``"ByteLevel"``, ``"Metaspace"``, ...), or None.
    #[getter]
    fn decoder_type(&self) -> Option<&'static str> {
        self.0.decoder_type()
    }

    fn __repr__(&self) -> String {
        format!(
            "Tokenizer({:?}, vocab_size={}, decoder_type={})",
            self.0.origin(),
            self.0.vocab_size(),
            self.0
                .decoder_type()
                .map_or("None".into(), |d| format!("{d:?}"))
        )
    }
}

/// One request's streaming text: each round's committed token ids in, the text to emit out (incremental
/// detokenization, stop strings across token boundaries, hold-back of an incomplete UTF-8 sequence and of a
/// partial stop string), as vLLM's ``skip_special_tokens`` and ``include_stop_str_in_output`` define it. See
/// ``specrt_text::detok``.
#[pyclass(module = "specrt._specrt", name = "TextAssembler")]
pub struct PyTextAssembler(TextAssembler);

/// What one round adds to the text.
#[pyclass(module = "specrt._specrt", name = "TextDelta", frozen, get_all)]
pub struct PyTextDelta {
    /// Text to emit now (``str``).
    text: String,
    /// With a stop string found this round: the tokens to keep (``int``, pass it to the engine's ``stop_at``);
    /// else None.
    n_keep: Option<usize>,
    /// With a stop string found this round: its index in the stops given; else None.
    stop_index: Option<usize>,
    /// Whether the text is complete (``bool``): feed no more.
    finished: bool,
}

impl From<TextDelta> for PyTextDelta {
    fn from(d: TextDelta) -> Self {
        Self {
            text: d.text,
            n_keep: d.stop.as_ref().map(|s| s.n_keep),
            stop_index: d.stop.as_ref().map(|s| s.index),
            finished: d.finished,
        }
    }
}

#[pymethods]
impl PyTextDelta {
    fn __repr__(&self) -> String {
        let opt = |v: Option<usize>| v.map_or("None".into(), |v| v.to_string());
        format!(
            "TextDelta(text={:?}, n_keep={}, stop_index={}, finished={})",
            self.text,
            opt(self.n_keep),
            opt(self.stop_index),
            py_bool(self.finished)
        )
    }
}

#[pymethods]
impl PyTextAssembler {
    /// An assembler for one request.
    ///
    /// Args:
    ///     tokenizer: the model's ``Tokenizer``.
    ///     stops: stop strings (``Sequence[str]``, non-empty strings), matched in the text without special tokens
    ///         whatever ``skip_special_tokens`` says (where the engine stops).
    ///     skip_special_tokens: vLLM's: leave special tokens' text out. With False the text keeps it and is cut
    ///         before the first stop string occurring in it.
    ///     include_stop_str_in_output: vLLM's: keep the stop string that ended the generation, or the text of the
    ///         EOS / stop-token-id token that ended it; without it both are left out.
    ///
    /// Raises:
    ///     ConfigError: an empty stop string.
    #[new]
    #[pyo3(
        signature = (tokenizer, stops, *, skip_special_tokens=true, include_stop_str_in_output=false),
        text_signature = "(tokenizer, stops, *, skip_special_tokens=True, include_stop_str_in_output=False)"
    )]
    fn new(
        tokenizer: &PyTokenizer,
        stops: Vec<String>,
        skip_special_tokens: bool,
        include_stop_str_in_output: bool,
    ) -> PyResult<Self> {
        let options = TextOptions {
            skip_special_tokens,
            include_stop_str_in_output,
        };
        TextAssembler::new(tokenizer.0.clone(), stops, options)
            .map(Self)
            .map_err(to_pyerr)
    }

    /// Add one round's committed tokens.
    ///
    /// Args:
    ///     tokens: the ids the round committed (``Sequence[int]``).
    ///     finish_reason: the engine's for this round: None (going on), ``"eos"`` or ``"stop"`` (ended on that
    ///         token), ``"length"``.
    ///
    /// Returns:
    ///     ``TextDelta``: the text to emit, ``n_keep`` when a stop string was found (the assembler's own tokens are
    ///     then cut to it; the caller cuts the engine's with ``stop_at(n_keep)``), and whether the text is complete.
    ///
    /// Raises:
    ///     ConfigError: called after the text finished, or an unknown ``finish_reason``.
    ///     OverflowError: an id that is negative or >= 2**32.
    #[pyo3(text_signature = "(self, tokens, finish_reason)")]
    fn feed(
        &mut self,
        py: Python<'_>,
        tokens: Vec<u32>,
        finish_reason: Option<&str>,
    ) -> PyResult<PyTextDelta> {
        let end = RoundEnd::from_finish_reason(finish_reason).map_err(to_pyerr)?;
        let inner = &mut self.0;
        run_kernel(py, || inner.feed(&tokens, end)).map(PyTextDelta::from)
    }

    /// The text so far (``str``; once finished the whole text, cut at the stop string).
    #[getter]
    fn text(&self) -> String {
        self.0.text().to_owned()
    }

    /// The tokens fed so far, cut to ``n_keep`` after a stop string (``list[int]``).
    #[getter]
    fn tokens(&self) -> Vec<u32> {
        self.0.tokens().to_vec()
    }

    /// Whether the text is complete (``bool``).
    #[getter]
    fn finished(&self) -> bool {
        self.0.finished()
    }

    /// Whether the text is kept incrementally (byte-level tokenizers) rather than decoded whole each round.
    #[getter]
    fn incremental(&self) -> bool {
        self.0.is_incremental()
    }

    fn __repr__(&self) -> String {
        format!(
            "TextAssembler(n_tokens={}, finished={}, incremental={})",
            self.0.tokens().len(),
            py_bool(self.0.finished()),
            py_bool(self.0.is_incremental())
        )
    }
}

/// `True` / `False`, as Python prints a bool.
fn py_bool(b: bool) -> &'static str {
    if b {
        "True"
    } else {
        "False"
    }
}
