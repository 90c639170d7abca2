"""What the ``dtype="gguf"`` tests share (tests/convert/test_convert_gguf_blocks.py, tests/engine/test_gguf_parity.py):
the skip for a build without specrt's operators. The SmolLM2 GGUF fixture (``smollm2_gguf_folder``) is in
conftest.py."""

from __future__ import annotations

import pytest


def _has_gguf_ops() -> bool:
    from specrt import _specrt

    return hasattr(_specrt, "gguf_matmul")


needs_gguf_ops = pytest.mark.skipif(
    not _has_gguf_ops(),
    reason="specrt's ai.specrt::GgufMatMul / GgufGather operators have not landed (no specrt._specrt.gguf_matmul)",
)
