"""The FastAPI app of ``specrt serve`` (:func:`create_app`: the routes, registered over a :class:`ServerContext`)
and the uvicorn runner (:func:`run_server`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from specrt.errors import ConfigError
from specrt.generate import Decoder, check_request
from specrt.scheduler import DEFAULT_MAX_QUEUE, Scheduler
from specrt.server import defaults
from specrt.server.chat import chat_completions
from specrt.server.completions import completions
from specrt.server.context import ServerContext, card, model_not_found, unavailable
from specrt.server.guard import RequestGuard
from specrt.server.metrics import Metrics
from specrt.server.schemas import body_doc, generation_ok, json_doc, openapi_components, pydantic_models, responses_doc
from specrt.server.shutdown import run_server as _run_server
from specrt.server.tokenize import detokenize, tokenize, tokenizer_info
from specrt.server.wire import error_response

__all__ = ["create_app", "run_server"]


def _endpoint(ctx: ServerContext, route: Callable[[ServerContext, Request], Awaitable[Any]]) -> Callable[..., Any]:
    """``route`` as a FastAPI endpoint of the app ``ctx`` belongs to (its docstring is the operation's description)."""

    async def endpoint(request: Request) -> Any:
        return await route(ctx, request)

    endpoint.__name__ = route.__name__
    endpoint.__doc__ = route.__doc__
    return endpoint


def create_app(
    decoder: Decoder,
    *,
    model_name: str,
    max_queue: int = DEFAULT_MAX_QUEUE,
    request_timeout_s: float | None = defaults.REQUEST_TIMEOUT_S,
    num_speculative_tokens: int | str = defaults.NUM_SPECULATIVE_TOKENS,
    proposer: str | None = None,
    default_max_tokens: int = defaults.CHAT_MAX_TOKENS,
    api_keys: Sequence[str] = (),
    metrics_need_key: bool = False,
    max_request_bytes: int = defaults.MAX_REQUEST_BYTES,
    body_timeout_s: float = defaults.BODY_TIMEOUT_S,
) -> Any:
    """The FastAPI app serving ``decoder`` as ``model_name``.

    Args:
        decoder: the loaded :class:`~specrt.Decoder` (the app's scheduler becomes its only user).
        model_name: the id ``/v1/models`` lists and requests' ``model`` must name (or omit).
        max_queue: generations that may wait (a request queues one per choice: prompts x n); a request whose
            choices do not all fit now gets 429, one with more choices than ``max_queue`` a 400.
        request_timeout_s: seconds from arrival after which a request ends (504 / an error event); None = no limit.
        num_speculative_tokens: K of requests that do not set it (an int 0..``_specrt.MAX_DRAFT_TOKENS`` or ``"auto"``).
        proposer: proposer of requests that do not set it (one of ``_specrt.PROPOSERS``); None: ``"auto"``
            (:data:`specrt.server.defaults.PROPOSER_WITH_DRAFT`) for requests whose K is ``"auto"`` when ``decoder``
            has a draft model, else the Decoder's default (the draft model; target-only without one), so a fixed K
            stays a fixed K.
        default_max_tokens: ``max_tokens`` of chat requests that set neither it nor ``max_completion_tokens``
            (completions default to OpenAI's 16).
        api_keys: keys a request must send as ``Authorization: Bearer <key>`` (empty: none needed); ``/health``
            never needs one, ``/metrics`` only with ``metrics_need_key`` (:mod:`specrt.server.guard`).
        metrics_need_key: whether ``/metrics`` needs a key too.
        max_request_bytes: the largest request body (bytes); a larger one is a 413 before it is read.
        body_timeout_s: seconds a request body may take to arrive; a slower one is a 408.

    Raises:
        ImportError: fastapi / prometheus_client are not installed (``pip install 'specrt[serve]'``).
        ConfigError: ``proposer`` not one of ``_specrt.PROPOSERS`` (or a draft proposer without a draft model),
            ``max_queue`` < 1, ``request_timeout_s`` <= 0, an empty API key, ``max_request_bytes`` < 1 or
            ``body_timeout_s`` <= 0.
    """
    try:
        RequestGuard.check(api_keys, max_request_bytes, body_timeout_s)
    except ValueError as e:
        raise ConfigError(str(e)) from e
    if proposer is not None:  # the Rust resolver's check: a known name, and a draft model where it needs one
        check_request("create_app", has_draft=decoder.draft_path is not None, proposer=proposer)
    schemas = pydantic_models()
    scheduler = Scheduler(decoder, max_queue=max_queue, default_timeout_s=request_timeout_s)
    metrics = Metrics(scheduler)
    state: dict[str, Any] = {"draining": False, "tokenizer_info": None}
    components = openapi_components(schemas)
    ctx = ServerContext(
        decoder=decoder,
        scheduler=scheduler,
        metrics=metrics,
        schemas=schemas,
        model_name=model_name,
        num_speculative_tokens=num_speculative_tokens,
        proposer=proposer,
        default_max_tokens=default_max_tokens,
        state=state,
    )

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        # Shutdown: refuse new requests, finish the admitted ones.
        state["draining"] = True
        await asyncio.to_thread(scheduler.close, True)

    app = FastAPI(title="specrt", version=_version(), lifespan=lifespan)
    app.add_middleware(
        RequestGuard,
        api_keys=list(api_keys),
        metrics_need_key=metrics_need_key,
        max_request_bytes=max_request_bytes,
        body_timeout_s=body_timeout_s,
    )
    app.state.scheduler = scheduler
    app.state.context = ctx
    app.state.metrics = metrics

    def openapi() -> dict[str, Any]:
        # The routes read the raw body (to answer a bad one with OpenAI's 400 naming the field), so FastAPI does not
        # see the request models: their schemas join the components the operations' requestBody refers to.
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            schema.setdefault("components", {}).setdefault("schemas", {}).update(components)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request: Request, exc: StarletteHTTPException) -> Any:
        # 404 for unknown paths, 405 for a wrong method: OpenAI's error schema, not FastAPI's {"detail": ...}; the
        # exception's headers (a 405's Allow) are kept.
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return error_response(exc.status_code, str(exc.detail), kind, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _internal_error(_request: Request, exc: Exception) -> Any:
        return error_response(500, f"internal error: {type(exc).__name__}: {exc}", "server_error")

    @app.get("/health", responses=responses_doc(json_doc("Health", "The server is up"), 503))
    async def health() -> Any:
        if state["draining"]:
            return unavailable(ctx)
        return {"status": "ok", "queue_length": scheduler.queue_length, "running": scheduler.running}

    @app.get("/v1/models", responses=responses_doc(json_doc("ModelList", "The served model")))
    async def models() -> Any:
        return {"object": "list", "data": [card(ctx)]}

    @app.get("/v1/models/{model:path}", responses=responses_doc(json_doc("ModelCard", "The model"), 404))
    async def model(model: str) -> Any:
        return card(ctx) if model == model_name else model_not_found(ctx, model)

    @app.get(
        "/metrics",
        response_class=PlainTextResponse,
        responses={200: {"description": "Prometheus text format", "content": {"text/plain": {"schema": {}}}}},
    )
    async def prometheus() -> Any:
        return PlainTextResponse(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    app.post(
        "/v1/completions",
        openapi_extra=body_doc("CompletionRequest"),
        responses=responses_doc(generation_ok("CompletionResponse"), 400, 404, 429, 499, 500, 503, 504),
    )(_endpoint(ctx, completions))

    app.post(
        "/v1/chat/completions",
        openapi_extra=body_doc("ChatCompletionRequest"),
        responses=responses_doc(generation_ok("ChatCompletionResponse"), 400, 404, 429, 499, 500, 503, 504),
    )(_endpoint(ctx, chat_completions))

    app.post(
        "/tokenize",
        openapi_extra=body_doc("TokenizeCompletionRequest", "TokenizeChatRequest"),
        responses=responses_doc(json_doc("TokenizeResponse", "The prompt's token ids"), 400, 404, 500),
    )(_endpoint(ctx, tokenize))

    app.post(
        "/detokenize",
        openapi_extra=body_doc("DetokenizeRequest"),
        responses=responses_doc(json_doc("DetokenizeResponse", "The text of the token ids"), 400, 404, 500),
    )(_endpoint(ctx, detokenize))

    app.get(
        "/tokenizer_info",
        responses=responses_doc(
            json_doc("TokenizerInfoResponse", "The tokenizer's configuration (tokenizer_config.json)")
        ),
    )(_endpoint(ctx, tokenizer_info))

    return app


def _version() -> str:
    from specrt import __version__

    return __version__


def run_server(
    app: Any,
    *,
    host: str = defaults.HOST,
    port: int = defaults.PORT,
    log_level: str = "info",
    drain_timeout_s: float = defaults.DRAIN_TIMEOUT_S,
) -> None:
    """Serve ``app`` with uvicorn until SIGINT / SIGTERM; then answer new requests 503, let the admitted ones finish
    for ``drain_timeout_s`` seconds (fractions honoured), end the rest (an error event and ``[DONE]`` for a stream, a
    503 otherwise) and return (:mod:`specrt.server.shutdown`)."""
    _run_server(app, host=host, port=port, log_level=log_level, drain_timeout_s=drain_timeout_s)
