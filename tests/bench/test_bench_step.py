"""``benches/bench_step.py`` (issue 31: the one-token step, specrt vs onnxruntime-genai) on a tiny model, specrt's arms
only: each arm's steps are timed in its own worker processes, the same greedy tokens come out with and without
log-probabilities, and ``--profile`` finds a ``model_run`` per step in the trace ``Engine(profile=...)`` writes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from specrt.convert import convert
from specrt.convert.tiny import write_tiny_gguf

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_bench_step_times_and_profiles_specrt_arms(tmp_path: Path) -> None:
    gguf = write_tiny_gguf(tmp_path / "t.gguf", arch="qwen2", seed=2, n_layers=2)
    model = convert(gguf, tmp_path / "m", progress=False)
    out = tmp_path / "step.json"
    cmd = [sys.executable, str(ROOT / "benches" / "bench_step.py"), str(model), "--arms", "specrt,specrt-ids"]
    cmd += ["--max-new-tokens", "8", "--rounds", "2", "--procs", "2", "--threads", "1", "--profile"]
    subprocess.run([*cmd, "--json", str(out)], check=True, capture_output=True, text=True, timeout=280)
    rep = json.loads(out.read_text())
    assert rep["machine"]["load_avg_end"] is not None and rep["versions"] is None  # no genai arm
    (m,) = rep["models"]
    prompts = rep["prompts"]
    for arm in ("specrt", "specrt-ids"):
        # 2 processes x 2 rounds x the prompts, each with a step time (>= 2 tokens: EOS is unlikely on random weights)
        assert m["summary"][arm]["n"] == 4 * len(prompts)
        assert 0 < m["summary"][arm]["min"] <= m["summary"][arm]["median"] <= m["summary"][arm]["max"]
        splits = m["profile"][arm]
        assert len(splits) == 2  # one per worker process
        for sp in splits:
            assert sp["n_runs"] > 4 * len(prompts) and sp["run_ms"] > 0 and sp["traces"]
    assert all(m["same_tokens"].values())
    assert {r["proc"] for r in m["runs"]} == {0, 1}
