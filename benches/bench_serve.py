"""Load test of ``specrt serve`` on the loopback address: concurrent clients, mixed requests, correctness and memory.

    python benches/bench_serve.py                                   # SmolLM2 + its 6-layer draft, 16 clients x 200
    python benches/bench_serve.py --clients 16 --requests 200 --json benches/out/serve.json
    python benches/bench_serve.py --max-batch 8 --max-seq-len 512  # batched rounds (server --max-batch 8)

Starts ``specrt serve`` in its own process, then sends ``--requests`` requests from ``--clients`` concurrent clients
(httpx, asyncio): completions and chat completions, streamed and not, ``max_tokens`` 8-64, greedy; every 10th stream
is dropped after its first chunk (the client disconnects) and every 12th request is malformed (a field out of range,
an unknown field, no prompt). Before the load it computes each prompt's solo greedy output with a local
:class:`specrt.Decoder` on the same models, and checks that every completed response equals it, token for token in
text. Meanwhile it samples the server's ``RssAnon`` (/proc/<pid>/status) every 0.5 s; the growth is the least-squares
slope over the samples after the first quarter of the run (warm-up), as in bench_memory.py.

Reports: 5xx count (must be 0), mismatches (must be 0), 4xx for the malformed ones, cancelled count, p50 / p99
latency of completed requests, time to first token of streams, aggregate completion tokens/s, RssAnon slope.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

import httpx

import specrt
from specrt import models

PROMPTS = [
    "def fibonacci(n):",
    "The quick brown fox",
    "import numpy as np\nx = np.",
    "Once upon a time, in a land far away,",
]
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
]
LENGTHS = [8, 16, 32, 64]
MALFORMED = [
    {"prompt": "x", "temperature": 9},
    {"prompt": "x", "frobnicate": True},
    {"max_tokens": 4},
    {"prompt": "x", "max_tokens": 0},
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(base: str, tries: int = 1200) -> None:
    """Poll ``base``/health every 0.1 s until it answers 200 (RuntimeError after ``tries`` polls)."""

    def healthy() -> bool:
        try:
            return httpx.get(f"{base}/health", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    for _ in range(tries):
        if healthy():
            return
        time.sleep(0.1)
    raise RuntimeError("server did not come up")


def rss_anon_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    raise RuntimeError("no RssAnon")


def slope(xs: list[float], ys: list[float]) -> float:
    n = len(xs)
    if n < 2:
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, round(q * (len(v) - 1)))]


def plan(n: int, seed: int) -> list[dict[str, Any]]:
    """The request mix: kind, endpoint, body, and the key of its solo reference."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        if i % 12 == 11:
            out.append({"kind": "malformed", "path": "/v1/completions", "body": MALFORMED[i % len(MALFORMED)]})
            continue
        stream = rng.random() < 0.45
        n_tok = rng.choice(LENGTHS)
        if rng.random() < 0.6:
            j = rng.randrange(len(PROMPTS))
            body = {"prompt": PROMPTS[j], "max_tokens": n_tok, "temperature": 0}
            path, ref = "/v1/completions", ("p", j, n_tok)
        else:
            j = rng.randrange(len(CHATS))
            body = {"messages": CHATS[j], "max_tokens": n_tok, "temperature": 0}
            path, ref = "/v1/chat/completions", ("c", j, n_tok)
        kind = "stream" if stream else "plain"
        if stream and i % 10 == 0:
            kind = "cancel"
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        out.append({"kind": kind, "path": path, "body": body, "ref": ref})
    return out


async def one(client: httpx.AsyncClient, req: dict[str, Any]) -> dict[str, Any]:
    t0 = time.perf_counter()
    rec: dict[str, Any] = {"kind": req["kind"], "ref": req.get("ref")}
    if not req["body"].get("stream"):
        r = await client.post(req["path"], json=req["body"])
        rec["status"] = r.status_code
        rec["latency_s"] = time.perf_counter() - t0
        if r.status_code == 200:
            b = r.json()
            c = b["choices"][0]
            rec["text"] = c.get("text", c.get("message", {}).get("content"))
            rec["tokens"] = b["usage"]["completion_tokens"]
        return rec
    text, ttft, tokens = "", None, None
    async with client.stream("POST", req["path"], json=req["body"]) as r:
        rec["status"] = r.status_code
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if "error" in ev:
                rec["error"] = ev["error"]
                continue
            if ev.get("usage"):
                tokens = ev["usage"]["completion_tokens"]
            for c in ev.get("choices", []):
                piece = c.get("text", c.get("delta", {}).get("content")) or ""
                if piece and ttft is None:
                    ttft = time.perf_counter() - t0
                text += piece
            if req["kind"] == "cancel" and ttft is not None:
                rec["cancelled"] = True
                break  # leave mid-stream: the server must free the decoder
    rec["latency_s"] = time.perf_counter() - t0
    rec["ttft_s"] = ttft
    if not rec.get("cancelled"):
        rec["text"], rec["tokens"] = text, tokens
    return rec


async def load(base: str, reqs: list[dict[str, Any]], clients: int, pid: int) -> tuple[list, list, float]:
    sem = asyncio.Semaphore(clients)
    samples: list[tuple[float, int]] = []
    done = asyncio.Event()

    async def sampler() -> None:
        t0 = time.perf_counter()
        while not done.is_set():
            samples.append((time.perf_counter() - t0, rss_anon_kib(pid)))
            await asyncio.sleep(0.5)

    async def guarded(client: httpx.AsyncClient, req: dict[str, Any]) -> dict[str, Any]:
        async with sem:
            return await one(client, req)

    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(base_url=base, timeout=900, limits=limits) as client:
        task = asyncio.create_task(sampler())
        t0 = time.perf_counter()
        results = await asyncio.gather(*(guarded(client, r) for r in reqs))
        wall = time.perf_counter() - t0
        done.set()
        await task
    return results, samples, wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default=None, help="default: SmolLM2-135M-Instruct fp32")
    ap.add_argument("--draft", default=None, help="default: its 6-layer truncated draft")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("-k", default="4", help="server K (default 4)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    ap.add_argument(
        "--max-batch", type=int, default=1, help="server --max-batch (> 1: batched rounds on the batched layout)"
    )
    ap.add_argument("--max-seq-len", type=int, default=4096, help="server --max-seq-len (per row when batching)")
    a = ap.parse_args()
    att = "batched" if a.max_batch > 1 else "gqa"
    name = "smollm2-135m-instruct"
    target = Path(a.target) if a.target else models.pull(name, progress=False, attention=att)
    draft = Path(a.draft) if a.draft else models.truncated(name, 6, progress=False, attention=att)
    # Solo references always come from the single-stream (GQA) decoder.
    ref_target = Path(a.target) if a.target else models.pull(name, progress=False)
    ref_draft = Path(a.draft) if a.draft else models.truncated(name, 6, progress=False)
    reqs = plan(a.requests, a.seed)

    # Solo references, one per (prompt, length), on a local Decoder with the server's settings.
    dec = specrt.Decoder(ref_target, ref_draft, max_seq_len=4096)
    k: int | str = a.k if a.k == "auto" else int(a.k)
    refs: dict[tuple, str] = {}
    for r in reqs:
        key = r.get("ref")
        if key is None or key in refs:
            continue
        kind, j, n_tok = key
        src = {"prompt": PROMPTS[j]} if kind == "p" else {"messages": CHATS[j]}
        refs[key] = dec.generate(**src, max_new_tokens=n_tok, temperature=0, num_speculative_tokens=k).text
    del dec

    port = _free_port()
    cmd = [sys.executable, "-m", "specrt.cli", "serve", "--target", str(target), "--draft", str(draft)]
    cmd += ["--port", str(port), "-k", str(a.k), "--log-level", "warning", "--model-name", "smollm2"]
    cmd += ["--max-batch", str(a.max_batch), "--max-seq-len", str(a.max_seq_len)]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "python")}
    server = subprocess.Popen(cmd, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base)
        results, samples, wall = asyncio.run(load(base, reqs, a.clients, server.pid))
        metrics = httpx.get(f"{base}/metrics").text
    finally:
        server.terminate()
        server.wait(60)

    fives = [r for r in results if r["status"] >= 500]
    malformed = [r for r in results if r["kind"] == "malformed"]
    completed = [r for r in results if r.get("text") is not None and r["status"] == 200 and "error" not in r]
    mismatches = [r for r in completed if r["text"] != refs[r["ref"]]]
    cancelled = [r for r in results if r.get("cancelled")]
    lat = [r["latency_s"] for r in completed]
    ttft = [r["ttft_s"] for r in results if r.get("ttft_s") is not None]
    tokens = sum(r["tokens"] or 0 for r in completed)
    warm = [s for s in samples if s[0] >= samples[-1][0] / 4] if samples else []
    growth = slope([s[0] for s in warm], [s[1] for s in warm])
    report = {
        "command": "python benches/bench_serve.py " + " ".join(sys.argv[1:]),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
        "models": {"target": str(target), "draft": str(draft)},
        "max_batch": a.max_batch,
        "clients": a.clients,
        "requests": len(results),
        "wall_s": wall,
        "status_5xx": len(fives),
        "malformed_4xx": sum(400 <= r["status"] < 500 for r in malformed),
        "malformed": len(malformed),
        "completed": len(completed),
        "mismatches": len(mismatches),
        "cancelled": len(cancelled),
        "latency_s": {"p50": pct(lat, 0.5), "p99": pct(lat, 0.99)},
        "ttft_s": {"p50": pct(ttft, 0.5), "p99": pct(ttft, 0.99)},
        "completion_tokens": tokens,
        "aggregate_tokens_per_s": tokens / wall if wall else None,
        "rss_anon_kib": {"first": samples[0][1] if samples else None, "last": samples[-1][1] if samples else None},
        "rss_anon_slope_kib_per_s": growth,
        "cancelled_in_metrics": [line for line in metrics.splitlines() if 'outcome="cancelled"' in line],
        "mismatch_examples": [{"ref": r["ref"], "got": r["text"], "want": refs[r["ref"]]} for r in mismatches[:3]],
        "mean_latency_s": statistics.mean(lat) if lat else None,
    }
    print(json.dumps({k: v for k, v in report.items() if k != "mismatch_examples"}, indent=2))
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps({**report, "samples": samples}, indent=2) + "\n", encoding="utf-8")
    ok = not fives and not mismatches and report["malformed_4xx"] == len(malformed)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
