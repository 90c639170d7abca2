"""The README's examples stay true: its ``curl`` request to ``specrt serve`` answers deterministically, and its Rust
example runs from the checkout right after ``make install`` with nothing set (libonnxruntime found through the
checkout's ``.venv``). Both on SmolLM2-135M from the cache (skipped when it is not there)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _smollm2_folder() -> Path:
    from specrt.models import cache_dir

    folder = cache_dir() / "models" / "smollm2-135m-instruct" / "fp32"
    if not (folder / "model.onnx").is_file():
        pytest.skip("SmolLM2 fp32 is not in the cache (specrt models pull smollm2-135m-instruct)")
    return folder


def _command_after(marker: str) -> tuple[str, str]:
    """The README's shell command that starts with ``marker`` (its continuation lines joined) and the line after."""
    lines = README.splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith(marker))
    parts = []
    while True:
        parts.append(lines[i].rstrip("\\").strip())
        i += 1
        if not lines[i - 1].endswith("\\"):
            return " ".join(parts), lines[i]


def test_the_readme_curl_example_answers_the_same_every_time() -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    import specrt
    from specrt.server import create_app

    cmd, comment = _command_after("curl -s localhost:8000/v1/chat/completions")
    argv = shlex.split(cmd)
    body = json.loads(argv[argv.index("-d") + 1])
    assert body.get("temperature") == 0, "the README's request must be greedy to answer deterministically"
    dec = specrt.Decoder(_smollm2_folder(), max_seq_len=512)
    with TestClient(create_app(dec, model_name="smollm2-135m-instruct")) as c:
        answers = [c.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]["content"] for _ in "ab"]
    assert answers[0] == answers[1]
    # What the README says it answers.
    said = re.match(r'# -> "([^"]+)"', comment)
    assert said, f"the line after the curl example says what it answers: {comment!r}"
    assert answers[0].strip() == said.group(1)


def test_the_readme_rust_example_finds_onnxruntime_from_the_checkout_with_nothing_set() -> None:
    folder = _smollm2_folder()
    if shutil.which("cargo") is None or not (ROOT / ".venv" / "bin" / "python").exists():
        pytest.skip("needs cargo and the checkout's .venv (make install)")
    cmd, _ = _command_after("cargo run --release -p specrt-ort --example generate")
    argv = [os.path.expanduser(a) for a in shlex.split(cmd)]
    argv[argv.index("--target") + 1] = str(folder)  # the cache may be elsewhere ($SPECRT_CACHE_DIR)
    env = {k: v for k, v in os.environ.items() if k not in ("SPECRT_ORT_LIBRARY", "ORT_DYLIB_PATH", "SPECRT_PYTHON")}
    env.pop("VIRTUAL_ENV", None)
    # A PATH whose python3 has no onnxruntime (as on a fresh machine): the checkout's .venv must be found.
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if not p.startswith(str(ROOT / ".venv")))
    out = subprocess.run([*argv, "--max-new-tokens", "8"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Paris" in out.stdout, out.stdout
