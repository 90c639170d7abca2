"""A converted model folder's text side, read without loading a session: for tools that encode prompts as
:meth:`specrt.Decoder.encode` does (benches that must hold no session of their own, prompt-length checks)."""

from __future__ import annotations

import os
from pathlib import Path

from specrt import _specrt
from specrt.errors import ModelFileNotFoundError

__all__ = ["folder_text"]


def folder_text(folder: str | os.PathLike[str]) -> tuple[_specrt.Tokenizer, _specrt.ChatTemplate | None]:
    """The tokenizer (``tokenizer.json``) and chat template (``chat_template.jinja`` with the folder's special-token
    strings; None without one) of converted model ``folder``: what :meth:`specrt.Decoder.encode` and
    :meth:`specrt.Decoder.apply_chat_template` use (the Decoder gets them from its Rust driver, which reads the same
    files).

    Raises:
        ModelFileNotFoundError: no ``tokenizer.json``.
        ModelFileError: a tokenizer or template file that cannot be read or compiled.
    """
    tokenizer = _specrt.Tokenizer.from_file(Path(folder) / "tokenizer.json")
    try:
        template = _specrt.ChatTemplate.from_folder(folder)
    except ModelFileNotFoundError:
        template = None
    return tokenizer, template
