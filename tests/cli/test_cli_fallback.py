"""``--provider cuda --allow-fallback`` on a machine where CUDA cannot be used says so on stderr, in one line naming
why, and generates on the CPU (on a tiny random-weight qwen2 model)."""

from __future__ import annotations

from pathlib import Path

import pytest

from specrt import cli
from specrt._ort import cuda_provider_library, find_ort_library

ON_CPU_WHEEL = cuda_provider_library(find_ort_library()) is None


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from specrt.convert import convert
    from specrt.convert.tiny import write_tiny_gguf

    root = tmp_path_factory.mktemp("tiny-fallback")
    return convert(write_tiny_gguf(root / "t.gguf", arch="qwen2", seed=3, n_layers=1), root / "model", progress=False)


@pytest.mark.skipif(not ON_CPU_WHEEL, reason="the CUDA build is installed: CUDA may really run here")
def test_generate_with_cuda_fallback_says_on_stderr_why_it_runs_on_the_cpu(
    tiny_target: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["generate", "--target", str(tiny_target), "--prompt", "hi", "--max-new-tokens", "2", "--temperature", "0"]
    assert cli.main([*argv, "--provider", "cuda", "--allow-fallback"]) == 0
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if "--allow-fallback" in x]
    assert len(lines) == 1, f"one line on stderr says that it fell back to the CPU: {err!r}"
    line = lines[0]
    assert line.startswith("specrt generate: warning: running on the CPU, not CUDA (--allow-fallback): ")
    # The reason is the CUDA check's: the CPU build has no CUDA provider library.
    assert "libonnxruntime_providers_cuda.so" in line, line
    # Asked for the CPU, nothing is said.
    assert cli.main([*argv, "--provider", "cpu"]) == 0
    assert "CUDA" not in capsys.readouterr().err
