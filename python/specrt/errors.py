"""specrt's exceptions (defined in the Rust extension, one class per core ``SpecError`` variant).

``SpecrtError`` is the base of all of them; where a builtin base helps, a class also derives from it, so
``except ValueError`` catches bad arguments and ``except FileNotFoundError`` a missing model file:

- ``ConfigError(SpecrtError, ValueError)``: a setting outside its allowed range; attribute ``field``: the name of
  the request or decoder setting it refuses, as specrt names it (``"temperature"``, ``"max_new_tokens"``,
  ``"num_speculative_tokens"``, ``"stop"``, ``"prompt"``, ``"response_format.json_schema.name"``, ``"regex"``,
  ``"kwargs"`` for a chat template's keyword arguments, ...: the name its message starts with), or ``None`` when
  the error is not about one setting (a ``ConfigError`` raised in Python has ``None`` unless it sets ``field``).
  ``specrt serve`` turns it into an OpenAI error's ``param``.
- ``ShapeError(SpecrtError, ValueError)``: wrong dtype, shape or memory layout of an array.
- ``VocabError(SpecrtError, ValueError)``: a token id or vocabulary mismatch.
- ``NonFiniteLogitsError(SpecrtError, ValueError)``: NaN / +inf logits or an all -inf row;
  attributes ``row``, ``token``, ``value``, ``what``.
- ``SequenceLengthError(SpecrtError, ValueError)``: the sequence would exceed the maximum length.
- ``BackendError(SpecrtError, RuntimeError)``: ONNX Runtime failed; attributes ``code``, ``message``.
- ``ProviderError(SpecrtError, RuntimeError)``: an execution provider could not be loaded.
- ``ModelFileError(SpecrtError, OSError)``: a file that cannot be read or is malformed (Rust ``Io``,
  ``ModelFormat``), and ``ModelFileNotFoundError(ModelFileError, FileNotFoundError)``: one that does not exist
  (Rust ``NotFound``). The class follows the Rust variant, never the message's words.
- ``GenerationCancelled(SpecrtError)``: generation was cancelled.
- ``InternalError(SpecrtError, RuntimeError)``: a bug in specrt (including any Rust panic).
"""

from specrt._specrt import (
    BackendError,
    ConfigError,
    GenerationCancelled,
    InternalError,
    ModelFileError,
    ModelFileNotFoundError,
    NonFiniteLogitsError,
    ProviderError,
    SequenceLengthError,
    ShapeError,
    SpecrtError,
    VocabError,
)

__all__ = [
    "BackendError",
    "ConfigError",
    "GenerationCancelled",
    "InternalError",
    "ModelFileError",
    "ModelFileNotFoundError",
    "NonFiniteLogitsError",
    "ProviderError",
    "SequenceLengthError",
    "ShapeError",
    "SpecrtError",
    "VocabError",
]
