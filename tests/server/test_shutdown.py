"""``specrt serve``'s shutdown (issue 42, :mod:`specrt.server.shutdown`): new requests are refused (503 with
``Retry-After``) from the signal on, admitted ones finish until the drain deadline, what is left is cut (a stream ends
with an error event and ``[DONE]``, a waiting request gets a 503), counted in ``/metrics``; the process exits 0."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from typing import Any

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from fastapi.testclient import TestClient  # noqa: E402

from specrt.server import create_app  # noqa: E402
from specrt.server.shutdown import drain  # noqa: E402
from test_server import HeldDecoder, _free_port, _wait_until  # noqa: E402

STREAM = {"prompt": "x", "max_tokens": 60, "temperature": 0, "ignore_eos": True, "stream": True}
WHOLE = {"prompt": "y", "max_tokens": 60, "temperature": 0, "ignore_eos": True}


def _stream_events(c: TestClient, out: dict[str, Any]) -> None:
    with c.stream("POST", "/v1/completions", json=STREAM) as resp:
        out["status"] = resp.status_code
        out["events"] = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]


def test_the_drain_deadline_cuts_what_is_left_and_says_so(tiny_decoder) -> None:
    dec = HeldDecoder(tiny_decoder)  # the stream is held after its first chunk: it cannot finish before the deadline
    app = create_app(dec, model_name="tiny", num_speculative_tokens=1)
    with TestClient(app) as c:
        streamed: dict[str, Any] = {}
        whole: dict[str, Any] = {}
        threads = [
            threading.Thread(target=_stream_events, args=(c, streamed)),
            threading.Thread(target=lambda: whole.update(r=c.post("/v1/completions", json=WHOLE))),
        ]
        threads[0].start()
        _wait_until(lambda: dec.n_chunks >= 1, "the stream started")
        threads[1].start()
        _wait_until(lambda: app.state.scheduler.queue_length == 1, "the second request queued")
        cut: list[int] = []
        drainer = threading.Thread(target=lambda: cut.append(c.portal.call(drain, app, 0.3)))
        drainer.start()
        _wait_until(lambda: app.state.context.state["draining"], "the drain began")
        late = c.post("/v1/completions", json=WHOLE)  # arrives after the signal
        assert late.status_code == 503 and late.headers["retry-after"] == "10", late.text
        assert c.get("/health").status_code == 503
        _wait_until(lambda: app.state.scheduler._closed, "the deadline passed and the rest was cut")
        dec.gate.set()  # the held round ends; the cut requests leave after it
        drainer.join(60)
        for t in threads:
            t.join(60)
        assert cut == [2]
        assert streamed["status"] == 200
        *_, error, done = streamed["events"]
        assert done == "[DONE]" and json.loads(error)["error"]["code"] == "shutting_down", streamed["events"]
        r = whole["r"]
        assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down" and r.headers["retry-after"]
        metrics = c.get("/metrics").text
        assert "specrt_requests_cut_at_shutdown_total 2.0" in metrics


def test_requests_that_finish_before_the_deadline_are_not_cut(tiny_decoder) -> None:
    dec = HeldDecoder(tiny_decoder)
    app = create_app(dec, model_name="tiny", num_speculative_tokens=1)
    with TestClient(app) as c:
        streamed: dict[str, Any] = {}
        t = threading.Thread(target=_stream_events, args=(c, streamed))
        t.start()
        _wait_until(lambda: dec.n_chunks >= 1, "the stream started")
        cut: list[int] = []
        drainer = threading.Thread(target=lambda: cut.append(c.portal.call(drain, app, 120.0)))
        drainer.start()
        _wait_until(lambda: app.state.context.state["draining"], "the drain began")
        dec.gate.set()  # the stream goes on and finishes well within the deadline
        drainer.join(120)
        t.join(60)
        assert cut == [0]
        assert streamed["events"][-1] == "[DONE]"
        assert not any("error" in json.loads(e) for e in streamed["events"][:-1])


@pytest.mark.slow
def test_sigterm_drains_and_exits_zero(tiny_decoder, tmp_path) -> None:
    """The real process: ``run_server`` under SIGTERM exits with status 0 after logging what it cut."""
    port = _free_port()
    script = (
        "import sys; from specrt import Decoder; from specrt.server import create_app, run_server; "
        f"d = Decoder({str(tiny_decoder.target_path)!r}, max_seq_len=256); "
        f"run_server(create_app(d, model_name='tiny'), host='127.0.0.1', port={port}, log_level='warning', "
        "drain_timeout_s=0.5)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    try:
        base = f"http://127.0.0.1:{port}"

        def up() -> bool:
            try:
                return httpx.get(f"{base}/health", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        _wait_until(up, "the server came up", timeout_s=120)
        assert httpx.post(f"{base}/v1/completions", json={"prompt": "x", "max_tokens": 2}).status_code == 200
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "0 request(s) cut" in err, err
