"""Queueing a request's choices on the Scheduler and answering: a whole response, or a stream of server-sent
events."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from specrt.errors import ConfigError, GenerationCancelled, SequenceLengthError, SpecrtError
from specrt.generate import GenerationResult, StreamChunk, check_request
from specrt.scheduler import QueueFullError, RequestHandle, RequestTimeoutError, SchedulerClosedError
from specrt.server.context import ServerContext, failure, model_not_found, outcome, rejected, unavailable
from specrt.server.policy import param_of
from specrt.server.settings import refused_param, seeds
from specrt.server.wire import BYTE_DECODER, FINISH, error_event, error_response, speculative, sse, usage
from specrt.toolcalls import ToolCallParser


@dataclass
class Choice:
    """One generation of a request: prompt ``prompt_index``'s sample ``index % n``, choice ``index``."""

    index: int
    prompt_index: int
    handle: RequestHandle
    n_prompt: int
    echo: str = ""  # text put before the generated text (completions' echo)
    first: bool = True  # nothing sent yet
    chunks: Any = None  # the handle's async iterator (streaming)
    result: GenerationResult | None = None
    error: BaseException | None = None
    n_out: int = 0  # tokens streamed so far
    seen: list[int] = field(default_factory=list)  # tokens whose logprobs were given out (text offsets)
    prompt_chunk: StreamChunk | None = None  # the first chunk of a prompt-scored stream (echo with logprobs)
    score_only: bool = False  # max_tokens 0 with echo: the one token generated is not returned or counted
    tools: ToolCallParser | None = None


def whole_text(c: Choice, result: GenerationResult) -> str:
    """The text of a finished choice that was not streamed: the driver's, as the request's skip_special_tokens /
    include_stop_str_in_output define it."""
    return result.text


async def merged(choices: list[Choice]) -> AsyncIterator[tuple[Choice, StreamChunk]]:
    """The chunks of all ``choices`` as they come (each choice's in order); raises the first error of any."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(c: Choice) -> None:
        try:
            async for chunk in c.chunks:
                await queue.put((c, chunk, None))
            await queue.put((c, None, None))
        except Exception as e:  # the request's error, raised to the stream below
            await queue.put((c, None, e))

    tasks = [asyncio.ensure_future(pump(c)) for c in choices]
    try:
        open_ = len(choices)
        while open_:
            c, chunk, error = await queue.get()
            if error is not None:
                c.error = error
                raise error
            if chunk is None:
                open_ -= 1
                continue
            yield c, chunk
    finally:
        for t in tasks:
            t.cancel()


def submit_all(
    ctx: ServerContext,
    endpoint: str,
    req: Any,
    kw: dict[str, Any],
    prompts: list[list[int]],
    source: str,
    max_tokens_field: str | None,
    echoes: list[str] | None = None,
) -> list[Choice] | Any:
    """Queue every choice, all at once (so they share batched rounds): ``n`` per prompt, prompt-major (choice
    index = prompt index * n + i); or return the error response. ``max_tokens_field``: the field that set
    max_new_tokens (None: the server's default, capped to the room each prompt leaves)."""
    if ctx.state["draining"]:
        return unavailable(ctx)
    if req.model is not None and req.model != ctx.model_name:
        return model_not_found(ctx, req.model)
    if req.seed is not None:  # the range is Rust's (a u64); choice i's seed is seed + i modulo 2**64
        try:
            check_request("specrt serve", has_draft=ctx.decoder.draft_path is not None, seed=req.seed)
        except ConfigError as e:
            return rejected(ctx, endpoint, str(e), param_of(e, req))
    n_total = len(prompts) * req.n
    if n_total > ctx.scheduler.max_queue:
        return rejected(
            ctx,
            endpoint,
            f"{'n' if req.n > 1 else source}: {len(prompts)} prompt(s) x n {req.n} = {n_total} generations exceed "
            f"this server's queue (max_queue {ctx.scheduler.max_queue}); send fewer at a time",
            "n" if req.n > 1 else source,
        )
    if ctx.scheduler.queue_length + n_total > ctx.scheduler.max_queue:  # all or none
        ctx.metrics.requests.labels(endpoint, "rejected_queue_full").inc()
        return error_response(
            429,
            f"{ctx.scheduler.queue_length} requests are waiting (max_queue {ctx.scheduler.max_queue}); {n_total} more "
            "do not fit; retry later",
            "rate_limit_error",
            code="queue_full",
        )
    # Each choice is resolved and checked once, by Scheduler.submit (the one resolver in Rust: every setting, the
    # prompt's ids and length), before any token work: a bad request is a 400 and nothing of it stays queued. The
    # server's own default max_new_tokens is capped to the room a prompt leaves (at least 1, so a prompt that fills
    # the context is refused by the same check).
    choices: list[Choice] = []
    k, ids = 0, prompts[0]
    try:
        for k, ids in enumerate(prompts):
            budget = kw["max_new_tokens"]
            if max_tokens_field is None:
                budget = max(1, min(budget, ctx.decoder.max_seq_len - len(ids)))
            for i, seed in enumerate(seeds(ctx, req)):
                handle = ctx.scheduler.submit(ids, **{**kw, "max_new_tokens": budget, "seed": seed})
                choices.append(Choice(k * req.n + i, k, handle, len(ids), echoes[k] if echoes else ""))
    except (QueueFullError, SchedulerClosedError, SpecrtError, TypeError, ValueError) as e:
        for c in choices:
            c.handle.cancel()
        if isinstance(e, QueueFullError):
            ctx.metrics.requests.labels(endpoint, "rejected_queue_full").inc()
            return error_response(429, str(e), "rate_limit_error", code="queue_full")
        if isinstance(e, SchedulerClosedError):
            return error_response(503, str(e), "server_error", code="shutting_down")
        if isinstance(e, SequenceLengthError):
            where = "" if len(prompts) == 1 else f"{source}.{k}: "
            # About the prompt when it fills the context alone, else about the field that set max_new_tokens.
            full = len(ids) >= ctx.decoder.max_seq_len
            return rejected(ctx, endpoint, f"{where}{e}", source if full else max_tokens_field or source)
        return rejected(ctx, endpoint, str(e), refused_param(e, req) or source)
    return choices


async def wait_all(ctx: ServerContext, request: Request, choices: list[Choice]) -> None:
    """Every choice's result or error (``c.result`` / ``c.error``); a failed choice or a client that goes away
    cancels the others."""
    tasks = {asyncio.ensure_future(c.handle.aresult()): c for c in choices}
    pending = set(tasks)
    try:
        while pending:
            done, pending = await asyncio.wait(pending, timeout=0.25, return_when=asyncio.FIRST_EXCEPTION)
            failed = False
            for t in done:
                c = tasks[t]
                if t.exception() is not None:
                    c.error, failed = t.exception(), True
                else:
                    c.result = t.result()
            if failed or (pending and await request.is_disconnected()):
                for c in choices:
                    c.handle.cancel()
    finally:
        for t in pending:
            t.cancel()
        for c in choices:
            if not c.handle.done:
                c.handle.cancel()


def token_text(ctx: ServerContext, ids: list[int], as_ids: bool = False) -> list[str]:
    if as_ids:  # vLLM's return_tokens_as_token_ids
        return [f"token_id:{i}" for i in ids]
    return [ctx.tokenizer.decode([i], skip_special_tokens=False) for i in ids]


def token_bytes(ctx: ServerContext, i: int) -> list[int]:
    """The token's own bytes (a piece of a multi-byte character stays that piece, unlike its decoded text)."""
    piece = ctx.tokenizer.id_to_token(i) or ""
    if ctx.byte_level and all(c in BYTE_DECODER for c in piece):
        return [BYTE_DECODER[c] for c in piece]
    m = re.fullmatch(r"<0x([0-9A-Fa-f]{2})>", piece)  # SentencePiece byte fallback
    if m:
        return [int(m.group(1), 16)]
    return list(piece.replace("\u2581", " ").encode("utf-8"))


def offsets(ctx: ServerContext, all_ids: list[int], start: int) -> list[int]:
    """Character offset in the generated text where each of ``all_ids[start:]`` begins."""
    return [
        len(ctx.tokenizer.decode(all_ids[:j], skip_special_tokens=True).rstrip("\ufffd"))
        for j in range(start, len(all_ids))
    ]


async def await_first(
    ctx: ServerContext, request: Request, handle: RequestHandle, chunks: Any
) -> tuple[Any, BaseException | None]:
    """The request's first chunk (it has started and its settings were accepted), or its error; cancels it if
    the client goes away meanwhile."""
    task = asyncio.ensure_future(chunks.__anext__())
    while True:
        done, _ = await asyncio.wait({task}, timeout=0.25)
        if done:
            break
        if await request.is_disconnected():
            handle.cancel()  # ends it after its current round (or before it starts); the task then raises
    try:
        return task.result(), None
    except StopAsyncIteration:
        return None, GenerationCancelled("the request ended without output")
    except Exception as e:
        return None, e


def total_usage(ctx: ServerContext, choices: list[Choice]) -> dict[str, Any]:
    """Usage of a whole request: each prompt's tokens once (OpenAI's and vLLM's count for n > 1), every
    choice's completion tokens, and of the prompt tokens those whose target KV the prefix cache supplied
    (``Stats.n_cached_tokens``; for n > 1 the first finished sample's of each prompt, as its tokens are
    counted once)."""
    n_prompt = sum({c.prompt_index: c.n_prompt for c in choices}.values())
    n_out = sum(len(c.result.token_ids) for c in choices if c.result is not None and not c.score_only)
    cached: dict[int, int] = {}
    for c in choices:
        if c.result is not None:
            cached.setdefault(c.prompt_index, c.result.stats.n_cached_tokens)
    return usage(n_prompt, n_out, sum(cached.values()))


async def stream(
    ctx: ServerContext,
    request: Request,
    endpoint: str,
    req: Any,
    choices: list[Choice],
    first_chunk: StreamChunk,
    event_of: Any,
    head: dict[str, Any],
) -> AsyncIterator[str]:
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    continuous = bool(req.stream_options and req.stream_options.continuous_usage_stats)
    error: BaseException | None = None

    def event(c: Choice, chunk: StreamChunk) -> str | None:
        """The server-sent event of one chunk of choice ``c`` (None: nothing to send)."""
        if chunk.result is not None:
            c.result = chunk.result
            # (The chunk of the last round carried the rest of the text; the result has no tokens of its own.)
            body = event_of(c, "", [], [], [], FINISH.get(chunk.result.finish_reason))
            n_out = len(chunk.result.token_ids)
        else:
            if chunk.prompt_logprobs is not None:
                c.prompt_chunk = chunk
            text = chunk.text  # the driver's text of this round (stop strings cut, partial characters held)
            c.n_out += len(chunk.token_ids)
            if not (text or chunk.token_ids or c.first):
                return None
            body = event_of(c, text, chunk.token_ids, chunk.logprobs, chunk.top_logprobs, None)
            n_out = c.n_out
        if continuous:  # vLLM's continuous_usage_stats: this choice's counts so far
            body["usage"] = usage(c.n_prompt, n_out)
        return sse(body)

    try:
        text = event(choices[0], first_chunk)
        if text is not None:
            yield text
        async with contextlib.aclosing(merged(choices)) as chunks:
            async for c, chunk in chunks:
                text = event(c, chunk)
                if text is not None:
                    yield text
                if await request.is_disconnected():
                    for other in choices:
                        other.handle.cancel()
        if include_usage:
            results = [c.result for c in choices if c.result is not None]
            yield sse({**head, "choices": [], "usage": total_usage(ctx, choices), "speculative": speculative(results)})
    except RequestTimeoutError as e:
        error = e
        yield error_event(str(e), "timeout_error", "request_timeout")
    except SchedulerClosedError as e:  # cut at the server's drain deadline: the client is told, then [DONE]
        error = e
        yield error_event(str(e), "server_error", "shutting_down")
    except GenerationCancelled as e:
        error = e
    except Exception as e:
        error = e
        yield error_event(f"{type(e).__name__}: {e}", "server_error", None)
    finally:
        for c in choices:
            if not c.handle.done:
                c.handle.cancel()  # the client went away (the response was cancelled), or another choice failed
        for c in choices:
            err = c.error
            if c.result is None and err is None:
                # Ended before its result without an error of its own: the client went away (also when the
                # loop above had already cancelled the request on seeing the disconnect), or a sibling failed.
                err = GenerationCancelled("client disconnected" if error is None else "another choice failed")
            ctx.metrics.observe(endpoint, c.handle, outcome(ctx, err, c.result), c.result)
    yield "data: [DONE]\n\n"


async def reply(
    ctx: ServerContext,
    request: Request,
    endpoint: str,
    req: Any,
    choices: list[Choice],
    head: dict[str, Any],
    chunk_object: str,
    event_of: Any,
    final_of: Any,
) -> Any:
    """A stream of server-sent events, or the whole response once every choice's result is in.

    Every setting, prompt id and length was checked when the choices were submitted (:func:`submit_all`). A
    stream's HTTP status is still sent only once the first choice has produced its first round, so what can fail
    before that (a timeout in the queue, a constraint that does not compile over the tokenizer, a failed first
    pass) is an HTTP error, not an error event."""
    if req.stream:
        for c in choices:
            c.chunks = c.handle.aiter()
        first_chunk, error = await await_first(ctx, request, choices[0].handle, choices[0].chunks)
        if first_chunk is None:
            assert error is not None
            for c in choices[1:]:
                c.handle.cancel()
            for c in choices:
                why = error if c is choices[0] else GenerationCancelled("another choice failed")
                ctx.metrics.observe(endpoint, c.handle, outcome(ctx, why, None), None)
            return failure(ctx, error, req)
        chunk_head = {"id": head["id"], "object": chunk_object, "created": head["created"], "model": ctx.model_name}
        return StreamingResponse(
            stream(ctx, request, endpoint, req, choices, first_chunk, event_of, chunk_head),
            media_type="text/event-stream",
        )
    await wait_all(ctx, request, choices)
    for c in choices:
        ctx.metrics.observe(endpoint, c.handle, outcome(ctx, c.error, c.result), c.result)
    errors = [c.error for c in choices if c.error is not None]
    if errors:
        return failure(ctx, next((e for e in errors if not isinstance(e, GenerationCancelled)), errors[0]), req)
    results = [c.result for c in choices]
    return {
        **head,
        "model": ctx.model_name,
        # (final_of may set the finish reason: "tool_calls")
        "choices": [
            {"index": c.index, "finish_reason": FINISH.get(c.result.finish_reason), **final_of(c, c.result)}
            for c in choices
        ],
        "usage": total_usage(ctx, choices),
        "speculative": speculative(results),
    }
