"""``specrt serve`` against ``llama-server`` under one load generator: 1 / 4 / 8 / 16 concurrent streams, with and
without a draft model.

    python benches/bench_serve_peers.py                                         # SmolLM2-135M, both servers
    python benches/bench_serve_peers.py --streams 1,4 --requests-per-stream 2 --max-tokens 32   # a small run
    python benches/bench_serve_peers.py --qwen-int4 --json benches/results/serve-peers-qwen.json  # the issue's pair

Each server runs in its own process on the loopback address, once without and once with a draft, each run with
``--slots`` slots (default: the most streams asked; ``specrt serve --max-batch N``, batched layout; ``llama-server
--parallel N`` with a context of ``N * --max-seq-len``). For each stream count S the same generator (httpx, asyncio)
runs S clients at once, each sending ``--requests-per-stream`` streamed chat completions one after the other: a fixed
list of questions, greedy, ``max_tokens`` tokens with EOS ignored (both servers accept vLLM's ``ignore_eos``), so
every request yields exactly ``--max-tokens`` tokens. Per server, draft and S it reports: aggregate output tokens/s
(all completion tokens of the successful requests over the level's wall time), time to the first content token
(TTFT) p50 / p99, inter-token latency (ITL: the gaps between successive content chunks of a stream, as vLLM's
serving benchmark counts them; a speculative server sends several tokens in one chunk) p50 / p99, the mean
per-stream decode rate (tokens after the first over the time after it), and the requests that failed.

Every setting runs ``--repeats`` times (default 3), interleaved: each repeat starts each server once per draft
setting, in an order rotated by one per repeat. The summary printed last (and ``summary`` in the JSON) gives each
figure's median with its min-max spread over the repeats, and per stream count and repeat specrt's best setting
against llama.cpp's best, with the fewest wins over the repeats: the figure a headline may quote.

Draft length: each server's own default unless ``-k`` sets one (specrt: auto K, chosen per batch from timings;
llama-server: ``--spec-draft-n-max`` 16 with its probability cut-off).

Models: specrt takes ONNX folders (``--specrt-target`` / ``--specrt-draft``, default SmolLM2-135M-Instruct fp32 and
its int4 copy, batched layout, from the specrt cache), llama-server GGUF files (``--gguf-target`` /
``--gguf-draft``, default SmolLM2-135M-Instruct Q4_1 for both). ``--qwen-int4`` selects the Qwen2.5-Coder pair in
one precision class: specrt int4 1.5B target + int4 0.5B draft (batched layout), llama-server Q4_K_M 1.5B + the
0.5B GGUF. The precisions differ otherwise (say so next to any figure), and a same-size draft only shows the draft
path's cost, not a speed-up. llama-server is the one ``benches/peers/setup_llama_cpp.sh`` builds from the llama.cpp
vendored in llama-cpp-python's sdist (``--llama-bin`` overrides the folder).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
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
from specrt.bench.peers import LLAMA_CPP_PYTHON_VERSION
from specrt.models import cache_dir

QUESTIONS = [
    "Explain what a hash map is.",
    "Write a Python function that reverses a string.",
    "What causes the seasons on Earth?",
    "Give three tips for writing clear emails.",
    "How does a bicycle stay upright?",
    "Describe the water cycle.",
    "What is the difference between a list and a tuple in Python?",
    "Summarise the plot of a detective story in three sentences.",
]


def specrt_cmd(a: argparse.Namespace, port: int, draft: bool, slots: int) -> list[str]:
    cmd = [sys.executable, "-m", "specrt.cli", "serve", "--target", str(a.specrt_target), "--port", str(port)]
    cmd += ["--max-batch", str(slots), "--max-seq-len", str(a.max_seq_len), "--log-level", "warning"]
    cmd += ["--model-name", "m", "--max-queue", str(max(64, slots))]
    if a.threads:
        cmd += ["--threads", str(a.threads)]
    if draft:
        cmd += ["--draft", str(a.specrt_draft), "-k", str(a.k or "auto")]
    return cmd


def llama_cmd(a: argparse.Namespace, port: int, draft: bool, slots: int) -> list[str]:
    cmd = [str(Path(a.llama_bin) / "llama-server"), "-m", str(a.gguf_target), "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--parallel", str(slots), "-c", str(slots * a.max_seq_len), "--no-webui"]
    if a.threads:
        cmd += ["-t", str(a.threads)]
    if draft:
        cmd += ["-md", str(a.gguf_draft), "--spec-type", "draft-simple"]
        if a.k:
            cmd += ["--spec-draft-n-max", str(a.k)]
    return cmd


async def one(client: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    """One streamed chat completion: time to the first content chunk, the gaps between content chunks, end time;
    ``error`` (and no timings) when the request failed. A connection the server closed before answering (httpx's
    ``RemoteProtocolError`` / ``ConnectError`` before any byte: a kept-alive connection the server dropped) is
    retried once on a new connection, as the openai SDK retries it; ``retried`` says so and the time counts from
    the first try."""
    t0 = time.perf_counter()
    for attempt in (0, 1):
        times: list[float] = []
        spec: dict[str, Any] | None = None
        got_bytes = False
        try:
            async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
                got_bytes = True
                if resp.status_code != 200:
                    return {"error": f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"}
                async for line in resp.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    event = json.loads(line[len("data: ") :])
                    if "error" in event:
                        return {"error": str(event["error"])[:200]}
                    spec = event.get("speculative") or spec  # specrt's usage chunk: the request's trace
                    if any((c.get("delta") or {}).get("content") for c in event.get("choices", [])):
                        times.append(time.perf_counter() - t0)
        except (httpx.RemoteProtocolError, httpx.ConnectError) as e:
            if attempt == 0 and not got_bytes:
                continue
            return {"error": f"{type(e).__name__}: {e}"}
        except httpx.HTTPError as e:
            return {"error": f"{type(e).__name__}: {e}"}
        break
    if not times:
        return {"error": "no content came back"}
    return {
        "ttft_s": times[0],
        "itl_s": [b - a for a, b in itertools.pairwise(times)],
        "latency_s": times[-1],
        "retried": attempt,
        "speculative": spec,
    }


def _pct(xs: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``xs``, linear interpolation (numpy's default); NaN when empty."""
    if not xs:
        return float("nan")
    xs = sorted(xs)
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


async def level(base: str, streams: int, a: argparse.Namespace) -> dict[str, Any]:
    """``streams`` clients at once, each sending ``--requests-per-stream`` requests in turn."""

    async def client_loop(c: httpx.AsyncClient, s: int) -> list[dict[str, Any]]:
        out = []
        for r in range(a.requests_per_stream):
            q = QUESTIONS[(s * a.requests_per_stream + r) % len(QUESTIONS)]
            body = {
                "model": "m",
                "messages": [{"role": "user", "content": q}],
                "max_tokens": a.max_tokens,
                "temperature": 0,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            out.append(await one(c, body))
        return out

    async with httpx.AsyncClient(base_url=base, timeout=3600) as c:
        t0 = time.perf_counter()
        per_client = await asyncio.gather(*(client_loop(c, s) for s in range(streams)))
        wall = time.perf_counter() - t0
    res = [r for rs in per_client for r in rs]
    ok = [r for r in res if "error" not in r]
    n = a.max_tokens
    ttft = [1000 * r["ttft_s"] for r in ok]
    itl = [1000 * g for r in ok for g in r["itl_s"]]
    return {
        "streams": streams,
        "requests": len(res),
        "errors": len(res) - len(ok),
        "error_samples": sorted({r["error"] for r in res if "error" in r})[:3],
        "retried": sum(r.get("retried", 0) for r in ok),
        "wall_s": wall,
        "tokens_per_s": len(ok) * n / wall,
        "mean_ttft_ms": statistics.mean(ttft) if ttft else float("nan"),
        "median_ttft_ms": _pct(ttft, 0.5),
        "p99_ttft_ms": _pct(ttft, 0.99),
        "p50_itl_ms": _pct(itl, 0.5),
        "p99_itl_ms": _pct(itl, 0.99),
        "stream_decode_tokens_per_s": statistics.mean((n - 1) / (r["latency_s"] - r["ttft_s"]) for r in ok)
        if ok
        else float("nan"),
        "trace": trace([r["speculative"] for r in ok if r.get("speculative")]),
    }


def trace(specs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """specrt's per-request ``speculative`` fields of one level, summed: the rounds auto K ran at each K, the
    acceptance, tokens per round, and the time split (ms summed over requests; in a batch a batched pass counts for
    each row it served). None for a server that sends no such field (llama-server)."""
    if not specs:
        return None
    by_k = [0] * max(len(s.get("rounds_by_k", [])) for s in specs)
    for s in specs:
        for k, n in enumerate(s.get("rounds_by_k", [])):
            by_k[k] += n
    tot = {k: sum(s.get(k) or 0 for s in specs) for k in ("n_rounds", "n_drafted", "n_accepted", "n_recovered")}
    tot |= {k: sum(s.get(k) or 0 for s in specs) for k in ("n_bonus", "prefill_ms", "draft_ms", "target_ms")}
    emitted = tot["n_accepted"] + tot["n_recovered"] + tot["n_bonus"]
    return {
        "rounds_by_k": by_k,
        **tot,
        "acceptance_rate": tot["n_accepted"] / tot["n_drafted"] if tot["n_drafted"] else None,
        "mean_tokens_per_round": emitted / tot["n_rounds"] if tot["n_rounds"] else None,
        "target_ms_per_round": tot["target_ms"] / tot["n_rounds"] if tot["n_rounds"] else None,
        "draft_ms_per_drafted_token": tot["draft_ms"] / tot["n_drafted"] if tot["n_drafted"] else None,
    }


def run_server(cmd: list[str], a: argparse.Namespace, port: int) -> list[dict[str, Any]]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "python")}
    server = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, tries=6000)
        asyncio.run(level(base, 1, argparse.Namespace(**{**vars(a), "requests_per_stream": 1})))  # warm-up
        return [asyncio.run(level(base, s, a)) for s in a.streams]
    finally:
        server.terminate()
        server.wait(60)


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per server, draft and stream count: the median and min-max of tokens/s and of TTFT p50 over the repeats; per
    stream count and repeat, each server's best setting (by tokens/s) and specrt's best over llama.cpp's best, with
    the fewest wins of either over the repeats (a headline holds only if it holds in every repeat)."""
    by_cfg: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for r in runs:
        by_cfg.setdefault((r["server"], r["draft"], r["streams"]), []).append(r)
    cells = []
    for (server, draft, streams), rs in sorted(by_cfg.items()):
        tps = [r["tokens_per_s"] for r in rs]
        ttft = [r["median_ttft_ms"] for r in rs]
        cells.append(
            {
                "server": server,
                "draft": draft,
                "streams": streams,
                "repeats": len(rs),
                "tokens_per_s": {"median": statistics.median(tps), "min": min(tps), "max": max(tps)},
                "ttft_p50_ms": {"median": statistics.median(ttft), "min": min(ttft), "max": max(ttft)},
                "errors": sum(r["errors"] for r in rs),
            }
        )
    ratios = []
    for streams in sorted({r["streams"] for r in runs}):
        for rep in sorted({r.get("repeat", 0) for r in runs}):
            best: dict[str, dict[str, Any]] = {}
            for r in runs:
                here = r["streams"] == streams and r.get("repeat", 0) == rep
                if here and (r["server"] not in best or r["tokens_per_s"] > best[r["server"]]["tokens_per_s"]):
                    best[r["server"]] = r
            if {"specrt", "llama.cpp"} <= best.keys():
                s, ll = best["specrt"], best["llama.cpp"]
                ratios.append(
                    {
                        "streams": streams,
                        "repeat": rep,
                        "specrt_best": s["draft"],
                        "llama_best": ll["draft"],
                        "tokens_per_s_ratio": s["tokens_per_s"] / ll["tokens_per_s"],
                        "ttft_p50_ratio": s["median_ttft_ms"] / ll["median_ttft_ms"],
                    }
                )
    return {"cells": cells, "best_vs_best": ratios}


def trace_text(t: dict[str, Any] | None) -> str:
    """A level's trace on one line: K chosen per round, acceptance, per-round target ms, per-token draft ms."""
    if not t or not t["n_rounds"]:
        return ""
    ks = " ".join(f"{k}:{n}" for k, n in enumerate(t["rounds_by_k"]) if n)
    acc = "-" if t["acceptance_rate"] is None else f"{t['acceptance_rate']:.2f}"
    dft = "-" if t["draft_ms_per_drafted_token"] is None else f"{t['draft_ms_per_drafted_token']:.1f}"
    return (
        f"  [rounds by K {ks}; acceptance {acc}; {t['mean_tokens_per_round']:.2f} tokens/round; "
        f"target {t['target_ms_per_round']:.1f} ms/round; draft {dft} ms/token; prefill {t['prefill_ms']:.0f} ms]"
    )


def render_summary(summary: dict[str, Any]) -> str:
    """The summary as text: medians with their [min-max] spread, then specrt's best over llama.cpp's per repeat."""
    lines = [
        "",
        "summary over repeats: median [min-max]",
        "server     draft  streams  n  tokens/s                TTFT p50 ms",
    ]
    for c in summary["cells"]:
        t, f = c["tokens_per_s"], c["ttft_p50_ms"]
        lines.append(
            f"{c['server']:<10} {c['draft']:<5}  {c['streams']:>7}  {c['repeats']}  "
            f"{t['median']:>7.1f} [{t['min']:.1f}-{t['max']:.1f}]  {f['median']:>6.0f} [{f['min']:.0f}-{f['max']:.0f}]"
        )
    by_streams: dict[int, list[dict[str, Any]]] = {}
    for r in summary["best_vs_best"]:
        by_streams.setdefault(r["streams"], []).append(r)
    if by_streams:
        lines.append("specrt best / llama.cpp best, per repeat: tokens/s ratio (TTFT p50 ratio; below 1 is faster)")
        for streams, rs in sorted(by_streams.items()):
            cells = ", ".join(f"{r['tokens_per_s_ratio']:.2f} ({r['ttft_p50_ratio']:.2f})" for r in rs)
            lines.append(f"  {streams} streams: {cells}; fewest: {min(r['tokens_per_s_ratio'] for r in rs):.2f}")
    return "\n".join(lines)


def main() -> None:
    models = cache_dir() / "models" / "smollm2-135m-instruct"
    smol_gguf = cache_dir() / "gguf" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--specrt-target", type=Path, default=models / "fp32-B")
    ap.add_argument("--specrt-draft", type=Path, default=models / "int4-P-B")
    ap.add_argument("--gguf-target", type=Path, default=smol_gguf)
    ap.add_argument("--gguf-draft", type=Path, default=smol_gguf)
    qwen = cache_dir() / "models"
    ap.add_argument(
        "--qwen-int4",
        action="store_true",
        help="the Qwen2.5-Coder pair in int4 / Q4_K_M (overrides the four model options; folders must be pulled)",
    )
    ap.add_argument("--llama-bin", default=str(cache_dir() / "llama.cpp" / LLAMA_CPP_PYTHON_VERSION / "build" / "bin"))
    ap.add_argument("--servers", default="specrt,llama.cpp", help="comma-separated: specrt, llama.cpp")
    ap.add_argument("--drafts", default="off,on", help="comma-separated: off (target only), on (with the draft)")
    ap.add_argument("--streams", default="1,4,8,16", type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--requests-per-stream", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--max-seq-len", type=int, default=512, help="per slot, both servers")
    ap.add_argument("--slots", type=int, default=None, help="--max-batch, --parallel (default: most streams)")
    ap.add_argument(
        "-k",
        type=int,
        default=None,
        help="draft tokens per round (specrt -k, llama --spec-draft-n-max); default: each server's own (auto / 16)",
    )
    ap.add_argument("--threads", type=int, default=None, help="both servers' threads (default: theirs)")
    ap.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="runs of every server and draft setting, interleaved (each repeat runs them all once, in a rotated "
        "order); the summary gives each figure's median and its min-max spread",
    )
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    if a.qwen_int4:
        a.specrt_target = qwen / "qwen2.5-coder-1.5b-instruct" / "int4-B"
        a.specrt_draft = qwen / "qwen2.5-coder-0.5b-instruct" / "int4-P-B"
        a.gguf_target = cache_dir() / "gguf" / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
        a.gguf_draft = cache_dir() / "gguf" / "qwen2.5-coder-0.5b-instruct.gguf"
    slots = a.slots or max(a.streams)
    report: dict[str, Any] = {
        "command": "python benches/bench_serve_peers.py " + " ".join(sys.argv[1:]),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
        "args": {k: str(v) for k, v in vars(a).items()},
        "runs": [],
    }
    print(
        "server     draft  streams  tokens/s  TTFT p50 ms  TTFT p99 ms  ITL p50 ms  ITL p99 ms  stream tok/s  errors"
        "  retried"
    )
    configs = [(server, draft) for server in a.servers.split(",") for draft in a.drafts.split(",")]
    for rep in range(a.repeats):
        # Interleaved and rotated: a slow spell of the machine falls on different settings in different repeats.
        shift = rep % len(configs)
        for server, draft in configs[shift:] + configs[:shift]:
            port = _free_port()
            build = specrt_cmd if server == "specrt" else llama_cmd
            cmd = build(a, port, draft == "on", slots)
            for row in run_server(cmd, a, port):
                report["runs"].append(
                    {"server": server, "draft": draft, "repeat": rep, "command": " ".join(cmd), **row}
                )
                print(
                    f"{server:<10} {draft:<5}  {row['streams']:>7}  {row['tokens_per_s']:>8.1f}  "
                    f"{row['median_ttft_ms']:>11.0f}  {row['p99_ttft_ms']:>11.0f}  {row['p50_itl_ms']:>10.1f}  "
                    f"{row['p99_itl_ms']:>10.1f}  {row['stream_decode_tokens_per_s']:>12.1f}  {row['errors']:>6}  "
                    f"{row['retried']:>7}  (repeat {rep + 1}){trace_text(row['trace'])}",
                    flush=True,
                )
    report["summary"] = summarize(report["runs"])
    print(render_summary(report["summary"]))
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
