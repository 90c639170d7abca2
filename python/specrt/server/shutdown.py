"""How ``specrt serve`` stops: on SIGTERM / SIGINT it answers new requests 503 (with ``Retry-After``) at once, lets the
running ones finish until the drain deadline, then cuts what is left (a stream ends with an error event and
``[DONE]``, a non-streamed request gets a 503), counts the cut requests in ``/metrics`` and the log, and exits 0.

uvicorn's own handling closes the listening socket first (new connections are refused rather than answered), lets
responses run for a whole number of seconds and then drops them mid-chunk, and re-raises the signal (exit status
-15 / 130); :func:`run_server` replaces it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Iterator
from typing import Any

__all__ = ["drain", "run_server"]

_log = logging.getLogger("specrt.serve")

#: Seconds the cut requests get to send their last event after the deadline.
_FLUSH_S = 5.0


async def drain(app: Any, timeout_s: float) -> int:
    """Refuse new requests (503), wait up to ``timeout_s`` seconds for the running and queued ones, then cut the
    rest. Returns how many were cut (also counted in ``specrt_requests_cut_at_shutdown`` and logged).

    Args:
        app: an app of :func:`specrt.server.create_app`.
        timeout_s: seconds (fractions honoured) the admitted requests get to finish.
    """
    scheduler = app.state.scheduler
    app.state.context.state["draining"] = True

    def busy() -> bool:
        return bool(scheduler.queue_length or scheduler.running)

    deadline = time.monotonic() + timeout_s
    while busy() and time.monotonic() < deadline:
        await asyncio.sleep(min(0.05, max(deadline - time.monotonic(), 0.0)))
    cut = 0
    if busy():
        cut = scheduler.cut(f"the server shut down ({timeout_s:g} s drain deadline passed); retry on another server")
        app.state.metrics.cut_at_shutdown.inc(cut)
        flush_until = time.monotonic() + _FLUSH_S
        while busy() and time.monotonic() < flush_until:
            await asyncio.sleep(0.02)
    _log.warning("shutdown: drained within %.3g s; %d request(s) cut at the deadline", timeout_s, cut)
    return cut


def run_server(app: Any, *, host: str, port: int, log_level: str, drain_timeout_s: float) -> None:
    """Serve ``app`` with uvicorn until SIGINT / SIGTERM, then :func:`drain` it (``drain_timeout_s`` seconds, fractions
    honoured) and return (exit status 0 for the CLI). A second signal during the drain cuts at once.

    """
    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:  # the signals are handled below
            yield

    server = Server(uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=_FLUSH_S))

    async def main() -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        signals = 0

        def on_signal() -> None:
            nonlocal signals
            signals += 1
            stop.set()
            if signals > 1:  # a second signal: no more waiting
                app.state.scheduler.cut("the server was stopped")

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal)
        serving = asyncio.ensure_future(server.serve())
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if stop.is_set() and not serving.done():
            await drain(app, drain_timeout_s)
            server.should_exit = True
        stopping.cancel()
        await serving  # uvicorn exits the process (status 1) itself when it cannot listen

    asyncio.run(main())
