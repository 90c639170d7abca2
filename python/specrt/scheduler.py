"""Many requests at once on one :class:`~specrt.Decoder`: submit from any thread or from asyncio, receive each result
or stream independently.

:class:`Scheduler` owns a worker thread that runs the queued requests on its decoder, first come first served. On a
``Decoder(max_batch=N)`` up to N requests decode together in batched rounds (continuous batching: a finished request
leaves and the next queued one joins at the next round, its prompt prefilled a chunk per round); on a single-stream
decoder they run one at a time. Each request's tokens are those it would get alone (same seed and settings). Each
:meth:`Scheduler.submit` returns a :class:`RequestHandle` at once:

- ``handle.result()`` / ``await handle.aresult()``: the :class:`~specrt.GenerationResult`;
- ``for chunk in handle`` / ``async for chunk in handle.aiter()``: the :class:`~specrt.StreamChunk` s as rounds commit;
- ``handle.cancel()``: a queued request never starts, a running one stops after its current round (its batch row is
  freed for the next request).

Limits: ``max_queue`` requests may wait (more raise :class:`QueueFullError` at submit); a request's ``timeout_s``
counts from submission (queueing included) and ends it with :class:`RequestTimeoutError` after the round in which it
expired (unless that round finished the generation), carrying the tokens generated so far. :meth:`Scheduler.close`
stops accepting and, with ``drain=True``, finishes everything already submitted.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from specrt.errors import GenerationCancelled, SpecrtError
from specrt.generate import Decoder
from specrt.results import EventChunks, GenerationResult, StreamChunk

__all__ = [
    "DEFAULT_MAX_QUEUE",
    "QueueFullError",
    "RequestHandle",
    "RequestTimeoutError",
    "Scheduler",
    "SchedulerClosedError",
]

#: Requests that may wait to start by default (``Scheduler(max_queue=...)``, ``specrt serve --max-queue``).
DEFAULT_MAX_QUEUE = 64


class QueueFullError(SpecrtError):
    """:meth:`Scheduler.submit` found ``max_queue`` requests already waiting (HTTP 429 in ``specrt serve``)."""


class SchedulerClosedError(SpecrtError):
    """:meth:`Scheduler.submit` after :meth:`Scheduler.close` (HTTP 503 in ``specrt serve``)."""


class RequestTimeoutError(SpecrtError, TimeoutError):
    """A request ran past its ``timeout_s`` (counted from submission).

    Attributes:
        timeout_s: the limit in seconds.
        token_ids: tokens generated before it ended (empty if it timed out in the queue).
        text: their text.
    """

    def __init__(self, message: str, timeout_s: float, token_ids: list[int], text: str) -> None:
        super().__init__(message)
        self.timeout_s = timeout_s
        self.token_ids = token_ids
        self.text = text


_DONE = object()  # end of a handle's chunk stream


@dataclass
class RequestHandle:
    """One submitted request. Created by :meth:`Scheduler.submit`; iterate it (or :meth:`aiter`) for chunks.

    Attributes:
        request_id: ``"req-<n>"``, unique within the scheduler.
        submitted_at: ``time.perf_counter()`` at submission (s).
        started_at, first_token_at, finished_at: ``time.perf_counter()`` when the generation started, emitted its
            first token and ended (None until then).
        token_times: ``time.perf_counter()`` of each chunk that carried tokens, with its token count.
    """

    request_id: str
    request: Any  # the prepared request (``_specrt.PreparedRequest``), resolved and checked at submission
    timeout_s: float | None
    submitted_at: float = field(default_factory=time.perf_counter)
    started_at: float | None = None
    first_token_at: float | None = None
    finished_at: float | None = None
    token_times: list[tuple[float, int]] = field(default_factory=list)
    _chunks: collections.deque = field(default_factory=collections.deque, repr=False)
    _cond: threading.Condition = field(default_factory=threading.Condition, repr=False)
    _result: GenerationResult | None = field(default=None, repr=False)
    _error: BaseException | None = field(default=None, repr=False)
    _done: bool = field(default=False, repr=False)
    _cancelled: bool = field(default=False, repr=False)
    _cancel_error: BaseException | None = field(default=None, repr=False)  # what a cancel ends it with
    _waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = field(default_factory=list, repr=False)
    _tokens: list[int] = field(default_factory=list, repr=False)  # generated so far (for a timeout's error)
    _text: list[str] = field(default_factory=list, repr=False)

    # ----- producer side (the worker thread) ---------------------------------------------------------------------
    def _push(self, item: object) -> None:
        with self._cond:
            self._chunks.append(item)
            self._cond.notify_all()
            waiters = list(self._waiters)
        for loop, event in waiters:
            # A closed event loop (its consumer is gone) raises RuntimeError: nothing to wake there.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(event.set)

    def _finish(self, result: GenerationResult | None, error: BaseException | None) -> None:
        self.finished_at = time.perf_counter()
        with self._cond:
            self._result, self._error, self._done = result, error, True
        self._push(_DONE)

    # ----- consumer side -----------------------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        """Whether the request has ended (result, error or cancellation)."""
        return self._done

    @property
    def cancelled(self) -> bool:
        """Whether :meth:`cancel` was called."""
        return self._cancelled

    def cancel(self, error: BaseException | None = None) -> None:
        """Stop this request: a queued one never starts, a running one stops after its current round; its result
        is then ``error``, by default :class:`~specrt.errors.GenerationCancelled`. No effect once done."""
        if not self._cancelled:
            self._cancel_error = error
        self._cancelled = True

    def result(self, timeout: float | None = None) -> GenerationResult:
        """Wait for the end and return the result.

        Args:
            timeout: seconds to wait (None = no limit).

        Raises:
            TimeoutError: not done within ``timeout`` (the request keeps running).
            RequestTimeoutError: the request ran past its own ``timeout_s``.
            GenerationCancelled: it was cancelled.
            SpecrtError: whatever the generation raised (bad settings, sequence too long, ...).
        """
        with self._cond:
            if not self._cond.wait_for(lambda: self._done, timeout):
                raise TimeoutError(f"request {self.request_id} not done within {timeout} s")
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def _is_end(self, item: object) -> bool:
        """Whether ``item`` ends the stream; raises the request's error there."""
        if item is not _DONE:
            return False
        if self._error is not None:
            raise self._error
        return True

    def __iter__(self) -> Iterator[StreamChunk]:
        """The chunks of this request as rounds commit them (blocking); raises as :meth:`result` at the end."""
        i = 0
        while True:
            with self._cond:
                while len(self._chunks) <= i:
                    self._cond.wait()
                item = self._chunks[i]
            i += 1
            if self._is_end(item):
                return
            yield item  # type: ignore[misc]

    async def aiter(self) -> AsyncIterator[StreamChunk]:
        """:meth:`__iter__` for asyncio: awaits chunks without blocking the event loop."""
        loop = asyncio.get_running_loop()
        event = asyncio.Event()
        with self._cond:
            self._waiters.append((loop, event))
        try:
            i = 0
            while True:
                with self._cond:
                    ready = len(self._chunks) > i
                    item = self._chunks[i] if ready else None
                    if not ready:
                        event.clear()
                if not ready:
                    await event.wait()
                    continue
                i += 1
                if self._is_end(item):
                    return
                yield item  # type: ignore[misc]
        finally:
            with self._cond:
                self._waiters.remove((loop, event))

    async def aresult(self) -> GenerationResult:
        """:meth:`result` for asyncio."""
        async for _ in self.aiter():
            pass
        assert self._result is not None
        return self._result


class Scheduler:
    """Run submitted requests on ``decoder`` in a worker thread, first come first served.

    Args:
        decoder: the :class:`~specrt.Decoder` to run on (the scheduler's worker is its only user while open).
        max_queue: most requests waiting to start (>= 1); one more raises :class:`QueueFullError`.
        default_timeout_s: ``timeout_s`` of requests that give none (None = no limit).
        on_finish: called in the worker thread with each handle once it is done (metrics); must not raise.

    Raises:
        ConfigError: ``max_queue`` < 1 or ``default_timeout_s`` <= 0.
    """

    def __init__(
        self,
        decoder: Decoder,
        *,
        max_queue: int = DEFAULT_MAX_QUEUE,
        default_timeout_s: float | None = None,
        on_finish: Callable[[RequestHandle], None] | None = None,
    ) -> None:
        from specrt.errors import ConfigError

        if not isinstance(max_queue, int) or max_queue < 1:
            raise ConfigError(f"max_queue must be an integer >= 1, got {max_queue!r}")
        if default_timeout_s is not None and not default_timeout_s > 0:
            raise ConfigError(f"default_timeout_s must be > 0 seconds or None, got {default_timeout_s!r}")
        self.decoder = decoder
        self.max_queue = max_queue
        self.default_timeout_s = default_timeout_s
        self._on_finish = on_finish
        self._queue: collections.deque[RequestHandle] = collections.deque()
        self._cond = threading.Condition()
        self._closed = False
        self._active: list[RequestHandle] = []  # handles generating now
        self._n_running = 0
        self._n = 0
        # A batching decoder's requests share its batch: the scheduler owns it. A single-stream decoder stays usable
        # directly: the worker holds its lock while requests of the scheduler run (direct calls wait, as for any
        # other thread's generation).
        self._owns = decoder.batched
        self._holds_lock = False
        if self._owns:
            decoder.attach_scheduler(self)
        self._worker = threading.Thread(target=self._work, name="specrt-scheduler", daemon=True)
        self._worker.start()

    def _sweep_queue(self) -> None:
        """Finish queued requests that were cancelled or ran past their deadline: they never start, and they leave
        the queue (and its ``max_queue`` count) now rather than when a row frees."""
        now = time.perf_counter()
        with self._cond:
            gone = [
                h
                for h in self._queue
                if h.cancelled or (h.timeout_s is not None and now >= h.submitted_at + h.timeout_s)
            ]
            for h in gone:
                self._queue.remove(h)
        for h in gone:
            _may_start(h)  # finishes it with GenerationCancelled / RequestTimeoutError
            self._finished(h)

    @property
    def queue_length(self) -> int:
        """Requests waiting to start."""
        return len(self._queue)

    @property
    def running(self) -> int:
        """Requests generating now (at most the decoder's ``max_batch``)."""
        return self._n_running

    @property
    def prefix_cache_usage(self) -> tuple[int, int]:
        """``(entries, bytes)`` of the batched layout's prefix store (KV copies of both models, at most its budget,
        1 GiB by default); ``(0, 0)`` in the single-stream layout. Waits for a running step to end (the driver's
        lock)."""
        return tuple(self.decoder.driver.prefix_cache_usage)

    def submit(
        self,
        prompt: str | list[int] | None = None,
        *,
        timeout_s: float | None = None,
        **kwargs: Any,
    ) -> RequestHandle:
        """Queue a generation; returns at once.

        Args:
            prompt: as :meth:`Decoder.stream` (or give ``messages=``).
            timeout_s: seconds from now after which the request ends with :class:`RequestTimeoutError` (default:
                the scheduler's ``default_timeout_s``).
            kwargs: every other argument of :meth:`Decoder.stream`, resolved and checked now (:meth:`Decoder.prepare`):
                a bad one raises here and nothing is queued.

        Raises:
            QueueFullError: ``max_queue`` requests are already waiting.
            SchedulerClosedError: after :meth:`close`.
            ConfigError: ``timeout_s`` <= 0; a setting out of range (named); a schema, regex or grammar that is not
                valid; both or neither of prompt and messages.
            SequenceLengthError, VocabError, TypeError: as :meth:`Decoder.stream`.
        """
        from specrt.errors import ConfigError

        if timeout_s is not None and not timeout_s > 0:
            raise ConfigError(f"timeout_s must be > 0 seconds or None, got {timeout_s!r}")
        if prompt is not None:
            kwargs = {**kwargs, "prompt": prompt}
        request = self.decoder.prepare(_caller="Scheduler.submit", **kwargs)  # never waits for a running round
        with self._cond:
            if self._closed:
                raise SchedulerClosedError("the scheduler is closed (shutting down); no new requests are accepted")
            if len(self._queue) >= self.max_queue:
                raise QueueFullError(
                    f"{len(self._queue)} requests are waiting (max_queue {self.max_queue}); retry later"
                )
            self._n += 1
            handle = RequestHandle(
                request_id=f"req-{self._n}",
                request=request,
                timeout_s=self.default_timeout_s if timeout_s is None else float(timeout_s),
            )
            self._queue.append(handle)
            self._cond.notify_all()
        return handle

    def close(self, drain: bool = True, timeout: float | None = None) -> bool:
        """Stop accepting requests; with ``drain`` finish the queued and running ones, else cancel them.

        Args:
            drain: finish what was submitted (True) or cancel it (False).
            timeout: seconds to wait for the worker (None = until done).

        Returns:
            True if the worker finished within ``timeout``.
        """
        with self._cond:
            self._closed = True
            if not drain:
                for h in self._queue:
                    h.cancel()
                for h in self._active:
                    h.cancel()
            self._cond.notify_all()
        self._worker.join(timeout)
        return not self._worker.is_alive()

    def cut(self, why: str) -> int:
        """Stop accepting requests and end every queued and running one now (a running one after its current
        round) with :class:`SchedulerClosedError` (``why``): a server's drain deadline. Returns how many were cut.
        The worker keeps running until :meth:`close`."""
        with self._cond:
            self._closed = True
            handles = [h for h in [*self._queue, *self._active] if not h.done]
            for h in handles:
                h.cancel(SchedulerClosedError(f"request {h.request_id}: {why}"))
            self._cond.notify_all()
        return len(handles)

    def __enter__(self) -> Scheduler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(drain=exc[0] is None)

    # ----- the worker --------------------------------------------------------------------------------------------
    def _set_active(self, handles: list[RequestHandle]) -> None:
        with self._cond:
            self._active = handles
            self._n_running = len(handles)

    def _finished(self, handle: RequestHandle) -> None:
        if self._on_finish is not None:
            with contextlib.suppress(Exception):  # metrics must never stop the worker
                self._on_finish(handle)

    def _work(self) -> None:
        """Rounds of the decoder's driver: admit queued requests into free rows, run one round, deliver each
        request's chunks (one request at a time on a single-stream decoder)."""
        rows: dict[int, tuple[RequestHandle, EventChunks]] = {}
        try:
            while self._round(rows):
                pass
        finally:
            self._hold_decoder(False)
            if self._owns:
                self.decoder.detach_scheduler(self)

    def _hold_decoder(self, hold: bool) -> None:
        """Take (``hold``) or give back a single-stream decoder's lock (no-op for a batching decoder, owned)."""
        if self._owns or hold == self._holds_lock:
            return
        if hold:
            self.decoder.generation_lock.acquire()
        else:
            self.decoder.generation_lock.release()
        self._holds_lock = hold

    def _round(self, rows: dict[int, tuple[RequestHandle, EventChunks]]) -> bool:
        """One iteration of the worker; False when closed and drained. An unexpected error ends the requests in the
        batch (with that error), never the worker."""
        batch = self.decoder.driver
        with self._cond:
            self._cond.wait_for(lambda: self._queue or rows or self._closed)
            if not self._queue and not rows:
                return False  # closed and drained
            admitted = []
            while self._queue and len(rows) + len(admitted) < batch.max_batch:
                admitted.append(self._queue.popleft())
        try:
            if admitted:
                self._set_active([h for h, _ in rows.values()] + admitted)  # running, though maybe waiting for the lock
                self._hold_decoder(True)
            self._admit(batch, rows, admitted)
            self._set_active([h for h, _ in rows.values()])
            if rows:
                self._step(batch, rows)
            self._sweep_queue()
        except Exception as e:  # a bug or a model failure: fail what is running, keep serving
            for rid, (h, _) in list(rows.items()):
                with contextlib.suppress(Exception):
                    batch.cancel(rid)
                if not h.done:
                    h._finish(None, e)
                self._finished(h)
            rows.clear()
        self._set_active([h for h, _ in rows.values()])
        if not rows:
            self._hold_decoder(False)
        return True

    def _admit(self, batch: Any, rows: dict[int, tuple[RequestHandle, EventChunks]], admitted: list) -> None:
        for h in admitted:
            if not _may_start(h):
                self._finished(h)
                continue
            try:
                rid = batch.submit(h.request)  # resolved and checked at submission
            except Exception as e:  # the request's own error (a constraint that does not compile): the others go on
                h._finish(None, e)
                self._finished(h)
                continue
            rows[rid] = (h, EventChunks(h.request.prompt_ids, h.request.scored))

    def _step(self, batch: Any, rows: dict[int, tuple[RequestHandle, EventChunks]]) -> None:
        events = batch.step()  # a failed model pass raises: every running row is gone (handled by the caller)
        for e in events:
            rid = e["id"]
            if rid not in rows:  # not admitted by this scheduler (cannot happen once it owns the decoder; be safe)
                batch.cancel(rid)
                continue
            h, chunks = rows[rid]
            done = True
            try:
                if e["error"] is not None:
                    h._finish(None, e["error"])
                else:
                    for chunk in chunks.chunks(e):
                        done = _deliver(h, chunk)
                        if done:
                            break
            except Exception as err:  # this request's own failure: the others go on
                if not h.done:
                    h._finish(None, err)
                done = True
            if done:
                batch.cancel(rid)  # frees the row of a request that ended early (a no-op once it finished)
                del rows[rid]
                self._finished(h)
        # Cancelled or expired requests that committed nothing this round (prefilling) leave too.
        for rid, (h, _) in list(rows.items()):
            if _ended_early(h):
                batch.cancel(rid)
                del rows[rid]
                self._finished(h)


def _deadline(h: RequestHandle) -> float | None:
    return None if h.timeout_s is None else h.submitted_at + h.timeout_s


def _may_start(h: RequestHandle) -> bool:
    """Whether a dequeued request starts now; if not (cancelled, or timed out in the queue) it is finished here."""
    deadline = _deadline(h)
    if h.cancelled:
        h._finish(
            None, h._cancel_error or GenerationCancelled(f"request {h.request_id} was cancelled before it started")
        )
        return False
    if deadline is not None and time.perf_counter() >= deadline:
        h._finish(None, _timeout(h, [], "", queued=True))
        return False
    h.started_at = time.perf_counter()
    return True


def _deliver(h: RequestHandle, chunk: StreamChunk) -> bool:
    """Record and push one chunk; returns True when the request is over (its result, a cancel, or its timeout)."""
    now = time.perf_counter()
    if chunk.token_ids:
        if h.first_token_at is None:
            h.first_token_at = now
        h.token_times.append((now, len(chunk.token_ids)))
        h._tokens += chunk.token_ids
        h._text.append(chunk.text)
    h._push(chunk)
    if chunk.result is not None:
        h._finish(chunk.result, None)
        return True
    if chunk.finish_reason is not None:
        return False  # the result chunk follows
    return _ended_early(h)


def _ended_early(h: RequestHandle) -> bool:
    """Finish a running request that was cancelled or ran past its deadline; returns whether it did."""
    if h.cancelled:
        error = h._cancel_error or GenerationCancelled(
            f"request {h.request_id} was cancelled after {len(h._tokens)} tokens"
        )
        h._finish(None, error)
        return True
    deadline = _deadline(h)
    if deadline is not None and time.perf_counter() >= deadline:
        h._finish(None, _timeout(h, list(h._tokens), "".join(h._text), queued=False))
        return True
    return False


def _timeout(h: RequestHandle, tokens: list[int], text: str, *, queued: bool) -> RequestTimeoutError:
    where = "while queued" if queued else f"after {len(tokens)} generated tokens"
    return RequestTimeoutError(
        f"request {h.request_id} ran past its timeout of {h.timeout_s:g} s {where}", h.timeout_s or 0.0, tokens, text
    )
