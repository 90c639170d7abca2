"""``POST /v1/chat/completions``."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from fastapi import Request

from specrt.generate import GenerationResult
from specrt.server.context import ServerContext, parsed, rejected
from specrt.server.generation import Choice, reply, submit_all, token_bytes, token_text, whole_text
from specrt.server.policy import BadFieldError, check_policy
from specrt.server.prompts import chat_ids
from specrt.server.settings import constrain, settings_of
from specrt.server.wire import FINISH
from specrt.toolcalls import ToolCallParser


async def chat_completions(ctx: ServerContext, request: Request) -> Any:
    endpoint = "chat_completions"
    req = await parsed(ctx, request, "chat", endpoint)
    if not isinstance(req, ctx.schemas["chat"]):
        return req  # the schema's 400
    if req.top_logprobs is not None and not req.logprobs:
        return rejected(ctx, endpoint, "top_logprobs: needs logprobs: true", "top_logprobs")
    field = "max_completion_tokens" if req.max_completion_tokens else "max_tokens" if req.max_tokens else None
    max_tokens = req.max_completion_tokens or req.max_tokens or ctx.default_max_tokens

    def prepare() -> tuple[dict[str, Any], str | None, list[int]]:
        check_policy(req, chat=True)
        kw = settings_of(ctx, req, max_tokens)
        constrained_by = constrain(ctx, req, kw)
        return kw, constrained_by, chat_ids(ctx, req)

    try:  # off the event loop: compiling a constraint, the chat template and tokenizing take a while
        kw, constrained_by, ids = await asyncio.to_thread(prepare)
    except BadFieldError as e:
        return rejected(ctx, endpoint, str(e), e.param)
    # tool_choice required / a function / auto: the output is parsed into tool calls.
    tool_mode = None if constrained_by != "tool_choice" else "auto" if req.tool_choice == "auto" else "forced"
    kw["logprobs"] = bool(req.logprobs)
    kw["top_logprobs"] = req.top_logprobs or 0  # from the target's verification row of each position
    # Off the event loop too: submitting resolves and checks each choice (a constraint's schema, regex or grammar).
    choices = await asyncio.to_thread(submit_all, ctx, endpoint, req, kw, [ids], "messages", field)
    if not isinstance(choices, list):
        return choices
    if tool_mode is not None:
        for c in choices:
            c.tools = ToolCallParser(text_allowed=tool_mode == "auto")
    rid, created = f"chatcmpl-{req.request_id or uuid.uuid4().hex}", int(time.time())

    def entry(i: int, lp: float) -> dict[str, Any]:
        return {
            "token": token_text(ctx, [i], req.return_tokens_as_token_ids)[0],
            "logprob": lp,
            "bytes": token_bytes(ctx, i),
        }

    def logprobs_of(ids: list[int], lps: list[float], tops: list[list[tuple[int, float]]]) -> dict[str, Any] | None:
        if not req.logprobs:
            return None
        tops = tops or [[] for _ in ids]
        return {
            "content": [
                {**entry(i, lp), "top_logprobs": [entry(a, alp) for a, alp in alts]}
                for i, lp, alts in zip(ids, lps, tops, strict=True)
            ]
        }

    def event_of(
        c: Choice, text: str, ids: list[int], lps: list[float], tops: list, finish: str | None
    ) -> dict[str, Any]:
        calls: list[dict[str, Any]] = []
        if c.tools is not None:  # tool calls: OpenAI's delta.tool_calls (index, id, name, then argument pieces)
            calls, text = c.tools.feed(text)
            if finish is not None:
                text += c.tools.finish()[1]
                if finish == "stop" and c.tools.complete:
                    finish = "tool_calls"
        if c.first:
            delta: dict[str, Any] = {"role": "assistant", "content": text}
            c.first = False
        else:
            delta = {"content": text} if text or (finish is None and not calls) else {}
        if calls:
            delta["tool_calls"] = calls
        choice = {
            "index": c.index,
            "delta": delta,
            "logprobs": logprobs_of(ids, lps, tops),
            "finish_reason": finish,
        }
        return {
            "id": rid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": ctx.model_name,
            "choices": [choice],
        }

    def final_of(c: Choice, r: GenerationResult) -> dict[str, Any]:
        text = whole_text(c, r)
        out: dict[str, Any] = {
            "message": {"role": "assistant", "content": text},
            "logprobs": logprobs_of(r.token_ids, r.logprobs, r.top_logprobs),
        }
        if c.tools is not None:
            c.tools.feed(text)
            c.tools.finish()
            # The answer is tool calls once one has begun (a stream has sent it as tool-call deltas already): a
            # call cut short by max_tokens or a stop string stays a call with the arguments written so far, as
            # OpenAI returns one cut by max_tokens; finish_reason "tool_calls" only when every call is complete.
            if c.tools.calls:
                out["message"] = {
                    "role": "assistant",
                    "content": c.tools.content or None,  # tool_choice auto: the text before the first call
                    "tool_calls": c.tools.tool_calls(),
                }
                if c.tools.complete and FINISH.get(r.finish_reason) == "stop":
                    out["finish_reason"] = "tool_calls"
        return out

    head = {"id": rid, "object": "chat.completion", "created": created}
    return await reply(ctx, request, endpoint, req, choices, head, "chat.completion.chunk", event_of, final_of)
