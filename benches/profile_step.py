"""Where one decode step's time goes: ONNX Runtime's profiler around the steps a speculative round makes.

    python benches/profile_step.py MODEL [--provider cuda] [--context 512] [--k 4] [--repeats 20] [--json OUT]

For a model folder (a target or a draft; any form), on a cache of ``--context`` positions: ``--repeats`` timed
forwards of 1 token (a draft step, a plain target step) and of K + 1 tokens (a verification), each rolled back to
the same cache, first returning logits and then, when the model has an ``argmax`` output (the graph form), only
argmax ids. For each it reports, as medians over the repeats (ms):

- ``wall``: the call as Python sees it (binding, the run, copies back, pyo3);
- ``run``: ONNX Runtime's ``model_run`` event (the session's Run, from the profiler's trace);
- ``nodes``: the summed ``Node`` kernel events of that run (on the CPU: the kernels' time; on CUDA: the time to
  launch them, as the kernels run asynchronously) and ``gpu_kernels``: the summed CUDA kernel events when the
  ONNX Runtime build records them (CUPTI), else null;
- ``outside_run_share``: ``(wall - run) / wall``, the time a step spends outside ONNX Runtime's run;
- the top operators by node time, those of the median repeat (below).

``nodes`` and the top operators come from one repeat, the median one: the repeat whose node total is the median
(the lower of the two middle ones for an even count), so the operators listed sum to at most ``nodes`` however
uneven the repeats are (a mean of operator times beside a median of totals does not: one slow repeat on a loaded
machine puts the operators above the total). In each repeat the nodes lie inside the run and the run inside the
call; medians keep that order (and the lower median is at most the median), so ``nodes <= run <= wall`` holds too.

This is the "profile first" step of the speed issue (per-kernel time of a target step and a draft step against the
step's wall time). On a GPU run it with the CUDA build (``--provider cuda``, fp16 models).
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))


def _runs(trace: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per ``model_run`` event of a trace, in order: its duration and the node / GPU kernel events inside it (us)."""
    runs = [
        {"ts": e["ts"], "end": e["ts"] + e["dur"], "run": e["dur"], "nodes": Counter(), "kernels": 0.0, "n_kernels": 0}
        for e in trace
        if e.get("cat") == "Session" and e.get("name") == "model_run"
    ]
    runs.sort(key=lambda r: r["ts"])
    starts = [r["ts"] for r in runs]
    for e in trace:
        cat = e.get("cat")
        if cat not in ("Node", "Kernel") or "dur" not in e:
            continue
        i = bisect.bisect_right(starts, e["ts"]) - 1
        if i < 0 or e["ts"] > runs[i]["end"] + (1e6 if cat == "Kernel" else 0):
            continue
        if cat == "Node":
            if not e["name"].endswith("_kernel_time"):
                continue
            runs[i]["nodes"][e.get("args", {}).get("op_name", "?")] += e["dur"]
        else:
            runs[i]["kernels"] += e["dur"]
            runs[i]["n_kernels"] += 1
    return runs


def profile(
    model: str | os.PathLike[str],
    *,
    provider: str = "cpu",
    context: int = 512,
    k: int = 4,
    repeats: int = 20,
    warmup: int = 3,
    threads: int | None = 2,
) -> dict[str, Any]:
    """Profile the steps of one model (see the module docstring). Returns the JSON-ready report."""
    import numpy as np

    from specrt import _specrt

    with tempfile.TemporaryDirectory() as tmp:
        m = _specrt.OrtModel(
            model,
            provider=provider,
            max_seq_len=context + k + 2,
            intra_op_threads=threads,
            profile=str(Path(tmp) / "trace"),
            device_argmax=True,  # the graph's argmax output, also on the CPU (where the engine scans the logits)
        )
        rng = np.random.default_rng(0)
        vocab = m.vocab_size
        m.forward(rng.integers(0, vocab, size=context, dtype=np.int64), 0, 1)
        has_argmax = _has_argmax(Path(model))
        cases = [(n, mode) for n in sorted({1, k + 1}) for mode in ("logits", *(("argmax",) if has_argmax else ()))]
        order: list[tuple[int, str]] = []
        walls: dict[tuple[int, str], list[float]] = {c: [] for c in cases}
        for rep in range(warmup + repeats):
            for n, mode in cases:
                toks = rng.integers(0, vocab, size=n, dtype=np.int64)
                call = m.forward if mode == "logits" else m.forward_argmax
                t0 = time.perf_counter()
                call(toks, context, n)
                wall = (time.perf_counter() - t0) * 1e3
                order.append((n, mode) if rep >= warmup else (0, "warmup"))
                if rep >= warmup:
                    walls[(n, mode)].append(wall)
        trace = json.loads(Path(m.end_profiling()).read_text())
    runs = _runs(trace)[1:]  # the first run is the prefill
    if len(runs) != len(order):
        raise RuntimeError(f"the trace holds {len(runs)} step runs, {len(order)} were made")
    steps = [_step(case, [r for r, c in zip(runs, order, strict=True) if c == case], walls[case]) for case in cases]
    return {
        "command": "python " + " ".join(sys.argv),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
        "model": str(model),
        "provider": provider,
        "context": context,
        "k": k,
        "repeats": repeats,
        "threads": threads,
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "steps": steps,
    }


def _step(case: tuple[int, str], mine: list[dict[str, Any]], walls_ms: list[float]) -> dict[str, Any]:
    """The figures of one step (``case``: tokens, returns) from its repeats: ``mine``, the trace's runs (``_runs``,
    microseconds), and ``walls_ms``, the calls' wall times in the same order."""
    # The median repeat by node total: its total is nodes_ms and its operators are top_ops_ms (one repeat for both,
    # so the operators sum to at most the total; the trace's durations are whole microseconds).
    totals = [sum(r["nodes"].values()) for r in mine]
    middle = mine[totals.index(statistics.median_low(totals))]
    wall = statistics.median(walls_ms)
    run = statistics.median(r["run"] for r in mine) / 1e3
    kernels = [r["kernels"] for r in mine if r["n_kernels"]]
    return {
        "tokens": case[0],
        "returns": case[1],
        "wall_ms": round(wall, 3),
        "run_ms": round(run, 3),
        "nodes_ms": round(sum(middle["nodes"].values()) / 1e3, 3),
        "gpu_kernels_ms": round(statistics.median(kernels) / 1e3, 3) if kernels else None,
        "outside_run_share": round((wall - run) / wall, 4),
        "top_ops_ms": {op: round(us / 1e3, 3) for op, us in middle["nodes"].most_common(8)},
    }


def _has_argmax(model: Path) -> bool:
    cfg = model / "specrt_config.json"
    return cfg.is_file() and json.loads(cfg.read_text()).get("attention") == "gqa-graph"


def _at_least_one(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"{v} is invalid (expected an integer >= 1)")
    return v


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", help="model folder (specrt convert output)")
    ap.add_argument("--provider", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument(
        "--context", type=_at_least_one, default=512, help="cached positions before each step (default 512)"
    )
    ap.add_argument("--k", type=_at_least_one, default=4, help="K: the verification step has K + 1 tokens (default 4)")
    ap.add_argument("--repeats", type=_at_least_one, default=20)
    ap.add_argument("--threads", type=_at_least_one, default=2, help="intra-op threads (default 2)")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    cfg = Path(a.model) / "specrt_config.json"
    limit = json.loads(cfg.read_text()).get("max_position_embeddings") if cfg.is_file() else None
    if limit is not None and a.context + a.k + 2 > limit:
        ap.error(f"--context {a.context} + --k {a.k} + 2 exceeds the model's max_position_embeddings {limit}")
    rep = profile(a.model, provider=a.provider, context=a.context, k=a.k, repeats=a.repeats, threads=a.threads)
    print(
        f"{'tokens':>6} {'returns':>7} {'wall ms':>8} {'run ms':>8} {'nodes ms':>9} {'gpu ms':>7} {'outside':>8}",
        " top ops",
    )
    for s in rep["steps"]:
        gpu = "-" if s["gpu_kernels_ms"] is None else f"{s['gpu_kernels_ms']:.3f}"
        top = ", ".join(f"{op} {ms:.2f}" for op, ms in list(s["top_ops_ms"].items())[:4])
        print(
            f"{s['tokens']:>6} {s['returns']:>7} {s['wall_ms']:>8.3f} {s['run_ms']:>8.3f} {s['nodes_ms']:>9.3f} "
            f"{gpu:>7} {s['outside_run_share']:>8.1%}  {top}"
        )
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(rep, indent=2) + "\n")


if __name__ == "__main__":
    main()
