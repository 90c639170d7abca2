"""Structured output over HTTP: OpenAI's ``response_format``, vLLM's ``guided_*`` and ``structured_outputs``, and
``tool_choice`` (a tool-call grammar, :mod:`specrt.toolcalls`), translated to the Decoder's one constraint."""

from __future__ import annotations

from typing import Any

from specrt.server.policy import STRUCTURAL_TAG, BadFieldError, shown

#: vLLM's ``guided_*`` fields -> the Decoder's constraint arguments (docs/openai-api.md).
GUIDED = {
    "guided_json": "json_schema",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
}


#: vLLM's ``structured_outputs`` keys -> the Decoder's constraint arguments (``json_object`` true -> response_format).
STRUCTURED_OUTPUTS = {"json": "json_schema", "regex": "regex", "choice": "choice", "grammar": "grammar"}


def constraint_fields(req: Any) -> list[tuple[str, str, Any]]:
    """The structured-output fields a request sets, as (request field, Decoder argument, value): OpenAI's
    ``response_format`` (not ``text``), vLLM's ``guided_*`` and ``structured_outputs`` keys, and ``tools`` with
    ``tool_choice`` ``"required"``, ``"auto"`` or a named function (a tool-call grammar, :mod:`specrt.toolcalls`).
    The values are passed on as they are: the Rust resolver checks them (one definition)."""
    from specrt.toolcalls import ToolsError, check_tools, tool_call_grammar

    found: list[tuple[str, str, Any]] = []
    rf = getattr(req, "response_format", None)
    if rf is not None and rf.type != "text":
        found.append(("response_format", "response_format", rf.model_dump(exclude_none=True)))
    for name, arg in GUIDED.items():
        value = getattr(req, name, None)
        if value is not None:
            found.append((name, arg, value))
    for key, value in (getattr(req, "structured_outputs", None) or {}).items():
        where = f"structured_outputs.{key}"
        if value is None:
            continue
        if key == "json_object":
            if value is not True:
                raise BadFieldError(where, f"{where} {shown(value)} is invalid (accepted: true or null)")
            found.append((where, "response_format", {"type": "json_object"}))
        elif key in STRUCTURED_OUTPUTS:
            found.append((where, STRUCTURED_OUTPUTS[key], value))
        else:
            why = STRUCTURAL_TAG if key == "structural_tag" else "not a structured-output key specrt takes"
            raise BadFieldError(
                where,
                f"{where} is not supported: {why} (accepted keys: {', '.join([*STRUCTURED_OUTPUTS, 'json_object'])})",
            )
    choice = getattr(req, "tool_choice", None)
    tools = getattr(req, "tools", None)
    if tools:
        try:
            check_tools([t.function.model_dump(exclude_none=True) for t in tools])
        except ToolsError as e:
            raise BadFieldError(e.param, str(e)) from None
    if choice is not None and choice != "none":
        if not tools:
            raise BadFieldError("tool_choice", f"tool_choice {shown(choice)} needs tools (the request has none)")
        functions = [t.function.model_dump(exclude_none=True) for t in tools]
        if isinstance(choice, str):
            multiple = req.parallel_tool_calls is not False
            grammar = tool_call_grammar(functions, multiple=multiple, text_allowed=choice == "auto")
        else:
            named = [f for f in functions if f["name"] == choice.function.name]
            if not named:
                raise BadFieldError(
                    "tool_choice",
                    f"tool_choice names the function {choice.function.name!r}, which is not among the tools "
                    f"(accepted: {', '.join(repr(f['name']) for f in functions)})",
                )
            grammar = tool_call_grammar(named[:1], multiple=False)
        found.append(("tool_choice", "grammar", grammar))
    if len(found) > 1:
        raise BadFieldError(
            found[1][0],
            f"{found[1][0]}: structured output takes one constraint per request: response_format (json_object / "
            "json_schema), a guided_* field, a structured_outputs key, or tool_choice (required / auto / a function); "
            "got " + " and ".join(f for f, _, _ in found),
        )
    return found
