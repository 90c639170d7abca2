"""The Ray Serve deployment (``specrt.ray_serve``): a local Ray cluster, the OpenAI-compatible app served through
Ray Serve's proxy, and the same outputs as the Decoder alone."""

from __future__ import annotations

import json
import socket

import pytest

serve = pytest.importorskip("ray.serve")
ray = pytest.importorskip("ray")
httpx = pytest.importorskip("httpx")

from specrt.errors import ConfigError  # noqa: E402
from specrt.ray_serve import app_builder, deployment  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_ray_serve_gives_the_decoders_outputs(tiny_decoder, monkeypatch) -> None:
    dec = tiny_decoder
    want = dec.generate("def add(a, b):", max_new_tokens=12, temperature=0, num_speculative_tokens=2)
    chat = [{"role": "user", "content": "hello"}]
    want_chat = dec.generate(messages=chat, max_new_tokens=10, temperature=1.0, seed=3, num_speculative_tokens=2)
    port = _free_port()
    # Ray Serve gives its HTTP proxy 5 s to start; on a loaded 2-core machine it can take 20 s (the cluster's processes
    # inherit this environment).
    monkeypatch.setenv("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "120")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        app = deployment(
            dec.target_path,
            dec.draft_path,
            model_name="tiny",
            num_replicas=2,
            num_cpus=0.5,
            decoder_kwargs={"max_seq_len": 256, "intra_op_threads": 1},
            app_kwargs={"num_speculative_tokens": 2},
        )
        serve.run(app, name="specrt", route_prefix="/", blocking=False)
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base, timeout=120) as c:
            assert [m["id"] for m in c.get("/v1/models").json()["data"]] == ["tiny"]
            for _ in range(4):  # both replicas answer the same
                r = c.post("/v1/completions", json={"prompt": "def add(a, b):", "max_tokens": 12, "temperature": 0})
                assert r.status_code == 200, r.text
                assert r.json()["choices"][0]["text"] == want.text
            body = {"messages": chat, "max_tokens": 10, "temperature": 1.0, "seed": 3, "stream": True}
            text = ""
            with c.stream("POST", "/v1/chat/completions", json=body) as resp:
                for line in resp.iter_lines():
                    if line.startswith("data: {"):
                        for ch in json.loads(line[6:])["choices"]:
                            text += ch["delta"].get("content", "")
            assert text == want_chat.text
            r = c.post("/v1/completions", json={"prompt": "x", "temperature": 7})
            assert r.status_code == 400 and r.json()["error"]["param"] == "temperature"
    finally:
        serve.shutdown()
        ray.shutdown()


def test_app_builder_names_bad_arguments() -> None:
    with pytest.raises(ConfigError, match=r"unknown arguments \['tagret'\]"):
        app_builder({"tagret": "x"})
    with pytest.raises(ConfigError, match="target=<model name or folder> is required"):
        app_builder({"draft": "x"})


def test_app_builder_takes_serves_network_options(monkeypatch) -> None:
    import specrt.ray_serve as rs

    got: dict = {}
    monkeypatch.setattr(rs, "deployment", lambda *a, **kw: got.update(kw))
    monkeypatch.setenv("SPECRT_API_KEY", "from-env")
    app_builder({"target": "x", "api_key": "k1,k2", "max_request_bytes": "2048", "metrics_need_key": "true"})
    assert got["app_kwargs"] == {
        "api_keys": ["k1", "k2", "from-env"],
        "max_request_bytes": 2048,
        "metrics_need_key": True,
    }
