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

With ``tool_choice`` ``"auto"`` the answer is either plain text, or text (possibly none) followed by tool calls: the
first ``<tool_call>`` the model writes starts the calls, constrained from there on; the text before it is the
message's ``content`` (trailing whitespace dropped; ``null`` when none is left). Text after or between calls is not
allowed (not yet: the grammar ends the answer after the last call).

The grammar is the only place the format is written; schema, regex and grammar checks stay in Rust
(``specrt_grammar``), which compiles and validates the grammar like any other ``grammar=`` request.
"""

import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CALL_CLOSE", "CALL_OPEN", "ToolCallParser", "ToolsError", "check_tools", "tool_call_grammar"]

#: The tag that opens a call (Qwen2.5's added token 151657).
CALL_TAG = "<tool_call>"
#: How a call starts and ends (the model family's tool-call tags, with their newlines).
CALL_OPEN = CALL_TAG + "\n"
CALL_CLOSE = "\n</tool_call>"
#: Between two calls of one answer.
CALL_SEPARATOR = "\n"
_NAME_HEAD = '{"name": '
_ARGS_HEAD = ', "arguments": '
#: What follows a call's arguments: the call object's brace, then the closing tag.
_ARGS_END = "}" + CALL_CLOSE


#: A function name as OpenAI accepts it.
_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")


class ToolsError(ValueError):
    """A request's ``tools`` that cannot be used; ``param`` names the field (``tools.<i>.function.name``)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def check_tools(tools: Sequence[dict[str, Any]]) -> None:
    """Check OpenAI function definitions before they are rendered or compiled (the one place these rules live).

    Args:
        tools: ``{"name", "description"?, "parameters"?, "strict"?}`` per tool, in the request's order.

    Raises:
        ToolsError: a name that is not 1-64 of ``a-z A-Z 0-9 _ -`` (OpenAI's rule), a name given twice, or
            ``parameters`` whose ``type`` is not ``"object"`` (a call's arguments are a JSON object).
    """
    seen: dict[str, int] = {}
    for i, fn in enumerate(tools):
        name = fn.get("name")
        where = f"tools.{i}.function.name"
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ToolsError(
                where, f"{where} {name!r} is invalid (accepted: 1 to 64 letters, digits, underscores or dashes)"
            )
        if name in seen:
            raise ToolsError(where, f"{where} {name!r} is also tools.{seen[name]}.function.name (names must be unique)")
        seen[name] = i
        params = fn.get("parameters")
        if params is not None and params.get("type", "object") != "object":
            where = f"tools.{i}.function.parameters"
            raise ToolsError(
                where,
                f'{where}: type {params.get("type")!r} is invalid (accepted: "object"; a call\'s arguments are a '
                "JSON object)",
            )


def _lit(text: str) -> str:
    """A Lark string literal of ``text`` (llguidance's literals take JSON's escapes)."""
    return json.dumps(text, ensure_ascii=False)


def tool_call_grammar(tools: Sequence[dict[str, Any]], *, multiple: bool, text_allowed: bool = False) -> str:
    """The Lark grammar (llguidance's syntax, start rule ``start``) of an answer made of tool calls.

    Args:
        tools: OpenAI function definitions (``{"name", "parameters"?, "strict"?}``), at least one: each call is to one
            of them, its ``arguments`` valid against that function's ``parameters`` (absent: any JSON object).
        multiple: one or more calls (``"\\n"`` between them); False: exactly one.
        text_allowed: tool_choice ``"auto"``: the answer may be plain text that never writes ``<tool_call>``
            (lexeme ``TEXT``), or text up to and including its first ``<tool_call>`` (lexeme ``TEXT_TO_CALL``, which
            may be just the tag) followed by the calls; nothing may follow the last call. So every call the model
            starts is constrained from its tag on, and none is hidden in text the parser would pass on.

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
        body = "\n" + _NAME_HEAD + json.dumps(fn["name"], ensure_ascii=False) + _ARGS_HEAD
        rules.append(f"body_{i}: {_lit(body)} args_{i} {_lit(_ARGS_END)}")
        rules.append(f"args_{i}: %json {json.dumps(schema, ensure_ascii=False)}")
        names.append(f"body_{i}")
    more = f" ({_lit(CALL_SEPARATOR)} call)*" if multiple else ""
    rules = [f"body: {' | '.join(names)}", f"call: {_lit(CALL_TAG)} body", *rules]
    if text_allowed:
        tag = re.escape(CALL_TAG)
        start = [
            f"start: TEXT | TEXT_TO_CALL body{more}",
            # Any text without the tag; any text whose one tag is at its end.
            f"TEXT: /(?s:.*)/ & ~/(?s:.*{tag}.*)/",
            f"TEXT_TO_CALL: /(?s:.*){tag}/ & ~/(?s:.*{tag}.*{tag}.*)/",
        ]
    else:
        start = [f"start: call{more}"]
    return "\n".join([*start, *rules]) + "\n"


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
    text so far; later ones: ``index`` and an argument piece), and the text to pass on as ``content``. With
    ``text_allowed`` (tool_choice ``"auto"``) the text before the first ``<tool_call>`` is content: it goes out as it
    comes, except an end that may be the start of the tag and the whitespace before it, which wait for what follows
    (whitespace right before the tag is dropped, so streamed and whole content are the same text, ``content``).
    A call's final ``}`` is held back until the next byte shows whether it closes the arguments or the call.
    """

    text_allowed: bool = False
    calls: list[ParsedCall] = field(default_factory=list)
    #: The content passed on so far (text_allowed: the text before the first call).
    content: str = ""
    #: "text" (text_allowed, no tag yet) or "calls".
    mode: str = "calls"
    _buf: str = ""  # text not consumed yet
    _held: str = ""  # text held back in "text" mode

    def __post_init__(self) -> None:
        if self.text_allowed:
            self.mode = "text"

    def feed(self, text: str) -> tuple[list[dict[str, Any]], str]:
        """Deltas and content text of the next piece of output (see the class docstring)."""
        if self.mode == "text":
            self._held += text
            at = self._held.find(CALL_TAG)
            if at < 0:
                # Hold back an end that may grow into the tag, and the whitespace before it.
                keep = next((n for n in range(len(CALL_TAG) - 1, 0, -1) if self._held.endswith(CALL_TAG[:n])), 0)
                cut = len(self._held[: len(self._held) - keep].rstrip())
                out, self._held = self._held[:cut], self._held[cut:]
                self.content += out
                return [], out
            out = self._held[:at].rstrip()
            self.content += out
            self.mode, text, self._held = "calls", self._held[at:], ""
            return self._feed_calls(text)[0], out
        return self._feed_calls(text)

    def _feed_calls(self, text: str) -> tuple[list[dict[str, Any]], str]:
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
        """At the end of the output: text held back in "text" mode goes out as content after all."""
        out, self._held = self._held, ""
        self.content += out
        return [], out

    @property
    def complete(self) -> bool:
        """At least one call, every call closed and nothing left over (the output was tool calls)."""
        return bool(self.calls) and all(c.done for c in self.calls) and not self._buf.strip()

    def tool_calls(self) -> list[dict[str, Any]]:
        """OpenAI's ``message.tool_calls`` of the calls parsed (``arguments`` as the JSON text the model wrote)."""
        return [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in self.calls
        ]
