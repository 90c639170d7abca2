"""Fault soak of ``specrt serve`` (issue 42): concurrent good requests and faults, then the invariants.

    python benches/soak.py                                  # SmolLM2-135M fp32 + its int4 self-draft, 16 x 600 s
    python benches/soak.py --max-batch 4                    # batched rounds
    python benches/soak.py --duration 60 --no-faults-duration 30 --json benches/out/soak.json

Phases, each on its own ``specrt serve`` process (an API key, ``--max-request-bytes``, ``--body-timeout`` and
``--max-seq-len`` set small so faults are cheap):

1. **soak**: ``--clients`` clients for ``--duration`` seconds, each drawing from a mix of good requests (chat and
   completions, streamed and not, greedy and seeded, ``response_format`` json_schema, ``tool_choice: required``,
   logprobs, a prompt that fills the context, a slow reader) and faults (disconnects during prefill and mid-stream,
   cancels, malformed JSON, a body that is not an object, oversize bodies by Content-Length and chunked, a body that
   never ends, missing and wrong keys, out-of-range settings, a prompt over the context). Every answer's status and
   error ``param`` / ``code`` is checked against the documented one (docs/openai-api.md). The server's resident
   memory (VmRSS, /proc) is sampled each second, the batched prefix store's bytes (``specrt_prefix_cache_bytes``)
   every 5 s; the growth bound applies to RSS net of that store (a cache that fills up to its budget by design);
   at the end ``/health`` and ``/metrics`` must be idle.
2. **no-faults**: the same good load, no faults, for ``--no-faults-duration`` seconds: the latency baseline.
3. **replay**: a fresh server answers each distinct greedy / seeded request alone, one at a time; every text of the
   soak and of the baseline must equal it (a seeded request's text too: it must repeat).
4. **kill -9**: the replay server is killed with SIGKILL under load and started again; the time until it answers
   and its first answer (which must equal the replay) are recorded.

Every server is stopped with SIGTERM (exit status 0 expected); its log (uvicorn's, level info) must hold no
traceback and no 5xx. Writes a JSON report (``--json``) and prints a short summary; exit status 1 when an invariant
fails. No figure here is checked against a wall-time bound except the memory growth (``--max-rss-growth``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
KEY = "soak-key"
MAX_REQUEST_BYTES = 64 * 1024
BODY_TIMEOUT_S = 3.0

PROMPTS = ["def fibonacci(n):", "The quick brown fox", "Once upon a time, in a land far away,", "SELECT name FROM"]
QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea.", "Name three primes.", "Say hello."]
LENGTHS = [8, 16, 32]
SEEDS = [1, 2, 3]
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
    "required": ["city", "population"],
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "city_population",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
# Out-of-range settings and the param the 400 must name.
OUT_OF_RANGE = [
    ("/v1/completions", {"prompt": "x", "temperature": 9}, "temperature"),
    ("/v1/completions", {"prompt": "x", "top_p": 2}, "top_p"),
    ("/v1/completions", {"prompt": "x", "max_tokens": -1}, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "n": 0}, "n"),
    ("/v1/completions", {"prompt": "x", "presence_penalty": 5}, "presence_penalty"),
    ("/v1/completions", {"prompt": "x", "frobnicate": True}, "frobnicate"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 3}, "top_logprobs"),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 99},
        "top_logprobs",
    ),
    ("/v1/chat/completions", {"messages": []}, "messages"),
]
KILL9_CHECK = {"prompt": PROMPTS[0], "max_tokens": 32, "temperature": 0}  # the first request after the restart
GOOD_KINDS = {  # kind: weight
    "chat": 3, "chat_stream": 3, "cmpl": 3, "cmpl_stream": 3, "seeded": 2, "seeded_stream": 1, "json_schema": 2,
    "tools_required": 2, "logprobs_chat": 1, "logprobs_cmpl": 1, "context_fill": 1, "slow_reader": 1,
}  # fmt: skip
FAULT_KINDS = {
    "disconnect_prefill": 2, "disconnect_stream": 2, "cancel": 2, "malformed_json": 1, "not_object": 1,
    "oversize_length": 1, "oversize_chunked": 1, "body_never_ends": 1, "missing_key": 1, "wrong_key": 1,
    "out_of_range": 3, "context_over": 1,
}  # fmt: skip
# What each fault must get: allowed statuses (None: the client closed the connection first), param, code.
EXPECTED: dict[str, tuple[set[int | None], str | None, str | None]] = {
    "malformed_json": ({400}, None, None),
    "not_object": ({400}, None, None),
    "oversize_length": ({413}, None, "request_too_large"),
    "oversize_chunked": ({413}, None, "request_too_large"),
    "body_never_ends": ({408}, None, "body_timeout"),
    "missing_key": ({401}, None, "invalid_api_key"),
    "wrong_key": ({401}, None, "invalid_api_key"),
    "context_over": ({400}, "*", None),  # param: prompt / messages, set per request
    "out_of_range": ({400}, "*", None),
    "disconnect_prefill": ({None, 200}, None, None),  # 200: the status came before the client left
    "disconnect_stream": ({200}, None, None),
    "cancel": ({None, 200}, None, None),  # 200: answered before the client left
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, RssAnon) of ``pid`` in KiB, from /proc/<pid>/status."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "RssAnon:")):
                out[line.split(":")[0]] = int(line.split()[1])
    return out["VmRSS"], out["RssAnon"]


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, round(q * (len(v) - 1)))]


class Server:
    """One ``specrt serve`` process with the soak's options; its log goes to ``log``."""

    def __init__(self, a: argparse.Namespace, log: Path, port: int | None = None) -> None:
        self.port = port or _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = log
        cmd = [sys.executable, "-m", "specrt.cli", "serve", "--target", a.target, "--port", str(self.port)]
        if a.draft:
            cmd += ["--draft", a.draft]
        if a.draft_dtype:
            cmd += ["--draft-dtype", a.draft_dtype]
        cmd += ["--api-key", KEY, "--max-request-bytes", str(MAX_REQUEST_BYTES), "--body-timeout", str(BODY_TIMEOUT_S)]
        cmd += ["--max-seq-len", str(a.max_seq_len), "--max-batch", str(a.max_batch), "-k", str(a.k)]
        cmd += ["--model-name", "soak", "--log-level", "info", "--drain-timeout", "30"]
        env = {**os.environ, "PYTHONPATH": str(REPO / "python"), "PYTHONUNBUFFERED": "1"}
        self._logf = open(log, "a")  # noqa: SIM115 (closed in stop)
        self.t_start = time.monotonic()
        self.proc = subprocess.Popen(cmd, env=env, stdout=self._logf, stderr=subprocess.STDOUT)

    def wait_healthy(self, timeout_s: float = 600) -> float:
        """Seconds from the start until /health answers 200 (RuntimeError if the process ends or never answers)."""
        while time.monotonic() - self.t_start < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}; see {self.log}")
            try:
                if httpx.get(f"{self.base}/health", timeout=1).status_code == 200:
                    return time.monotonic() - self.t_start
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"the server did not come up; see {self.log}")

    def stop(self) -> int | None:
        """SIGTERM, then the exit status (None if it had to be killed)."""
        rc: int | None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                rc = self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                rc = None
        else:
            rc = self.proc.returncode
        self._logf.close()
        return rc

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self._logf.close()


def scan_log(path: Path) -> dict[str, Any]:
    """Tracebacks and 5xx access-log lines in a server log."""
    text = path.read_text(errors="replace")
    fives = [ln for ln in text.splitlines() if re.search(r'HTTP/1\.[01]" 5\d\d', ln)]
    return {"tracebacks": text.count("Traceback (most recent call last)"), "5xx_lines": fives[:20], "5xx": len(fives)}


# ---------------------------------------------------------------- requests


class Mix:
    """Request bodies for each kind; ``key`` identifies a deterministic request (greedy or seeded) for the replay."""

    def __init__(self, fill_words: int, over_words: int) -> None:
        self.fill_words = fill_words
        self.over_words = over_words

    def good(self, kind: str, rng: random.Random) -> tuple[str, dict[str, Any], bool]:
        """(path, body, deterministic) of a good request of ``kind``."""
        n = rng.choice(LENGTHS)
        chat = {"messages": [{"role": "user", "content": rng.choice(QUESTIONS)}], "max_tokens": n, "temperature": 0}
        cmpl = {"prompt": rng.choice(PROMPTS), "max_tokens": n, "temperature": 0}
        if kind in ("chat", "chat_stream"):
            return "/v1/chat/completions", {**chat, "stream": kind == "chat_stream"}, True
        if kind in ("cmpl", "cmpl_stream", "slow_reader"):
            return "/v1/completions", {**cmpl, "stream": kind != "cmpl"}, True
        if kind in ("seeded", "seeded_stream"):
            # coupled: a seeded request repeats whatever K and batching (docs/openai-api.md, seed)
            body = {**chat, "temperature": 0.8, "top_p": 0.95, "seed": rng.choice(SEEDS), "coupled": True}
            return "/v1/chat/completions", {**body, "stream": kind == "seeded_stream"}, True
        if kind == "json_schema":
            fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA}}
            msg = [{"role": "user", "content": "Give a city and its population as JSON."}]
            return (
                "/v1/chat/completions",
                {"messages": msg, "max_tokens": 32, "temperature": 0, "response_format": fmt},
                True,
            )
        if kind == "tools_required":
            msg = [{"role": "user", "content": f"How many people live in {rng.choice(['Paris', 'Oslo'])}?"}]
            body = {"messages": msg, "tools": TOOLS, "tool_choice": "required", "max_tokens": 32, "temperature": 0}
            return "/v1/chat/completions", body, True
        if kind == "logprobs_chat":
            return "/v1/chat/completions", {**chat, "logprobs": True, "top_logprobs": 3}, True
        if kind == "logprobs_cmpl":
            return "/v1/completions", {**cmpl, "logprobs": 2}, True
        if kind == "context_fill":  # the prompt takes nearly all the context; what is left is generated
            return "/v1/completions", {"prompt": "hello " * self.fill_words, "max_tokens": 8, "temperature": 0}, True
        raise ValueError(kind)


def _error_fields(resp_json: Any) -> tuple[str | None, str | None]:
    err = resp_json.get("error") if isinstance(resp_json, dict) else None
    return (err.get("param"), err.get("code")) if isinstance(err, dict) else (None, None)


def _text_of(path: str, data: dict[str, Any]) -> str:
    ch = data["choices"][0]
    if path == "/v1/completions":
        return ch["text"]
    msg = ch["message"]
    if msg.get("tool_calls"):
        return json.dumps([(c["function"]["name"], c["function"]["arguments"]) for c in msg["tool_calls"]])
    return msg["content"] or ""


def _delta_text(path: str, event: dict[str, Any]) -> str:
    if not event.get("choices"):
        return ""
    ch = event["choices"][0]
    return (ch.get("text") or "") if path == "/v1/completions" else (ch.get("delta", {}).get("content") or "")


async def send_good(client: httpx.AsyncClient, path: str, body: dict[str, Any], slow: bool = False) -> dict[str, Any]:
    """One good request: its status, text (streamed texts joined), error fields, latency."""
    t0 = time.monotonic()
    out: dict[str, Any] = {"status": None}
    if not body.get("stream"):
        r = await client.post(path, json=body)
        out["status"] = r.status_code
        data = r.json()
        if r.status_code == 200:
            out["text"] = _text_of(path, data)
        else:
            out["param"], out["code"] = _error_fields(data)
    else:
        async with client.stream("POST", path, json=body) as r:
            out["status"] = r.status_code
            if r.status_code != 200:
                data = json.loads(await r.aread())
                out["param"], out["code"] = _error_fields(data)
            else:
                parts, done = [], False
                async for line in r.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    if line == "data: [DONE]":
                        done = True
                        break
                    event = json.loads(line[6:])
                    if "error" in event:
                        out["stream_error"] = event["error"]
                    parts.append(_delta_text(path, event))
                    if slow:
                        await asyncio.sleep(0.3)
                out["text"] = "".join(parts)
                out["done"] = done
    out["latency_s"] = time.monotonic() - t0
    return out


async def raw_chunked_post(base: httpx.URL, chunks: list[bytes], timeout_s: float = 60.0) -> tuple[Any, Any]:
    """POST ``chunks`` as a chunked body on a raw socket, never ending the body (no zero-length chunk), reading what
    the server answers while it is sent: (status, JSON body). httpx cannot read an answer that comes while it still
    sends, so the body's faults use this. The status is ``"reset"`` when the connection was reset before any answer
    arrived (the server closed with sent bytes unread)."""
    reader, writer = await asyncio.open_connection(base.host, base.port)
    received: list[bytes] = []

    async def read_all() -> None:
        try:
            while block := await reader.read(65536):
                received.append(block)
        except ConnectionError:
            pass

    read_task = asyncio.create_task(read_all())
    try:
        head = (
            f"POST /v1/completions HTTP/1.1\r\nHost: {base.host}\r\nAuthorization: Bearer {KEY}\r\n"
            "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        writer.write(head.encode())
        try:
            for c in chunks:
                writer.write(b"%x\r\n%s\r\n" % (len(c), c))
                await writer.drain()
        except ConnectionError:
            pass  # the server answered and closed while the body was still going out
        await asyncio.wait_for(read_task, timeout_s)
    finally:
        read_task.cancel()
        writer.close()
    data = b"".join(received)
    if not data:
        return "reset", None
    header, _, body = data.partition(b"\r\n\r\n")
    status = int(header.split(b" ", 2)[1])
    try:
        return status, json.loads(body)
    except json.JSONDecodeError:
        return status, None


async def send_fault(client: httpx.AsyncClient, kind: str, mix: Mix, rng: random.Random) -> dict[str, Any]:
    """One fault: what came back (status None: the client closed the connection before a status)."""
    out: dict[str, Any] = {"status": None}
    hdr = {"content-type": "application/json"}

    async def post_raw(content: Any, headers: dict[str, str] | None = None, path: str = "/v1/completions") -> None:
        r = await client.post(path, content=content, headers={**hdr, **(headers or {})})
        out["status"] = r.status_code
        out["param"], out["code"] = _error_fields(r.json())

    if kind == "malformed_json":
        await post_raw(b'{"prompt": "x", "max_tokens": ')
    elif kind == "not_object":
        await post_raw(b"[1, 2, 3]")
    elif kind == "oversize_length":
        await post_raw(json.dumps({"prompt": "a" * (MAX_REQUEST_BYTES + 100)}).encode())
    elif kind in ("oversize_chunked", "body_never_ends"):  # past the limit; 8 KiB and never the end
        # Just past the limit, then silence: the server reads every byte sent, so its close is not a reset.
        n = MAX_REQUEST_BYTES // 8192 + 1 if kind == "oversize_chunked" else 1
        out["status"], data = await raw_chunked_post(client.base_url, [b'{"prompt": "' + b"a" * 8192] * n)
        out["param"], out["code"] = _error_fields(data)
    elif kind in ("missing_key", "wrong_key"):
        req = client.build_request("POST", "/v1/completions", json={"prompt": "x"})
        if kind == "wrong_key":
            req.headers["Authorization"] = f"Bearer {rng.choice(['not-the-key', KEY + 'x', KEY[:-1]])}"
        else:
            del req.headers["Authorization"]
        r = await client.send(req)
        out["status"] = r.status_code
        out["param"], out["code"] = _error_fields(r.json())
    elif kind == "out_of_range":
        path, body, param = rng.choice(OUT_OF_RANGE)
        out["expected_param"] = param
        r = await client.post(path, json=body)
        out["status"] = r.status_code
        out["param"], out["code"] = _error_fields(r.json())
    elif kind == "context_over":
        if rng.random() < 0.5:
            path, body = "/v1/completions", {"prompt": "hello " * mix.over_words, "max_tokens": 4}
            out["expected_param"] = "prompt"
        else:
            msgs = [{"role": "user", "content": "hello " * mix.over_words}]
            path, body = "/v1/chat/completions", {"messages": msgs}
            out["expected_param"] = "messages"
        r = await client.post(path, json=body)
        out["status"] = r.status_code
        out["param"], out["code"] = _error_fields(r.json())
    elif kind == "disconnect_prefill":  # a long prompt, the client leaves within its prefill
        body = {"prompt": "hello " * mix.fill_words, "max_tokens": 8, "stream": True, "temperature": 0}
        try:
            async with asyncio.timeout(rng.uniform(0.01, 0.3)):
                async with client.stream("POST", "/v1/completions", json=body) as r:
                    out["status"] = r.status_code
                    async for _ in r.aiter_lines():
                        pass
        except TimeoutError:
            pass
    elif kind == "disconnect_stream":  # the client leaves after the first events
        body = {"prompt": rng.choice(PROMPTS), "max_tokens": 64, "stream": True, "temperature": 0, "ignore_eos": True}
        async with client.stream("POST", "/v1/completions", json=body) as r:
            out["status"] = r.status_code
            n = 0
            async for line in r.aiter_lines():
                n += line.startswith("data: ")
                if n >= rng.randint(1, 3):
                    break
    elif kind == "cancel":  # a whole request cancelled before its answer
        msgs = [{"role": "user", "content": rng.choice(QUESTIONS)}]
        body = {"messages": msgs, "max_tokens": 64, "temperature": 0, "ignore_eos": True}
        try:
            async with asyncio.timeout(rng.uniform(0.05, 1.0)):
                r = await client.post("/v1/chat/completions", json=body)
                out["status"] = r.status_code  # answered before the cancel
        except TimeoutError:
            pass
    else:
        raise ValueError(kind)
    return out


def check_fault(kind: str, res: dict[str, Any]) -> str | None:
    """Why a fault's answer is not the documented one (None: it is)."""
    statuses, param, code = EXPECTED[kind]
    if res.get("exception"):
        return f"client error {res['exception']}"
    if res["status"] not in statuses:
        return f"status {res['status']}, expected {sorted(statuses, key=str)}"
    want_param = res.get("expected_param") if param == "*" else param
    if res["status"] is not None and res["status"] >= 400:
        if res.get("param") != want_param:
            return f"param {res.get('param')!r}, expected {want_param!r}"
        if code is not None and res.get("code") != code:
            return f"code {res.get('code')!r}, expected {code!r}"
    return None


def _key(path: str, body: dict[str, Any]) -> str:
    return json.dumps([path, {k: v for k, v in body.items() if k != "stream"}], sort_keys=True)


async def load(
    base: str, a: argparse.Namespace, mix: Mix, duration_s: float, faults: bool, pid: int | None
) -> tuple[list[dict[str, Any]], list[tuple[float, int, int]]]:
    """``a.clients`` clients for ``duration_s``; returns every request's record and (t, VmRSS, RssAnon, prefix store)
    samples in KiB."""
    kinds = dict(GOOD_KINDS) | (FAULT_KINDS if faults else {})
    names, weights = list(kinds), list(kinds.values())
    records: list[dict[str, Any]] = []
    samples: list[tuple[float, int, int, int]] = []
    t0 = time.monotonic()
    limits = httpx.Limits(max_connections=4 * a.clients, max_keepalive_connections=2 * a.clients)
    headers = {"Authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=900, limits=limits) as client:

        async def worker(i: int) -> None:
            rng = random.Random(a.seed * 1000 + i + (0 if faults else 500))
            while time.monotonic() - t0 < duration_s:
                kind = rng.choices(names, weights)[0]
                rec: dict[str, Any] = {"kind": kind, "t": time.monotonic() - t0}
                try:
                    if kind in GOOD_KINDS:
                        path, body, det = mix.good(kind, rng)
                        rec |= {
                            "path": path,
                            "key": _key(path, body) if det else None,
                            "stream": bool(body.get("stream")),
                        }
                        rec |= await send_good(client, path, body, slow=kind == "slow_reader")
                    else:
                        rec |= await send_fault(client, kind, mix, rng)
                except Exception as e:  # a client-side failure is recorded, and the soak goes on
                    rec["exception"] = f"{type(e).__name__}: {e}"
                records.append(rec)

        store_kib = [0]  # the batched prefix store's bytes (/metrics), read every 5 s

        async def sampler() -> None:
            n = 0
            while time.monotonic() - t0 < duration_s:
                if n % 5 == 0:
                    store_kib[0] = await prefix_store_kib(client)
                if pid is not None:
                    samples.append((time.monotonic() - t0, *rss_kib(pid), store_kib[0]))
                n += 1
                await asyncio.sleep(1.0)

        await asyncio.gather(sampler(), *(worker(i) for i in range(a.clients)))
        if pid is not None:
            samples.append((time.monotonic() - t0, *rss_kib(pid), await prefix_store_kib(client)))
    return records, samples


async def prefix_store_kib(client: httpx.AsyncClient) -> int:
    """``specrt_prefix_cache_bytes`` from /metrics in KiB (the batched prefix store: a cache bounded by its budget,
    1 GiB by default, that fills as distinct prompts arrive); 0 in the single-stream layout."""
    text = (await client.get("/metrics", timeout=30)).text
    m = re.search(r"^specrt_prefix_cache_bytes ([0-9.e+-]+)$", text, re.M)
    return int(float(m.group(1)) / 1024) if m else 0


def wait_idle(base: str, timeout_s: float = 60) -> dict[str, Any]:
    """Poll /health until queue and running are 0; then read /metrics' gauges."""
    t0 = time.monotonic()
    health: dict[str, Any] = {}
    while time.monotonic() - t0 < timeout_s:
        health = httpx.get(f"{base}/health", timeout=5).json()
        if health.get("queue_length") == 0 and health.get("running") == 0:
            break
        time.sleep(0.2)
    text = httpx.get(f"{base}/metrics", timeout=5).text
    gauges = {}
    for name in ("specrt_queue_length", "specrt_running_requests"):
        m = re.search(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M)
        gauges[name] = float(m.group(1)) if m else None
    idle = health.get("queue_length") == 0 and health.get("running") == 0 and all(v == 0 for v in gauges.values())
    return {"health": health, "metrics": gauges, "idle": idle, "waited_s": round(time.monotonic() - t0, 2)}


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts, documented-status failures, 5xx, good latencies."""
    by_kind: dict[str, dict[str, int]] = {}
    wrong: list[dict[str, Any]] = []
    for r in records:
        d = by_kind.setdefault(r["kind"], {})
        d[str(r.get("status"))] = d.get(str(r.get("status")), 0) + 1
        if r["kind"] in FAULT_KINDS:
            why = check_fault(r["kind"], r)
        elif r.get("exception"):
            why = f"client error {r['exception']}"
        elif r["status"] != 200:
            why = f"status {r['status']} param {r.get('param')!r} code {r.get('code')!r}"
        elif r.get("stream") and (not r.get("done") or r.get("stream_error")):
            why = f"stream ended without [DONE] or with an error event: {r.get('stream_error')}"
        else:
            why = None
        if why:
            wrong.append({**r, "why": why})
    good = [r for r in records if r["kind"] in GOOD_KINDS and r["kind"] != "slow_reader" and r.get("status") == 200]
    lat = [r["latency_s"] for r in good if "latency_s" in r]
    return {
        "requests": len(records),
        "good_completed": len(good),
        "by_kind": by_kind,
        "5xx": sum(1 for r in records if (r.get("status") or 0) >= 500),
        "undocumented": wrong[:50],
        "n_undocumented": len(wrong),
        "good_latency_s": {"p50": pct(lat, 0.5), "p99": pct(lat, 0.99), "mean": statistics.fmean(lat) if lat else None},
    }


def memory(samples: list[tuple[float, int, int, int]], warm_s: float) -> dict[str, Any]:
    """RSS after warm-up against the end; also net of the batched prefix store (a bounded cache that fills by design:
    its bytes are what /metrics reports), which is what the growth bound applies to."""
    warm = [s for s in samples if s[0] >= warm_s]
    if len(warm) < 2:
        return {"samples": len(samples)}
    first, last = warm[0], warm[-1]
    mid = min(warm, key=lambda s: abs(s[0] - (first[0] + last[0]) / 2))
    step_s = max(10.0, (samples[-1][0] - samples[0][0]) / 40)
    timeline, next_t = [], 0.0
    for t, rss, anon, store in samples:  # about 40 points: enough to tell a plateau from a steady climb
        if t >= next_t:
            timeline.append([round(t, 1), rss, anon, store])
            next_t = t + step_s

    def pct(a: float, b: float) -> float:
        return round(100 * (b - a) / a, 2)

    return {
        "samples": len(samples),
        "warm_at_s": round(first[0], 1),
        "rss_warm_kib": first[1],
        "rss_end_kib": last[1],
        "rss_growth_pct": pct(first[1], last[1]),
        "rss_max_kib": max(s[1] for s in warm),
        "rss_anon_warm_kib": first[2],
        "rss_anon_end_kib": last[2],
        # the second half of the warm span alone: near 0 for a plateau, about half the whole for a steady leak
        "rss_growth_second_half_pct": pct(mid[1], last[1]),
        "prefix_store_warm_kib": first[3],
        "prefix_store_end_kib": last[3],
        "rss_net_of_prefix_store_growth_pct": pct(first[1] - first[3], last[1] - last[3]),
        "timeline_s_rss_anon_store_kib": timeline,
    }


async def replay(base: str, keys: list[str]) -> dict[str, str]:
    """Each request alone, one after another (not streamed): its text."""
    out = {}
    async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {KEY}"}, timeout=900) as client:
        for k in keys:
            path, body = json.loads(k)
            r = await send_good(client, path, body)
            out[k] = r.get("text", f"<status {r['status']}>")
    return out


def compare(records: list[dict[str, Any]], refs: dict[str, str]) -> dict[str, Any]:
    mism = []
    n = 0
    for r in records:
        if r.get("key") and r.get("status") == 200 and "text" in r and not r.get("stream_error"):
            n += 1
            if r["text"] != refs[r["key"]]:
                mism.append({"kind": r["kind"], "key": r["key"], "got": r["text"], "replay": refs[r["key"]]})
    return {"compared": n, "mismatches": len(mism), "examples": mism[:10]}


async def kill9_under_load(
    a: argparse.Namespace, out_dir: Path, server: Server, refs: dict[str, str]
) -> dict[str, Any]:
    """Load ``server``, SIGKILL it mid-load, start it again on the same port: the time to serve and the answer."""
    body = dict(KILL9_CHECK)
    long_body = {"prompt": PROMPTS[1], "max_tokens": 128, "temperature": 0, "ignore_eos": True}
    headers = {"Authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(base_url=server.base, headers=headers, timeout=120) as client:

        async def one() -> Any:
            try:
                return (await client.post("/v1/completions", json=long_body)).status_code
            except httpx.HTTPError as e:
                return type(e).__name__

        tasks = [asyncio.create_task(one()) for _ in range(a.clients)]
        t0 = time.monotonic()
        while time.monotonic() - t0 < 30:
            h = httpx.get(f"{server.base}/health", timeout=5).json()
            if h["running"] >= 1:
                break
            await asyncio.sleep(0.05)
        load_at_kill = h
        server.kill9()
        seen = await asyncio.gather(*tasks)
    restarted = Server(a, out_dir / "server-after-kill9.log", port=server.port)
    try:
        up_s = restarted.wait_healthy()
        t1 = time.monotonic()
        async with httpx.AsyncClient(base_url=restarted.base, headers=headers, timeout=120) as client:
            r = await send_good(client, "/v1/completions", body)
        first_s = time.monotonic() - t1
    finally:
        rc = restarted.stop()
    key = _key("/v1/completions", body)
    return {
        "load_at_kill": load_at_kill,
        "clients_saw": {str(s): seen.count(s) for s in set(seen)},
        "restart_to_health_s": round(up_s, 2),
        "first_request_s": round(first_s, 2),
        "first_status": r["status"],
        "first_equals_replay": r.get("text") == refs[key],
        "exit_status_after_sigterm": rc,
        "log": scan_log(out_dir / "server-after-kill9.log"),
    }


def context_words(base: str, max_seq_len: int) -> tuple[int, int]:
    """Repeats of 'hello ' that leave ~12 tokens of the context, and ones that overflow it twice."""
    r = httpx.post(f"{base}/tokenize", json={"prompt": "hello " * 100}, headers={"Authorization": f"Bearer {KEY}"})
    per = r.json()["count"] / 100
    return int((max_seq_len - 12) / per) - 2, int(2 * max_seq_len / per)


def run(a: argparse.Namespace) -> dict[str, Any]:
    out_dir = Path(a.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for f in out_dir.glob("server-*.log"):
        f.unlink()
    report: dict[str, Any] = {
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs",
        "args": vars(a),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    phases: list[tuple[str, bool, float]] = [("soak", True, a.duration)]
    if a.no_faults_duration > 0:
        phases.append(("no_faults", False, a.no_faults_duration))
    all_records: list[dict[str, Any]] = []
    mix = None
    for name, faults, dur in phases:
        server = Server(a, out_dir / f"server-{name}.log")
        try:
            up = server.wait_healthy()
            if mix is None:
                mix = Mix(*context_words(server.base, a.max_seq_len))
            records, samples = asyncio.run(load(server.base, a, mix, dur, faults, server.proc.pid))
            idle = wait_idle(server.base)
        finally:
            rc = server.stop()
        for r in records:
            r["phase"] = name
        all_records += records
        report[name] = {
            "duration_s": dur,
            "startup_s": round(up, 2),
            **summarize(records),
            "memory": memory(samples, max(10.0, a.warmup_fraction * dur)),
            "idle_at_end": idle,
            "exit_status_after_sigterm": rc,
            "log": scan_log(out_dir / f"server-{name}.log"),
        }
    keys = sorted({r["key"] for r in all_records if r.get("key")} | {_key("/v1/completions", KILL9_CHECK)})
    server = Server(a, out_dir / "server-replay.log")
    try:
        server.wait_healthy()
        t0 = time.monotonic()
        refs = asyncio.run(replay(server.base, keys))
    except BaseException:
        server.stop()
        raise
    report["replay"] = {"distinct_requests": len(keys), "seconds": round(time.monotonic() - t0, 1)}
    report["replay"] |= compare(all_records, refs)
    report["replay"]["log"] = scan_log(out_dir / "server-replay.log")
    try:
        report["kill9"] = asyncio.run(kill9_under_load(a, out_dir, server, refs))
    finally:
        if server.proc.poll() is None:
            server.stop()
    report["invariants"] = invariants(report, a)
    report["ok"] = all(report["invariants"].values())
    return report


def invariants(report: dict[str, Any], a: argparse.Namespace) -> dict[str, bool]:
    phases = [p for p in ("soak", "no_faults") if p in report]
    logs = [report[p]["log"] for p in phases] + [report["replay"]["log"], report["kill9"]["log"]]
    soak_mem = report["soak"]["memory"]
    return {
        "no_5xx": all(report[p]["5xx"] == 0 for p in phases) and all(lg["5xx"] == 0 for lg in logs),
        "no_tracebacks": all(lg["tracebacks"] == 0 for lg in logs),
        "documented_statuses": all(report[p]["n_undocumented"] == 0 for p in phases),
        "greedy_and_seeded_equal_replay": report["replay"]["mismatches"] == 0 and report["replay"]["compared"] > 0,
        "idle_at_end": all(report[p]["idle_at_end"]["idle"] for p in phases),
        "rss_growth_below_limit": soak_mem.get("rss_net_of_prefix_store_growth_pct", 0.0) < a.max_rss_growth,
        "exit_0_on_sigterm": all(report[p]["exit_status_after_sigterm"] == 0 for p in phases),
        "serves_after_kill9": report["kill9"]["first_status"] == 200 and report["kill9"]["first_equals_replay"],
    }


def text_summary(report: dict[str, Any]) -> str:
    lines = [f"soak: {report['command']}  ({report['machine']})"]
    for p in ("soak", "no_faults"):
        if p not in report:
            continue
        r = report[p]
        lat = r["good_latency_s"]
        f = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
        lines.append(
            f"  {p}: {r['duration_s']:.0f} s, {r['requests']} requests ({r['good_completed']} good completed), "
            f"5xx {r['5xx']}, undocumented {r['n_undocumented']}, good p50 {f(lat['p50'])} s p99 {f(lat['p99'])} s, "
            f"idle at end {r['idle_at_end']['idle']}, tracebacks {r['log']['tracebacks']}"
        )
        if r["memory"].get("rss_warm_kib"):
            m = r["memory"]
            lines.append(
                f"    RSS {m['rss_warm_kib'] / 1024:.0f} MiB at {m['warm_at_s']} s -> "
                f"{m['rss_end_kib'] / 1024:.0f} MiB "
                f"({m['rss_growth_pct']:+.2f} %; second half {m['rss_growth_second_half_pct']:+.2f} %); "
                f"prefix store {m['prefix_store_warm_kib'] / 1024:.0f} -> {m['prefix_store_end_kib'] / 1024:.0f} MiB, "
                f"RSS net of it {m['rss_net_of_prefix_store_growth_pct']:+.2f} %"
            )
    rp, k9 = report["replay"], report["kill9"]
    lines.append(
        f"  replay: {rp['compared']} texts vs {rp['distinct_requests']} solo requests, {rp['mismatches']} differ"
    )
    lines.append(
        f"  kill -9 under load ({k9['load_at_kill']}): back in {k9['restart_to_health_s']} s, first answer "
        f"{k9['first_status']} in {k9['first_request_s']} s, equal to replay {k9['first_equals_replay']}"
    )
    lines.append(
        "  invariants: " + ", ".join(f"{k} {'ok' if v else 'FAILED'}" for k, v in report["invariants"].items())
    )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2-135m-instruct", help="model name or folder (default: SmolLM2 fp32)")
    ap.add_argument("--draft", default="smollm2-135m-instruct", help="draft name or folder ('' for none)")
    ap.add_argument("--draft-dtype", default="int4", help="for a draft model name (default: int4 self-draft)")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--duration", type=float, default=600, help="seconds of the fault soak")
    ap.add_argument(
        "--no-faults-duration", type=float, default=None, help="seconds of the baseline (default: --duration; 0: none)"
    )
    ap.add_argument("--max-batch", type=int, default=1)
    ap.add_argument("--max-seq-len", type=int, default=1024)
    ap.add_argument("-k", default="auto")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--warmup-fraction", type=float, default=0.2, help="of the soak before the RSS reference (min 10 s)"
    )
    ap.add_argument("--max-rss-growth", type=float, default=5.0, help="percent")
    ap.add_argument("--out-dir", default=str(REPO / "benches" / "out" / "soak"), help="server logs")
    ap.add_argument("--json", default=None, help="the report (default: <out-dir>/report.json)")
    a = ap.parse_args(argv)
    if a.no_faults_duration is None:
        a.no_faults_duration = a.duration
    if a.draft == "":
        a.draft = None
    if a.draft is None or Path(a.draft).is_dir():
        a.draft_dtype = None
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    report = run(a)
    path = Path(a.json or Path(a.out_dir) / "report.json")
    path.write_text(json.dumps(report, indent=1, default=str))
    print(text_summary(report))
    print(f"report: {path}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
