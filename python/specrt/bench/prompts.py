"""The benchmark prompts: :class:`Prompt` and :func:`load_prompts` (the package's ``specrt/bench/prompts.json`` by
default; a checkout's ``benches/prompts.json`` is a symlink to it)."""

from __future__ import annotations

import importlib.resources
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Prompt:
    """One benchmark prompt.

    Attributes:
        id: short unique name.
        kind: ``"code_completion"``, ``"chat_answer"``, ``"code_editing"`` or ``"prose"``.
        prompt: raw text (completion without a chat template), or None.
        messages: chat messages rendered with the model's chat template, or None (exactly one of the two is set).
        peer: the letter of the prompt in ``shared/notes/peers.md`` (``"a"`` .. ``"d"``), or None.
        note: free text (what the prompt is, expected token count).
    """

    id: str
    kind: str
    prompt: str | None = None
    messages: tuple[dict[str, str], ...] | None = None
    peer: str | None = None
    note: str = ""

    def generate_kwargs(self) -> dict[str, Any]:
        """``prompt=`` or ``messages=`` for :meth:`specrt.Decoder.generate`."""
        if self.messages is not None:
            return {"messages": [dict(m) for m in self.messages]}
        return {"prompt": self.prompt}


def default_prompts_path() -> Path:
    """The prompt file shipped in the package (``specrt/bench/prompts.json``), in site-packages or a checkout alike.

    A checkout's ``benches/prompts.json`` is a relative symlink to this file, for the scripts in ``benches/``: one copy.
    """
    return Path(str(importlib.resources.files("specrt.bench") / "prompts.json"))


def load_prompts(
    path: str | os.PathLike[str] | None = None, *, set_name: str | None = None, ids: Sequence[str] | None = None
) -> list[Prompt]:
    """Read a prompt file and select prompts.

    The file is ``{"sets": {name: [id, ...]}, "prompts": [{"id", "kind", "prompt" | "messages", "peer"?, "note"?}]}``.

    Args:
        path: the JSON file (default :func:`default_prompts_path`).
        set_name: a named set (``"main"``, ``"sweep"``, ``"quick"``, ``"peers"``, ...) or ``"all"``.
        ids: explicit prompt ids (overrides ``set_name``), in the order given.

    Returns:
        The selected prompts, in set order.

    Raises:
        FileNotFoundError: no such file.
        ValueError: malformed file, unknown set or id (the valid ones are named).
    """
    p = Path(path) if path is not None else default_prompts_path()
    data = json.loads(p.read_text(encoding="utf-8"))
    prompts: dict[str, Prompt] = {}
    for raw in data["prompts"]:
        has_prompt, has_messages = raw.get("prompt") is not None, raw.get("messages") is not None
        if has_prompt == has_messages:
            raise ValueError(f"{p}: prompt {raw.get('id')!r} needs exactly one of 'prompt' and 'messages'")
        msgs = tuple({"role": m["role"], "content": m["content"]} for m in raw["messages"]) if has_messages else None
        prompts[raw["id"]] = Prompt(
            id=raw["id"],
            kind=raw["kind"],
            prompt=raw.get("prompt"),
            messages=msgs,
            peer=raw.get("peer"),
            note=raw.get("note", ""),
        )
    sets: dict[str, list[str]] = data.get("sets", {})
    if ids:
        chosen = list(ids)
    elif set_name is None or set_name == "all":
        chosen = list(prompts)
    elif set_name in sets:
        chosen = sets[set_name]
    else:
        raise ValueError(f"prompt set {set_name!r} is unknown (expected one of: all, {', '.join(sets)})")
    unknown = [i for i in chosen if i not in prompts]
    if unknown:
        raise ValueError(f"prompt ids {unknown} are not in {p} (known: {', '.join(prompts)})")
    return [prompts[i] for i in chosen]
