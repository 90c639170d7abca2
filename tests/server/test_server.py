"""``specrt serve`` (``specrt.server``) on tiny models: OpenAI response shapes, streaming, usage, logprobs, errors in
OpenAI's schema (400 naming the field, 404, 429, 504), metrics, and a client that disconnects mid-stream freeing the
decoder (on a real uvicorn server on the loopback address)."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")
httpx = pytest.importorskip("httpx")

from fastapi.testclient import TestClient  # noqa: E402

import specrt  # noqa: E402
from specrt.server import create_app  # noqa: E402


@pytest.fixture
def tiny(tiny_decoder):
    return tiny_decoder


@pytest.fixture
def client(tiny):
    with TestClient(create_app(tiny, model_name="tiny", num_speculative_tokens=3)) as c:
        yield c


class HeldDecoder:
    """A decoder whose requests, after their first ``free`` chunks, wait for the test to set ``gate``: a shutdown or a
    disconnect then surely comes while a stream is open, however fast or loaded the machine. ``n_chunks`` counts the
    chunks (the driver's per-request events) delivered so far. It holds the driver's ``step`` (the one loop every
    request runs through), so the scheduler and the server are exercised as they are."""

    def __init__(self, dec, free: int = 1) -> None:
        self._dec, self.free = dec, free
        self.gate = threading.Event()
        self.n_chunks = 0
        self.driver = _HeldDriver(self, dec.driver)

    def __getattr__(self, name: str):
        return getattr(self._dec, name)


class _HeldDriver:
    def __init__(self, held: HeldDecoder, batch) -> None:
        self._held, self._inner = held, batch

    def __getattr__(self, name: str):
        return getattr(self._inner, name)

    def step(self):
        if self._held.n_chunks >= self._held.free:
            assert self._held.gate.wait(60), "the test never let the stream go on"
        events = self._inner.step()
        self._held.n_chunks += sum(1 for e in events if e["error"] is None)
        return events


def _wait_until(cond, what: str, timeout_s: float = 60.0) -> None:
    """Poll ``cond`` until it holds; fail naming ``what`` after ``timeout_s`` (a hang guard, not a speed bound)."""
    for _ in range(int(timeout_s / 0.01)):
        if cond():
            return
        time.sleep(0.01)
    raise AssertionError(f"{what}: not within {timeout_s:g} s")


def _events(resp) -> list:
    out = []
    for line in resp.iter_lines():
        if line.startswith("data: "):
            data = line[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def test_completion_equals_the_decoder_and_reports_usage_and_speculation(client, tiny) -> None:
    want = tiny.generate("def add(a, b):", max_new_tokens=20, temperature=0, num_speculative_tokens=3)
    r = client.post(
        "/v1/completions",
        json={"model": "tiny", "prompt": "def add(a, b):", "max_tokens": 20, "temperature": 0, "logprobs": 0},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion" and body["model"] == "tiny" and body["id"].startswith("cmpl-")
    choice = body["choices"][0]
    assert choice["text"] == want.text
    assert choice["finish_reason"] == {"eos": "stop", "stop": "stop", "length": "length"}[want.finish_reason]
    # (To float32 rounding: the first token's row comes from a prefill whose cached head depends on earlier requests.)
    assert choice["logprobs"]["token_logprobs"] == pytest.approx(want.logprobs, abs=1e-4)
    assert len(choice["logprobs"]["tokens"]) == len(want.token_ids)
    assert body["usage"] == {
        "prompt_tokens": len(want.prompt_token_ids),
        "completion_tokens": len(want.token_ids),
        "total_tokens": len(want.prompt_token_ids) + len(want.token_ids),
        # The decoder's last generation had this prompt: all of it but the last token (the first round's input)
        # comes from the prefix cache.
        "prompt_tokens_details": {"cached_tokens": len(want.prompt_token_ids) - 1},
    }
    spec = body["speculative"]
    assert spec["n_drafted"] == want.stats.n_drafted and spec["n_accepted"] == want.stats.n_accepted
    # The per-K rounds add up to the rounds and the drafted tokens (the trace bench_serve_peers.py records).
    assert spec["rounds_by_k"] == list(want.stats.rounds_by_k) and sum(spec["rounds_by_k"]) == spec["n_rounds"]
    assert sum(k * n for k, n in enumerate(spec["rounds_by_k"])) == spec["n_drafted"]
    # (prefill_ms is 0 when an earlier test left the whole prompt in the prefix cache)
    assert spec["draft_ms"] > 0 and spec["target_ms"] > 0 and spec["prefill_ms"] >= 0
    # Token ids as the prompt, and OpenAI's default of 16 tokens.
    r = client.post("/v1/completions", json={"prompt": want.prompt_token_ids, "temperature": 0, "ignore_eos": True})
    assert r.json()["usage"]["completion_tokens"] == 16


def test_streaming_completion_matches_the_whole_response(client) -> None:
    req = {"prompt": "hello world, hello", "max_tokens": 30, "temperature": 1.0, "seed": 7}
    whole = client.post("/v1/completions", json=req).json()
    with client.stream(
        "POST", "/v1/completions", json={**req, "stream": True, "stream_options": {"include_usage": True}}
    ) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        events = _events(resp)
    assert events[-1] == "[DONE]"
    usage = events[-2]
    assert usage["choices"] == [] and "speculative" in usage
    # The same counts; the repeated prompt now comes from the prefix cache but for its last token.
    cached = {"cached_tokens": whole["usage"]["prompt_tokens"] - 1}
    assert usage["usage"] == {**whole["usage"], "prompt_tokens_details": cached}
    chunks = events[:-2]
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == whole["choices"][0]["finish_reason"]
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    with client.stream("POST", "/v1/completions", json={**req, "stream": True}) as resp:
        events = _events(resp)
    assert events[-1] == "[DONE]" and "usage" not in events[-2]


def test_usage_reports_the_prompt_tokens_the_prefix_cache_supplied(client, tiny) -> None:
    """``usage.prompt_tokens_details.cached_tokens`` (OpenAI's and vLLM's field) is ``Stats.n_cached_tokens``: a
    chat whose history the previous request left in the cache reuses it, whole and streamed with include_usage;
    nothing with ``--no-prefix-caching``."""
    messages = [{"role": "system", "content": "you answer in one line"}, {"role": "user", "content": "name a fruit"}]
    req = {"messages": messages, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    first = client.post("/v1/chat/completions", json=req).json()
    answer = first["choices"][0]["message"]["content"]
    turn2 = [*messages, {"role": "assistant", "content": answer}, {"role": "user", "content": "and a vegetable"}]
    want = tiny.generate(messages=turn2, max_new_tokens=6, temperature=0, ignore_eos=True)
    n_prompt = len(want.prompt_token_ids)
    # The decoder now holds turn 2's prompt: repeating it reuses all but its last token, whole and streamed.
    whole = client.post("/v1/chat/completions", json={**req, "messages": turn2}).json()
    assert whole["usage"]["prompt_tokens"] == n_prompt
    assert whole["usage"]["prompt_tokens_details"] == {"cached_tokens": n_prompt - 1}
    stream = {**req, "messages": turn2, "stream": True, "stream_options": {"include_usage": True}}
    with client.stream("POST", "/v1/chat/completions", json=stream) as resp:
        events = _events(resp)
    assert events[-2]["usage"] == whole["usage"]
    # A prompt sharing only its first 10 token ids with the cached one reuses those, no more.
    prompt = [*want.prompt_token_ids[:10], 11, 12, 13]
    r = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 2, "temperature": 0})
    common = next((j for j, (x, y) in enumerate(zip(prompt, want.prompt_token_ids, strict=False)) if x != y), 99)
    assert r.json()["usage"]["prompt_tokens_details"] == {"cached_tokens": min(common, len(prompt) - 1)}
    off = specrt.Decoder(tiny.target_path, tiny.draft_path, max_seq_len=256, prefix_caching=False)
    with TestClient(create_app(off, model_name="tiny", num_speculative_tokens=3)) as c:
        for _ in range(2):
            usage = c.post("/v1/chat/completions", json={**req, "messages": turn2}).json()["usage"]
            assert usage["prompt_tokens_details"] == {"cached_tokens": 0}


def test_chat_completion_stream_and_logprobs(client, tiny) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    want = tiny.generate(messages=messages, max_new_tokens=12, temperature=0, num_speculative_tokens=3)
    r = client.post(
        "/v1/chat/completions",
        json={"messages": messages, "max_completion_tokens": 12, "temperature": 0, "logprobs": True},
    )
    body = r.json()
    assert r.status_code == 200, body
    assert body["object"] == "chat.completion"
    msg = body["choices"][0]["message"]
    assert msg == {"role": "assistant", "content": want.text}
    lp = body["choices"][0]["logprobs"]["content"]
    assert [x["logprob"] for x in lp] == pytest.approx(want.logprobs, abs=1e-4)
    assert all(x["top_logprobs"] == [] for x in lp)
    # Content given as text parts is the same prompt.
    parts = [
        messages[0],
        {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]},
    ]
    r2 = client.post("/v1/chat/completions", json={"messages": parts, "max_tokens": 12, "temperature": 0})
    assert r2.json()["choices"][0]["message"]["content"] == want.text
    with client.stream(
        "POST", "/v1/chat/completions", json={"messages": messages, "max_tokens": 12, "temperature": 0, "stream": True}
    ) as resp:
        events = _events(resp)
    chunks = events[:-1]
    assert chunks[0]["object"] == "chat.completion.chunk" and chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == want.text and chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")


@pytest.mark.parametrize(
    ("path", "body", "status", "param", "words"),
    [
        ("/v1/completions", {"max_tokens": 5}, 400, "prompt", "Field required"),
        ("/v1/completions", {"prompt": "x", "temperature": 5}, 400, "temperature", "less than or equal to 2"),
        ("/v1/completions", {"prompt": "x", "n": 0}, 400, "n", "greater than or equal to 1"),
        ("/v1/completions", {"prompt": "x", "frobnicate": 1}, 400, "frobnicate", "unknown field"),
        ("/v1/completions", {"prompt": "x", "logprobs": 6}, 400, "logprobs", "less than or equal to 5"),
        ("/v1/completions", {"prompt": "x", "max_tokens": -1}, 400, "max_tokens", "greater than or equal to 0"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 0}, 400, "max_tokens", "needs echo true"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 100000}, 400, "max_tokens", "maximum sequence length"),
        ("/v1/completions", {"prompt": "x", "stop": ["a", ""]}, 400, "stop", "non-empty"),
        ("/v1/completions", {"prompt": "x", "model": "gpt-4"}, 404, "model", "does not exist"),
        ("/v1/completions", {"prompt": [1, 2, 999999]}, 400, "prompt", "999999"),
        ("/v1/completions", {"prompt": [1, 2, 999999], "stream": True}, 400, "prompt", "999999"),
        ("/v1/completions", {"prompt": "x", "num_speculative_tokens": 65}, 400, "num_speculative_tokens", "64"),
        ("/v1/chat/completions", {"messages": []}, 400, "messages", "at least 1"),
        ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, 400, "messages.0.role", "robot"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 21},
            400,
            "top_logprobs",
            "less than or equal to 20",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            400,
            "messages.0.content",
            "only text parts",
        ),
    ],
)
def test_malformed_requests_get_openai_errors_naming_the_field(client, path, body, status, param, words) -> None:
    r = client.post(path, json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["param"] == param and words in err["message"], err


def test_not_json_and_not_an_object(client) -> None:
    r = client.post("/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = client.post("/v1/completions", json=[1, 2])
    assert r.status_code == 400 and "JSON object" in r.json()["error"]["message"]


@pytest.mark.timing
def test_full_queue_is_429_and_timeout_is_504(tiny, scheduler_clock) -> None:
    app = create_app(tiny, model_name="tiny", max_queue=1)
    sched = app.state.scheduler
    with TestClient(app) as c:
        with tiny.generation_lock:  # the worker's generation waits for this lock: a running request and a full queue
            running = sched.submit("a", max_new_tokens=2)
            _wait_until(lambda: sched.running, "the worker took the first request")
            queued = sched.submit("b", max_new_tokens=2)
            r = c.post("/v1/completions", json={"prompt": "c"})
            assert r.status_code == 429 and r.json()["error"]["code"] == "queue_full", r.text
        running.result(timeout=30), queued.result(timeout=30)
        m = c.get("/metrics").text
        assert 'specrt_requests_total{endpoint="completions",outcome="rejected_queue_full"} 1.0' in m
    app = create_app(tiny, model_name="tiny", request_timeout_s=1e-6)
    with TestClient(app) as c:
        r = c.post("/v1/completions", json={"prompt": "c", "max_tokens": 4})
        assert r.status_code == 504 and r.json()["error"]["code"] == "request_timeout", r.text
        assert "timeout" in r.json()["error"]["message"]
        # Timed out before it started: a stream gets the HTTP error too (its status waits for the first round).
        r = c.post("/v1/completions", json={"prompt": "c", "max_tokens": 4, "stream": True})
        assert r.status_code == 504 and r.json()["error"]["code"] == "request_timeout", r.text
    # Timed out mid-stream: the status was sent, so the stream ends with an error event. The request's 60 s run out
    # (on the scheduler's clock) once its stream has yielded 3 chunks.
    dec = HeldDecoder(tiny, free=200)  # never held: it counts the chunks
    app = create_app(dec, model_name="tiny", request_timeout_s=60, num_speculative_tokens=1)
    scheduler_clock.advance(61, when=lambda: dec.n_chunks >= 3)
    with TestClient(app) as c:
        body = {"prompt": "c", "max_tokens": 200, "ignore_eos": True, "stream": True}
        with c.stream("POST", "/v1/completions", json=body) as resp:
            assert resp.status_code == 200
            events = _events(resp)
        assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "request_timeout"
        assert "after" in events[-2]["error"]["message"] and len(events) == 3 + 2, events


def test_health_models_and_metrics(client) -> None:
    assert client.get("/health").json()["status"] == "ok"
    models = client.get("/v1/models").json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == ["tiny"]
    client.post("/v1/completions", json={"prompt": "def f(x):", "max_tokens": 8, "temperature": 0})
    m = client.get("/metrics").text
    for name in (
        "specrt_requests_total",
        "specrt_generation_tokens_total",
        "specrt_draft_tokens_total",
        "specrt_accepted_tokens_total",
        "specrt_acceptance_rate",
        "specrt_queue_length",
        "specrt_running_requests",
        "specrt_time_to_first_token_seconds_bucket",
        "specrt_inter_token_latency_seconds_bucket",
        "specrt_request_latency_seconds_count",
        "specrt_decode_tokens_per_second",
    ):
        assert name in m, name
    assert 'specrt_requests_total{endpoint="completions",outcome="' in m


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve_on_loopback(config):
    """Run a uvicorn server in a thread; (server, thread, base URL) once /health answers."""
    import uvicorn

    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://{config.host}:{config.port}"

    def up() -> bool:
        try:
            return httpx.get(f"{base}/health").status_code == 200
        except httpx.TransportError:
            return False

    _wait_until(up, "the server answers /health")
    return server, thread, base


def _refuses_connections(base: str) -> bool:
    try:
        httpx.get(f"{base}/health", timeout=5)
    except httpx.TransportError:
        return True
    return False


@pytest.mark.timing
def test_a_client_that_disconnects_frees_the_decoder(tiny) -> None:
    import uvicorn

    dec = HeldDecoder(tiny)  # the generation waits after its first chunk: it cannot end before the client leaves
    app = create_app(dec, model_name="tiny", num_speculative_tokens=1)
    server, thread, base = _serve_on_loopback(
        uvicorn.Config(app, host="127.0.0.1", port=_free_port(), log_level="error")
    )
    cancelled = 'specrt_requests_total{endpoint="completions",outcome="cancelled"} 1.0'
    try:
        body = {"prompt": "x", "max_tokens": 200, "temperature": 1.0, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=30) as resp:
            for line in resp.iter_lines():
                if line.startswith("data: {"):
                    break  # first chunk: leave
        sched = app.state.scheduler
        # The server sees the disconnect while the generation is held (it could not have finished), and cancels it.
        _wait_until(lambda: cancelled in httpx.get(f"{base}/metrics").text, "the disconnect counted as cancelled")
        assert sched.running == 1 and dec.n_chunks == 1
        dec.gate.set()
        _wait_until(lambda: sched.running == 0, "the cancelled request released the decoder")
        assert dec.n_chunks <= 2  # it ended at its next round, not after its 200 tokens
        # The decoder serves the next request in full.
        r = httpx.post(f"{base}/v1/completions", json={"prompt": "y", "max_tokens": 5, "ignore_eos": True}, timeout=30)
        assert r.json()["usage"]["completion_tokens"] == 5
    finally:
        dec.gate.set()
        server.should_exit = True
        thread.join(30)
    assert not thread.is_alive()


def test_serve_cli_parses_and_needs_a_target(tmp_path: Path) -> None:
    from specrt.cli import build_parser

    a = build_parser().parse_args(["serve", "--target", "t", "--port", "9000", "-k", "4", "--max-queue", "3"])
    assert (a.port, a.num_speculative_tokens, a.max_queue, a.request_timeout) == (9000, 4, 3, 600.0)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve"])


@pytest.mark.timing
def test_shutdown_drains_open_streams(tiny) -> None:
    import uvicorn

    dec = HeldDecoder(tiny)  # the stream waits after its first chunk until the server refuses new connections
    app = create_app(dec, model_name="tiny", num_speculative_tokens=1)
    config = uvicorn.Config(app, host="127.0.0.1", port=_free_port(), log_level="error", timeout_graceful_shutdown=60)
    server, thread, base = _serve_on_loopback(config)
    body = {
        "prompt": "x",
        "max_tokens": 120,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    events = []
    try:
        with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=60) as resp:
            for line in resp.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    if len(events) == 1:
                        server.should_exit = True  # shutdown begins while this stream is open
                        _wait_until(lambda: _refuses_connections(base), "the server stopped accepting connections")
                        assert dec.n_chunks == 1  # ... while the stream was held open
                        dec.gate.set()
    finally:
        dec.gate.set()
    thread.join(60)
    assert not thread.is_alive()
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["usage"]["completion_tokens"] == 120  # the admitted request finished in full
    assert app.state.scheduler._closed  # and the scheduler was closed after it


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        (b'{"prompt": "\\ud800 hi"}', None, ""),  # a lone surrogate is not text
        (b'{"prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}", None, ""),  # nesting past the parser's limit
        (b'{"prompt": "x", "max_tokens": "5"}', "max_tokens", "valid integer"),
        (b'{"prompt": "x", "max_tokens": true}', "max_tokens", "valid integer"),
        (b'{"prompt": "x", "stream": "yes"}', "stream", "valid boolean"),
        (b'{"prompt": [1.0, 2.0]}', "prompt", "valid integer (at prompt.0)"),
        (b'{"prompt": [true, false]}', "prompt", "valid integer (at prompt.0)"),
        (b'{"prompt": 5}', "prompt", "valid string or"),
        (b'{"prompt": "x", "repetition_penalty": Infinity}', "repetition_penalty", "finite number"),
        (b'{"prompt": "x", "top_k": 1099511627776}', "top_k", "top_k < 2**32"),
        (b'{"prompt": [], "stream": true}', "prompt", "empty"),
    ],
)
def test_bodies_that_broke_the_first_version(client, body, param, words) -> None:
    r = client.post("/v1/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and words in err["message"], err


def test_openai_shaped_errors_for_paths_and_methods(client) -> None:
    for method, path, status in [("GET", "/v1/completions", 405), ("POST", "/health", 405), ("GET", "/nope", 404)]:
        r = client.request(method, path)
        assert r.status_code == status
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}, r.text


def test_a_setting_the_engine_refuses_is_a_400_even_when_streaming(tiny) -> None:
    from specrt.errors import ConfigError

    def refuse(*args, **kwargs):  # the driver's submit refusing a setting, as Rust's resolver does
        refusal = ConfigError("top_k 3 is invalid here (a refusal made by the test)")
        refusal.field = "top_k"  # as the Rust validators' errors name their setting
        raise refusal

    refusing = HeldDecoder(tiny, free=10**9)
    refusing.driver.submit = refuse
    with TestClient(create_app(refusing, model_name="tiny")) as c:
        for stream in (True, False):
            r = c.post("/v1/completions", json={"prompt": "x", "stream": stream})
            assert r.status_code == 400 and r.json()["error"]["param"] == "top_k", r.text


def test_default_chat_length_fits_the_room_left_and_length_errors_name_the_right_field(client, tiny) -> None:
    long = "word " * 40  # most of the 256 tokens the tiny decoder holds
    n_prompt = len(tiny.encode(None, [{"role": "user", "content": long}]))
    assert n_prompt < 256
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": long}], "ignore_eos": True})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 256 - n_prompt
    r = client.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": long}], "max_completion_tokens": 100},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_completion_tokens"
    r = client.post("/v1/completions", json={"prompt": "word " * 400, "max_tokens": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "top_logprobs": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "top_logprobs"


def test_logprob_bytes_rebuild_multibyte_text(tiny_smollm2_or_skip) -> None:
    dec = tiny_smollm2_or_skip
    with TestClient(create_app(dec, model_name="s")) as c:
        body = {
            "messages": [{"role": "user", "content": "Reply with three rocket emoji and the word 東京."}],
            "max_tokens": 24,
            "temperature": 0,
            "logprobs": True,
        }
        r = c.post("/v1/chat/completions", json=body).json()
        text = r["choices"][0]["message"]["content"]
        raw = b"".join(bytes(x["bytes"]) for x in r["choices"][0]["logprobs"]["content"])
        assert raw.decode("utf-8", errors="replace").startswith(text.rstrip("\ufffd")), (raw, text)
        r = c.post("/v1/completions", json={"prompt": "東京 means", "max_tokens": 12, "temperature": 0, "logprobs": 0})
        choice = r.json()["choices"][0]
        offsets = choice["logprobs"]["text_offset"]
        assert offsets == sorted(offsets) and all(0 <= o <= len(choice["text"]) for o in offsets)


def test_acceptance_rate_is_nan_until_a_token_is_drafted_and_schema_refusals_are_counted(tiny) -> None:
    import math

    from prometheus_client.parser import text_string_to_metric_families

    def sample(text: str, name: str, **labels: str) -> float | None:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                    return s.value
        return None

    # A target-only server drafts nothing: the gauge is NaN (responses say null), not 0.
    with TestClient(create_app(tiny, model_name="tiny", num_speculative_tokens=0)) as c:
        r = c.post("/v1/completions", json={"prompt": "x", "max_tokens": 4, "temperature": 0})
        assert r.status_code == 200 and r.json()["speculative"]["acceptance_rate"] is None, r.text
        assert math.isnan(sample(c.get("/metrics").text, "specrt_acceptance_rate"))
        # Refused by the request schema (an unknown field, a wrong type): counted as invalid, per endpoint.
        assert c.post("/v1/completions", json={"prompt": "x", "no_such_field": 1}).status_code == 400
        assert c.post("/v1/chat/completions", json={"messages": "not a list"}).status_code == 400
        m = c.get("/metrics").text
        assert sample(m, "specrt_requests_total", endpoint="completions", outcome="invalid") == 1.0
        assert sample(m, "specrt_requests_total", endpoint="chat_completions", outcome="invalid") == 1.0
        # Refused when it starts (a stop token id outside the vocabulary): a 400, counted as invalid, not an error.
        r = c.post("/v1/completions", json={"prompt": "x", "stop_token_ids": [1_000_000_000]})
        assert r.status_code == 400 and r.json()["error"]["param"] == "stop_token_ids", r.text
        m = c.get("/metrics").text
        assert sample(m, "specrt_requests_total", endpoint="completions", outcome="invalid") == 2.0
        assert sample(m, "specrt_requests_total", endpoint="completions", outcome="error") in (None, 0.0)
    # With speculation the gauge is accepted / drafted.
    with TestClient(create_app(tiny, model_name="tiny", num_speculative_tokens=3)) as c:
        r = c.post("/v1/completions", json={"prompt": "def f(x):", "max_tokens": 8, "temperature": 0})
        spec = r.json()["speculative"]
        assert spec["acceptance_rate"] is not None
        assert sample(c.get("/metrics").text, "specrt_acceptance_rate") == pytest.approx(spec["acceptance_rate"])
