"""``specrt serve`` on a network (issue 42): API keys, the body's size and time limits answered before any work
(:mod:`specrt.server.guard`), and the work of a request kept off the event loop."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi.testclient import TestClient

from specrt.errors import ConfigError
from specrt.server import create_app
from specrt.server.guard import RequestGuard, is_loopback

KEYS = ["key-one", "key-two"]
ROUTES = [
    ("GET", "/v1/models", None),
    ("GET", "/v1/models/tiny", None),
    ("POST", "/v1/completions", {"prompt": "x", "max_tokens": 1}),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1}),
    ("POST", "/tokenize", {"prompt": "x"}),
    ("POST", "/detokenize", {"tokens": [1]}),
    ("GET", "/tokenizer_info", None),
    ("GET", "/openapi.json", None),
    ("GET", "/docs", None),
]


@pytest.fixture
def keyed(tiny_decoder):
    with TestClient(create_app(tiny_decoder, model_name="tiny", api_keys=KEYS)) as c:
        yield c


def _call(c: TestClient, method: str, path: str, body: Any, key: str | None) -> Any:
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    return c.request(method, path, json=body, headers=headers)


@pytest.mark.parametrize(("method", "path", "body"), ROUTES, ids=[p for _, p, _ in ROUTES])
def test_every_route_needs_a_key_and_takes_each_configured_one(keyed, method, path, body) -> None:
    for key in (None, "wrong", "KEY-ONE", "key-one2", "key-on"):
        r = _call(keyed, method, path, body, key)
        assert r.status_code == 401, (key, r.text)
        err = r.json()["error"]
        assert err["code"] == "invalid_api_key" and err["param"] is None and "Authorization: Bearer" in err["message"]
        assert r.headers["www-authenticate"] == "Bearer"
    for key in KEYS:
        assert _call(keyed, method, path, body, key).status_code == 200, key


def test_health_is_open_and_metrics_has_its_own_switch(tiny_decoder, keyed) -> None:
    assert keyed.get("/health").status_code == 200
    assert keyed.get("/metrics").status_code == 200
    with TestClient(create_app(tiny_decoder, model_name="tiny", api_keys=KEYS, metrics_need_key=True)) as c:
        assert c.get("/health").status_code == 200
        assert c.get("/metrics").status_code == 401
        assert c.get("/metrics", headers={"Authorization": "Bearer key-two"}).status_code == 200


def test_without_keys_nothing_needs_one(tiny_decoder) -> None:
    with TestClient(create_app(tiny_decoder, model_name="tiny")) as c:
        assert c.get("/v1/models").status_code == 200
        assert c.get("/v1/models", headers={"Authorization": "Bearer anything"}).status_code == 200


def test_a_refused_key_is_logged_without_the_key(keyed, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="specrt.serve"):
        _call(keyed, "GET", "/v1/models", None, "a-secret-attempt")
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "401" in text and "/v1/models" in text and "a-secret-attempt" not in text


def test_bad_settings_are_refused_when_the_app_is_made(tiny_decoder) -> None:
    for kw, field in [
        ({"api_keys": ["ok", ""]}, "api_keys"),
        ({"max_request_bytes": 0}, "max_request_bytes"),
        ({"body_timeout_s": 0.0}, "body_timeout_s"),
    ]:
        with pytest.raises(ConfigError, match=field):
            create_app(tiny_decoder, model_name="tiny", **kw)


def test_loopback_hosts() -> None:
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.1.2.3", "localhost", "::1"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "10.0.0.5", "example.org"))


def test_a_declared_oversize_body_is_a_413_before_it_is_read(tiny_decoder) -> None:
    with TestClient(create_app(tiny_decoder, model_name="tiny", max_request_bytes=1000)) as c:
        r = c.post("/v1/completions", json={"prompt": "x" * 5000, "max_tokens": 1})
        assert r.status_code == 413, r.text
        assert r.json()["error"]["code"] == "request_too_large" and "1000" in r.json()["error"]["message"]
        assert c.post("/v1/completions", json={"prompt": "x", "max_tokens": 1}).status_code == 200


# ----- the middleware alone, with bodies in chunks (no Content-Length) and bodies that never end


def _run_guard(chunks: list[bytes], *, hang: bool = False, **kw: Any) -> tuple[int, bytes, int]:
    """Run RequestGuard over an app that reads the whole body, fed ``chunks`` (then nothing, with ``hang``).
    Returns (status, response body, chunks the app was handed)."""
    handed = 0

    async def app(scope: Any, receive: Any, send: Any) -> None:
        nonlocal handed
        while True:
            m = await receive()
            handed += 1
            if not m.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def main() -> tuple[int, bytes]:
        queue = list(chunks)

        async def receive() -> dict[str, Any]:
            if not queue:
                await asyncio.Event().wait()  # a client that never sends the rest
            body = queue.pop(0)
            return {"type": "http.request", "body": body, "more_body": bool(queue) or hang}

        sent: list[dict[str, Any]] = []

        async def send(m: dict[str, Any]) -> None:
            sent.append(m)

        scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": []}
        await RequestGuard(app, **kw)(scope, receive, send)
        return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])

    status, body = asyncio.run(main())
    return status, body, handed


def test_a_chunked_body_is_counted_as_it_arrives_and_refused_past_the_limit() -> None:
    status, body, handed = _run_guard([b"a" * 400] * 10, max_request_bytes=1000, body_timeout_s=30)
    assert status == 413 and b"request_too_large" in body
    assert handed == 2  # the third chunk crossed the limit: it never reached the app
    assert _run_guard([b"a" * 400] * 2, max_request_bytes=1000, body_timeout_s=30)[:2] == (200, b"ok")


def test_a_body_that_never_ends_times_out() -> None:
    status, body, handed = _run_guard([b"{"], hang=True, max_request_bytes=1000, body_timeout_s=0.2)
    assert status == 408 and b"body_timeout" in body and handed == 1


def test_request_work_runs_off_the_event_loop(tiny_decoder, monkeypatch) -> None:
    """Validating the body, templating and tokenizing run in worker threads, so the event loop (and /health) is
    free while a large request is prepared."""
    from specrt.server import completions as route

    seen: list[str] = []
    real = route.completion_prompts

    def spy(ctx: Any, req: Any) -> Any:
        seen.append(threading.current_thread().name)
        return real(ctx, req)

    monkeypatch.setattr(route, "completion_prompts", spy)
    with TestClient(create_app(tiny_decoder, model_name="tiny")) as c:
        loop_thread = c.portal.call(lambda: threading.current_thread().name)
        assert c.post("/v1/completions", json={"prompt": "x", "max_tokens": 1}).status_code == 200
    assert seen and seen[0] != loop_thread
