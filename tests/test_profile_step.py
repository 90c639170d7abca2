"""``benches/profile_step.py`` (the per-step profile of the speed issue) on tiny models: every step the round makes is
profiled, the figures are consistent (ONNX Runtime's run inside the call, its kernels inside the run), and the graph
form's argmax-only step is profiled beside the logits step."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from specrt import _specrt
from specrt.convert import convert
from specrt.convert.tiny import write_tiny_gguf
from specrt.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def _load_profile_step():
    spec = importlib.util.spec_from_file_location("profile_step", ROOT / "benches" / "profile_step.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["profile_step"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("attention", ["gqa", "gqa-graph"])
def test_profile_reports_each_step_consistently(tmp_path: Path, attention: str) -> None:
    gguf = write_tiny_gguf(tmp_path / "t.gguf", arch="qwen2", seed=2, n_layers=2)
    model = convert(gguf, tmp_path / attention, progress=False, attention=attention)
    rep = _load_profile_step().profile(model, context=24, k=3, repeats=4, warmup=1, threads=1)
    cases = {(s["tokens"], s["returns"]) for s in rep["steps"]}
    want = {(1, "logits"), (4, "logits")}
    if attention == "gqa-graph":
        want |= {(1, "argmax"), (4, "argmax")}
    assert cases == want
    for s in rep["steps"]:
        assert 0 < s["nodes_ms"] <= s["run_ms"] <= s["wall_ms"], s
        assert 0 <= s["outside_run_share"] < 1 and s["gpu_kernels_ms"] is None  # CPU: no CUDA kernel events
        assert s["top_ops_ms"] and sum(s["top_ops_ms"].values()) <= s["nodes_ms"] + 1e-3


def test_end_profiling_needs_the_profile_option(tmp_path: Path) -> None:
    gguf = write_tiny_gguf(tmp_path / "t.gguf", arch="qwen2", seed=2, n_layers=1)
    m = _specrt.OrtModel(convert(gguf, tmp_path / "m", progress=False), max_seq_len=32)
    with pytest.raises(ConfigError, match="profiling is off"):
        m.end_profiling()
    assert m.forward_argmax([1, 2, 3], 0, 2) == [int(r.argmax()) for r in m.forward([1, 2, 3], 0, 2)]
