"""``benches/bench_serve_peers.py``'s summary over repeats (issue 44: one lucky run cannot make a headline): medians
with their min-max spread per server, draft and stream count, and specrt's best over llama.cpp's best in every
repeat, on made-up rows (the servers themselves are not started here)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def peers():
    sys.path.insert(0, str(ROOT / "benches"))
    try:
        spec = importlib.util.spec_from_file_location("bench_serve_peers", ROOT / "benches" / "bench_serve_peers.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(ROOT / "benches"))


def _row(server: str, draft: str, streams: int, rep: int, tps: float, ttft: float) -> dict:
    return {
        "server": server,
        "draft": draft,
        "streams": streams,
        "repeat": rep,
        "tokens_per_s": tps,
        "median_ttft_ms": ttft,
        "errors": 0,
    }


def test_summary_gives_medians_spreads_and_the_worst_repeat_of_best_against_best(peers) -> None:
    runs = []
    for rep, (s_off, s_on, l_off, l_on) in enumerate([(18, 20, 25, 10), (19, 30, 21, 11), (17, 19, 24, 9)]):
        runs += [
            _row("specrt", "off", 1, rep, s_off, 100),
            _row("specrt", "on", 1, rep, s_on, 120 + rep),
            _row("llama.cpp", "off", 1, rep, l_off, 90),
            _row("llama.cpp", "on", 1, rep, l_on, 300),
        ]
    summary = peers.summarize(runs)
    on = next(c for c in summary["cells"] if (c["server"], c["draft"], c["streams"]) == ("specrt", "on", 1))
    assert on["repeats"] == 3
    assert on["tokens_per_s"] == {"median": 20, "min": 19, "max": 30}
    assert on["ttft_p50_ms"] == {"median": 121, "min": 120, "max": 122}
    ratios = summary["best_vs_best"]
    assert [r["repeat"] for r in ratios] == [0, 1, 2]
    # Repeat 1: specrt's best is with the draft (30), llama.cpp's without it (21).
    assert ratios[1]["specrt_best"] == "on" and ratios[1]["llama_best"] == "off"
    assert ratios[1]["tokens_per_s_ratio"] == pytest.approx(30 / 21)
    text = peers.render_summary(summary)
    # The fewest over the repeats is the headline: 19 / 24 in repeat 2, not repeat 1's 1.43.
    assert f"fewest: {19 / 24:.2f}" in text
    assert "20.0 [19.0-30.0]" in text


def test_trace_sums_the_requests_rounds_by_k_and_time_split(peers) -> None:
    specs = [
        {"rounds_by_k": [2, 0, 1], "n_rounds": 3, "n_drafted": 2, "n_accepted": 1, "n_recovered": 1, "n_bonus": 2,
         "prefill_ms": 10.0, "draft_ms": 4.0, "target_ms": 30.0},
        {"rounds_by_k": [0, 1, 0, 2], "n_rounds": 3, "n_drafted": 7, "n_accepted": 7, "n_recovered": 0, "n_bonus": 2,
         "prefill_ms": 5.0, "draft_ms": 10.0, "target_ms": 60.0},
    ]  # fmt: skip
    t = peers.trace(specs)
    assert t["rounds_by_k"] == [2, 1, 1, 2] and t["n_rounds"] == 6
    assert t["acceptance_rate"] == pytest.approx(8 / 9) and t["mean_tokens_per_round"] == pytest.approx(13 / 6)
    assert t["target_ms_per_round"] == pytest.approx(15.0) and t["draft_ms_per_drafted_token"] == pytest.approx(14 / 9)
    assert "0:2 1:1 2:1 3:2" in peers.trace_text(t)
    assert peers.trace([]) is None and peers.trace_text(None) == ""
