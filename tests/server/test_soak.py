"""The fault soak (issue 42, benches/soak.py) in short: 4 clients for 25 s against ``specrt serve`` on a tiny
random-weight pair, then the soak's invariants (no 5xx, no traceback, every fault answered with its documented status
and ``param``, every greedy / seeded text equal to the same request alone on a fresh server, idle at the end, exit 0
on SIGTERM, serving after ``kill -9``). The checkers themselves are shown to catch broken answers."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

REPO = Path(__file__).resolve().parents[2]


def _soak() -> ModuleType:
    spec = importlib.util.spec_from_file_location("soak", REPO / "benches" / "soak.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


soak = _soak()


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Converted folders of the tiny qwen2 pair tests/conftest.py's ``tiny_decoder`` loads (2-layer target, 1-layer
    draft, seed 3)."""
    from specrt.convert import convert
    from specrt.convert.tiny import write_tiny_gguf

    root = tmp_path_factory.mktemp("soak-pair")
    paths = {}
    for name, layers in [("target", 2), ("draft", 1)]:
        gguf = write_tiny_gguf(root / f"{name}.gguf", arch="qwen2", seed=3, n_layers=layers)
        paths[name] = convert(gguf, root / name, progress=False)
    return paths["target"], paths["draft"]


@pytest.mark.slow
def test_a_short_soak_keeps_every_invariant(tiny_pair: tuple[Path, Path], tmp_path: Path) -> None:
    target, draft = tiny_pair
    args = ["--target", str(target), "--draft", str(draft), "--clients", "4", "--duration", "25"]
    args += ["--no-faults-duration", "0", "--max-seq-len", "256", "--out-dir", str(tmp_path)]
    rc = soak.main(args)
    report = json.loads((tmp_path / "report.json").read_text())
    inv = report["invariants"]
    for name in ("no_5xx", "no_tracebacks", "documented_statuses", "greedy_and_seeded_equal_replay", "idle_at_end",
                 "exit_0_on_sigterm", "serves_after_kill9"):  # fmt: skip
        assert inv[name], (name, json.dumps(report, default=str)[:4000])
    assert rc == 0 or not inv["rss_growth_below_limit"]  # a 25 s run's memory figure is not asserted
    # Every good kind completed and every fault was tried: the mix was exercised.
    kinds = report["soak"]["by_kind"]
    assert set(kinds) == set(soak.GOOD_KINDS) | set(soak.FAULT_KINDS), sorted(kinds)
    assert report["replay"]["compared"] >= 20


def test_the_checkers_catch_wrong_answers(tmp_path: Path) -> None:
    """Each checker the soak's invariants rest on fails on a broken answer."""
    assert soak.check_fault("oversize_length", {"status": 413, "param": None, "code": "request_too_large"}) is None
    assert "status 400" in soak.check_fault("oversize_length", {"status": 400, "param": None, "code": None})
    assert "code" in soak.check_fault("wrong_key", {"status": 401, "param": None, "code": "other"})
    ok = {"status": 400, "param": "top_p", "code": None, "expected_param": "top_p"}
    assert soak.check_fault("out_of_range", ok) is None
    assert "param" in soak.check_fault("out_of_range", {**ok, "param": None})
    assert "status 500" in soak.check_fault("cancel", {"status": 500})
    assert "client error" in soak.check_fault("malformed_json", {"status": None, "exception": "ReadError: "})

    key = soak._key("/v1/completions", {"prompt": "p", "max_tokens": 4, "temperature": 0, "stream": True})
    rec = {"kind": "cmpl_stream", "key": key, "status": 200, "text": "abc"}
    assert soak.compare([rec], {key: "abc"})["mismatches"] == 0
    assert soak.compare([rec], {key: "abd"})["mismatches"] == 1

    good = {"kind": "cmpl_stream", "status": 200, "stream": True, "done": True, "text": "x", "latency_s": 0.1}
    assert soak.summarize([good])["n_undocumented"] == 0
    assert soak.summarize([{**good, "done": False}])["n_undocumented"] == 1
    assert soak.summarize([{**good, "status": 503}])["5xx"] == 1

    log = tmp_path / "server.log"
    log.write_text('INFO:     127.0.0.1:1 - "POST /v1/completions HTTP/1.1" 200 OK\n')
    assert soak.scan_log(log) == {"tracebacks": 0, "5xx_lines": [], "5xx": 0}
    log.write_text(
        'INFO:     127.0.0.1:1 - "POST /v1/completions HTTP/1.1" 500 Internal Server Error\n'
        "Traceback (most recent call last):\n"
    )
    assert soak.scan_log(log)["5xx"] == 1 and soak.scan_log(log)["tracebacks"] == 1
