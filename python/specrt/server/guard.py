"""What ``specrt serve`` checks before a request reaches a route: the API key (``--api-key``) and the body's size
(``--max-request-bytes``) and arrival time (``--body-timeout``). One ASGI middleware, outermost in the app, so a
refused request costs no parsing, no tokenizing and no queue slot.

- **Keys**: with keys configured, every route needs ``Authorization: Bearer <key>`` (vLLM's and llama-server's
  ``--api-key``), except ``GET /health`` (load balancers probe it) and, unless ``metrics_need_key``, ``GET
  /metrics``. Keys are compared in constant time (:func:`hmac.compare_digest`, every configured key tried); a missing
  or wrong key is a 401 in OpenAI's error schema (``code: invalid_api_key``, ``WWW-Authenticate: Bearer``), logged
  with the method, path and client address, never the key.
- **Body size**: a ``Content-Length`` above the limit is a 413 before any byte is read; a chunked body is counted as
  it arrives and refused (413) as soon as it passes the limit. TGI's ``--payload-limit`` is the same (2 MB there).
- **Body time**: a body still arriving ``body_timeout_s`` after the request began is a 408 (the connection is then
  closed): a client that never finishes its body holds no queue slot, since requests queue only once parsed.

Headers that trickle in slowly are read by uvicorn before any of this runs; bound them at a reverse proxy
(nginx ``client_header_timeout``, ``large_client_header_buffers``) — docs/openai-api.md, "On a network".
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

__all__ = ["RequestGuard", "is_loopback"]

_log = logging.getLogger("specrt.serve")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

#: Paths that never need a key.
_OPEN_PATHS = frozenset({"/health"})


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address uvicorn binds) is reachable only from this machine."""
    return host in ("localhost", "::1") or host.startswith("127.")


class _RefusedBodyError(Exception):
    """A body refused while it arrives: the response to send instead of the route's."""

    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message)
        self.status, self.code = status, code


async def _error(send: Send, status: int, message: str, code: str, headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    kind = "authentication_error" if status == 401 else "invalid_request_error"
    body = json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}}).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers]
    if status in (408, 413):
        raw.append((b"connection", b"close"))  # the rest of the body is not read
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


class RequestGuard:
    """ASGI middleware: API keys, body size and body time (module docs).

    Args:
        app: the ASGI app guarded.
        api_keys: accepted keys (empty: no key needed).
        metrics_need_key: whether ``GET /metrics`` needs a key too (only with keys).
        max_request_bytes: the largest body, in bytes (>= 1).
        body_timeout_s: seconds a body may take to arrive, from the start of the request (> 0).

    Raises:
        ValueError: an empty key, ``max_request_bytes`` < 1 or ``body_timeout_s`` <= 0 (named).
    """

    def __init__(
        self,
        app: Callable[[Scope, Receive, Send], Awaitable[None]],
        *,
        api_keys: Sequence[str] = (),
        metrics_need_key: bool = False,
        max_request_bytes: int,
        body_timeout_s: float,
    ) -> None:
        self.check(api_keys, max_request_bytes, body_timeout_s)
        self.app = app
        self._keys = [k.encode() for k in api_keys]
        self._metrics_need_key = metrics_need_key
        self.max_request_bytes = max_request_bytes
        self.body_timeout_s = body_timeout_s

    @staticmethod
    def check(api_keys: Sequence[str], max_request_bytes: int, body_timeout_s: float) -> None:
        """The settings' rules (the app checks them when it is made; the middleware is built at its first request).

        Raises:
            ValueError: an empty key, ``max_request_bytes`` < 1 or ``body_timeout_s`` <= 0 (named).
        """
        if any(not k for k in api_keys):
            raise ValueError("api_keys: a key must be non-empty")
        if max_request_bytes < 1:
            raise ValueError(f"max_request_bytes {max_request_bytes} is invalid (expected >= 1)")
        if not body_timeout_s > 0:
            raise ValueError(f"body_timeout_s {body_timeout_s} is invalid (expected > 0 seconds)")

    def _key_ok(self, scope: Scope) -> bool:
        if not self._keys:
            return True
        path = scope.get("path", "")
        if path in _OPEN_PATHS or (path == "/metrics" and not self._metrics_need_key):
            return True
        given = b""
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                given = token.strip() if scheme.lower() == b"bearer" else b""
        ok = False
        for key in self._keys:  # every key compared: the time does not say which one matched
            ok |= hmac.compare_digest(given, key)
        return ok

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if not self._key_ok(scope):
            client = scope.get("client") or ("?", 0)
            _log.warning("401: %s %s from %s: missing or wrong API key", scope["method"], scope["path"], client[0])
            await _error(
                send,
                401,
                "a valid API key is needed: send the header 'Authorization: Bearer <key>'",
                "invalid_api_key",
                [(b"www-authenticate", b"Bearer")],
            )
            return
        length = dict(scope.get("headers", ())).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_request_bytes:
            await _error(send, 413, self._too_large(int(length)), "request_too_large")
            return
        started = False
        seen = 0
        body_done = False
        deadline = time.monotonic() + self.body_timeout_s

        async def guarded_receive() -> Message:
            nonlocal seen, body_done
            if body_done:  # the body is in: later receives wait for a disconnect, unbounded
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(deadline - time.monotonic(), 0.001))
            except TimeoutError:
                raise _RefusedBodyError(
                    408, f"the request body did not arrive within {self.body_timeout_s:g} s", "body_timeout"
                ) from None
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_request_bytes:
                    raise _RefusedBodyError(413, self._too_large(seen, so_far=True), "request_too_large")
                body_done = not message.get("more_body", False)
            else:
                body_done = True
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, guarded_receive, tracked_send)
        except _RefusedBodyError as e:
            if started:
                raise
            await _error(send, e.status, str(e), e.code)

    def _too_large(self, n: int, so_far: bool = False) -> str:
        got = f"more than {self.max_request_bytes} bytes arrived" if so_far else f"Content-Length is {n} bytes"
        return (
            f"the request body is too large: {got} (this server's limit: --max-request-bytes {self.max_request_bytes})"
        )
