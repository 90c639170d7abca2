"""specrt: lossless speculative decoding on ONNX Runtime.

The Rust core (``specrt._specrt``) holds sampling, verification and the decode loop; this package holds the
Python API (:class:`Decoder`), tokenization, model conversion (``specrt.convert``), the model cache
(``specrt.models``) and the CLI (``specrt.cli``).
"""

from specrt._specrt import __version__
from specrt.errors import ConfigError, ProviderError, SpecrtError
from specrt.generate import Decoder, GenerationResult, Stats, StreamChunk

__all__ = [
    "ConfigError",
    "Decoder",
    "GenerationResult",
    "ProviderError",
    "SpecrtError",
    "Stats",
    "StreamChunk",
    "__version__",
]
