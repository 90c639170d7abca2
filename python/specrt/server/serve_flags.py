"""The flags of ``specrt serve`` that belong to the server (address, queue, time limits, keys, body limits, the log)
and the :func:`specrt.server.create_app` options they become; the model flags are the CLI's own. Importing this
module loads no web framework."""

from __future__ import annotations

import argparse
import os
from typing import Any

from specrt import _specrt
from specrt.cli_args import K_RANGE, k_arg, positive_int
from specrt.scheduler import DEFAULT_MAX_QUEUE
from specrt.server import defaults as serve_defaults

__all__ = ["add_serve_arguments", "app_options"]


def add_serve_arguments(sv: argparse.ArgumentParser) -> None:
    """Add the server's flags to the ``serve`` subcommand ``sv`` (defaults: :mod:`specrt.server.defaults`)."""
    sv.add_argument("--host", default=serve_defaults.HOST, help="address to listen on")
    sv.add_argument("--port", type=int, default=serve_defaults.PORT, help="TCP port")
    sv.add_argument("--model-name", default=None, help="the model id clients send (default: the target's name)")
    sv.add_argument(
        "--num-speculative-tokens",
        "-k",
        type=k_arg,
        default=serve_defaults.NUM_SPECULATIVE_TOKENS,
        help=f"K of requests that do not set num_speculative_tokens: {K_RANGE} or 'auto'",
    )
    sv.add_argument(
        "--proposer",
        choices=_specrt.PROPOSERS,
        default=None,
        help=f"proposer of requests that do not set one (default: {serve_defaults.PROPOSER_WITH_DRAFT!r} for requests "
        "with auto K when a draft model is loaded: each round a plain step, prompt lookup or the draft model, chosen "
        "from measured acceptance and costs; with a fixed K the draft model; without one: none)",
    )
    sv.add_argument(
        "--max-queue", type=positive_int, default=DEFAULT_MAX_QUEUE, help="requests that may wait; one more gets 429"
    )
    sv.add_argument(
        "--request-timeout",
        type=float,
        default=serve_defaults.REQUEST_TIMEOUT_S,
        help="seconds from arrival before a request ends (504)",
    )
    sv.add_argument(
        "--default-max-tokens",
        type=positive_int,
        default=serve_defaults.CHAT_MAX_TOKENS,
        help="max_tokens of chat requests",
    )
    sv.add_argument(
        "--drain-timeout",
        type=float,
        default=serve_defaults.DRAIN_TIMEOUT_S,
        help="seconds admitted requests get to finish after SIGTERM / SIGINT (fractions honoured); then they are cut",
    )
    sv.add_argument(
        "--api-key",
        action="append",
        default=None,
        metavar="KEY",
        help=f"a key clients send as 'Authorization: Bearer KEY', repeatable; also ${serve_defaults.API_KEY_ENV} "
        "(default: none: anyone who reaches the port may use it)",
    )
    sv.add_argument(
        "--metrics-need-key", action="store_true", help="GET /metrics needs a key too (default: it is open)"
    )
    sv.add_argument(
        "--max-request-bytes",
        type=positive_int,
        default=serve_defaults.MAX_REQUEST_BYTES,
        help="largest request body in bytes; a larger one gets 413 before it is read",
    )
    sv.add_argument(
        "--body-timeout",
        type=float,
        default=serve_defaults.BODY_TIMEOUT_S,
        help="seconds a request body may take to arrive (408 after)",
    )
    sv.add_argument(
        "--log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug"],
        help="uvicorn's log level",
    )


def app_options(a: argparse.Namespace) -> dict[str, Any]:
    """The :func:`specrt.server.create_app` keyword arguments of parsed ``serve`` flags ``a`` (the API keys of
    ``--api-key`` and ``$SPECRT_API_KEY`` together)."""
    keys = list(a.api_key or [])
    if os.environ.get(serve_defaults.API_KEY_ENV):
        keys.append(os.environ[serve_defaults.API_KEY_ENV])
    return {
        "max_queue": a.max_queue,
        "request_timeout_s": a.request_timeout,
        "num_speculative_tokens": a.num_speculative_tokens,
        "proposer": a.proposer,
        "default_max_tokens": a.default_max_tokens,
        "api_keys": keys,
        "metrics_need_key": a.metrics_need_key,
        "max_request_bytes": a.max_request_bytes,
        "body_timeout_s": a.body_timeout,
    }
