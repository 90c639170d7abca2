"""Mean time to first token of requests sharing a long system prompt on ``specrt serve``, prefix caching on and off
(issue 31: 16 requests sharing a 400-token system prompt on ``--max-batch 4``: mean TTFT at least 3x lower).

    python benches/bench_prefix_serve.py                               # SmolLM2-135M fp32-B, target only
    python benches/bench_prefix_serve.py --draft ~/.cache/specrt/models/smollm2-135m-instruct/int4-P-B -k 4
    python benches/bench_prefix_serve.py --modes on,off,on:256 --json benches/results/prefix-serve.json

For each mode it starts ``specrt serve --max-batch 4`` in its own process on the loopback address (``on``: defaults;
``off``: ``--no-prefix-caching``; ``on:N`` / ``off:N``: also ``--max-prefill-tokens N``), sends one warm-up request
whose system prompt differs from the first token on, then ``--requests`` streamed chat requests at once (httpx,
asyncio), each with the same ~``--system-tokens``-token system prompt and its own short question, greedy,
``--max-tokens`` tokens, EOS ignored. TTFT is the wall time from sending a request to its first server-sent event
(the server sends it after the request's first round). Reports per mode: mean TTFT (the median over ``--repeats``
interleaved runs of each run's mean), median TTFT, mean latency, the mean
``usage.prompt_tokens_details.cached_tokens``, and whether every run gave the same texts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx

from bench_serve import _free_port, wait_healthy  # the load test's helpers: one definition
from specrt import _specrt, models

SENTENCES = (
    "You are the support assistant of a small company that sells garden tools online. ",
    "Answer politely and briefly, in plain English, and never invent prices, stock levels or delivery dates. ",
    "If a customer asks about an order, ask for the order number first, then look it up in the order system. ",
    "Returns are accepted within thirty days when the tool is unused and in its original box. ",
    "Refunds go back to the original payment method within five working days of the return arriving. ",
    "Warranty claims need a photo of the fault and the receipt; the warranty is two years for every tool. ",
    "Do not discuss competitors, politics or anything unrelated to gardening and the company's products. ",
)
QUESTIONS = [
    "How do I return a rake?",
    "Is the hedge trimmer in stock?",
    "My spade broke after a month. What now?",
    "When will my refund arrive?",
    "Do you ship to Norway?",
    "Can I change my delivery address?",
    "What is the warranty on a lawn mower?",
    "Which gloves do you recommend for roses?",
]


def system_prompt(tokenizer: Any, n_tokens: int) -> str:
    """Sentences from ``SENTENCES``, cycled, until the text is at least ``n_tokens`` tokens long."""
    text, i = "", 0
    while len(tokenizer.encode(text, add_special_tokens=False).ids) < n_tokens:
        text += SENTENCES[i % len(SENTENCES)]
        i += 1
    return text


async def one(client: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    t0 = time.perf_counter()
    ttft = None
    text = []
    usage = None
    async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if not line.startswith("data: "):
                continue
            if ttft is None:
                ttft = time.perf_counter() - t0
            data = line[len("data: ") :]
            if data == "[DONE]":
                break
            event = json.loads(data)
            if event.get("usage"):
                usage = event["usage"]
            text.extend(c["delta"].get("content") or "" for c in event["choices"])
    assert ttft is not None and usage is not None
    return {
        "ttft_s": ttft,
        "latency_s": time.perf_counter() - t0,
        "text": "".join(text),
        "prompt_tokens": usage["prompt_tokens"],
        "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"],
    }


async def wave(base: str, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(base_url=base, timeout=3600) as client:
        return await asyncio.gather(*(one(client, b) for b in bodies))


def serve(a: argparse.Namespace, mode: str, bodies: list[dict[str, Any]], warm: dict[str, Any]) -> list[dict]:
    """Start the server in ``mode``, send the warm-up request, then all ``bodies`` at once; the server then stops."""
    cache, _, budget = mode.partition(":")
    port = _free_port()
    cmd = [sys.executable, "-m", "specrt.cli", "serve", "--target", str(a.target), "--port", str(port)]
    if a.draft:
        cmd += ["--draft", str(a.draft), "-k", str(a.k)]
    cmd += ["--max-batch", str(a.max_batch), "--max-seq-len", str(a.max_seq_len), "--log-level", "warning"]
    cmd += ["--model-name", "m", "--max-queue", str(max(64, a.requests))]
    if a.threads:
        cmd += ["--threads", str(a.threads)]
    if cache == "off":
        cmd.append("--no-prefix-caching")
    if budget:
        cmd += ["--max-prefill-tokens", budget]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "python")}
    server = subprocess.Popen(cmd, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, tries=3000)
        asyncio.run(wave(base, [warm]))
        return asyncio.run(wave(base, bodies))
    finally:
        server.terminate()
        server.wait(60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=None, help="default: SmolLM2-135M-Instruct fp32, batched layout")
    ap.add_argument("--draft", default=None)
    ap.add_argument("-k", default="4", help="server -k with a draft")
    ap.add_argument("--modes", default="on,off", help="comma-separated: on, off, on:N, off:N (N: --max-prefill-tokens)")
    ap.add_argument("--max-batch", type=int, default=4)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--system-tokens", type=int, default=400)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--max-seq-len", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=1, help="runs per mode, interleaved (reported: the median mean)")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    if a.target is None:
        a.target = models.pull("smollm2-135m-instruct", progress=False, attention="batched")
    tokenizer = _specrt.Tokenizer.from_file(Path(a.target) / "tokenizer.json")
    system = system_prompt(tokenizer, a.system_tokens)
    common = {"temperature": 0, "max_tokens": a.max_tokens, "ignore_eos": True, "stream": True}
    common["stream_options"] = {"include_usage": True}
    bodies = [
        {
            **common,
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": f"{QUESTIONS[i % len(QUESTIONS)]} (customer {i})"},
            ],
        }
        for i in range(a.requests)
    ]
    warm = {
        **common,
        "messages": [{"role": "system", "content": "Warm-up request. " + system}, *bodies[0]["messages"][1:]],
    }

    report: dict[str, Any] = {
        "command": "python benches/bench_prefix_serve.py " + " ".join(sys.argv[1:]),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
        "target": str(a.target),
        "draft": str(a.draft) if a.draft else None,
        "modes": {},
    }
    texts: dict[str, list[str]] = {}
    print(f"{a.requests} requests at once, max_batch {a.max_batch}, system prompt ~{a.system_tokens} tokens")
    print("mode        mean TTFT ms  median TTFT ms  mean latency ms  mean cached  prompt tokens")
    modes = a.modes.split(",")
    runs: dict[str, list[list[dict[str, Any]]]] = {m: [] for m in modes}
    for _ in range(a.repeats):  # modes interleaved, so a change of the machine's load hits them alike
        for mode in modes:
            runs[mode].append(serve(a, mode, bodies, warm))
    for mode in modes:
        texts[mode] = [r["text"] for r in runs[mode][0]]
        means = [1000 * statistics.mean(r["ttft_s"] for r in res) for res in runs[mode]]
        res = [r for rs in runs[mode] for r in rs]
        row = {
            "mean_ttft_ms": statistics.median(means),
            "mean_ttft_ms_per_repeat": means,
            "median_ttft_ms": 1000 * statistics.median(r["ttft_s"] for r in res),
            "mean_latency_ms": 1000 * statistics.mean(r["latency_s"] for r in res),
            "mean_cached_tokens": statistics.mean(r["cached_tokens"] for r in res),
            "mean_prompt_tokens": statistics.mean(r["prompt_tokens"] for r in res),
            "ttft_ms": [[1000 * r["ttft_s"] for r in rs] for rs in runs[mode]],
        }
        report["modes"][mode] = row
        print(
            f"{mode:<10}  {row['mean_ttft_ms']:>12.0f}  {row['median_ttft_ms']:>14.0f}  {row['mean_latency_ms']:>15.0f}"
            f"  {row['mean_cached_tokens']:>11.1f}  {row['mean_prompt_tokens']:>13.1f}"
        )
    report["same_texts"] = all(
        r["text"] == t for m in modes for rs in runs[m] for r, t in zip(rs, texts[modes[0]], strict=True)
    )
    print(f"same texts in every run: {report['same_texts']}")
    if "on" in report["modes"] and "off" in report["modes"]:
        ratio = report["modes"]["off"]["mean_ttft_ms"] / report["modes"]["on"]["mean_ttft_ms"]
        report["mean_ttft_off_over_on"] = ratio
        print(f"mean TTFT off / on: {ratio:.1f}x")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
