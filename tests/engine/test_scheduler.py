"""``specrt.Scheduler``: many requests on one Decoder from threads and asyncio, each result equal to its solo run;
queue limits, cancellation, timeouts, draining. Scheduling logic runs on a scripted stand-in decoder whose rounds
wait for the test, so every interleaving asserted here is forced, not timed; timeouts run out on the test's clock
(``scheduler_clock``), not the machine's."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from specrt.errors import ConfigError, GenerationCancelled, SequenceLengthError, VocabError
from specrt.generate import GenerationResult
from specrt.scheduler import QueueFullError, RequestTimeoutError, Scheduler, SchedulerClosedError

pytestmark = pytest.mark.timing  # threads, a worker, timeouts


@pytest.fixture
def tiny(tiny_decoder):
    return tiny_decoder


REQUESTS = [
    {"prompt": "def add(a, b):", "max_new_tokens": 24, "temperature": 0, "num_speculative_tokens": 4},
    {"prompt": "hello world, hello", "max_new_tokens": 17, "temperature": 1.0, "seed": 5, "num_speculative_tokens": 2},
    {"prompt": "x = [1, 2, 3]", "max_new_tokens": 30, "temperature": 0.7, "top_p": 0.9, "seed": 1, "coupled": True},
    {"prompt": "the cat", "max_new_tokens": 9, "temperature": 0, "proposer": "ngram", "ignore_eos": True},
    {"prompt": "abc abc abc", "max_new_tokens": 20, "temperature": 1.0, "seed": 9, "stop": ["a"]},
]


def test_requests_from_many_threads_each_equal_their_solo_run(tiny) -> None:
    solo = [tiny.generate(**r) for r in REQUESTS]
    with Scheduler(tiny, max_queue=len(REQUESTS) * 3) as sched:
        handles: list = [None] * (len(REQUESTS) * 3)

        def submit(i: int) -> None:
            handles[i] = sched.submit(**REQUESTS[i % len(REQUESTS)])

        threads = [threading.Thread(target=submit, args=(i,)) for i in range(len(handles))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for i, h in enumerate(handles):
            got = h.result(timeout=60)
            want = solo[i % len(REQUESTS)]
            assert (got.token_ids, got.text, got.finish_reason) == (want.token_ids, want.text, want.finish_reason)
            assert got.logprobs == want.logprobs
    ids = {h.request_id for h in handles}
    assert len(ids) == len(handles)


def test_asyncio_streams_and_results(tiny) -> None:
    solo = [tiny.generate(**r) for r in REQUESTS]

    async def main(sched: Scheduler) -> list[tuple[str, list[int], GenerationResult]]:
        async def one(r: dict) -> tuple[str, list[int], GenerationResult]:
            h = sched.submit(**r)
            text, ids = "", []
            async for chunk in h.aiter():
                text += chunk.text
                ids += chunk.token_ids
            return text, ids, await h.aresult()

        return await asyncio.gather(*(one(r) for r in REQUESTS))

    with Scheduler(tiny) as sched:
        out = asyncio.run(main(sched))
    for (text, ids, res), want in zip(out, solo, strict=True):
        assert text == want.text == res.text and ids == want.token_ids == res.token_ids


def test_a_bad_request_is_refused_at_submission_and_queues_nothing(tiny) -> None:
    # Resolved and checked once, by submit (Decoder.prepare): the error is raised there, naming the setting, nothing
    # of the request is queued, and the requests around it run as if it had never been sent.
    with Scheduler(tiny) as sched:
        first = sched.submit("hi", max_new_tokens=4, temperature=0)
        bad = [
            ({"temperature": -1.0}, ConfigError, "temperature"),
            ({"bogus": 1}, TypeError, r"^Scheduler\.submit\(\) got an unexpected keyword argument 'bogus'"),
            ({"stop": [""]}, ConfigError, "stop"),
            ({"stop_token_ids": [10**6]}, VocabError, "stop_token_ids"),
            ({"max_new_tokens": 10**6}, SequenceLengthError, "maximum sequence length"),
            ({"regex": "("}, ConfigError, "regex"),
        ]
        for settings, error, message in bad:
            with pytest.raises(error, match=message):
                sched.submit("hi", **{"max_new_tokens": 4, **settings})
        with pytest.raises(VocabError, match="prompt token"):
            sched.submit([1, -3], max_new_tokens=4)
        with pytest.raises(ConfigError, match="exactly one of prompt and messages"):
            sched.submit(max_new_tokens=4)
        good = sched.submit("hi", max_new_tokens=4, temperature=0)
        assert (first.request_id, good.request_id) == ("req-1", "req-2")  # no refused request took an id
        assert good.result(timeout=30).token_ids == first.result(timeout=30).token_ids
    with pytest.raises(ConfigError, match="max_queue must be an integer >= 1, got 0"):
        Scheduler(tiny, max_queue=0)
    with Scheduler(tiny) as sched, pytest.raises(ConfigError, match="timeout_s must be > 0"):
        sched.submit("hi", timeout_s=0)


class ScriptedDecoder:
    """Stands in for a single-stream Decoder (the surface a Scheduler uses: ``prepare``, ``driver``
    with submit / step / cancel, and ``generation_lock``): each request yields ``rounds`` one-token rounds, each only
    after the test releases it with ``step.release()``; records the order in which requests started and, as
    ``"<prompt>:<rounds done>"``, when each was let go (``cancel``)."""

    batched = False

    def __init__(self) -> None:
        self.step = threading.Semaphore(0)
        self.started: list[str] = []
        self.closed: list[str] = []
        self.generation_lock = threading.Lock()
        self.driver = _ScriptedDriver(self)

    def prepare(self, prompt: str, rounds: int = 3, **_kw) -> SimpleNamespace:
        return SimpleNamespace(prompt_ids=[ord(ch) for ch in prompt], scored=False, prompt=prompt, rounds=rounds)


class _ScriptedDriver:
    """The scripted driver: one request at a time, one released round per ``step``."""

    max_batch = 1

    def __init__(self, dec: ScriptedDecoder) -> None:
        self.dec = dec
        self.requests: dict[int, list] = {}  # id -> [prompt, rounds, done]
        self.next = 0

    def submit(self, request: SimpleNamespace) -> int:
        rid, self.next = self.next, self.next + 1
        self.requests[rid] = [request.prompt, request.rounds, 0]
        self.dec.started.append(request.prompt)
        return rid

    def cancel(self, rid: int) -> bool:
        req = self.requests.pop(rid, None)
        if req is not None:
            self.dec.closed.append(f"{req[0]}:{req[2]}")
        return req is not None

    def step(self) -> list[dict]:
        (rid, req), *_ = self.requests.items()
        assert self.dec.step.acquire(timeout=30), "the test never released a round"
        _, rounds, i = req
        req[2] += 1
        last = "length" if i == rounds - 1 else None
        event = {
            "id": rid,
            "text": f"{i}",
            "tokens": [i],
            "sources": ["bonus"],
            "finish_reason": last,
            "logprobs": [0.0],
            "top_logprobs": [[]],
            "prompt": None,
            "done": None,
            "error": None,
        }
        if last is not None:
            stats = {
                **dict.fromkeys(["n_prompt_tokens", "n_rounds", "n_drafted", "n_accepted"], 0),
                **dict.fromkeys(["n_recovered", "n_bonus"], 0),
                **dict.fromkeys(["n_cached_tokens", "n_cached_tokens_dft"], 0),
                **dict.fromkeys(["prefill_ms", "draft_ms", "target_ms", "core_ms"], 0.0),
                **dict.fromkeys(["acceptance_rate", "mean_tokens_per_round"]),
                **dict.fromkeys(["decode_tokens_per_s", "tokens_per_s"]),
                "accepted_at": [],
                "n_drafted_ngram": 0,
                "n_accepted_ngram": 0,
                "rounds_by_k": [],
                "n_drafted_forced": 0,
                "n_accepted_forced": 0,
                "mask_ms": 0.0,
            }
            event["done"] = {
                "text": "".join(str(j) for j in range(rounds)),
                "tokens": list(range(rounds)),
                "finish_reason": "length",
                "logprobs": [0.0] * rounds,
                "sources": ["bonus"] * rounds,
                "top_logprobs": [[]] * rounds,
                "stats": stats,
                "prompt": None,
            }
        return [event]


def _wait_until(cond, timeout: float = 30.0) -> None:
    ev = threading.Event()
    for _ in range(int(timeout / 0.005)):
        if cond():
            return
        ev.wait(0.005)
    raise AssertionError("condition not reached")


def test_queue_limit_order_cancel_and_drain() -> None:
    dec = ScriptedDecoder()
    sched = Scheduler(dec, max_queue=2)  # type: ignore[arg-type]
    a = sched.submit("a", rounds=2)
    _wait_until(lambda: dec.started == ["a"])  # a runs, the queue is empty
    b = sched.submit("b", rounds=1)
    c = sched.submit("c", rounds=1)
    assert sched.queue_length == 2 and sched.running == 1
    with pytest.raises(QueueFullError, match=r"2 requests are waiting \(max_queue 2\)"):
        sched.submit("d")
    c.cancel()  # queued: never starts
    for _ in range(3):
        dec.step.release()
    assert a.result(timeout=30).text == "01" and b.result(timeout=30).text == "0"
    with pytest.raises(GenerationCancelled, match="cancelled before it started"):
        c.result(timeout=30)
    assert dec.started == ["a", "b"]  # first come first served; the cancelled one never ran
    # A running request stops after its current round and releases the decoder.
    e = sched.submit("e", rounds=50)
    it = iter(e)
    dec.step.release()
    assert next(it).token_ids == [0]
    e.cancel()
    dec.step.release()
    with pytest.raises(GenerationCancelled, match="cancelled after 2 tokens"):
        e.result(timeout=30)
    _wait_until(lambda: "e:2" in dec.closed)
    # Close with drain: what was submitted still finishes; nothing new is accepted.
    f = sched.submit("f", rounds=1)
    closer = threading.Thread(target=sched.close, kwargs={"drain": True})
    closer.start()
    _wait_until(lambda: sched._closed)
    with pytest.raises(SchedulerClosedError, match="closed"):
        sched.submit("g")
    dec.step.release()
    closer.join(30)
    assert not closer.is_alive() and f.result(timeout=1).text == "0"


def test_timeouts_end_requests_with_what_they_generated(scheduler_clock) -> None:
    dec = ScriptedDecoder()
    with Scheduler(dec, default_timeout_s=60) as sched:  # type: ignore[arg-type]
        a = sched.submit("a", rounds=100)
        _wait_until(lambda: dec.started == ["a"])
        queued = sched.submit("q", rounds=1, timeout_s=30)
        dec.step.release()
        _wait_until(lambda: len(a.token_times) == 1)  # a's first round ended within its time
        scheduler_clock.advance(61)  # a is past its 60 s now (and q past its 30 s); a's next round ends it
        dec.step.release()
        with pytest.raises(RequestTimeoutError, match=r"timeout of 60 s after 2 generated tokens") as err:
            a.result(timeout=30)
        assert err.value.token_ids == [0, 1] and err.value.text == "01" and err.value.timeout_s == 60
        with pytest.raises(RequestTimeoutError, match="while queued") as err:
            queued.result(timeout=30)
        assert err.value.token_ids == []
    assert dec.started == ["a"]


def test_close_without_drain_cancels_everything(tmp_path: Path) -> None:
    dec = ScriptedDecoder()
    sched = Scheduler(dec)  # type: ignore[arg-type]
    a = sched.submit("a", rounds=5)
    _wait_until(lambda: dec.started == ["a"])
    b = sched.submit("b", rounds=5)
    closer = threading.Thread(target=sched.close, kwargs={"drain": False})
    closer.start()
    _wait_until(lambda: sched._closed)
    dec.step.release()
    closer.join(30)
    assert not closer.is_alive()
    for h in (a, b):
        with pytest.raises(GenerationCancelled):
            h.result(timeout=1)
    assert dec.started == ["a"]


def test_a_request_whose_last_round_ends_past_its_deadline_is_not_a_timeout(scheduler_clock) -> None:
    dec = ScriptedDecoder()
    with Scheduler(dec) as sched:  # type: ignore[arg-type]
        h = sched.submit("a", rounds=1, timeout_s=60)
        _wait_until(lambda: dec.started == ["a"])
        scheduler_clock.advance(61)  # the deadline passes during its only round
        dec.step.release()
        assert h.result(timeout=30).text == "0"
