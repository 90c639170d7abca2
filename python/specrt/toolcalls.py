"""Tool calls for ``specrt serve``: the Lark grammar that constrains a chat completion to the model's tool-call format,
and the parser that turns the constrained text back into OpenAI's ``tool_calls`` (whole, or as streamed deltas).

The format is Qwen2.5's and Hermes' (their chat templates teach it; specrt uses it for every model family, documented
in docs/openai-api.md): each call is

    <tool_call>
    {"name": "<function>", "arguments": {...}}
    </tool_call>

with calls separated by ``"\\n"``. The JSON is written compactly (``", "`` between items, ``": "`` after keys), as
every structured output of specrt is, so a JSON string never holds a raw newline and ``"}\\n"`` ends a call's
arguments unambiguously (the parser relies on it). In Qwen2.5's tokenizer ``<tool_call>`` and ``</tool_call>`` are
added, non-special tokens (ids 151657 / 151658): the grammar's string literals match their bytes, so the model's own
single token is allowed. The arguments are constrained by the function's ``parameters`` schema with llguidance's
``%json`` (strict when the function says ``strict: true``; otherwise schema keywords llguidance lacks are ignored).

The grammar is the only place the format is written; schema, regex and grammar checks stay in Rust
(``specrt_grammar``), which compiles and validates the grammar like any other ``grammar=`` request.
"""

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CALL_CLOSE", "CALL_OPEN", "ToolCallParser", "tool_call_grammar"]

#: How a call starts and ends (the model family's tool-call tags, with their newlines).
CALL_OPEN = "<tool_call>\n"
CALL_CLOSE = "\n</tool_call>"
#: Between two calls of one answer.
CALL_SEPARATOR = "\n"
_NAME_HEAD = '{"name": '
_ARGS_HEAD = ', "arguments": '
#: What follows a call's arguments: the call object's brace, then the closing tag.
_ARGS_END = "}" + CALL_CLOSE


def _lit(text: str) -> str:
    """A Lark string literal of ``text`` (llguidance's literals take JSON's escapes)."""
    return json.dumps(text, ensure_ascii=False)


def tool_call_grammar(tools: Sequence[dict[str, Any]], *, multiple: bool, text_allowed: bool = False) -> str:
    """The Lark grammar (llguidance's syntax, start rule ``start``) of an answer made of tool calls.

    Args:
        tools: OpenAI function definitions (``{"name", "parameters"?, "strict"?}``), at least one: each call is to one
            of them, its ``arguments`` valid against that function's ``parameters`` (absent: any JSON object).
        multiple: one or more calls (``"\\n"`` between them); False: exactly one.
        text_allowed: the answer may instead be plain text that does not begin with ``<tool_call>`` (tool_choice
            ``"auto"``): a lexeme ``TEXT`` of any text minus those starting with the tag, so the output is text or
            tool calls from its first byte on, never a tool call the parser would miss.

    Returns:
        The grammar text (compiled and checked by the Rust constraint compiler like a request's ``grammar``).
    """
    rules = []
    names = []
    for i, fn in enumerate(tools):
        schema = fn.get("parameters") or {"type": "object"}
        # Compact JSON (the parser relies on it); strict per function, as OpenAI's `strict`.
        options = {
            "item_separator": ", ",
            "key_separator": ": ",
            "whitespace_flexible": False,
            "lenient": not fn.get("strict", False),
        }
        schema = {**schema, "x-guidance": options}
        head = CALL_OPEN + _NAME_HEAD + json.dumps(fn["name"], ensure_ascii=False) + _ARGS_HEAD
        rules.append(f"call_{i}: {_lit(head)} args_{i} {_lit(_ARGS_END)}")
        rules.append(f"args_{i}: %json {json.dumps(schema, ensure_ascii=False)}")
        names.append(f"call_{i}")
    call = "call: " + " | ".join(names)
    calls = f"calls: call ({_lit(CALL_SEPARATOR)} call)*" if multiple else "calls: call"
    if text_allowed:
        # Any text (possibly empty) whose start is not the opening tag.
        start = ["start: calls | TEXT", f"TEXT: /(?s:.*)/ & ~/(?s:{CALL_OPEN.strip()}.*)/"]
    else:
        start = ["start: calls"]
    return "\n".join([*start, calls, call, *rules]) + "\n"


@dataclass
class ParsedCall:
    """One tool call as it is parsed: its id, function name and the arguments' JSON text so far."""

    id: str
    name: str
    arguments: str = ""
    done: bool = False


@dataclass
class ToolCallParser:
    """Constrained output text -> tool calls, fed piece by piece (the stream's text) or whole.

    ``feed(text)`` returns the tool-call deltas the new text completes, as OpenAI's streamed
    ``delta.tool_calls`` entries (the first of a call: ``index``, ``id``, ``type``, ``function.name`` and the argument
    text so far; later ones: ``index`` and an argument piece), and the plain text to pass on as ``content`` (with
    ``text_allowed``: all of it once the answer turned out to be text; "" while it may still become a call).
    A call's final ``}`` is held back until the next byte shows whether it closes the arguments or the call.
    """

    text_allowed: bool = False
    calls: list[ParsedCall] = field(default_factory=list)
    #: "undecided" (text_allowed, the start may still be the tag), "text", or "calls".
    mode: str = "calls"
    _buf: str = ""  # text not consumed yet
    _held: str = ""  # text held back while undecided

    def __post_init__(self) -> None:
        if self.text_allowed:
            self.mode = "undecided"

    def feed(self, text: str) -> tuple[list[dict[str, Any]], str]:
        """Deltas and content text of the next piece of output (see the class docstring)."""
        if self.mode == "text":
            return [], text
        if self.mode == "undecided":
            self._held += text
            tag = CALL_OPEN.strip()
            if self._held.startswith(tag):
                self.mode, text, self._held = "calls", self._held, ""
            elif tag.startswith(self._held):
                return [], ""  # still a prefix of the tag
            else:
                self.mode, out, self._held = "text", self._held, ""
                return [], out
        self._buf += text
        deltas: dict[int, dict[str, Any]] = {}
        while True:
            if not self.calls or self.calls[-1].done:
                head = (CALL_SEPARATOR if self.calls else "") + CALL_OPEN + _NAME_HEAD
                if not self._buf.startswith(head):
                    break
                try:
                    name, end = json.JSONDecoder().raw_decode(self._buf, len(head))
                except ValueError:
                    break  # the name is not complete yet
                if not self._buf.startswith(_ARGS_HEAD, end):
                    break
                call = ParsedCall(id=f"call_{uuid.uuid4().hex[:24]}", name=name)
                self.calls.append(call)
                self._buf = self._buf[end + len(_ARGS_HEAD) :]
                deltas[len(self.calls) - 1] = {
                    "index": len(self.calls) - 1,
                    "id": call.id,
                    "type": "function",
                    "function": {"name": name, "arguments": ""},
                }
                continue
            call = self.calls[-1]
            k = len(self.calls) - 1
            end = self._buf.find("}\n")
            if end >= 0 and self._buf.startswith(_ARGS_END, end):
                piece, call.done = self._buf[:end], True
                self._buf = self._buf[end + len(_ARGS_END) :]
            elif end >= 0:
                # The arguments are whole (compact JSON has no newline) but the closing tag is not all here: more
                # may come, or a stop string cut it. The arguments go out now, the brace and tag stay held back.
                piece, self._buf = self._buf[:end], self._buf[end:]
            else:
                cut = len(self._buf) - 1 if self._buf.endswith("}") else len(self._buf)
                piece, self._buf = self._buf[:cut], self._buf[cut:]
            call.arguments += piece
            if piece or k not in deltas:
                d = deltas.setdefault(k, {"index": k, "function": {"arguments": ""}})
                d["function"]["arguments"] += piece
            if not call.done:
                break
        return [d for d in deltas.values() if d.get("id") or d["function"]["arguments"]], ""

    def finish(self) -> tuple[list[dict[str, Any]], str]:
        """At the end of the output: an undecided start is text after all (returned as content)."""
        if self.mode == "undecided":
            self.mode, out, self._held = "text", self._held, ""
            return [], out
        return [], ""

    @property
    def complete(self) -> bool:
        """At least one call, every call closed and nothing left over (the output was tool calls)."""
        return bool(self.calls) and all(c.done for c in self.calls) and not self._buf.strip()

    def tool_calls(self) -> list[dict[str, Any]]:
        """OpenAI's ``message.tool_calls`` of the calls parsed (``arguments`` as the JSON text the model wrote)."""
        return [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in self.calls
        ]
