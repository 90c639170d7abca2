"""What every route of one app shares (:class:`ServerContext`), and the responses that need it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from specrt.errors import ConfigError, GenerationCancelled, SequenceLengthError, VocabError
from specrt.generate import Decoder, GenerationResult
from specrt.scheduler import RequestTimeoutError, Scheduler, SchedulerClosedError
from specrt.server.metrics import Metrics
from specrt.server.policy import param_of
from specrt.server.schemas import parse_body
from specrt.server.wire import FINISH, error_response


@dataclass
class ServerContext:
    """What every route of one app shares: the decoder it serves, the Scheduler that runs its requests (the
    decoder's only user), the metrics, the request schemas, and the app's settings (:func:`specrt.server.create_app`
    documents them). ``state`` holds ``draining`` (shutdown has begun: new requests get 503) and the cached
    ``tokenizer_info``."""

    decoder: Decoder
    scheduler: Scheduler
    metrics: Metrics
    schemas: dict[str, Any]
    model_name: str
    num_speculative_tokens: int | str
    #: Proposer of requests that set none (None: ``"auto"`` under auto K with a draft model, else the Decoder's).
    proposer: str | None
    default_max_tokens: int
    state: dict[str, Any]
    #: The decoder's tokenizer (``specrt._specrt.Tokenizer``).
    tokenizer: Any = field(init=False)
    #: Whether the tokenizer is byte-level BPE (GPT-2, Qwen, SmolLM2): a token's bytes are spelled one character each.
    byte_level: bool = field(init=False)

    def __post_init__(self) -> None:
        self.tokenizer = self.decoder.tokenizer
        self.byte_level = self.tokenizer.decoder_type == "ByteLevel"


def unavailable(ctx: ServerContext) -> Any:
    return error_response(503, "the server is shutting down", "server_error", code="shutting_down")


def model_not_found(ctx: ServerContext, model: str) -> Any:
    return error_response(
        404,
        f"the model {model!r} does not exist (this server has {ctx.model_name!r})",
        "invalid_request_error",
        "model",
        "model_not_found",
    )


def card(ctx: ServerContext) -> dict[str, Any]:
    return {
        "id": ctx.model_name,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "specrt",
        "max_model_len": ctx.decoder.max_seq_len,
    }


def rejected(ctx: ServerContext, endpoint: str, message: str, param: str | None) -> Any:
    ctx.metrics.requests.labels(endpoint, "invalid").inc()
    return error_response(400, message, "invalid_request_error", param)


def outcome(ctx: ServerContext, error: BaseException | None, result: GenerationResult | None) -> str:
    if result is not None:
        return FINISH.get(result.finish_reason, result.finish_reason)
    if isinstance(error, RequestTimeoutError):
        return "timeout"
    if isinstance(error, SchedulerClosedError):
        return "shutdown"  # cut at the drain deadline
    if isinstance(error, GenerationCancelled):
        return "cancelled"
    if isinstance(error, (ConfigError, VocabError, SequenceLengthError)):
        return "invalid"  # refused when it started (a 400, as one refused before queueing)
    return "error"


def failure(ctx: ServerContext, error: BaseException, req: Any) -> Any:
    if isinstance(error, RequestTimeoutError):
        return error_response(504, str(error), "timeout_error", code="request_timeout")
    if isinstance(error, GenerationCancelled):
        return error_response(499, str(error), "cancelled", code="cancelled")
    if isinstance(error, SchedulerClosedError):  # cut at the drain deadline (503 with Retry-After)
        return error_response(503, str(error), "server_error", code="shutting_down")
    if isinstance(error, (ConfigError, ValueError)):
        return error_response(400, str(error), "invalid_request_error", param_of(error, req))
    return error_response(500, f"{type(error).__name__}: {error}", "server_error")


async def parsed(ctx: ServerContext, request: Any, kind: str, endpoint: str) -> Any:
    """The body of a generation request validated against ``ctx.schemas[kind]``, or the schema's 400 response
    (counted as an invalid request of ``endpoint``)."""
    req = await parse_body(request, ctx.schemas[kind])
    if not isinstance(req, ctx.schemas[kind]):
        ctx.metrics.requests.labels(endpoint, "invalid").inc()
    return req
