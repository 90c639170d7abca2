"""Argument types and defaults shared by the command lines (``specrt`` in :mod:`specrt.cli`, ``specrt bench`` in
:mod:`specrt.bench.cli`): one parser of K values, the request defaults read from the Rust resolver. Imports no CLI
module, so neither CLI imports the other for them."""

from __future__ import annotations

import argparse

from specrt import _specrt

__all__ = ["K_RANGE", "REQUEST_DEFAULTS", "k_arg", "positive_int"]

#: The request defaults of the Rust resolver (``GenerationRequest::default()``, the one definition).
REQUEST_DEFAULTS = _specrt.request_defaults()
#: The range of K as messages word it (``specrt_core::verify::MAX_DRAFT_TOKENS``).
K_RANGE = f"0..{_specrt.MAX_DRAFT_TOKENS}"


def k_arg(value: str) -> int | str:
    """``--num-speculative-tokens``: an integer or ``"auto"`` (the range is checked by the Rust resolver).

    Raises:
        argparse.ArgumentTypeError: neither an integer nor ``"auto"``.
    """
    if value == "auto":
        return value
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer {K_RANGE} or 'auto'") from None


def positive_int(value: str) -> int:
    """An integer >= 1.

    Raises:
        argparse.ArgumentTypeError: anything else.
    """
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a positive integer")
    return n
