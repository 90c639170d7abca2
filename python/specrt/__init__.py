"""specrt: lossless speculative decoding on ONNX Runtime.

The Rust core (``specrt._specrt``) holds sampling, verification and the decode loop; this package holds the
Python API, tokenization, model conversion and the CLI.
"""

from specrt._specrt import __version__

__all__ = ["__version__"]
