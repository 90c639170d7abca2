"""The prepared GPU run (benches/gpu/run_gpu_bench.sh) in its CPU dry run (``GPU_BENCH_DRY=1``): the same steps in
the same order on test-sized random models, with the CPU mode of the CUDA-graph steps in benches/gpu/graph_speed.py.
Checks the script (every step runs, bounded, and reports), not a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_gpu_run_dry_run_runs_every_check_and_prints_the_table(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {
        **os.environ,
        "GPU_BENCH_DRY": "1",
        "OUT": str(out),
        "SPECRT_CACHE_DIR": str(tmp_path / "cache"),
        "PYTHON": sys.executable,
        "GPU_7B_S": "120",
    }
    run = subprocess.run(
        ["bash", str(REPO / "benches/gpu/run_gpu_bench.sh")], env=env, capture_output=True, text=True, timeout=600
    )
    summary = (out / "summary.txt").read_text()
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    for check in ("one-ort", "pytest", "graph-speed", "graph-speed-7b", "bench-cuda-graph"):
        assert f"| {check} | rc=0" in summary, summary
    report = json.loads((out / "graph-speed.json").read_text())
    # Both modes measured, the CPU mode of the graph steps in use, and greedy tokens equal in every run.
    assert report["costs"]["target/graph"]["graph_copies"] == "host"
    assert report["costs"]["target/no-graph"]["graph_copies"] is None
    assert set(report["predictions"]) == {"no-graph", "graph"}
    assert report["same_tokens"] and all(report["same_tokens"].values()), report["same_tokens"]
