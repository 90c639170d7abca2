"""The one-token decode step: specrt vs onnxruntime-genai on the same ONNX folder (target-only greedy, no draft).

    .venv/bin/python benches/bench_step.py [MODEL ...] [--max-new-tokens 128] [--rounds 2] [--procs 3] \\
        [--set quick] [--threads 2] [--arms specrt,specrt-ids,genai] [--profile] [--json OUT]

MODEL: converted model folders (default: the fp32 and int4 qwen2.5-coder-1.5b-instruct of the model cache). Arms:

- ``specrt``: ``specrt.Decoder.stream`` (what ``generate`` iterates), greedy, ``num_speculative_tokens=0``, the
  default ``logprobs=True``;
- ``specrt-ids``: the same with ``logprobs=False`` (greedy without log-probabilities: the engine reads only the argmax
  ids, ``GenerationConfig::ids_only``), the cost of returning log-probabilities;
- ``genai``: onnxruntime-genai in its venv (``--genai-python``, made by ``benches/peers/setup_genai_venv.sh``) on the
  very same ``model.onnx``, through the ``genai_config.json`` of ``genai_peer.write_genai_folder`` (the peer script of
  ``specrt bench --peers genai``), greedy, ``generate_next_token`` / ``get_next_tokens``.

Each arm runs in its own worker process (each process holds one session; genai's imports no specrt). The workers of
one model live together for ``--rounds`` rounds, in which every arm decodes every prompt of ``--set``, the arm order
rotating per round; then they exit and ``--procs`` fresh sets of workers repeat that, so a process's own luck (page
placement, thread pinning) shows as spread. When the arms' sessions would not fit in memory together (fp32 1.5B:
~6.2 GB each; the check: weight files x arms < 80% of MemAvailable) or with ``--serial``, the workers of one set run
one after another instead (the arm order rotating per set). Both runtimes use a KV buffer of ``--max-seq-len``
positions and ``--threads`` intra-op threads.

The step time of one generation is ``(t_n - t_1) / (n - 1)``: ``t_i`` the moment token ``i`` reached the caller, so
the n - 1 steps between hold exactly one 1-token run each in both runtimes (specrt's prefill stops one token short of
the prompt and its first step runs the last prompt token; genai's prefill runs the whole prompt and its first
``generate_next_token`` only picks from those logits), over the same tokens at the same positions. Per arm the report
gives the median / min / max of that per-generation figure, per worker process and overall, and the ratio of each
arm's median to genai's. The token ids of each prompt are compared across arms (greedy: equal, unless fp rounding
splits a near-tie).

``--profile`` turns ONNX Runtime's profiler on in every worker (specrt: ``_specrt.Driver(profile=...)``, genai:
its ``session_options.enable_profiling``) and splits each arm's step into ``run_ms`` (the median ``model_run`` event
of ONNX Runtime's trace, parsed by ``benches/profile_step.py``; prefill runs, a few among hundreds of steps, are
outliers the median ignores) and ``outside_run_ms`` = step - run (binding, sampling, copies, Python, pyo3). specrt's
workers also report the engine's own split of a step: ``target_ms`` (the target forward: binding + run), ``core_ms``
(greedy choice, log-probability, commit) and the rest (pyo3, text assembly, ``StreamChunk``s). The profiler slows each
run a little: take headline ratios from a run without ``--profile``.

JSON (``--json``): the command, the machine (CPU model, CPU count, load average before and after), versions (specrt,
its ONNX Runtime library, onnxruntime-genai and its onnxruntime), settings and every generation's figures.
"""

from __future__ import annotations

import argparse
import glob
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PEER_SCRIPTS = ROOT / "python" / "specrt" / "bench" / "peer_scripts"
ARMS = ("specrt", "specrt-ids", "genai")
MODEL_NAME = "qwen2.5-coder-1.5b-instruct"


def _steps(times: list[float]) -> float | None:
    """The mean step in ms from the moments (perf_counter s) the tokens reached the caller; None under 2 tokens."""
    return (times[-1] - times[0]) * 1e3 / (len(times) - 1) if len(times) >= 2 else None


def _profile_split(prefix: str, step_ms: list[float]) -> dict[str, Any]:
    """``run_ms`` (median ``model_run`` of the trace(s) named from ``prefix``) beside ``step_ms`` (median of the
    single steps, token to token, of every timed generation)."""
    from profile_step import _runs

    files = sorted(glob.glob(prefix + "*.json"))
    runs = [r["run"] / 1e3 for f in files for r in _runs(json.loads(Path(f).read_text()))]
    step = statistics.median(step_ms)
    run = statistics.median(runs) if runs else None
    return {
        "n_runs": len(runs),
        "step_ms": step,
        "run_ms": run,
        "outside_run_ms": None if run is None else step - run,
        "outside_run_share": None if run is None else (step - run) / step,
        "traces": files,
    }


def _specrt_worker(arm: str, model: Path, threads: int, max_seq_len: int, profile: str | None) -> None:
    import specrt
    from specrt import _specrt

    if profile:
        # Decoder builds its driver itself: give that one the profiler (the target's session only).
        pipeline = _specrt.Driver
        _specrt.Driver = lambda *a, **kw: pipeline(*a, profile=profile, **kw)  # type: ignore[misc]
    dec = specrt.Decoder(model, max_seq_len=max_seq_len, intra_op_threads=threads)
    steps: list[float] = []
    for line in sys.stdin:
        req = json.loads(line)
        if "encode" in req:
            p = req["encode"]
            print(json.dumps({"ids": dec.encode(p.get("prompt"), p.get("messages"))}), flush=True)
            continue
        times: list[float] = []
        tokens: list[int] = []
        result = None
        for chunk in dec.stream(
            req["ids"],
            max_new_tokens=req["max_new_tokens"],
            temperature=0,
            num_speculative_tokens=0,
            logprobs=arm == "specrt",
        ):
            if chunk.token_ids:
                times.append(time.perf_counter())
                tokens += chunk.token_ids
            result = chunk.result or result
        assert result is not None
        st = result.stats
        step = _steps(times)
        steps += [(b - t) * 1e3 for t, b in itertools.pairwise(times)]
        print(
            json.dumps(
                {
                    "tokens": tokens,
                    "step_ms": step,
                    "target_ms": st.target_ms / st.n_rounds,
                    "core_ms": st.core_ms / st.n_rounds,
                }
            ),
            flush=True,
        )
    # The steps for the parent's profile split (the trace is complete once this process has exited).
    print(json.dumps({"steps": steps}), flush=True)


def _genai_worker(model: Path, threads: int, max_seq_len: int, profile: str | None) -> None:
    import numpy as np
    import onnxruntime_genai as og

    sys.path.insert(0, str(PEER_SCRIPTS))
    from genai_peer import write_genai_folder

    folder = write_genai_folder(
        Path(tempfile.mkdtemp(prefix="bench-step-genai-")), model, None, threads=threads, max_length=max_seq_len, k=0
    )
    if profile:
        cfg = json.loads((folder / "genai_config.json").read_text())
        cfg["model"]["decoder"]["session_options"]["enable_profiling"] = profile
        (folder / "genai_config.json").write_text(json.dumps(cfg, indent=2))
    gmodel = og.Model(str(folder))
    steps: list[float] = []
    for line in sys.stdin:
        req = json.loads(line)
        params = og.GeneratorParams(gmodel)
        # The KV buffer of specrt's max_seq_len (past_present_share_buffer): both attend over the same cache size.
        params.set_search_options(max_length=max_seq_len, do_sample=False)
        gen = og.Generator(gmodel, params)
        gen.append_tokens(np.asarray([req["ids"]], dtype=np.int32))
        times: list[float] = []
        tokens: list[int] = []
        while not gen.is_done() and len(tokens) < req["max_new_tokens"]:
            gen.generate_next_token()
            tokens.append(int(gen.get_next_tokens()[0]))
            times.append(time.perf_counter())
        del gen
        step = _steps(times)
        steps += [(b - t) * 1e3 for t, b in itertools.pairwise(times)]
        print(json.dumps({"tokens": tokens, "step_ms": step}), flush=True)
    print(json.dumps({"steps": steps}), flush=True)


class Worker:
    """One arm's worker process, asked one JSON line at a time."""

    def __init__(self, arm: str, python: str, model: Path, a: argparse.Namespace, profile: str | None) -> None:
        self.arm, self.profile = arm, profile
        cmd = [python, __file__, str(model), "--worker", arm, "--threads", str(a.threads)]
        cmd += ["--max-seq-len", str(a.max_seq_len), *(["--profile-prefix", profile] if profile else [])]
        env = dict(os.environ, ORTGENAI_LOG_LEVEL="warning")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)

    def ask(self, req: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.arm} worker exited (code {self.proc.wait()})")
        return json.loads(line)

    def close(self) -> dict[str, Any] | None:
        """End the worker; its profile split when it made one (the trace is written when its session ends, which
        may be as late as the process's exit)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        line = self.proc.stdout.readline()
        if self.proc.wait() != 0 or not line:
            raise RuntimeError(f"{self.arm} worker failed (code {self.proc.returncode})")
        steps = json.loads(line)["steps"]
        return _profile_split(self.profile, steps) if self.profile and steps else None


def _fits(model: Path, n_sessions: int) -> bool:
    """Whether ``n_sessions`` sessions of ``model`` (each about its weight files in anonymous memory) fit in 80% of
    MemAvailable."""
    weights = sum(f.stat().st_size for f in model.glob("model.onnx*"))
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return n_sessions * weights < 0.8 * int(line.split()[1]) * 1024
    return True


def _spread(v: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)} if v else {"n": 0}


def _genai_versions(genai_python: str) -> dict[str, str | None]:
    """onnxruntime-genai's version and that of the onnxruntime it runs on, in the genai venv."""
    code = "import onnxruntime_genai as og, onnxruntime as o; print(og.__version__, o.__version__)"
    res = subprocess.run([genai_python, "-c", code], capture_output=True, text=True, check=False)
    parts: list[str | None] = [*res.stdout.split(), None, None]
    return {"onnxruntime_genai": parts[0], "genai_onnxruntime": parts[1]}


def bench_model(model: Path, arms: list[str], prompts: list[dict[str, Any]], a: argparse.Namespace) -> dict[str, Any]:
    """All rounds of all worker generations for one model folder; prints per-process lines and a summary."""
    runs: list[dict[str, Any]] = []
    profiles: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms}
    tokens: dict[str, dict[str, list[int]]] = {}
    tmp = Path(tempfile.mkdtemp(prefix="bench-step-"))
    ids: dict[str, list[int]] = {}
    serial = a.serial or not _fits(model, len(arms))
    if serial:
        print("  workers one at a time (all arms' sessions at once would not fit in memory)", flush=True)
    for proc in range(a.procs):
        order = arms[proc % len(arms) :] + arms[: proc % len(arms)]
        if not ids and order[0] == "genai":
            order = order[1:] + order[:1]  # a specrt worker first: it tokenizes the prompts
        # Concurrent: all arms' workers alive together, asked in turn; serial: one after another (rotating).
        for group in [[arm] for arm in order] if serial else [arms]:
            workers = {
                arm: Worker(
                    arm,
                    a.genai_python if arm == "genai" else sys.executable,
                    model,
                    a,
                    str(tmp / f"{arm}-p{proc}") if a.profile else None,
                )
                for arm in group
            }
            if not ids:
                encoder = next((w for arm, w in workers.items() if arm != "genai"), None)
                if encoder is None:
                    raise SystemExit("--arms needs a specrt arm (it tokenizes the prompts)")
                ids = {p["id"]: encoder.ask({"encode": p})["ids"] for p in prompts}
            for w in workers.values():  # warm-up (first-run allocations, page cache), untimed
                w.ask({"ids": ids[prompts[0]["id"]], "max_new_tokens": 8})
            for rnd in range(a.rounds):
                turn = group[rnd % len(group) :] + group[: rnd % len(group)]
                for p in prompts:
                    for arm in turn if proc % 2 == 0 else turn[::-1]:
                        res = workers[arm].ask({"ids": ids[p["id"]], "max_new_tokens": a.max_new_tokens})
                        tokens.setdefault(p["id"], {}).setdefault(arm, res["tokens"])
                        run = {"proc": proc, "round": rnd, "prompt": p["id"], "arm": arm, "n": len(res["tokens"])}
                        runs.append(run | {k: v for k, v in res.items() if k != "tokens"})
            for arm, w in workers.items():
                split = w.close()
                if split is not None:
                    profiles[arm].append(split)
        line = [f"  proc {proc}:"]
        for arm in arms:
            v = [r["step_ms"] for r in runs if r["proc"] == proc and r["arm"] == arm and r["step_ms"] is not None]
            s = _spread(v)
            line.append(f"{arm} {s['median']:.2f} ms [{s['min']:.2f}-{s['max']:.2f}]" if v else f"{arm} -")
        print("  ".join(line), flush=True)
    summary = {
        arm: _spread([r["step_ms"] for r in runs if r["arm"] == arm and r["step_ms"] is not None]) for arm in arms
    }
    ratios = {}
    if "genai" in arms and summary["genai"]["n"]:
        ratios = {arm: summary[arm]["median"] / summary["genai"]["median"] for arm in arms if summary[arm]["n"]}
    for arm in arms:
        s = summary[arm]
        if not s["n"]:
            continue
        extra = f"  {arm}/genai {ratios[arm]:.3f}" if arm in ratios else ""
        eng = [r for r in runs if r["arm"] == arm and "target_ms" in r]
        if eng:
            tgt = statistics.median(r["target_ms"] for r in eng)
            core = statistics.median(r["core_ms"] for r in eng)
            extra += f"  (engine per step: target forward {tgt:.2f} ms, core {core:.3f} ms)"
        print(f"  {arm:11s} step {s['median']:7.2f} ms  [{s['min']:.2f}-{s['max']:.2f}]  n={s['n']}{extra}", flush=True)
    for arm, splits in profiles.items():
        for sp in splits:
            if sp["run_ms"] is not None:
                print(
                    f"  profile {arm:11s} step {sp['step_ms']:.2f} ms = run {sp['run_ms']:.2f} + outside "
                    f"{sp['outside_run_ms']:.2f} ms ({sp['outside_run_share']:.1%}; {sp['n_runs']} runs)"
                )
    same = {pid: all(t == next(iter(by.values())) for t in by.values()) for pid, by in tokens.items()}
    print(f"  same tokens across arms: {same}", flush=True)
    return {
        "model": str(model),
        "summary": summary,
        "ratio_to_genai": ratios,
        "profile": profiles if a.profile else None,
        "same_tokens": same,
        "runs": runs,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", type=Path, help=f"model folders (default: {MODEL_NAME} fp32 and int4)")
    ap.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {', '.join(ARMS)}")
    ap.add_argument("--set", default="quick", help="prompt set of benches/prompts.json (default quick: 2 prompts)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2, help="rounds per worker process (default 2)")
    ap.add_argument("--procs", type=int, default=3, help="fresh worker processes per arm, one after another")
    ap.add_argument("--threads", type=int, default=2, help="intra-op threads of both runtimes (default 2)")
    ap.add_argument("--max-seq-len", type=int, default=1024, help="KV buffer length of both runtimes (default 1024)")
    ap.add_argument("--genai-python", default=None, help="the genai venv's python (default: the bench's genai venv)")
    ap.add_argument("--serial", action="store_true", help="one worker at a time (default: when memory is short)")
    ap.add_argument("--profile", action="store_true", help="split each step into ONNX Runtime's run and the rest")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--worker", choices=ARMS, help=argparse.SUPPRESS)
    ap.add_argument("--profile-prefix", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        model = a.models[0]
        if a.worker == "genai":
            _genai_worker(model, a.threads, a.max_seq_len, a.profile_prefix)
        else:
            _specrt_worker(a.worker, model, a.threads, a.max_seq_len, a.profile_prefix)
        return 0

    sys.path[:0] = [str(ROOT / "python"), str(HERE)]
    from specrt.bench.config import default_peer_venv
    from specrt.bench.runner import _machine
    from specrt.models import model_dir

    arms = [x for x in a.arms.split(",") if x]
    if unknown := set(arms) - set(ARMS):
        ap.error(f"--arms {sorted(unknown)} is invalid (expected some of {', '.join(ARMS)})")
    if a.genai_python is None:
        a.genai_python = str(default_peer_venv("genai") / "bin" / "python")
    if "genai" in arms and not Path(a.genai_python).is_file():
        ap.error(
            f"no genai venv at {a.genai_python}: run bash benches/peers/setup_genai_venv.sh (or --arms specrt,...)"
        )
    models = a.models or [model_dir(MODEL_NAME, d) for d in ("fp32", "int4")]
    data = json.loads((HERE / "prompts.json").read_text())
    by_id = {p["id"]: p for p in data["prompts"]}
    prompts = [
        {"id": i, "prompt": by_id[i].get("prompt"), "messages": by_id[i].get("messages")} for i in data["sets"][a.set]
    ]

    machine = _machine()
    t0 = time.time()
    results = []
    for model in models:
        print(f"{model} ({a.procs} procs x {a.rounds} rounds x {len(prompts)} prompts x {a.max_new_tokens} tokens)")
        results.append(bench_model(model, arms, prompts, a))
    machine["load_avg_end"] = list(os.getloadavg())
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        report = {
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "date": time.strftime("%Y-%m-%d %H:%M"),
            "seconds": round(time.time() - t0, 1),
            "machine": machine,
            # specrt's own versions are in machine (specrt_version, onnxruntime, ort_library).
            "versions": _genai_versions(a.genai_python) if "genai" in arms else None,
            "settings": {k: v for k, v in vars(a).items() if k not in ("worker", "profile_prefix", "json", "models")},
            "prompts": [p["id"] for p in prompts],
            "models": results,
        }
        a.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
