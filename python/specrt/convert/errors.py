"""Exceptions raised by model conversion and the model cache.

Every error specrt raises on purpose derives from ``SpecrtError``. The conversion errors are also subclasses of
the matching built-in (``ValueError`` for things the caller asked for that cannot be done, ``OSError`` for bad or
missing files), so generic ``except`` clauses keep working.

``specrt.errors`` (``SpecrtError``, ``ConfigError``, ``ModelFileError``) is the project-wide home of the base classes;
until it exists this module defines stand-ins with the same names and bases.
"""

from __future__ import annotations

try:  # pragma: no cover - depends on which modules exist in the checkout
    from specrt.errors import ConfigError, ModelFileError, SpecrtError
except ImportError:  # pragma: no cover

    class SpecrtError(Exception):  # type: ignore[no-redef]
        """Base class of every error specrt raises on purpose."""

    class ConfigError(SpecrtError, ValueError):  # type: ignore[no-redef]
        """A request that cannot be satisfied (unsupported option, unknown name)."""

    class ModelFileError(SpecrtError, OSError):  # type: ignore[no-redef]
        """A model file or folder that is missing, unreadable or malformed."""


__all__ = [
    "ConfigError",
    "ConversionError",
    "GGUFFormatError",
    "ModelFileError",
    "OutputExistsError",
    "SpecrtError",
    "TokenizerMetadataError",
    "UnsupportedArchitectureError",
    "UnsupportedModelError",
]


class ConversionError(SpecrtError):
    """Base class of every error raised while converting a model."""


class UnsupportedArchitectureError(ConversionError, ConfigError):
    """The GGUF's ``general.architecture`` is not one the converter knows.

    Attributes:
        architecture: the name found in the file.
        supported: the names the converter supports.
    """

    def __init__(self, architecture: str, supported: list[str]) -> None:
        self.architecture = architecture
        self.supported = list(supported)
        super().__init__(
            f"unsupported architecture {architecture!r}; supported architectures: {', '.join(self.supported)}"
        )


class UnsupportedModelError(ConversionError, ConfigError):
    """The architecture is known but this model uses a feature the converter does not implement
    (a RoPE scaling variant, partial rotary, an unknown tensor type, a dtype not yet supported)."""


class GGUFFormatError(ConversionError, ModelFileError):
    """The source file is not a readable GGUF: truncated, corrupt, or missing required keys or tensors."""


class TokenizerMetadataError(ConversionError, ModelFileError):
    """The GGUF lacks the tokenizer metadata needed to build ``tokenizer.json``, or uses a tokenizer type or
    pre-tokenizer the converter does not support."""


class OutputExistsError(ConversionError, FileExistsError):
    """The output folder already exists and ``force=True`` was not given."""
