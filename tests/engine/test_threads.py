"""Threads: generations from several Python threads on one Decoder (serialised) and on several Decoders (in
parallel) equal serial calls with the same seeds; the GIL is released while models run; a stream left open never
deadlocks its own thread, and one closed or dropped releases the decoder.

Nothing here asserts how long anything takes: each test forces the interleaving it checks (a stream held open, a
thread woken just before a native call with forced GIL switches off) and waits with generous hang guards only.
"""

from __future__ import annotations

import gc
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import specrt
from specrt import _specrt
from specrt._ort import find_ort_library
from specrt.convert import convert
from specrt.convert.tiny import write_tiny_gguf
from specrt.errors import ConfigError

pytestmark = pytest.mark.timing  # threads

PROMPTS = ["def add(a, b):", "hello world, hello", "x = [1, 2, 3]\nfor"]


def _convert_tiny(root: Path, name: str, **kw) -> Path:
    gguf = write_tiny_gguf(root / f"{name}.gguf", **kw)
    return convert(gguf, root / name, progress=False)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("threads")
    return {
        "target": _convert_tiny(root, "target", arch="qwen2", seed=1, n_layers=2),
        "draft": _convert_tiny(root, "draft", arch="qwen2", seed=9, n_layers=1),
        # ~10-30 ms per forward pass here: long enough to see whether the GIL is held during one.
        "slow": _convert_tiny(root, "slow", arch="qwen2", seed=3, n_layers=4, hidden=256, ffn=512, context=512),
    }


def _request(i: int) -> dict:
    return {
        "prompt": PROMPTS[i % len(PROMPTS)],
        "max_new_tokens": 24 + (i % 4) * 8,
        "temperature": 0.9,
        "top_p": 0.95,
        "seed": 1000 + i,
        "num_speculative_tokens": 1 + i % 5,
        "ignore_eos": True,
    }


def _generate(dec: specrt.Decoder, i: int) -> list[int]:
    kw = _request(i)
    return dec.generate(kw.pop("prompt"), **kw).token_ids


def _stream_events(dec: specrt.Decoder, i: int, events: list[tuple[int, int]]) -> list[int]:
    kw = _request(i)
    tokens: list[int] = []
    for chunk in dec.stream(kw.pop("prompt"), **kw):
        events.append((i, len(chunk.token_ids)))  # list.append is atomic under the GIL
        tokens += chunk.token_ids
    return tokens


def _runs(events: list[tuple[int, int]]) -> list[int]:
    """The generation ids of ``events`` with consecutive repeats collapsed."""
    out: list[int] = []
    for i, _ in events:
        if not out or out[-1] != i:
            out.append(i)
    return out


N = 8


def test_one_decoder_shared_by_threads_serialises_generations_and_matches_serial_results(tiny) -> None:
    dec = specrt.Decoder(tiny["target"], tiny["draft"], max_seq_len=128)
    serial = [_generate(dec, i) for i in range(N)]
    with ThreadPoolExecutor(4) as ex:
        parallel = list(ex.map(lambda i: _generate(dec, i), range(N)))
    assert parallel == serial
    # Streams: one generation's chunks are never interleaved with another's (the decoder lock is held from the
    # first chunk to the last).
    events: list[tuple[int, int]] = []
    with ThreadPoolExecutor(4) as ex:
        streamed = list(ex.map(lambda i: _stream_events(dec, i, events), range(N)))
    assert streamed == serial
    runs = _runs(events)
    assert sorted(runs) == list(range(N)), f"generations interleaved on one decoder: {runs}"


def test_separate_decoders_run_in_parallel_and_match_serial_results(tiny) -> None:
    decs = [specrt.Decoder(tiny["target"], tiny["draft"], max_seq_len=128) for _ in range(4)]
    serial = [_generate(decs[0], i) for i in range(N)]
    events: list[tuple[int, int]] = []

    def worker(j: int) -> list[tuple[int, list[int]]]:
        return [(i, _stream_events(decs[j], i, events)) for i in range(j, N, 4)]

    with ThreadPoolExecutor(4) as ex:
        results = dict(pair for chunk in ex.map(worker, range(4)) for pair in chunk)
    assert [results[i] for i in range(N)] == serial
    # The decoders do not wait for each other: with a stream open on one, another thread generates on another.
    it = decs[0].stream("hello", max_new_tokens=20, temperature=0)
    next(it)
    out: list[list[int]] = []
    t = threading.Thread(target=lambda: out.append(_generate(decs[1], 0)))
    t.start()
    t.join(timeout=60)
    try:
        assert not t.is_alive() and out == [serial[0]], "a generation waited for another decoder's open stream"
    finally:
        it.close()
        t.join(timeout=60)


def test_two_threads_on_one_driver_do_not_crash(tiny) -> None:
    # The binding locks the driver per call; concurrent prepare/submit/step/cancel from two threads interleave their
    # requests (that is what Decoder's lock and the Scheduler are for) but never crash or corrupt memory, and each
    # thread's requests end with valid tokens.
    batch = _specrt.Driver(
        str(tiny["target"]), str(tiny["draft"]), ort_library=find_ort_library(), batched=False, max_seq_len=128
    )
    errors: list[BaseException] = []
    ended: list[int] = []

    def worker(seed: int) -> None:
        try:
            for _ in range(20):
                request = batch.prepare([1, 2, 3], {"max_new_tokens": 16, "seed": seed, "num_speculative_tokens": 3})
                rid = batch.submit(request)
                for _ in range(40):
                    events = batch.step()
                    for e in events:
                        assert all(0 <= t < batch.vocab_size for t in e["tokens"])
                    if any(e["id"] == rid and e["done"] for e in events):
                        ended.append(rid)
                        break
                else:
                    batch.cancel(rid)  # the other thread's steps ran it to its end (its event went there)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(s,)) for s in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)
    assert ended, "no request ended in either thread"
    assert batch.is_idle, "a request was left in the driver"


def _another_thread_runs_during(call, attempts: int = 20) -> bool:
    """Whether another Python thread gets to run while ``call()`` (one native call) runs, in up to ``attempts``
    calls. Forced GIL switches are off meanwhile (a 10 s switch interval, set before that thread starts): the other
    thread, woken just before the first call, can then run only where this thread releases the GIL of its own accord,
    and it does nothing else between and after the calls. So True means a call released the GIL; a call that holds it
    gives False however the threads are scheduled (more attempts only give a loaded machine more chances to run the
    other thread). A thread already waiting for the GIL (tqdm's monitor wakes every 10 s) gets its turn first."""
    go, ran = threading.Event(), threading.Event()

    def other() -> None:
        go.wait()
        ran.set()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(10.0)
    try:
        time.sleep(0.01)  # a thread already waiting for the GIL (on the old interval) runs now, not during the calls
        t = threading.Thread(target=other, daemon=True)
        t.start()  # returns once the thread waits for `go` (with no forced switches, it holds the GIL until then)
        go.set()  # wakes it: it now waits for the GIL
        for _ in range(attempts):
            call()
            if ran.is_set():
                break
        happened = ran.is_set()
    finally:
        sys.setswitchinterval(interval)
    t.join(timeout=60)
    return happened


def test_the_gil_is_released_while_models_run(tiny) -> None:
    lib = find_ort_library()
    model = _specrt.OrtModel(str(tiny["slow"]), ort_library=lib, max_seq_len=512)
    # Without prefix caching: each submission below repeats the prompt and its first step must prefill it in full
    # (a long native call).
    batch = _specrt.Driver(
        str(tiny["slow"]), str(tiny["slow"]), ort_library=lib, batched=False, max_seq_len=512, prefix_caching=False
    )
    tokens = np.arange(1, 257, dtype=np.int64)
    model.forward(tokens, 0)  # warm-up
    prompt = [1 + i % 250 for i in range(400)]
    settings = {"max_new_tokens": 100, "temperature": 0.0, "num_speculative_tokens": 4, "ignore_eos": True}
    request = batch.prepare(prompt, settings)
    running = [batch.submit(request)]
    batch.step()

    def prefill() -> None:  # the running request gives way to a new one, whose first step prefills its prompt
        batch.cancel(running.pop())
        running.append(batch.submit(request))
        batch.step()

    calls = {
        "OrtModel.forward": lambda: model.forward(tokens, 0),
        # A long prompt: the first step of a request (its prefill and a round) is one native call.
        "Driver.step (prefill)": prefill,
        "Driver.step (a round)": batch.step,
    }
    for name, call in calls.items():
        assert _another_thread_runs_during(call), f"{name}: no other Python thread ran during it: it held the GIL"


def test_the_gil_check_tells_a_call_that_holds_the_gil() -> None:
    # The check above on a call that holds the GIL (a C loop, 10-50 ms) and on one that releases it (a wait).
    assert not _another_thread_runs_during(lambda: sum(range(1_000_000)), attempts=5)
    assert _another_thread_runs_during(lambda: threading.Event().wait(0.01))


def test_decoder_properties_do_not_wait_for_a_running_generation(tiny) -> None:
    # vocab_size / max_seq_len / providers are fixed at construction: reading them from another thread must not wait
    # for the generation that holds the decoder (an open stream holds it from its first chunk to its last).
    dec = specrt.Decoder(tiny["slow"], tiny["slow"], max_seq_len=512)
    it = dec.stream("abc", max_new_tokens=40, temperature=0, ignore_eos=True, num_speculative_tokens=4)
    first = next(it)
    read: list[tuple] = []
    t = threading.Thread(target=lambda: read.append((dec.vocab_size, dec.max_seq_len, dec.providers)))
    try:
        t.start()
        t.join(timeout=60)
        assert not t.is_alive(), "a property read waited for the generation in progress"
        assert read == [(265, 512, ["CPUExecutionProvider"])]
        rest = list(it)  # the generation was still in progress: it goes on to its 40 tokens
    finally:
        it.close()
        t.join(timeout=60)
    assert len(first.token_ids) + sum(len(c.token_ids) for c in rest) == 40 and rest[-1].result is not None


def test_a_stream_left_open_never_deadlocks_its_own_thread(tiny) -> None:
    dec = specrt.Decoder(tiny["target"], max_seq_len=128)
    it = dec.stream("hello", max_new_tokens=20, temperature=0)
    next(it)
    # Same thread, decoder busy with the open stream: an error, not a hang on the decoder's lock.
    with pytest.raises(ConfigError, match="already generating in this thread"):
        dec.generate("hello", max_new_tokens=4, temperature=0)
    rest = list(it)
    assert rest[-1].result is not None
    assert dec.generate("hello", max_new_tokens=4, temperature=0).token_ids


@pytest.mark.parametrize("how", ["close", "del", "break"])
def test_a_closed_or_dropped_stream_releases_the_decoder(tiny, how: str) -> None:
    dec = specrt.Decoder(tiny["target"], max_seq_len=128)
    expected = dec.generate("hello", max_new_tokens=8, temperature=0).token_ids
    if how == "break":
        for _ in dec.stream("hello", max_new_tokens=50, temperature=0):
            break
    else:
        it = dec.stream("hello", max_new_tokens=50, temperature=0)
        next(it)
        if how == "close":
            it.close()
        else:
            del it
            gc.collect()
    # Another thread can generate now (it would block forever if the lock were still held).
    out: list[list[int]] = []
    t = threading.Thread(target=lambda: out.append(dec.generate("hello", max_new_tokens=8, temperature=0).token_ids))
    t.start()
    t.join(timeout=30)
    assert not t.is_alive(), "the decoder stayed locked after the stream was closed"
    assert out == [expected]


def test_another_thread_waits_for_an_open_stream_then_runs(tiny) -> None:
    dec = specrt.Decoder(tiny["target"], max_seq_len=128)
    it = dec.stream("hello", max_new_tokens=10, temperature=0)
    first = next(it)
    out: list[list[int]] = []
    t = threading.Thread(target=lambda: out.append(dec.generate("abc", max_new_tokens=5, temperature=0).token_ids))
    t.start()
    t.join(timeout=0.3)
    assert t.is_alive() and not out, "the second generation must wait for the open stream"
    rest = list(it)
    t.join(timeout=30)
    assert not t.is_alive() and len(out[0]) == 5
    assert first.token_ids + [x for c in rest for x in c.token_ids] == rest[-1].result.token_ids
