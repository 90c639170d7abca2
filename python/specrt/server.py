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
504 (or, once streaming has begun, a last ``error`` event). A client that disconnects cancels its request (it stops
after the current round); shutdown stops accepting requests and finishes the admitted ones.

Requests run one at a time, first come first served (batched rounds are not implemented yet).
"""

import asyncio
import json
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
        model_config = ConfigDict(extra="forbid")

    class StreamOptions(_Strict):
        include_usage: bool = False

    class Sampling(_Strict):
        model: str | None = None
        max_tokens: int | None = Field(default=None, ge=1)
        temperature: float | None = Field(default=None, ge=0.0, le=2.0)
        top_p: float | None = Field(default=None, gt=0.0, le=1.0)
        top_k: int | None = Field(default=None, ge=0)
        min_p: float | None = Field(default=None, ge=0.0, le=1.0)
        repetition_penalty: float | None = Field(default=None, gt=0.0)
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
        self.acceptance = Gauge("specrt_acceptance_rate", "Accepted / drafted tokens since start", registry=r)
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
            if self._drafted:
                self.acceptance.set(self._accepted / self._drafted)
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

    def _submit(endpoint: str, req: Any, kw: dict[str, Any]) -> RequestHandle | Any:
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
        try:
            # Settings and length are checked before queueing, so a bad request is a 400, not a failed stream.
            ids = _check_ids(
                "prompt", decoder.encode(kw.pop("prompt", None), kw.pop("messages", None)), decoder.vocab_size
            )
            if len(ids) + kw["max_new_tokens"] > decoder.max_seq_len:
                raise _BadFieldError(
                    "max_tokens",
                    f"prompt of {len(ids)} tokens + max_tokens {kw['max_new_tokens']} exceeds the maximum sequence "
                    f"length {decoder.max_seq_len}",
                )
            return scheduler.submit(ids, **kw)
        except QueueFullError as e:
            metrics.requests.labels(endpoint, "rejected_queue_full").inc()
            return _error(429, str(e), "rate_limit_error", code="queue_full")
        except SchedulerClosedError as e:
            return _error(503, str(e), "server_error", code="shutting_down")
        except _BadFieldError as e:
            return _error(400, str(e), "invalid_request_error", e.param)
        except VocabError as e:
            return _error(400, str(e), "invalid_request_error", "prompt")
        except (ConfigError, SpecrtError, ValueError) as e:
            return _error(400, str(e), "invalid_request_error")

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
            return _error(400, str(error), "invalid_request_error")
        return _error(500, f"{type(error).__name__}: {error}", "server_error")

    def _token_text(ids: list[int]) -> list[str]:
        return [tokenizer.decode([i], skip_special_tokens=False) for i in ids]

    async def _stream(
        request: Request, endpoint: str, handle: RequestHandle, make_chunk: Any, include_usage: bool
    ) -> AsyncIterator[str]:
        result = None
        error: BaseException | None = None
        try:
            first = True
            async for chunk in handle.aiter():
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
                error = error or GenerationCancelled("client disconnected")
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
        """A stream of server-sent events (``make_chunk`` given), or the whole response once the result is in."""
        if make_chunk is not None:
            include = bool(req.stream_options and req.stream_options.include_usage)
            return StreamingResponse(
                _stream(request, endpoint, handle, make_chunk, include), media_type="text/event-stream"
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
            return req
        try:
            kw = _kwargs(req, req.max_tokens or 16)
        except _BadFieldError as e:
            return _error(400, str(e), "invalid_request_error", e.param)
        kw["prompt"] = req.prompt
        handle = _submit("completions", req, kw)
        if not isinstance(handle, RequestHandle):
            return handle
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        want_logprobs = req.logprobs is not None

        def logprobs_of(ids: list[int], lps: list[float], offset: int) -> dict[str, Any] | None:
            if not want_logprobs:
                return None
            toks = _token_text(ids)
            offsets, pos = [], offset
            for t in toks:
                offsets.append(pos)
                pos += len(t)
            return {"tokens": toks, "token_logprobs": lps, "top_logprobs": None, "text_offset": offsets}

        sent = {"chars": 0}

        def make_chunk(chunk: StreamChunk | None, _first: bool, finish: str | None) -> dict[str, Any]:
            choices = []
            if chunk is not None:
                choices = [
                    {
                        "index": 0,
                        "text": chunk.text,
                        "logprobs": logprobs_of(chunk.token_ids, chunk.logprobs, sent["chars"]),
                        "finish_reason": finish,
                    }
                ]
                sent["chars"] += len(chunk.text)
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
            lambda r: {"text": r.text, "logprobs": logprobs_of(r.token_ids, r.logprobs, 0)},
        )

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        req = await _parse(request, schemas["chat"])
        if not isinstance(req, schemas["chat"]):
            return req
        messages = []
        for i, m in enumerate(req.messages):
            content = m.content
            if isinstance(content, list):  # OpenAI content parts: text only
                texts = []
                for part in content:
                    if part.get("type") != "text" or not isinstance(part.get("text"), str):
                        return _error(
                            400,
                            f"messages.{i}.content: only text parts are supported, got {part!r}",
                            "invalid_request_error",
                            f"messages.{i}.content",
                        )
                    texts.append(part["text"])
                content = "".join(texts)
            messages.append({"role": m.role, "content": content})
        max_tokens = req.max_completion_tokens or req.max_tokens or default_max_tokens
        try:
            kw = _kwargs(req, max_tokens)
        except _BadFieldError as e:
            return _error(400, str(e), "invalid_request_error", e.param)
        kw["messages"] = messages
        handle = _submit("chat_completions", req, kw)
        if not isinstance(handle, RequestHandle):
            return handle
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

        def logprobs_of(ids: list[int], lps: list[float]) -> dict[str, Any] | None:
            if not req.logprobs:
                return None
            return {
                "content": [
                    {"token": t, "logprob": lp, "bytes": list(t.encode("utf-8")), "top_logprobs": []}
                    for t, lp in zip(_token_text(ids), lps, strict=True)
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


async def _parse(request: Any, schema: Any) -> Any:
    """The body validated against ``schema``, or a 400 response naming the first bad field."""
    from pydantic import ValidationError

    raw = await request.body()
    try:
        body = json.loads(raw) if raw else None
    except ValueError as e:
        return _error(400, f"the body is not valid JSON: {e}", "invalid_request_error")
    if not isinstance(body, dict):
        return _error(400, "the body must be a JSON object", "invalid_request_error")
    try:
        return schema.model_validate(body)
    except ValidationError as e:
        first = e.errors()[0]
        # Union members add their type to the location ("constrained-int", "literal['auto']"): keep field names and
        # list indices only.
        loc = [str(x) for x in first.get("loc", ()) if isinstance(x, int) or str(x).isidentifier()]
        param = ".".join(loc) or None
        msg = first.get("msg", "invalid value")
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
