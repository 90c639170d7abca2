"""A request's Decoder settings: sampling, stop, structured output (checked when the request is submitted), seeds."""

from __future__ import annotations

import secrets
from typing import Any

from specrt import _specrt
from specrt.errors import ConfigError, VocabError
from specrt.generate import check_request
from specrt.server import defaults
from specrt.server.context import ServerContext
from specrt.server.policy import CONSTRAINT_SETTINGS, BadFieldError, param_of
from specrt.server.structured import constraint_fields


def settings_of(ctx: ServerContext, req: Any, max_tokens: int) -> dict[str, Any]:
    """The Decoder settings of a request, all but the seed (each choice has its own)."""
    kw: dict[str, Any] = {
        "max_new_tokens": max_tokens,
        "num_speculative_tokens": (
            ctx.num_speculative_tokens if req.num_speculative_tokens is None else req.num_speculative_tokens
        ),
        "frequency_penalty": req.frequency_penalty,
        "presence_penalty": req.presence_penalty,
        "ignore_eos": req.ignore_eos,
        "coupled": req.coupled,
        "min_tokens": req.min_tokens,
        # Which text the driver gives each choice (vLLM's definitions; Rust's TextAssembler, one place).
        "skip_special_tokens": req.skip_special_tokens,
        "include_stop_str_in_output": req.include_stop_str_in_output,
    }
    proposer = ctx.proposer if req.proposer is None else req.proposer
    if proposer is None and kw["num_speculative_tokens"] == "auto" and ctx.decoder.draft_path is not None:
        # auto K with a draft model: the proposer is chosen per round too (a fixed K keeps the draft model)
        proposer = defaults.PROPOSER_WITH_DRAFT
    if proposer is not None:
        kw["proposer"] = proposer
    for name in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty"):
        value = getattr(req, name)
        if value is not None:
            kw[name] = value
    if req.stop is not None:
        kw["stop"] = [req.stop] if isinstance(req.stop, str) else list(req.stop)
    if req.stop_token_ids:
        try:  # checked now, as the prompt's ids are: a 400 naming the field before the request queues
            kw["stop_token_ids"] = _specrt.check_token_ids("stop_token_ids", req.stop_token_ids, ctx.decoder.vocab_size)
        except (VocabError, TypeError) as e:
            raise BadFieldError("stop_token_ids", str(e)) from e
    return kw


def constrain(ctx: ServerContext, req: Any, kw: dict[str, Any]) -> str | None:
    """Put the request's structured-output field into the Decoder settings ``kw`` (checked with the other settings
    when the request is submitted: the Rust resolver validates the schema, regex or grammar; :func:`refused_param`
    names the request field that carried it). Returns that field (None: the request has no constraint).

    Raises:
        BadFieldError: a tool's ``parameters`` that do not compile (:func:`check_tool_schemas`).
    """
    found = constraint_fields(req)
    if not found:
        return None
    param, arg, value = found[0]
    if param == "tool_choice":
        check_tool_schemas(ctx, req)
    kw[arg] = value
    return param


def refused_param(error: BaseException, req: Any) -> str | None:
    """The request field (OpenAI's ``param``) a setting refused at submission is about: :func:`param_of`, except that
    an error about the structured-output constraint names the request field that carried it (``response_format``,
    ``guided_json``, ``tool_choice``, ...), or the part of it the error names (``response_format.json_schema.name``)."""
    field = param_of(error, req)
    found = constraint_fields(req)
    if not found or not isinstance(error, ConfigError):
        return field
    param = found[0][0]
    if field is None or field.split(".", 1)[0] in CONSTRAINT_SETTINGS:
        return field if field is not None and field.startswith(param + ".") else param
    return field


def check_tool_schemas(ctx: ServerContext, req: Any) -> None:
    """Each tool's ``parameters`` compiled alone (the Rust resolver, strict as the function says), so a bad one is
    a 400 naming ``tools.<i>.function.parameters`` rather than the tool-call grammar built from them."""
    for i, tool in enumerate(req.tools):
        fn = tool.function
        if fn.parameters is None:
            continue
        where = f"tools.{i}.function.parameters"
        rf = {"type": "json_schema", "json_schema": {"name": fn.name, "schema": fn.parameters}}
        rf["json_schema"]["strict"] = bool(fn.strict)
        try:
            check_request("specrt serve", has_draft=ctx.decoder.draft_path is not None, response_format=rf)
        except ConfigError as e:
            raise BadFieldError(where, f"{where} (function {fn.name!r}): {e}") from e


def seeds(ctx: ServerContext, req: Any) -> list[int]:
    """Choice i's seed: the request's seed + i, or a fresh random seed + i (modulo 2**64): n choices are n
    different samples (also under coupled sampling), and choice i equals a request of n = 1 with that seed."""
    base = secrets.randbits(63) if req.seed is None else req.seed
    return [(base + i) % 2**64 for i in range(req.n)]
