"""``specrt serve``: an OpenAI-compatible HTTP server (FastAPI + uvicorn) over a :class:`~specrt.scheduler.Scheduler`.

Endpoints:

- ``POST /v1/completions`` and ``POST /v1/chat/completions``: OpenAI's request and response schemas, streaming with
  server-sent events (``stream: true``; ``stream_options.include_usage`` adds a last chunk with ``usage``), ``usage``
  counts, ``logprobs`` (the chosen tokens' log-probabilities under the target: completions ``logprobs: 0``, chat
  ``logprobs: true`` with ``top_logprobs: 0``; alternatives are not computed, so larger values are refused), and an
  extra ``speculative`` field: acceptance rate, mean tokens per round, drafted / accepted / recovered / bonus tokens.
  specrt's own settings are accepted as extra fields: ``top_k``, ``min_p``, ``repetition_penalty``,
  ``num_speculative_tokens`` (int or ``"auto"``), ``ignore_eos``, ``coupled``.
- ``GET /v1/models``, ``GET /health``, ``GET /metrics`` (Prometheus text format: requests, tokens, acceptance rate,
  queue length, running requests, time to first token, inter-token latency, request latency, decode tokens/s).

Errors follow OpenAI's schema ``{"error": {"message", "type", "param", "code"}}``: a malformed request gets 400 naming
the field (``param``), an unknown model 404, a full queue 429, a server shutting down 503, a request past its timeout
504 (or, once streaming has begun, a last ``error`` event). A streamed response's status is sent once the request has
started, so settings the engine refuses are 400s too. A client that disconnects cancels its request (it stops after
the current round); shutdown stops accepting connections and finishes the admitted requests.

Requests run first come first served: one at a time, or with ``specrt serve --max-batch N`` (a ``Decoder(max_batch=N)``)
up to N together in batched rounds (continuous batching; each request gets the tokens it would get alone).
"""

import asyncio
import json
import math
import re
import secrets
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Literal

from specrt.errors import ConfigError, GenerationCancelled, SpecrtError, VocabError
from specrt.generate import Decoder, GenerationResult, StreamChunk, _check_ids
from specrt.scheduler import (
    QueueFullError,
    RequestHandle,
    RequestTimeoutError,
    Scheduler,
    SchedulerClosedError,
)

__all__ = ["create_app", "run_server"]

_FINISH = {"eos": "stop", "stop": "stop", "length": "length"}


def _pydantic_models() -> dict[str, Any]:
    """The request schemas (built on first use: pydantic is an optional dependency, ``specrt[serve]``)."""
    from typing import Annotated

    from pydantic import BaseModel, ConfigDict, Field

    class _Strict(BaseModel):
        # strict: "5" is not an int, true is not 1, 1.0 is not a token id; no NaN / Infinity.
        model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    class StreamOptions(_Strict):
        include_usage: bool = False

    class Sampling(_Strict):
        model: str | None = None
        max_tokens: int | None = Field(default=None, ge=1)
        temperature: float | None = Field(default=None, ge=0.0, le=2.0)
        top_p: float | None = Field(default=None, gt=0.0, le=1.0)
        top_k: int | None = Field(default=None, ge=0, lt=2**32)
        min_p: float | None = Field(default=None, ge=0.0, le=1.0)
        repetition_penalty: float | None = Field(default=None, ge=1e-6, le=1e6)
        frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
        presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
        seed: int | None = Field(default=None, ge=0, lt=2**64)
        stop: str | list[str] | None = None
        n: int = Field(default=1, ge=1, le=1)
        stream: bool = False
        stream_options: StreamOptions | None = None
        user: str | None = None
        num_speculative_tokens: Annotated[int, Field(ge=0, le=64)] | Literal["auto"] | None = None
        ignore_eos: bool = False
        coupled: bool = False

    class CompletionRequest(Sampling):
        prompt: str | list[int]
        logprobs: int | None = Field(default=None, ge=0, le=0)
        echo: Literal[False] = False
        best_of: int | None = Field(default=None, ge=1, le=1)
        logit_bias: dict[str, float] | None = Field(default=None, max_length=0)
        suffix: None = None

    class Message(_Strict):
        role: Literal["system", "user", "assistant", "developer", "tool"]
        content: str | list[dict[str, Any]]
        name: str | None = None

    class ChatRequest(Sampling):
        messages: list[Message] = Field(min_length=1)
        max_completion_tokens: int | None = Field(default=None, ge=1)
        logprobs: bool = False
        top_logprobs: int | None = Field(default=None, ge=0, le=0)
        logit_bias: dict[str, float] | None = Field(default=None, max_length=0)

    return {"completion": CompletionRequest, "chat": ChatRequest}


class _Metrics:
    """Prometheus metrics of one app (its own registry, so several apps in one process do not collide)."""

    def __init__(self, scheduler: Scheduler) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "specrt_requests", "Requests ended, by endpoint and outcome", ["endpoint", "outcome"], registry=r
        )
        self.prompt_tokens = Counter("specrt_prompt_tokens", "Prompt tokens of finished requests", registry=r)
        self.generation_tokens = Counter("specrt_generation_tokens", "Tokens generated (finished requests)", registry=r)
        self.drafted = Counter("specrt_draft_tokens", "Draft tokens proposed and verified", registry=r)
        self.accepted = Counter("specrt_accepted_tokens", "Draft tokens the target accepted", registry=r)
        self.acceptance = Gauge(
            "specrt_acceptance_rate", "Accepted / drafted tokens since start (NaN until a token is drafted)", registry=r
        )
        # NaN, not 0, while nothing was drafted (a server without a draft, or before the first round): responses say
        # `null` there, and 0 would read as a draft that is always rejected.
        self.acceptance.set_function(lambda: self._accepted / self._drafted if self._drafted else math.nan)
        self.tokens_per_s = Gauge("specrt_decode_tokens_per_second", "Decode tokens/s of the last request", registry=r)
        self.mean_tokens_per_round = Gauge(
            "specrt_mean_tokens_per_round", "Emitted tokens / rounds of the last request", registry=r
        )
        queue = Gauge("specrt_queue_length", "Requests waiting to start", registry=r)
        queue.set_function(lambda: scheduler.queue_length)
        running = Gauge("specrt_running_requests", "Requests generating now", registry=r)
        running.set_function(lambda: scheduler.running)
        buckets = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
        self.ttft = Histogram(
            "specrt_time_to_first_token_seconds", "Submission to first token", buckets=buckets, registry=r
        )
        self.itl = Histogram(
            "specrt_inter_token_latency_seconds",
            "Time between tokens (a round's gap per token)",
            buckets=buckets,
            registry=r,
        )
        self.latency = Histogram("specrt_request_latency_seconds", "Submission to end", buckets=buckets, registry=r)
        self._drafted = 0
        self._accepted = 0

    def observe(self, endpoint: str, handle: RequestHandle, outcome: str, result: GenerationResult | None) -> None:
        self.requests.labels(endpoint, outcome).inc()
        if handle.finished_at is not None:
            self.latency.observe(handle.finished_at - handle.submitted_at)
        if handle.first_token_at is not None:
            self.ttft.observe(handle.first_token_at - handle.submitted_at)
        for (t0, _), (t1, n) in zip(handle.token_times, handle.token_times[1:], strict=False):
            gap = (t1 - t0) / n
            for _ in range(n):
                self.itl.observe(gap)
        if result is not None:
            s = result.stats
            self.prompt_tokens.inc(s.n_prompt_tokens)
            self.generation_tokens.inc(len(result.token_ids))
            self.drafted.inc(s.n_drafted)
            self.accepted.inc(s.n_accepted)
            self._drafted += s.n_drafted
            self._accepted += s.n_accepted
            if s.decode_tokens_per_s is not None:
                self.tokens_per_s.set(s.decode_tokens_per_s)
            if s.mean_tokens_per_round is not None:
                self.mean_tokens_per_round.set(s.mean_tokens_per_round)


def _error(status: int, message: str, type_: str, param: str | None = None, code: str | None = None) -> Any:
    from fastapi.responses import JSONResponse

    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return JSONResponse(body, status_code=status)


def _error_event(message: str, type_: str, code: str | None) -> str:
    return _sse({"error": {"message": message, "type": type_, "param": None, "code": code}})


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def _speculative(result: GenerationResult) -> dict[str, Any]:
    s = result.stats
    return {
        "acceptance_rate": s.acceptance_rate,
        "mean_tokens_per_round": s.mean_tokens_per_round,
        "n_rounds": s.n_rounds,
        "n_drafted": s.n_drafted,
        "n_accepted": s.n_accepted,
        "n_recovered": s.n_recovered,
        "n_bonus": s.n_bonus,
        "decode_tokens_per_s": s.decode_tokens_per_s,
    }


def _usage(result: GenerationResult) -> dict[str, int]:
    n_prompt, n_out = len(result.prompt_token_ids), len(result.token_ids)
    return {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out}


def _gpt2_byte_decoder() -> dict[str, int]:
    """Byte-level BPE (GPT-2, Qwen, SmolLM2) spells byte b as one printable character; this maps it back."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


_BYTE_DECODER = _gpt2_byte_decoder()

#: Request fields a Decoder error message can start with (Decoder names -> request names).
_SETTING_FIELDS = {
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty",
    "seed": "seed",
    "num_speculative_tokens": "num_speculative_tokens",
    "max_new_tokens": "max_tokens",
    "stop": "stop",
    "prompt": "prompt",
}


def _param_of(message: str) -> str | None:
    """The request field an error message is about, when it starts with a setting's name ("top_k 7 is ...")."""
    word = re.split(r"[\s:=]", message.strip(), maxsplit=1)[0] if message.strip() else ""
    return _SETTING_FIELDS.get(word)


def create_app(
    decoder: Decoder,
    *,
    model_name: str,
    max_queue: int = 64,
    request_timeout_s: float | None = 600.0,
    num_speculative_tokens: int | str = "auto",
    default_max_tokens: int = 256,
) -> Any:
    """The FastAPI app serving ``decoder`` as ``model_name``.

    Args:
        decoder: the loaded :class:`~specrt.Decoder` (the app's scheduler becomes its only user).
        model_name: the id ``/v1/models`` lists and requests' ``model`` must name (or omit).
        max_queue: requests that may wait; one more gets 429.
        request_timeout_s: seconds from arrival after which a request ends (504 / an error event); None = no limit.
        num_speculative_tokens: K of requests that do not set it (an int 0..64 or ``"auto"``).
        default_max_tokens: ``max_tokens`` of chat requests that set neither it nor ``max_completion_tokens``
            (completions default to OpenAI's 16).

    Raises:
        ImportError: fastapi / prometheus_client are not installed (``pip install 'specrt[serve]'``).
        ConfigError: ``max_queue`` < 1 or ``request_timeout_s`` <= 0.
    """
    from fastapi import FastAPI, Request
    from fastapi.responses import PlainTextResponse, StreamingResponse
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
    from starlette.exceptions import HTTPException as StarletteHTTPException

    schemas = _pydantic_models()
    scheduler = Scheduler(decoder, max_queue=max_queue, default_timeout_s=request_timeout_s)
    metrics = _Metrics(scheduler)
    tokenizer = decoder.tokenizer
    state = {"draining": False}

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        # Shutdown: refuse new requests, finish the admitted ones.
        state["draining"] = True
        await asyncio.to_thread(scheduler.close, True)

    app = FastAPI(title="specrt", version=_version(), lifespan=lifespan)
    app.state.scheduler = scheduler
    app.state.metrics = metrics

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request: Request, exc: StarletteHTTPException) -> Any:
        # 404 for unknown paths, 405 for a wrong method: OpenAI's error schema, not FastAPI's {"detail": ...}.
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return _error(exc.status_code, str(exc.detail), kind)

    @app.exception_handler(Exception)
    async def _internal_error(_request: Request, exc: Exception) -> Any:
        return _error(500, f"internal error: {type(exc).__name__}: {exc}", "server_error")

    @app.get("/health")
    async def health() -> Any:
        if state["draining"]:
            return _error(503, "the server is shutting down", "server_error", code="shutting_down")
        return {"status": "ok", "queue_length": scheduler.queue_length, "running": scheduler.running}

    @app.get("/v1/models")
    async def models() -> Any:
        return {
            "object": "list",
            "data": [{"id": model_name, "object": "model", "created": int(time.time()), "owned_by": "specrt"}],
        }

    @app.get("/metrics")
    async def prometheus() -> Any:
        return PlainTextResponse(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    def _kwargs(req: Any, max_tokens: int) -> dict[str, Any]:
        kw: dict[str, Any] = {
            "max_new_tokens": max_tokens,
            "num_speculative_tokens": (
                num_speculative_tokens if req.num_speculative_tokens is None else req.num_speculative_tokens
            ),
            "frequency_penalty": req.frequency_penalty,
            "presence_penalty": req.presence_penalty,
            "ignore_eos": req.ignore_eos,
            "coupled": req.coupled,
            # No seed: a fresh one per request (OpenAI's behaviour); a given seed repeats exactly.
            "seed": secrets.randbits(63) if req.seed is None else req.seed,
        }
        for name in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty"):
            value = getattr(req, name)
            if value is not None:
                kw[name] = value
        if req.stop is not None:
            stops = [req.stop] if isinstance(req.stop, str) else list(req.stop)
            if len(stops) > 4 or any(not s for s in stops):
                raise _BadFieldError("stop", f"stop: up to 4 non-empty strings, got {stops!r}")
            kw["stop"] = stops
        return kw

    def _submit(endpoint: str, req: Any, kw: dict[str, Any], max_tokens_field: str | None) -> RequestHandle | Any:
        """Queue the request (``max_tokens_field``: the field that set max_new_tokens, None for the server default)
        or return the error response."""
        if state["draining"]:
            return _error(503, "the server is shutting down", "server_error", code="shutting_down")
        if req.model is not None and req.model != model_name:
            return _error(
                404,
                f"the model {req.model!r} does not exist (this server has {model_name!r})",
                "invalid_request_error",
                "model",
                "model_not_found",
            )
        source = "messages" if "messages" in kw else "prompt"
        try:
            # Token ids and length are checked before queueing; the other settings when the request starts, before
            # any response is sent (see _reply), so a bad request is a 400, not a failed stream.
            try:
                ids = decoder.encode(kw.pop("prompt", None), kw.pop("messages", None))
            except (TypeError, UnicodeError) as e:  # e.g. a lone surrogate, which is not text
                raise _BadFieldError(source, f"{source}: cannot be tokenized: {e}") from e
            ids = _check_ids("prompt", ids, decoder.vocab_size)
            room = decoder.max_seq_len - len(ids)
            if room < 1:
                raise _BadFieldError(
                    source,
                    f"{source}: {len(ids)} tokens leave no room to generate (maximum sequence length "
                    f"{decoder.max_seq_len})",
                )
            if max_tokens_field is None:  # the server's default: capped to what fits
                kw["max_new_tokens"] = min(kw["max_new_tokens"], room)
            elif kw["max_new_tokens"] > room:
                raise _BadFieldError(
                    max_tokens_field,
                    f"{max_tokens_field}: prompt of {len(ids)} tokens + {max_tokens_field} {kw['max_new_tokens']} "
                    f"exceeds the maximum sequence length {decoder.max_seq_len}",
                )
            return scheduler.submit(ids, **kw)
        except QueueFullError as e:
            metrics.requests.labels(endpoint, "rejected_queue_full").inc()
            return _error(429, str(e), "rate_limit_error", code="queue_full")
        except SchedulerClosedError as e:
            return _error(503, str(e), "server_error", code="shutting_down")
        except _BadFieldError as e:
            return _rejected(endpoint, str(e), e.param)
        except VocabError as e:
            return _rejected(endpoint, str(e), "prompt")
        except (ConfigError, SpecrtError, ValueError) as e:
            return _rejected(endpoint, str(e), _param_of(str(e)) or source)

    def _rejected(endpoint: str, message: str, param: str | None) -> Any:
        metrics.requests.labels(endpoint, "invalid").inc()
        return _error(400, message, "invalid_request_error", param)

    def _outcome(error: BaseException | None, result: GenerationResult | None) -> str:
        if result is not None:
            return _FINISH.get(result.finish_reason, result.finish_reason)
        if isinstance(error, RequestTimeoutError):
            return "timeout"
        if isinstance(error, GenerationCancelled):
            return "cancelled"
        return "error"

    async def _wait(request: Request, handle: RequestHandle) -> tuple[GenerationResult | None, BaseException | None]:
        """The result, cancelling the request if the client goes away first."""
        task = asyncio.ensure_future(handle.aresult())
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=0.25)
                if done:
                    break
                if await request.is_disconnected():
                    handle.cancel()
            try:
                return task.result(), None
            except Exception as e:
                return None, e
        finally:
            if not task.done():
                handle.cancel()
                task.cancel()

    def _failure(error: BaseException) -> Any:
        if isinstance(error, RequestTimeoutError):
            return _error(504, str(error), "timeout_error", code="request_timeout")
        if isinstance(error, GenerationCancelled):
            return _error(499, str(error), "cancelled", code="cancelled")
        if isinstance(error, (ConfigError, ValueError)):
            return _error(400, str(error), "invalid_request_error", _param_of(str(error)))
        return _error(500, f"{type(error).__name__}: {error}", "server_error")

    byte_level = type(tokenizer.decoder).__name__ == "ByteLevel"

    def _token_text(ids: list[int]) -> list[str]:
        return [tokenizer.decode([i], skip_special_tokens=False) for i in ids]

    def _token_bytes(i: int) -> list[int]:
        """The token's own bytes (a piece of a multi-byte character stays that piece, unlike its decoded text)."""
        piece = tokenizer.id_to_token(i) or ""
        if byte_level and all(c in _BYTE_DECODER for c in piece):
            return [_BYTE_DECODER[c] for c in piece]
        m = re.fullmatch(r"<0x([0-9A-Fa-f]{2})>", piece)  # SentencePiece byte fallback
        if m:
            return [int(m.group(1), 16)]
        return list(piece.replace("\u2581", " ").encode("utf-8"))

    def _offsets(all_ids: list[int], start: int) -> list[int]:
        """Character offset in the generated text where each of ``all_ids[start:]`` begins."""
        return [
            len(tokenizer.decode(all_ids[:j], skip_special_tokens=True).rstrip("\ufffd"))
            for j in range(start, len(all_ids))
        ]

    async def _first(request: Request, handle: RequestHandle, chunks: Any) -> tuple[Any, BaseException | None]:
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

    async def _stream(
        request: Request,
        endpoint: str,
        handle: RequestHandle,
        chunks: Any,
        first_chunk: StreamChunk,
        make_chunk: Any,
        include_usage: bool,
    ) -> AsyncIterator[str]:
        result = None
        error: BaseException | None = None

        async def all_chunks() -> AsyncIterator[StreamChunk]:
            yield first_chunk
            async for c in chunks:
                yield c

        try:
            first = True
            async for chunk in all_chunks():
                if chunk.result is not None:
                    result = chunk.result
                    yield _sse(make_chunk(chunk, first, _FINISH.get(chunk.result.finish_reason)))
                    break
                if chunk.text or chunk.token_ids or first:
                    yield _sse(make_chunk(chunk, first, None))
                    first = False
                if await request.is_disconnected():
                    handle.cancel()
            if result is not None and include_usage:
                yield _sse(
                    {
                        **make_chunk(None, False, None),
                        "choices": [],
                        "usage": _usage(result),
                        "speculative": _speculative(result),
                    }
                )
        except RequestTimeoutError as e:
            error = e
            yield _error_event(str(e), "timeout_error", "request_timeout")
        except GenerationCancelled as e:
            error = e
        except Exception as e:
            error = e
            yield _error_event(f"{type(e).__name__}: {e}", "server_error", None)
        finally:
            if not handle.done:
                handle.cancel()  # the client went away (the response was cancelled)
            if result is None and error is None:
                # Closed before its result without an error of its own: the client went away (also when the loop
                # above had already cancelled the request on seeing the disconnect, so the handle is done).
                error = GenerationCancelled("client disconnected")
            metrics.observe(endpoint, handle, _outcome(error, result), result)
        yield "data: [DONE]\n\n"

    async def _reply(
        request: Request,
        endpoint: str,
        req: Any,
        handle: RequestHandle,
        make_chunk: Any,
        head: dict[str, Any],
        choice_of: Any,
    ) -> Any:
        """A stream of server-sent events (``make_chunk`` given), or the whole response once the result is in.

        A stream's HTTP status is sent only once the request has started and produced its first round, so a setting
        the engine refuses (or a timeout in the queue) is still an HTTP error, not an error event."""
        if make_chunk is not None:
            chunks = handle.aiter()
            first_chunk, error = await _first(request, handle, chunks)
            if first_chunk is None:
                assert error is not None
                metrics.observe(endpoint, handle, _outcome(error, None), None)
                return _failure(error)
            include = bool(req.stream_options and req.stream_options.include_usage)
            return StreamingResponse(
                _stream(request, endpoint, handle, chunks, first_chunk, make_chunk, include),
                media_type="text/event-stream",
            )
        result, error = await _wait(request, handle)
        metrics.observe(endpoint, handle, _outcome(error, result), result)
        if result is None:
            assert error is not None
            return _failure(error)
        choice = {"index": 0, **choice_of(result), "finish_reason": _FINISH.get(result.finish_reason)}
        return {
            **head,
            "model": model_name,
            "choices": [choice],
            "usage": _usage(result),
            "speculative": _speculative(result),
        }

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        req = await _parse(request, schemas["completion"])
        if not isinstance(req, schemas["completion"]):
            metrics.requests.labels("completions", "invalid").inc()  # refused by the request schema
            return req
        try:
            kw = _kwargs(req, req.max_tokens or 16)
        except _BadFieldError as e:
            return _rejected("completions", str(e), e.param)
        kw["prompt"] = req.prompt
        # Log-probabilities only when asked for: without them a greedy request reads only argmax ids.
        kw["logprobs"] = req.logprobs is not None
        # OpenAI's default of 16 tokens is a request setting like any other: too long a prompt for it is an error.
        handle = _submit("completions", req, kw, "max_tokens")
        if not isinstance(handle, RequestHandle):
            return handle
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        want_logprobs = req.logprobs is not None
        seen: list[int] = []  # the tokens streamed so far (text offsets count from the start of the text)

        def logprobs_of(ids: list[int], lps: list[float]) -> dict[str, Any] | None:
            start = len(seen)
            seen.extend(ids)
            if not want_logprobs:
                return None
            return {
                "tokens": _token_text(ids),
                "token_logprobs": lps,
                "top_logprobs": None,
                "text_offset": _offsets(seen, start),
            }

        def make_chunk(chunk: StreamChunk | None, _first: bool, finish: str | None) -> dict[str, Any]:
            choices = []
            if chunk is not None:
                choices = [
                    {
                        "index": 0,
                        "text": chunk.text,
                        "logprobs": logprobs_of(chunk.token_ids, chunk.logprobs),
                        "finish_reason": finish,
                    }
                ]
            return {
                "id": rid,
                "object": "text_completion",
                "created": created,
                "model": model_name,
                "choices": choices,
            }

        return await _reply(
            request,
            "completions",
            req,
            handle,
            make_chunk if req.stream else None,
            {"id": rid, "object": "text_completion", "created": created},
            lambda r: {"text": r.text, "logprobs": logprobs_of(r.token_ids, r.logprobs)},
        )

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        req = await _parse(request, schemas["chat"])
        if not isinstance(req, schemas["chat"]):
            metrics.requests.labels("chat_completions", "invalid").inc()  # refused by the request schema
            return req
        messages = []
        for i, m in enumerate(req.messages):
            content = m.content
            if isinstance(content, list):  # OpenAI content parts: text only
                texts = []
                for part in content:
                    if part.get("type") != "text" or not isinstance(part.get("text"), str):
                        return _rejected(
                            "chat_completions",
                            f"messages.{i}.content: only text parts are supported, got {part!r}",
                            f"messages.{i}.content",
                        )
                    texts.append(part["text"])
                content = "".join(texts)
            messages.append({"role": m.role, "content": content})
        if req.top_logprobs is not None and not req.logprobs:
            return _rejected("chat_completions", "top_logprobs: needs logprobs: true", "top_logprobs")
        field = "max_completion_tokens" if req.max_completion_tokens else "max_tokens" if req.max_tokens else None
        max_tokens = req.max_completion_tokens or req.max_tokens or default_max_tokens
        try:
            kw = _kwargs(req, max_tokens)
        except _BadFieldError as e:
            return _rejected("chat_completions", str(e), e.param)
        kw["messages"] = messages
        kw["logprobs"] = bool(req.logprobs)
        handle = _submit("chat_completions", req, kw, field)
        if not isinstance(handle, RequestHandle):
            return handle
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

        def logprobs_of(ids: list[int], lps: list[float]) -> dict[str, Any] | None:
            if not req.logprobs:
                return None
            return {
                "content": [
                    {"token": t, "logprob": lp, "bytes": _token_bytes(i), "top_logprobs": []}
                    for i, t, lp in zip(ids, _token_text(ids), lps, strict=True)
                ]
            }

        def make_chunk(chunk: StreamChunk | None, first: bool, finish: str | None) -> dict[str, Any]:
            choices = []
            if chunk is not None:
                delta: dict[str, Any] = {"role": "assistant", "content": chunk.text} if first else {}
                if not first and (chunk.text or finish is None):
                    delta["content"] = chunk.text
                choices = [
                    {
                        "index": 0,
                        "delta": delta,
                        "logprobs": logprobs_of(chunk.token_ids, chunk.logprobs),
                        "finish_reason": finish,
                    }
                ]
            return {
                "id": rid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model_name,
                "choices": choices,
            }

        return await _reply(
            request,
            "chat_completions",
            req,
            handle,
            make_chunk if req.stream else None,
            {"id": rid, "object": "chat.completion", "created": created},
            lambda r: {
                "message": {"role": "assistant", "content": r.text},
                "logprobs": logprobs_of(r.token_ids, r.logprobs),
            },
        )

    return app


class _BadFieldError(ValueError):
    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


#: Type tags pydantic puts into the location of a union member's error ("prompt.str", "n.constrained-int").
_TYPE_TAGS = {"str", "int", "float", "bool", "none", "list", "dict"}


async def _parse(request: Any, schema: Any) -> Any:
    """The body validated against ``schema`` (JSON mode, strict), or a 400 response naming the first bad field."""
    from pydantic import ValidationError

    raw = await request.body()
    try:
        return schema.model_validate_json(raw or b"null")
    except ValidationError as e:
        errs = e.errors()
    first = errs[0]
    if first.get("type") == "json_invalid":
        why = first.get("ctx", {}).get("error", first.get("msg"))
        return _error(400, f"the body is not valid JSON: {why}", "invalid_request_error")
    if first.get("type") == "model_type" and not first.get("loc"):
        return _error(400, "the body must be a JSON object", "invalid_request_error")

    def param_of(err: dict) -> str | None:
        loc = [
            str(x)
            for x in err.get("loc", ())
            if isinstance(x, int) or (str(x).isidentifier() and str(x) not in _TYPE_TAGS)
        ]
        return ".".join(loc) or None

    param = param_of(first)
    # A union field reports one error per member ("a valid string", or at prompt.0 "a valid integer"): say all.
    msgs = []
    for err in errs:
        p = param_of(err) or ""
        if p == (param or "") or p.startswith(f"{param}."):
            text = err.get("msg", "invalid value") + (f" (at {p})" if p != param else "")
            if text not in msgs:
                msgs.append(text)
    msg = " or ".join(msgs)
    if first.get("type") == "extra_forbidden":
        msg = "unknown field (not part of the OpenAI API specrt serves, nor a specrt extension)"
    detail = f"{param}: {msg}" if param else msg
    given = first.get("input")
    if first.get("type") not in ("missing", "extra_forbidden") and not isinstance(given, (dict, list)):
        detail += f" (got {given!r})"
    return _error(400, detail, "invalid_request_error", param)


def _version() -> str:
    from specrt import __version__

    return __version__


def run_server(
    app: Any, *, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info", drain_timeout_s: float = 60.0
) -> None:
    """Serve ``app`` with uvicorn until SIGINT / SIGTERM; then stop accepting and drain (at most
    ``drain_timeout_s`` seconds for open streams)."""
    import uvicorn

    uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=int(drain_timeout_s))
