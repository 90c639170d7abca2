"""Batched rounds end to end (``Decoder(max_batch=N)`` and :class:`specrt.Scheduler`): requests share each draft and
verification pass, join and leave between rounds, and each gets exactly the output it gets alone on the single-stream
(GQA) decoder: greedy, seeded temperature 1 with fixed K, and coupled sampling with auto K (ARCHITECTURE.md "Batched
rounds"). The mixed-round mechanics (rows accepting 0 and K in one round, per-row rollback) are forced on mock models
in rust/specrt-core/tests/batch.rs; here the same holds on real ONNX Runtime passes.

On float32 the batched pass and the batch-1 GQA pass compute each row's logits to ~1e-6
(tests/convert/test_batched_graph.py),
so greedy tokens can differ only at a near-tie: a divergence is reported with its top-2 logit gap and allowed only
below ``TIE_BOUND`` (none has been seen on these models)."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import numpy as np
import pytest

import specrt
from specrt.errors import ConfigError, GenerationCancelled
from specrt.scheduler import RequestTimeoutError, Scheduler

TIE_BOUND = 1e-4  # largest top-2 logit gap at which a batched/solo greedy divergence is tolerated

PROMPT_LONG = list(range(5, 155))  # 150 tokens: several prefill chunks of 16

REQUESTS = [
    {"prompt": "def add(a, b):", "max_new_tokens": 24, "temperature": 0, "num_speculative_tokens": 4},
    {"prompt": "hello world, hello", "max_new_tokens": 17, "temperature": 0, "num_speculative_tokens": 8},
    {"prompt": "the cat", "max_new_tokens": 9, "temperature": 0, "num_speculative_tokens": 0, "ignore_eos": True},
    {"prompt": "abc abc abc abc", "max_new_tokens": 20, "temperature": 0, "proposer": "ngram+draft"},
    {"prompt": PROMPT_LONG, "max_new_tokens": 30, "temperature": 0, "num_speculative_tokens": 3},
    {"prompt": "x = [1, 2, 3]", "max_new_tokens": 21, "temperature": 0, "repetition_penalty": 1.3},
    {"prompt": "hello world, hello", "max_new_tokens": 17, "temperature": 1.0, "seed": 5, "num_speculative_tokens": 2},
    {"prompt": "abc abc abc", "max_new_tokens": 20, "temperature": 1.0, "seed": 9, "stop": ["a"]},
    {"prompt": "q", "max_new_tokens": 25, "temperature": 0.8, "top_p": 0.9, "seed": 3, "num_speculative_tokens": 5},
    {
        "prompt": "x = [1, 2, 3]",
        "max_new_tokens": 30,
        "temperature": 1.0,
        "seed": 1,
        "coupled": True,
        "num_speculative_tokens": "auto",
    },
]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny random-weight qwen2 pair (2-layer target, 1-layer draft of the same weights), in both layouts."""
    from specrt.convert import convert
    from specrt.convert.tiny import write_tiny_gguf

    root = tmp_path_factory.mktemp("batching")
    out = {}
    for name, layers in [("target", 2), ("draft", 1)]:
        gguf = write_tiny_gguf(root / f"{name}.gguf", arch="qwen2", seed=3, n_layers=layers)
        for attention in ("gqa", "batched"):
            out[f"{name}-{attention}"] = convert(
                gguf, root / f"{name}-{attention}", progress=False, attention=attention
            )
    return out


@pytest.fixture(scope="module")
def solo(pair) -> specrt.Decoder:
    return specrt.Decoder(pair["target-gqa"], pair["draft-gqa"], max_seq_len=256)


@pytest.fixture(scope="module")
def solo_results(solo) -> list:
    return [solo.generate(**r) for r in REQUESTS]


def batched(pair, max_batch: int) -> specrt.Decoder:
    return specrt.Decoder(
        pair["target-batched"], pair["draft-batched"], max_seq_len=256, max_batch=max_batch, prefill_chunk=16
    )


def assert_equal_or_near_tie(got, ref, solo: specrt.Decoder, what: str) -> None:
    """``got`` equals ``ref`` token for token, or first differs at a greedy near-tie of the target (reported)."""
    if got.token_ids == ref.token_ids:
        assert got.text == ref.text and got.finish_reason == ref.finish_reason, what
        return
    i = next((j for j, (a, b) in enumerate(zip(got.token_ids, ref.token_ids, strict=False)) if a != b), None)
    assert i is not None, f"{what}: one output is a prefix of the other: {got.token_ids} vs {ref.token_ids}"
    from specrt import _specrt
    from specrt._ort import find_ort_library

    model = _specrt.OrtModel(str(solo.target_path), ort_library=find_ort_library(), max_seq_len=solo.max_seq_len)
    seq = ref.prompt_token_ids + ref.token_ids[:i]
    logits = np.asarray(model.forward(seq, 0, 1)).reshape(-1)
    top2 = np.sort(logits)[-2:]
    gap = float(top2[1] - top2[0])
    assert gap < TIE_BOUND, f"{what}: first divergence at token {i}, top-2 logit gap {gap:.3g} >= {TIE_BOUND}"
    print(f"{what}: divergence at token {i} on a near-tie (top-2 gap {gap:.3g})")


@pytest.mark.parametrize("max_batch", [2, 4])
def test_concurrent_requests_each_equal_their_solo_run(pair, solo, solo_results, max_batch) -> None:
    dec = batched(pair, max_batch)
    with Scheduler(dec, max_queue=64) as sched:
        handles: list = [None] * len(REQUESTS)

        def submit(i: int) -> None:
            handles[i] = sched.submit(**REQUESTS[i])

        threads = [threading.Thread(target=submit, args=(i,)) for i in range(len(REQUESTS))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        results = [h.result(timeout=300) for h in handles]
    for i, (got, ref) in enumerate(zip(results, solo_results, strict=True)):
        if REQUESTS[i].get("temperature", 1.0) == 0:
            assert_equal_or_near_tie(got, ref, solo, f"B {max_batch}, request {i}")
        else:  # seeded sampling with fixed K, or coupled: the same tokens
            assert got.token_ids == ref.token_ids, f"B {max_batch}, request {i}"


def test_rows_share_rounds_and_a_waiting_request_joins_when_a_row_frees(pair) -> None:
    """On the pipeline the Scheduler drives: 3 rows commit tokens in the same rounds; a 4th waits for a slot."""
    dec = batched(pair, 3)
    eng = dec.driver
    cfg = {"max_new_tokens": 6, "temperature": 0.0, "num_speculative_tokens": 2, "ignore_eos": True}
    long = {**cfg, "max_new_tokens": 40}
    requests = [([1, 2, 3], cfg), ([4, 5], long), ([6], long), ([7, 8, 9], long)]
    ids = [eng.submit(eng.prepare(prompt, settings)) for prompt, settings in requests]
    seen: list[set[int]] = []
    emitted: dict[int, int] = {}
    while not eng.is_idle:
        events = eng.step()
        seen.append({e["id"] for e in events if e["tokens"]})
        for e in events:
            if e["done"] is not None:
                emitted[e["id"]] = e["done"]["stats"]["n_emitted"]
    one, two, three, four = ids
    assert max(len(s) for s in seen) == 3, seen
    first_four = next(i for i, s in enumerate(seen) if four in s)
    last_one = max(i for i, s in enumerate(seen) if one in s)
    assert first_four > last_one, "request 4 joined only after request 1 left its slot"
    assert any({two, three, four} <= s for s in seen[first_four:]), "the joined request shares rounds with the others"
    assert emitted == {one: 6, two: 40, three: 40, four: 40}
    assert not eng.cancel(one), "a finished request has left the driver"


def test_decoder_generate_on_a_batching_decoder_equals_the_single_stream_decoder(pair, solo, solo_results) -> None:
    dec = batched(pair, 3)
    for i, r in enumerate(REQUESTS[:4]):
        assert dec.generate(**r).token_ids == solo_results[i].token_ids, i
    assert dec.providers == ["CPUExecutionProvider"]


def test_asyncio_streams_equal_their_solo_runs(pair, solo_results) -> None:
    dec = batched(pair, 4)

    async def main(sched: Scheduler) -> list[list[int]]:
        async def one(r: dict) -> list[int]:
            h = sched.submit(**r)
            ids: list[int] = []
            async for chunk in h.aiter():
                ids += chunk.token_ids
            return ids

        return await asyncio.gather(*(one(r) for r in REQUESTS[:6]))

    with Scheduler(dec) as sched:
        streamed = asyncio.run(main(sched))
    assert streamed == [r.token_ids for r in solo_results[:6]]


@pytest.mark.timing
def test_cancel_frees_the_row_for_a_waiting_request(pair, solo) -> None:
    dec = batched(pair, 2)
    long = {"prompt": "a b c", "max_new_tokens": 120, "temperature": 0, "ignore_eos": True}
    # 240 rounds of one token (no speculation): the cancel below surely lands while it runs, however this thread is
    # scheduled on a loaded machine; cancelled, it costs a round or two.
    longest = {**long, "max_new_tokens": 240, "num_speculative_tokens": 0}
    short = {"prompt": "def f(x):", "max_new_tokens": 10, "temperature": 0, "ignore_eos": True}
    with Scheduler(dec) as sched:
        first = sched.submit(**longest)
        second = sched.submit(**long)
        third = sched.submit(**short)  # waits: both rows are taken
        next(iter(first))  # the first has committed a round
        first.cancel()
        with pytest.raises(GenerationCancelled):
            first.result(timeout=60)
        # The third ran in the cancelled request's row (test_rows_share_rounds... checks joining on the engine).
        assert third.result(timeout=120).token_ids == solo.generate(**short).token_ids
        assert second.result(timeout=300).token_ids == solo.generate(**long).token_ids


@pytest.mark.timing
def test_a_bad_or_expired_request_ends_alone(pair, solo_results, scheduler_clock) -> None:
    dec = batched(pair, 3)
    with Scheduler(dec) as sched:
        good = sched.submit(**REQUESTS[0])
        with pytest.raises(ConfigError, match="temperature"):  # refused at submission; never takes a row
            sched.submit(prompt="x", temperature=-1.0)
        slow = sched.submit(prompt="a b", max_new_tokens=200, temperature=0, ignore_eos=True, timeout_s=60)
        # Its 60 s run out as soon as it has generated something (the worker's next clock reading): mid-generation.
        scheduler_clock.advance(61, when=lambda: slow.token_times)
        with pytest.raises(RequestTimeoutError) as e:
            slow.result(timeout=60)
        assert len(e.value.token_ids) < 200
        assert good.result(timeout=120).token_ids == solo_results[0].token_ids


@pytest.mark.model
@pytest.mark.parametrize("sampling", ["greedy", "coupled"])
def test_smollm2_batched_rows_equal_solo_runs(sampling: str) -> None:
    """SmolLM2-135M with its int4 copy as draft (it accepts about half the drafts, so the rounds really speculate):
    four chat prompts decoded together at B = 4 with K = 1, 3, 4, 8, each equal to its single-stream run, greedy and
    with coupled sampling at temperature 1 (the issue's CI check on a real model). Plain seeded sampling is not
    compared: the batched layout's logits differ from the single-stream layout's by ~1e-6, which moves inverse-CDF
    sampling in the low-probability tail (README, batching)."""
    from specrt import models

    target = "smollm2-135m-instruct"
    solo = specrt.Decoder(models.pull(target, progress=False), models.pull(target, "int4", progress=False))
    dec = specrt.Decoder(
        models.pull(target, progress=False, attention="batched"),
        models.pull(target, "int4", progress=False, attention="batched"),
        max_batch=4,
        max_seq_len=512,
    )
    questions = [
        "Write a Python function that returns the n-th Fibonacci number.",
        "What is the capital of France? Answer in one sentence.",
        "List three uses of a hash map.",
        "Explain recursion to a child.",
    ]
    settings = {"temperature": 0} if sampling == "greedy" else {"temperature": 1.0, "seed": 7, "coupled": True}
    reqs = [
        {
            "messages": [{"role": "user", "content": q}],
            "max_new_tokens": 48,
            "num_speculative_tokens": k,
            **settings,
        }
        for q, k in zip(questions, (1, 3, 4, 8), strict=True)
    ]
    refs = [solo.generate(**r) for r in reqs]
    with Scheduler(dec) as sched:
        got = [h.result(timeout=600) for h in [sched.submit(**r) for r in reqs]]
    for i, (g, ref) in enumerate(zip(got, refs, strict=True)):
        if sampling == "greedy":
            assert_equal_or_near_tie(g, ref, solo, f"SmolLM2 request {i}")
        else:
            assert g.token_ids == ref.token_ids, f"SmolLM2 request {i}"
    accepted = sum(g.stats.n_accepted for g in got)
    drafted = sum(g.stats.n_drafted for g in got)
    assert drafted > 0 and accepted / drafted > 0.2, (accepted, drafted)


def test_the_server_batches_concurrent_requests_and_each_equals_its_solo_run(pair, solo) -> None:
    pytest.importorskip("fastapi")
    pytest.importorskip("prometheus_client")
    from fastapi.testclient import TestClient

    from specrt.server import create_app

    prompts = ["def add(a, b):", "hello world, hello", "the cat", "x = [1, 2, 3]", "abc abc abc abc", "q"]
    want = [solo.generate(p, max_new_tokens=16, temperature=0, num_speculative_tokens=3).text for p in prompts]
    dec = batched(pair, 4)
    with TestClient(create_app(dec, model_name="tiny", num_speculative_tokens=3)) as client:
        got: list = [None] * len(prompts)

        def one(i: int) -> None:
            body = {"model": "tiny", "prompt": prompts[i], "max_tokens": 16, "temperature": 0}
            if i % 2:  # streamed
                with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as resp:
                    assert resp.status_code == 200
                    text = ""
                    for line in resp.iter_lines():
                        if line.startswith("data: {"):
                            text += json.loads(line[6:])["choices"][0]["text"]
                    got[i] = text
            else:
                resp = client.post("/v1/completions", json=body)
                assert resp.status_code == 200, resp.text
                got[i] = resp.json()["choices"][0]["text"]

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert got == want
        metrics = client.get("/metrics").text
        assert "specrt_running_requests" in metrics


def test_a_scheduler_takes_over_a_batching_decoder_left_mid_stream(pair, solo_results) -> None:
    dec = batched(pair, 2)
    stream = dec.stream(**REQUESTS[1])
    next(stream)  # a generation left open: its row stays in the engine until the next start
    del stream
    with Scheduler(dec) as sched:
        got = [h.result(timeout=120) for h in [sched.submit(**r) for r in REQUESTS[:3]]]
    assert [g.token_ids for g in got] == [r.token_ids for r in solo_results[:3]]


def _last_round_stop(solo: specrt.Decoder) -> tuple[dict, str]:
    """A request and a stop string that first appears in the text of its last token (found in the last round)."""
    for prompt in ["def add(a, b):", "hello world, hello", "x = [1, 2, 3]", "the cat", "q"]:
        for n in range(3, 12):
            req = {"prompt": prompt, "max_new_tokens": n, "temperature": 0, "num_speculative_tokens": 0}
            ref = solo.generate(**req, ignore_eos=True)
            last = solo.tokenizer.decode(ref.token_ids[-1:], skip_special_tokens=True)
            if last.strip() and ref.text.find(last) == len(ref.text) - len(last):
                return {**req, "ignore_eos": True}, last
    raise AssertionError("no request whose last token starts a stop string")


def test_a_stop_string_found_in_the_last_round_ends_the_request_as_alone(pair, solo) -> None:
    req, stop = _last_round_stop(solo)
    want = solo.generate(**req, stop=[stop])
    assert want.finish_reason == "stop"
    dec = batched(pair, 2)
    assert dec.generate(**req, stop=[stop]).token_ids == want.token_ids
    with Scheduler(dec) as sched:
        handles = [sched.submit(**req, stop=[stop]), sched.submit(**REQUESTS[0])]
        got = handles[0].result(timeout=60)
        assert handles[1].result(timeout=60).token_ids == solo.generate(**REQUESTS[0]).token_ids
    assert (got.token_ids, got.text, got.finish_reason) == (want.token_ids, want.text, "stop")


def test_a_scheduler_owns_a_batching_decoder_until_closed(pair) -> None:
    dec = batched(pair, 2)
    sched = Scheduler(dec)
    with pytest.raises(ConfigError, match="owned by a Scheduler"):
        dec.generate("hi", max_new_tokens=3)
    with pytest.raises(ConfigError, match="already has a Scheduler"):
        Scheduler(dec)
    assert sched.submit("hi", max_new_tokens=3, temperature=0).result(timeout=60).token_ids
    assert sched.close(timeout=60)
    assert dec.generate("hi", max_new_tokens=3, temperature=0).token_ids  # usable again
    stream = dec.stream("hi", max_new_tokens=3, temperature=0)
    next(stream)
    with pytest.raises(ConfigError, match="a stream is open"):
        Scheduler(dec)
    stream.close()
    Scheduler(dec).close()


@pytest.mark.timing
def test_a_queued_request_cancelled_or_expired_ends_without_waiting_for_a_row(pair, scheduler_clock) -> None:
    dec = batched(pair, 2)
    long = {"prompt": "a b", "max_new_tokens": 240, "temperature": 0, "num_speculative_tokens": 0, "ignore_eos": True}
    with Scheduler(dec) as sched:
        running = [sched.submit(**long), sched.submit(**long)]  # both rows busy for 240 rounds
        queued = sched.submit(prompt="x", max_new_tokens=4)
        expiring = sched.submit(prompt="y", max_new_tokens=4, timeout_s=60)
        scheduler_clock.advance(61)  # past its deadline while it waits for a row
        queued.cancel()
        with pytest.raises(GenerationCancelled):
            queued.result(timeout=60)
        with pytest.raises(RequestTimeoutError):
            expiring.result(timeout=60)
        for h in running:
            h.result(timeout=300)
    assert queued.finished_at < min(h.finished_at for h in running)
    assert expiring.finished_at < min(h.finished_at for h in running)
