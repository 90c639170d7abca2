"""Third-party clients against ``specrt serve``: guidellm (load) and lm-eval (accuracy), each from its own venv.

    bash benches/clients/setup_venv.sh guidellm      # once: <specrt cache>/bench/venv-guidellm (brings torch)
    bash benches/clients/setup_venv.sh lmeval        # once: <specrt cache>/bench/venv-lmeval
    .venv/bin/python benches/clients/run_clients.py                  # everything below, SmolLM2-135M fp32
    .venv/bin/python benches/clients/run_clients.py --only lmeval    # lm-eval and the multiple-choice check only

Starts ``specrt serve --target T --port P [--max-batch B]`` on 127.0.0.1 (a free port), waits for ``/health``, runs
the clients, stops the server (SIGINT), once per server setting:

- **guidellm** (``guidellm run``, its default backend ``openai_http``, which sends chat completions, streamed):
  first a probe through the recording proxy below (2 requests of 16 tokens, also a warm-up), then
  ``--profile kind=concurrent`` with one sub-benchmark per level of ``--streams`` (default 1, 4, 16; ``--override
  profile.streams``) against ``--max-batch`` (default 4), synthetic prompts (``--prompt-tokens`` /
  ``--output-tokens``; guidellm sends ``ignore_eos``), ``--requests`` per level (``max_requests``, default
  max(16, 4 x streams)) and ``--max-seconds`` per level (``max_duration``); then target-only single-stream (streams 1
  on ``--max-batch 1``) unless ``--no-single``. Its tokenizer (``--tokenizer kind=huggingface_auto,model=DIR``) is the
  converted folder, or where that has no ``tokenizer_config.json`` (folders converted before specrt wrote one), a
  folder made here from its ``tokenizer.json`` and the server's ``/tokenizer_info``. Recorded per level: errors,
  requests/s, TTFT and ITL (mean, median, p95, p99) of the successful requests, output tokens/s.
- **lm-eval** (``lm-eval run``, default settings otherwise) on the two local tasks in ``tasks/`` (``specrt_capitals``:
  generate_until, exact match; ``specrt_facts_mc``: multiple_choice, acc / acc_norm): ``local-completions`` twice,
  with its default tokenizer backend (``auto``, which picks the server's ``/tokenize``) and with
  ``tokenizer=DIR,tokenizer_backend=huggingface``; ``local-chat-completions --apply_chat_template`` on the generation
  task only (chat completions cannot score a continuation). Once per ``--lmeval-max-batch`` (default 1). Its requests
  go through a recording proxy on another loopback port, so every request body and response is kept
  (``<name>-http.jsonl``); a refusal (any status >= 400) is reported with both.
- **The multiple-choice check**: for every question and choice of ``specrt_facts_mc``, the context and continuation
  lm-eval logged are encoded as lm-eval's ``TemplateLM._encode_pair`` does (trailing spaces of the context moved to the
  continuation; the whole string encoded, the context encoded, the continuation = the whole's tokens past the
  context's; no special tokens, as both of its tokenizer backends encode), the target (the ``fp32`` folder, one
  ``OrtModel.forward`` over context + continuation minus its last token) gives every position's logits, and the sum of
  the continuation tokens' log-softmax values is its log-likelihood. The argmax per question (ties: the first, as
  numpy's argmax in lm-eval) gives acc (and acc_norm: log-likelihood / the choice's characters, lm-eval's
  definition), compared per sample with lm-eval's logged log-likelihoods and its reported accuracies. It also checks
  that the token ids lm-eval sent (recorded by the proxy) are the ones encoded here.

Writes ``--out-dir`` (default ``benches/out/clients-<time>``): ``summary.json`` (commands, versions, every figure),
``summary.md`` (the tables), the tools' logs and outputs, the server logs. Waiting for a quiet machine is the
caller's business (run it when nothing else is timing).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import http.client
import json
import os
import platform
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
TASKS_DIR = Path(__file__).resolve().parent / "tasks"
GEN_TASK = "specrt_capitals"
MC_TASK = "specrt_facts_mc"
# Offline: tokenizers and data are local files; nothing may reach a model hub.
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
# Headers a proxy must not pass on (RFC 9110 hop-by-hop, plus the lengths it recomputes).
HOP_HEADERS = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "content-length",
    "host",
}
BODY_LIMIT_BYTES = 1 << 20


def specrt_cache() -> Path:
    """``$SPECRT_CACHE_DIR``, else ``~/.cache/specrt`` (as for models)."""
    env = os.environ.get("SPECRT_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "specrt"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_json(url: str, body: dict[str, Any] | None = None, timeout: float = 30.0) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def log(msg: str) -> None:
    print(f"[run_clients {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ----- the server ------------------------------------------------------------------------------------------------
class Server:
    """``specrt serve`` in its own process group on 127.0.0.1; stopped with SIGINT (then SIGKILL after 60 s)."""

    def __init__(self, target: str, max_batch: int, out_dir: Path, threads: int | None, max_seq_len: int | None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.argv = [str(Path(sys.executable).parent / "specrt"), "serve", "--target", target, "--port", str(self.port)]
        if max_batch > 1:
            self.argv += ["--max-batch", str(max_batch)]
        if threads:
            self.argv += ["--threads", str(threads)]
        if max_seq_len:
            self.argv += ["--max-seq-len", str(max_seq_len)]
        self.log_path = out_dir / f"server-b{max_batch}-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.model_id = ""

    def __enter__(self) -> Server:
        log(f"server: {shlex.join(self.argv)} (log {self.log_path})")
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(self.argv, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"specrt serve exited with {self.proc.returncode}; see {self.log_path}")
            with contextlib.suppress(OSError, ValueError):
                if http_json(self.url + "/health", timeout=2) is not None:
                    break
            time.sleep(0.5)
        else:
            raise RuntimeError(f"specrt serve did not answer /health within 600 s; see {self.log_path}")
        self.model_id = http_json(self.url + "/v1/models")["data"][0]["id"]
        log(f"server up: {self.url}, model {self.model_id!r}")
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()

    def statuses(self) -> dict[str, int]:
        """Counts of ``"METHOD path status"`` from uvicorn's access log (every request the server answered)."""
        pattern = re.compile(r'"(GET|POST|PUT|DELETE|HEAD|OPTIONS|PATCH) (\S+) HTTP/[\d.]+" (\d{3})')
        text = self.log_path.read_text(encoding="utf-8", errors="replace")
        return dict(Counter(f"{m[1]} {m[2]} {m[3]}" for m in pattern.finditer(text)))


# ----- a recording proxy (lm-eval's requests) --------------------------------------------------------------------
class RecordingProxy:
    """A loopback HTTP proxy in front of the server that keeps every request body and response.

    Bodies are kept up to ``BODY_LIMIT_BYTES``; responses without a Content-Length (server-sent events) are relayed
    chunk by chunk as they arrive. ``records``: dicts with method, path, status, request, response (text).
    """

    def __init__(self, upstream_port: int):
        self.upstream_port = upstream_port
        self.records: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:  # quiet: the records say it all
                pass

            def _relay(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_HEADERS}
                conn = http.client.HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=900)
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                streamed = resp.getheader("Content-Length") is None
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in HOP_HEADERS:
                        self.send_header(k, v)
                captured = bytearray()
                if streamed:
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    while chunk := resp.read1(65536):
                        if len(captured) < BODY_LIMIT_BYTES:
                            captured += chunk
                        self.wfile.write(f"{len(chunk):X}\r\n".encode() + chunk + b"\r\n")
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                else:
                    data = resp.read()
                    captured += data[:BODY_LIMIT_BYTES]
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                conn.close()
                with proxy._lock:
                    proxy.records.append(
                        {
                            "method": self.command,
                            "path": self.path,
                            "status": resp.status,
                            "request": body[:BODY_LIMIT_BYTES].decode("utf-8", "replace"),
                            "response": captured.decode("utf-8", "replace"),
                        }
                    )

            do_GET = do_POST = do_PUT = do_DELETE = _relay  # noqa: N815

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> RecordingProxy:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def dump(self, path: Path) -> dict[str, Any]:
        """Write the records (JSONL); return the status counts and every refusal (status >= 400) in full."""
        with path.open("w", encoding="utf-8") as f:
            for r in self.records:
                f.write(json.dumps(r) + "\n")
        counts = Counter(f"{r['method']} {r['path']} {r['status']}" for r in self.records)
        return {
            "log": str(path),
            "statuses": dict(counts),
            "refusals": [r for r in self.records if r["status"] >= 400],
        }


# ----- tokenizer folder -------------------------------------------------------------------------------------------
def processor_folder(model_folder: Path, server: Server, out_dir: Path) -> Path:
    """A folder ``transformers.AutoTokenizer`` loads: the model folder where it has ``tokenizer_config.json``, else
    ``out_dir/processor`` with its ``tokenizer.json`` and the server's ``/tokenizer_info`` as ``tokenizer_config.json``
    (what ``specrt convert`` writes today)."""
    if (model_folder / "tokenizer_config.json").is_file():
        return model_folder
    dest = out_dir / "processor"
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(model_folder / "tokenizer.json", dest / "tokenizer.json")
    info = http_json(server.url + "/tokenizer_info")
    (dest / "tokenizer_config.json").write_text(json.dumps(info, indent=1), encoding="utf-8")
    log(f"{model_folder} has no tokenizer_config.json: tokenizer folder {dest} (tokenizer.json + /tokenizer_info)")
    return dest


def run_logged(argv: list[str], log_path: Path, cwd: Path | None = None, env: dict[str, str] | None = None) -> float:
    """Run ``argv`` with output to ``log_path``; return the wall seconds; raise on a nonzero exit."""
    log(f"$ {shlex.join(argv)}  (cwd {cwd or Path.cwd()}, log {log_path}, load average {os.getloadavg()})")
    t0 = time.monotonic()
    with log_path.open("wb") as f:
        rc = subprocess.call(argv, stdout=f, stderr=subprocess.STDOUT, cwd=cwd, env={**os.environ, **(env or {})})
    wall = time.monotonic() - t0
    if rc != 0:
        tail = log_path.read_text(encoding="utf-8", errors="replace")[-3000:]
        raise RuntimeError(f"{argv[0]} exited with {rc} after {wall:.0f} s; {log_path} ends with:\n{tail}")
    return wall


def tool_versions(python: Path, packages: list[str]) -> dict[str, str]:
    code = (
        "import importlib.metadata as m, json, sys\n"
        "out = {}\n"
        "for p in sys.argv[1:]:\n"
        "    try: out[p] = m.version(p)\n"
        "    except m.PackageNotFoundError: pass\n"
        "print(json.dumps(out))"
    )
    return json.loads(subprocess.check_output([str(python), "-c", code, *packages]))


# ----- guidellm --------------------------------------------------------------------------------------------------
def _summary(dist: dict[str, Any] | None) -> dict[str, float | None]:
    """mean / median / p95 / p99 of a guidellm DistributionSummary (``successful`` part of a status summary)."""
    if not dist:
        return {"mean": None, "median": None, "p95": None, "p99": None}
    pct = dist.get("percentiles") or {}
    return {"mean": dist.get("mean"), "median": dist.get("median"), "p95": pct.get("p95"), "p99": pct.get("p99")}


def parse_guidellm(report_path: Path) -> list[dict[str, Any]]:
    """One row per benchmark (stream level) of a guidellm JSON report."""
    report = json.loads(report_path.read_text(encoding="utf-8"))
    rows = []
    for bench in report["benchmarks"]:
        m = bench["metrics"]
        totals = m["request_totals"]
        strategy = bench.get("config", {}).get("strategy", {})
        errored = [
            (r.get("info") or {}).get("error") or r.get("error")
            for r in (bench.get("requests") or {}).get("errored", [])
        ]
        rows.append(
            {
                "streams": strategy.get("streams"),
                "successful": totals["successful"],
                "incomplete": totals["incomplete"],
                "errored": totals["errored"],
                "error_messages": sorted({str(e) for e in errored if e})[:5],
                "duration_s": bench.get("duration"),
                "requests_per_s": m["requests_per_second"]["successful"]["mean"],
                "output_tokens_per_s": m["output_tokens_per_second"]["successful"]["mean"],
                "request_latency_s": _summary(m["request_latency"]["successful"]),
                "ttft_ms": _summary(m["time_to_first_token_ms"]["successful"]),
                "itl_ms": _summary(m["inter_token_latency_ms"]["successful"]),
                "tpot_ms": _summary(m["time_per_output_token_ms"]["successful"]),
                "prompt_tokens_mean": m["prompt_token_count"]["successful"]["mean"],
                "output_tokens_mean": m["output_token_count"]["successful"]["mean"],
            }
        )
    return rows


def run_guidellm(
    python: Path,
    server: Server,
    tokenizer_dir: Path,
    streams: list[int],
    requests: list[int],
    a: argparse.Namespace,
    name: str,
    output_tokens: int,
    proxy: RecordingProxy | None = None,
) -> dict[str, Any]:
    """One ``guidellm run`` (concurrent profile at ``streams``, ``requests[i]`` requests at level i) against the
    server, or through ``proxy`` (then every request and response is kept in ``<name>/http.jsonl``)."""
    out = a.out_dir / name
    out.mkdir(parents=True, exist_ok=True)
    target = proxy.url if proxy else server.url
    argv = [
        str(python.parent / "guidellm"),
        "run",
        "--backend",
        json.dumps({"kind": "openai_http", "target": target}),
        "--profile",
        json.dumps({"kind": "concurrent", "streams": streams[0]}),
        "--constraint",
        json.dumps({"kind": "max_requests", "count": requests[0]}),
        "--constraint",
        json.dumps({"kind": "max_duration", "seconds": a.max_seconds}),
        "--data",
        json.dumps({"kind": "synthetic_text", "prompt_tokens": a.prompt_tokens, "output_tokens": output_tokens}),
        "--tokenizer",
        json.dumps({"kind": "huggingface_auto", "model": str(tokenizer_dir)}),
        "--output",
        json.dumps({"kind": "json", "path": str(out / "benchmarks.json")}),
        "--output",
        json.dumps({"kind": "console"}),
        "--disable-console-interactive",
    ]
    if len(streams) > 1:  # one sub-benchmark per level (lists inside --profile / --constraint are deprecated in 0.8)
        argv += ["--override", "profile.streams", ",".join(map(str, streams))]
        argv += ["--override", "constraints[0].count", ",".join(map(str, requests))]
    before = server.statuses()
    try:
        wall = run_logged(argv, out / "guidellm.log", cwd=out, env=OFFLINE_ENV)
    finally:
        http_log = proxy.dump(out / "http.jsonl") if proxy else None
    after = server.statuses()
    run: dict[str, Any] = {
        "command": shlex.join(argv),
        "server_command": shlex.join(server.argv),
        "wall_s": round(wall, 1),
        "loadavg_after": os.getloadavg(),
        "rows": parse_guidellm(out / "benchmarks.json"),
        "server_statuses": {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)},
    }
    if http_log is not None:
        bodies = [json.loads(r["request"]) for r in proxy.records if r["method"] == "POST" and r["request"]]
        run["http"] = {
            **http_log,
            "request_fields": sorted({k for b in bodies for k in b}),
            "example_request": bodies[0] if bodies else None,
        }
    return run


# ----- lm-eval ---------------------------------------------------------------------------------------------------
def _newest(folder: Path, pattern: str) -> Path:
    found = sorted(folder.rglob(pattern), key=lambda p: p.stat().st_mtime)
    if not found:
        raise FileNotFoundError(f"no {pattern} under {folder}")
    return found[-1]


def run_lmeval(
    python: Path,
    server: Server,
    model_args: dict[str, str],
    model: str,
    tasks: list[str],
    name: str,
    a: argparse.Namespace,
) -> dict[str, Any]:
    out = a.out_dir / name
    out.mkdir(parents=True, exist_ok=True)
    with RecordingProxy(server.port) as proxy:
        endpoint = "/v1/chat/completions" if model == "local-chat-completions" else "/v1/completions"
        args = {"model": server.model_id, "base_url": proxy.url + endpoint, **model_args}
        argv = [
            str(python.parent / "lm-eval"),
            "run",
            "--model",
            model,
            "--model_args",
            ",".join(f"{k}={v}" for k, v in args.items()),
            "--tasks",
            ",".join(tasks),
            "--include_path",
            str(TASKS_DIR),
            "--output_path",
            str(out),
            "--log_samples",
        ]
        if model == "local-chat-completions":
            argv.append("--apply_chat_template")
        try:
            wall = run_logged(argv, out / "lm-eval.log", cwd=TASKS_DIR, env=OFFLINE_ENV)
        finally:
            http_log = proxy.dump(out / "http.jsonl")
    results = json.loads(_newest(out, "results_*.json").read_text(encoding="utf-8"))
    metrics = {
        task: {k: v for k, v in results["results"][task].items() if isinstance(v, int | float) and k != "alias"}
        for task in tasks
    }
    samples = {task: str(_newest(out, f"samples_{task}_*.jsonl")) for task in tasks}
    return {
        "command": shlex.join(argv),
        "cwd": str(TASKS_DIR),
        "server_command": shlex.join(server.argv),
        "wall_s": round(wall, 1),
        "loadavg_after": os.getloadavg(),
        "metrics": metrics,
        "samples": samples,
        "http": {"log": http_log["log"], "statuses": http_log["statuses"], "refusals": http_log["refusals"]},
    }


# ----- the multiple-choice check ---------------------------------------------------------------------------------
def encode_pair(tok: Any, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-eval's ``TemplateLM._encode_pair`` for a causal model: trailing spaces move from the context to the
    continuation; whole and context encoded without special tokens; the continuation is the whole's tail."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces > 0:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    whole = tok.encode(context + continuation, add_special_tokens=False).ids
    ctx = tok.encode(context, add_special_tokens=False).ids
    return ctx, whole[len(ctx) :]


def _pairs(sample: dict[str, Any]) -> list[tuple[str, str]]:
    """The (context, continuation) pairs of one logged multiple-choice sample, in choice order."""
    args = sample["arguments"]
    if isinstance(args, dict):  # {"gen_args_0": {"arg_0": context, "arg_1": continuation}, ...}
        items = sorted(args.items(), key=lambda kv: int(kv[0].rsplit("_", 1)[1]))
        return [(v["arg_0"], v["arg_1"]) for _, v in items]
    return [(c, x) for c, x in args]


def _loglikelihoods(sample: dict[str, Any]) -> list[float]:
    """lm-eval's logged log-likelihood per choice (``filtered_resps``: ``[ll, is_greedy]`` per choice)."""
    return [float(r[0]) for r in sample["filtered_resps"]]


def mc_check(
    model_folder: Path, samples_path: Path, http_log: Path | None, lm_metrics: dict[str, Any]
) -> dict[str, Any]:
    from tokenizers import Tokenizer

    from specrt import _ort, _specrt

    samples = [json.loads(line) for line in samples_path.read_text(encoding="utf-8").splitlines() if line.strip()]
    samples.sort(key=lambda s: s["doc_id"])
    tok = Tokenizer.from_file(str(model_folder / "tokenizer.json"))
    encoded = [[encode_pair(tok, c, x) for c, x in _pairs(s)] for s in samples]
    longest = max(len(c) + len(x) for pairs in encoded for c, x in pairs)
    model = _specrt.OrtModel(model_folder, ort_library=_ort.find_ort_library(), max_seq_len=longest + 8)

    per_sample = []
    max_abs_diff = 0.0
    sent_here: list[list[int]] = []
    for s, pairs in zip(samples, encoded, strict=True):
        lls = []
        for ctx, cont in pairs:
            ids = ctx + cont
            sent_here.append(ids)
            # [len(ids) - 1, vocab] float32: row i is the next-token logits after ids[: i + 1]
            logits = model.forward(np.asarray(ids[:-1], dtype=np.int64), 0, len(ids) - 1).astype(np.float64)
            row_max = logits.max(axis=1, keepdims=True)
            logp = logits - row_max - np.log(np.exp(logits - row_max).sum(axis=1, keepdims=True))
            # token j is predicted by row j - 1
            lls.append(float(sum(logp[j - 1, ids[j]] for j in range(len(ctx), len(ids)))))
        lm_lls = _loglikelihoods(s)
        choices = s["doc"]["choices"]
        lens = np.array([float(len(c)) for c in choices])
        gold = int(s["doc"]["label"])
        pred_here, pred_lm = int(np.argmax(lls)), int(np.argmax(lm_lls))
        norm_here, norm_lm = int(np.argmax(np.array(lls) / lens)), int(np.argmax(np.array(lm_lls) / lens))
        max_abs_diff = max(max_abs_diff, *(abs(x - y) for x, y in zip(lls, lm_lls, strict=True)))
        per_sample.append(
            {
                "doc_id": s["doc_id"],
                "gold": gold,
                "pred_teacher_forced": pred_here,
                "pred_lm_eval": pred_lm,
                "pred_norm_teacher_forced": norm_here,
                "pred_norm_lm_eval": norm_lm,
                "lm_eval_acc": float(s["acc"]),
                "ll_teacher_forced": [round(x, 5) for x in lls],
                "ll_lm_eval": [round(x, 5) for x in lm_lls],
            }
        )
    n = len(per_sample)
    acc_here = sum(p["pred_teacher_forced"] == p["gold"] for p in per_sample) / n
    acc_norm_here = sum(p["pred_norm_teacher_forced"] == p["gold"] for p in per_sample) / n
    tokens_match = None
    if http_log is not None:
        sent = []
        for line in http_log.read_text(encoding="utf-8").splitlines():
            r = json.loads(line)
            if r["path"] == "/v1/completions" and r["status"] == 200:
                body = json.loads(r["request"])
                if body.get("echo"):
                    prompts = body["prompt"]
                    sent += prompts if prompts and isinstance(prompts[0], list) else [prompts]
        tokens_match = sorted(map(tuple, sent)) == sorted(map(tuple, sent_here))
    return {
        "samples": str(samples_path),
        "n_questions": n,
        "n_choices": sum(len(p["ll_lm_eval"]) for p in per_sample),
        "acc_lm_eval_reported": lm_metrics.get("acc,none"),
        "acc_teacher_forced": acc_here,
        "acc_norm_lm_eval_reported": lm_metrics.get("acc_norm,none"),
        "acc_norm_teacher_forced": acc_norm_here,
        "every_choice_agrees": all(p["pred_teacher_forced"] == p["pred_lm_eval"] for p in per_sample),
        "every_norm_choice_agrees": all(p["pred_norm_teacher_forced"] == p["pred_norm_lm_eval"] for p in per_sample),
        "disagreements": [p for p in per_sample if p["pred_teacher_forced"] != p["pred_lm_eval"]],
        "max_abs_loglikelihood_diff": max_abs_diff,
        "sent_token_ids_equal_encoded_here": tokens_match,
        "per_sample": per_sample,
    }


# ----- report ----------------------------------------------------------------------------------------------------
def _f(x: float | None, nd: int = 1) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def markdown(summary: dict[str, Any]) -> str:
    lines = [f"# clients against specrt serve ({summary['date']}, specrt {summary['specrt_commit']})", ""]
    for run in summary.get("guidellm", []):
        lines += [
            f"guidellm: `{run['command']}`",
            f"server: `{run['server_command']}`",
            "",
            "| streams | ok | errors | incomplete | req/s | out tok/s | TTFT mean / p50 / p95 ms "
            "| ITL mean / p50 / p95 ms | latency mean s |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in run["rows"]:
            t, i = r["ttft_ms"], r["itl_ms"]
            lines.append(
                f"| {r['streams']} | {r['successful']} | {r['errored']} | {r['incomplete']} | "
                f"{_f(r['requests_per_s'], 3)} | {_f(r['output_tokens_per_s'])} | "
                f"{_f(t['mean'])} / {_f(t['median'])} / {_f(t['p95'])} | "
                f"{_f(i['mean'])} / {_f(i['median'])} / {_f(i['p95'])} | {_f(r['request_latency_s']['mean'], 2)} |"
            )
        lines += ["", f"server statuses: {run['server_statuses']}", ""]
        if "http" in run:
            lines += [
                f"through the recording proxy: {run['http']['statuses']}; refusals: {len(run['http']['refusals'])}; "
                f"request fields: {', '.join(run['http']['request_fields'])}",
                "",
            ]
    for run in summary.get("lmeval", []):
        lines += [f"lm-eval ({run['name']}): `{run['command']}` (cwd {run['cwd']})", ""]
        for task, m in run["metrics"].items():
            lines.append(f"- {task}: {', '.join(f'{k} {v:.4f}' for k, v in m.items())}")
        lines += [f"- HTTP: {run['http']['statuses']}; refusals: {len(run['http']['refusals'])}", ""]
        if "mc_check" in run:
            c = run["mc_check"]
            lines += [
                f"- MC check: acc lm-eval {c['acc_lm_eval_reported']} vs teacher-forced {c['acc_teacher_forced']}; "
                f"acc_norm {c['acc_norm_lm_eval_reported']} vs {c['acc_norm_teacher_forced']}; every choice agrees: "
                f"{c['every_choice_agrees']} (norm: {c['every_norm_choice_agrees']}); max |ll diff| "
                f"{c['max_abs_loglikelihood_diff']:.2e} over {c['n_choices']} choices; token ids sent == encoded "
                f"here: {c['sent_token_ids_equal_encoded_here']}",
                "",
            ]
    if "lmeval_same_generations" in summary:
        lines += [f"lm-eval generations identical across runs: {summary['lmeval_same_generations']}", ""]
    return "\n".join(lines) + "\n"


# ----- main ------------------------------------------------------------------------------------------------------
def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--target", default="smollm2-135m-instruct", help="model name (fp32) or converted folder")
    p.add_argument("--only", default="guidellm,lmeval", help="comma list of guidellm, lmeval (default: both)")
    p.add_argument("--out-dir", type=Path, default=None, help="default benches/out/clients-<time>")
    bench = specrt_cache() / "bench"
    p.add_argument("--guidellm-python", type=Path, default=bench / "venv-guidellm" / "bin" / "python")
    p.add_argument("--lmeval-python", type=Path, default=bench / "venv-lmeval" / "bin" / "python")
    p.add_argument("--streams", type=_ints, default=[1, 4, 16], help="guidellm concurrency levels (default 1,4,16)")
    p.add_argument("--max-batch", type=int, default=4, help="specrt serve --max-batch for guidellm (default 4)")
    p.add_argument("--no-single", action="store_true", help="skip target-only single-stream (streams 1, batch 1)")
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--output-tokens", type=int, default=64)
    p.add_argument("--requests", type=int, default=0, help="requests per level (default max(min, per-stream x S))")
    p.add_argument("--min-requests", type=int, default=16)
    p.add_argument("--requests-per-stream", type=int, default=4)
    p.add_argument("--max-seconds", type=float, default=600.0, help="guidellm max_duration per level (default 600)")
    p.add_argument("--lmeval-max-batch", type=_ints, default=[1], help="server --max-batch for lm-eval (default 1)")
    p.add_argument("--threads", type=int, default=None, help="specrt serve --threads (default: its own)")
    p.add_argument("--max-seq-len", type=int, default=None, help="specrt serve --max-seq-len (default: its own)")
    a = p.parse_args(argv)
    only = {x.strip() for x in a.only.split(",")}
    if not only <= {"guidellm", "lmeval"}:
        p.error(f"--only {a.only!r} is invalid (expected a comma list of: guidellm, lmeval)")
    a.out_dir = a.out_dir or ROOT / "benches" / "out" / f"clients-{time.strftime('%Y%m%d-%H%M%S')}"
    a.out_dir = a.out_dir.resolve()
    a.out_dir.mkdir(parents=True, exist_ok=True)
    for tool, py in (("guidellm", a.guidellm_python), ("lmeval", a.lmeval_python)):
        if tool in only and not py.is_file():
            print(f"{py} not found: bash {ROOT / 'benches/clients/setup_venv.sh'} {tool}", file=sys.stderr)
            return 2

    from specrt import models

    folder = Path(a.target) if Path(a.target).exists() else models.model_dir(a.target, "fp32")
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    summary: dict[str, Any] = {
        "date": dt.date.today().isoformat(),
        "specrt_commit": commit,
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor(), "python": platform.python_version()},
        "target_folder": str(folder),
        "versions": {},
    }
    cpu = Path("/proc/cpuinfo")
    if cpu.is_file():
        names = re.findall(r"^model name\s*:\s*(.+)$", cpu.read_text(), flags=re.M)
        summary["machine"]["cpu_model"] = names[0] if names else None
    if "guidellm" in only:
        summary["versions"]["guidellm"] = tool_versions(a.guidellm_python, ["guidellm", "httpx", "transformers"])
    if "lmeval" in only:
        summary["versions"]["lm-eval"] = tool_versions(a.lmeval_python, ["lm_eval", "aiohttp", "transformers"])

    def save() -> None:
        (a.out_dir / "summary.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
        (a.out_dir / "summary.md").write_text(markdown(summary), encoding="utf-8")

    failures: list[str] = []
    if "lmeval" in only:
        summary["lmeval"] = []
        for b in a.lmeval_max_batch:
            with Server(a.target, b, a.out_dir, a.threads, a.max_seq_len) as server:
                tok_dir = processor_folder(folder, server, a.out_dir)
                runs = [
                    ("local-completions", {}, [GEN_TASK, MC_TASK], f"lmeval-b{b}-completions-remote"),
                    (
                        "local-completions",
                        {"tokenizer": str(tok_dir), "tokenizer_backend": "huggingface"},
                        [GEN_TASK, MC_TASK],
                        f"lmeval-b{b}-completions-hf",
                    ),
                    ("local-chat-completions", {}, [GEN_TASK], f"lmeval-b{b}-chat"),
                ]
                for model, model_args, tasks, name in runs:
                    try:
                        run = {"name": name, **run_lmeval(a.lmeval_python, server, model_args, model, tasks, name, a)}
                    except (RuntimeError, FileNotFoundError, KeyError) as e:
                        failures.append(f"{name}: {e}")
                        log(f"FAILED {name}: {e}")
                        continue
                    if MC_TASK in tasks:
                        run["mc_check"] = mc_check(
                            folder,
                            Path(run["samples"][MC_TASK]),
                            Path(run["http"]["log"]),
                            run["metrics"][MC_TASK],
                        )
                    summary["lmeval"].append(run)
                    save()
        # greedy: every run's generated texts should be the same, whatever the tokenizer backend or --max-batch
        texts: dict[str, dict[str, list[Any]]] = {}
        for run in summary["lmeval"]:
            kind = "chat" if run["name"].endswith("-chat") else "completions"
            rows = [json.loads(r) for r in Path(run["samples"][GEN_TASK]).read_text(encoding="utf-8").splitlines()]
            texts.setdefault(kind, {})[run["name"]] = [r["resps"] for r in sorted(rows, key=lambda r: r["doc_id"])]
        summary["lmeval_same_generations"] = {
            kind: len({json.dumps(v) for v in runs.values()}) == 1 for kind, runs in texts.items()
        }
        save()
    if "guidellm" in only:
        summary["guidellm"] = []
        settings = [(a.max_batch, a.streams, f"guidellm-b{a.max_batch}")]
        if not a.no_single:
            settings.append((1, [1], "guidellm-b1-single"))
        for i, (b, streams, name) in enumerate(settings):
            with Server(a.target, b, a.out_dir, a.threads, a.max_seq_len) as server:
                tok_dir = processor_folder(folder, server, a.out_dir)
                runs = []
                if i == 0:  # what guidellm sends and gets, kept by the proxy: 2 requests, 16 tokens (also a warm-up)
                    runs.append((f"{name}-probe", [1], [2], 16, True))
                requests = [a.requests or max(a.min_requests, a.requests_per_stream * s) for s in streams]
                runs.append((name, streams, requests, a.output_tokens, False))
                for run_name, run_streams, run_requests, n_out, proxied in runs:
                    try:
                        with RecordingProxy(server.port) if proxied else contextlib.nullcontext() as proxy:
                            run = run_guidellm(
                                a.guidellm_python,
                                server,
                                tok_dir,
                                run_streams,
                                run_requests,
                                a,
                                run_name,
                                n_out,
                                proxy,
                            )
                        summary["guidellm"].append({"name": run_name, **run})
                    except (RuntimeError, FileNotFoundError, KeyError) as e:
                        failures.append(f"{run_name}: {e}")
                        log(f"FAILED {run_name}: {e}")
                    save()
    summary["failures"] = failures
    save()
    print(markdown(summary))
    log(f"wrote {a.out_dir / 'summary.json'} and summary.md")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
