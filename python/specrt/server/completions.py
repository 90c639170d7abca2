"""``POST /v1/completions``."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from fastapi import Request

from specrt.generate import GenerationResult, StreamChunk
from specrt.server.context import ServerContext, parsed, rejected
from specrt.server.defaults import COMPLETIONS_MAX_TOKENS
from specrt.server.generation import Choice, offsets, reply, submit_all, token_text, whole_text
from specrt.server.policy import BadFieldError, check_policy
from specrt.server.prompts import completion_prompts
from specrt.server.settings import constrain, settings_of


async def completions(ctx: ServerContext, request: Request) -> Any:
    endpoint = "completions"
    req = await parsed(ctx, request, "completion", endpoint)
    if not isinstance(req, ctx.schemas["completion"]):
        return req  # the schema's 400
    score_only = req.max_tokens == 0

    def prepare() -> tuple[dict[str, Any], list[list[int]], list[str]]:
        check_policy(req, chat=False)
        if score_only and not (req.echo and not req.stream):
            raise BadFieldError(
                "max_tokens",
                "max_tokens 0 scores the prompt only: it needs echo true and stream false (accepted otherwise: "
                "max_tokens >= 1)",
            )
        # OpenAI's default (16 tokens) is a request setting like any other: too long a prompt for it is an error.
        # Scoring only generates one token (the engine always does), which is neither returned nor counted.
        kw = settings_of(ctx, req, COMPLETIONS_MAX_TOKENS if req.max_tokens is None else max(req.max_tokens, 1))
        constrain(ctx, req, kw)
        return kw, *completion_prompts(ctx, req)

    try:  # off the event loop: compiling a constraint and tokenizing long prompts take a while
        kw, prompts, texts = await asyncio.to_thread(prepare)
    except BadFieldError as e:
        return rejected(ctx, endpoint, str(e), e.param)
    # Log-probabilities only when asked for: without them a greedy request reads only argmax ids.
    want_logprobs = req.logprobs is not None
    kw["logprobs"] = want_logprobs
    # OpenAI's legacy `logprobs: N`: N alternatives per token (0 = the chosen tokens only), from the target's
    # verification row of each position; with `echo`, the prompt's from the prefill pass too.
    kw["top_logprobs"] = req.logprobs or 0
    if req.echo and want_logprobs:
        kw["prompt_logprobs"] = req.logprobs
    # Off the event loop too: submitting resolves and checks each choice (a constraint's schema, regex or grammar).
    choices = await asyncio.to_thread(
        submit_all, ctx, endpoint, req, kw, prompts, "prompt", "max_tokens", texts if req.echo else None
    )
    if not isinstance(choices, list):
        return choices
    for c in choices:
        c.score_only = score_only
    rid, created = f"cmpl-{req.request_id or uuid.uuid4().hex}", int(time.time())

    def alternatives(tops: list[list[tuple[int, float]]]) -> list[dict[str, float] | None] | None:
        """OpenAI's legacy top_logprobs: per token {token text: log-probability} (None with logprobs 0); of
        alternatives with equal texts the most likely one's value is kept."""
        if not req.logprobs:
            return None
        out = []
        for alts in tops:
            d: dict[str, float] = {}
            for text, (_, lp) in zip(token_text(ctx, [i for i, _ in alts]), alts, strict=True):
                d.setdefault(text, lp)
            out.append(d)
        return out

    def logprobs_of(
        c: Choice, ids: list[int], lps: list[float], tops: list[list[tuple[int, float]]]
    ) -> dict[str, Any] | None:
        start = len(c.seen)
        c.seen.extend(ids)  # text offsets count from the start of the choice's text
        if not want_logprobs:
            return None
        offset = len(c.echo)  # the generated text starts after the echoed prompt
        return {
            "tokens": token_text(ctx, ids, req.return_tokens_as_token_ids),
            "token_logprobs": lps,
            "top_logprobs": alternatives(tops),
            "text_offset": [offset + o for o in offsets(ctx, c.seen, start)],
        }

    def prompt_logprobs_of(c: Choice, r: GenerationResult | StreamChunk) -> dict[str, Any]:
        """The echoed prompt's entries (first token: None, as OpenAI's), from the prefill pass (a result, or
        the first chunk of a stream)."""
        ids = r.prompt_token_ids or []
        tops = alternatives(r.prompt_top_logprobs)
        return {
            "tokens": token_text(ctx, ids, req.return_tokens_as_token_ids),
            "token_logprobs": list(r.prompt_logprobs or []),
            "top_logprobs": None if tops is None else [None, *tops[1:]],
            "text_offset": [len(ctx.tokenizer.decode(ids[:j], skip_special_tokens=False)) for j in range(len(ids))],
        }

    def event_of(
        c: Choice, text: str, ids: list[int], lps: list[float], tops: list, finish: str | None
    ) -> dict[str, Any]:
        lp = logprobs_of(c, ids, lps, tops)
        if c.first:
            if lp is not None and req.echo and c.prompt_chunk is not None:  # the prompt's entries come first
                head = prompt_logprobs_of(c, c.prompt_chunk)
                lp = {k: None if lp[k] is None else head[k] + lp[k] for k in lp}
            text, c.first = c.echo + text, False
        choice = {
            "index": c.index,
            "text": text,
            "logprobs": lp,
            "finish_reason": finish,
        }
        return {
            "id": rid,
            "object": "text_completion",
            "created": created,
            "model": ctx.model_name,
            "choices": [choice],
        }

    def final_of(c: Choice, r: GenerationResult) -> dict[str, Any]:
        if c.score_only:  # the prompt's text and scores alone
            return {"text": c.echo, "logprobs": prompt_logprobs_of(c, r) if want_logprobs else None}
        lps = logprobs_of(c, r.token_ids, r.logprobs, r.top_logprobs)
        if lps is not None and req.echo:  # the prompt's entries first, then the generated tokens'
            head = prompt_logprobs_of(c, r)
            # (top_logprobs is None on both sides with logprobs 0, a list on both otherwise)
            lps = {k: None if lps[k] is None else head[k] + lps[k] for k in lps}
        return {"text": c.echo + whole_text(c, r), "logprobs": lps}

    head = {"id": rid, "object": "text_completion", "created": created}
    return await reply(ctx, request, endpoint, req, choices, head, "text_completion", event_of, final_of)
