"""CPU-side tests of the CUDA path's choices: the extras, library discovery, ``specrt env`` and the memory plan.

The GPU runs of the same choices are in ``tests/gpu/test_gpu.py`` (marked ``gpu``).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specrt import _ort, diagnostics
from specrt._ort import INSTALL_CPU, INSTALL_CUDA, cuda_provider_library, find_ort_library
from specrt._specrt import OrtModel

REPO = Path(__file__).resolve().parents[2]
ON_CPU_WHEEL = cuda_provider_library(find_ort_library()) is None


def _requirement_names(reqs: list[str]) -> set[str]:
    return {r.split("[")[0].split(">")[0].split("=")[0].split("<")[0].strip().lower() for r in reqs}


def test_base_package_depends_on_neither_onnxruntime_build_and_each_extra_pulls_one() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    base = _requirement_names(project["dependencies"])
    assert not base & {"onnxruntime", "onnxruntime-gpu"}, base
    extras = project["optional-dependencies"]
    assert _requirement_names(extras["cpu"]) == {"onnxruntime"}
    assert "onnxruntime-gpu" in _requirement_names(extras["cuda"])
    assert "onnxruntime" not in _requirement_names(extras["cuda"])
    # The CUDA build must bring the CUDA runtime and cuDNN from pip, and claim nothing older than what ran on a GPU.
    (gpu_req,) = [r for r in extras["cuda"] if r.startswith("onnxruntime-gpu")]
    assert "[cuda,cudnn]" in gpu_req and ">=1.31.1" in gpu_req


def test_readme_and_ci_install_the_cpu_extra() -> None:
    makefile = (REPO / "Makefile").read_text()
    assert "'.[cpu,test]'" in makefile
    readme = (REPO / "README.md").read_text()
    assert INSTALL_CUDA in readme and "--provider cuda" in readme


def test_no_onnxruntime_installed_is_an_error_naming_both_install_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(_ort.ORT_LIBRARY_ENV, raising=False)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnxruntime" else real(name, *a))
    with pytest.raises(FileNotFoundError) as info:
        find_ort_library()
    assert INSTALL_CPU in str(info.value) and INSTALL_CUDA in str(info.value)


def test_memory_plan_never_binds_an_output_to_cuda_pinned_memory() -> None:
    # onnxruntime#29713: logits bound to CUDA-pinned host memory failed the first CUDA run.
    assert OrtModel.planned_memory("cuda") == {"kv_cache": "cuda_device", "logits": "host", "inputs": "host"}
    assert OrtModel.planned_memory("cpu") == {"kv_cache": "host", "logits": "host", "inputs": "host"}
    with pytest.raises(ValueError, match="provider 'tpu' is invalid"):
        OrtModel.planned_memory("tpu")


def test_runtime_info_names_the_loaded_library_its_version_and_providers() -> None:
    from specrt import _specrt

    lib = find_ort_library()
    info = _specrt.runtime_info(lib)
    assert Path(info["library"]) == Path(lib).resolve()
    assert "CPUExecutionProvider" in info["providers"]
    dist = "onnxruntime" if ON_CPU_WHEEL else "onnxruntime-gpu"
    assert info["version"] == importlib.metadata.version(dist)
    assert ("CUDAExecutionProvider" in info["providers"]) == (not ON_CPU_WHEEL)


@pytest.mark.skipif(not ON_CPU_WHEEL, reason="the GPU build is installed: see tests/gpu/test_gpu.py")
def test_env_report_on_the_cpu_wheel_names_the_gpu_install_line() -> None:
    env = diagnostics.collect_env()
    ort = env["onnxruntime"]
    assert ort["onnxruntime"] == importlib.metadata.version("onnxruntime")
    assert ort["library"] == find_ort_library()
    assert ort["version"] == ort["onnxruntime"]
    assert ort["providers"][-1] == "CPUExecutionProvider"
    missing = env["cuda"]["provider_library"]
    assert missing["loaded"] is None and INSTALL_CUDA in missing["error"]
    assert env["python"] == sys.version.split()[0]
    text = diagnostics.render_env(env)
    assert f"libonnxruntime: {find_ort_library()}" in text
    assert "CUDA provider library: MISSING" in text and INSTALL_CUDA in text
    assert env["cuda"]["usable"] == {"ok": False, "error": missing["error"]}
    said = "--provider cuda: fails here, or with --allow-fallback runs on the CPU (CUDA cannot be used: "
    assert f"{said}{missing['error']})" in text.splitlines()
    assert json.loads(diagnostics.render_env(env, as_json=True)) == json.loads(json.dumps(env))


def test_env_report_says_whether_provider_cuda_runs_on_cuda_or_falls_back() -> None:
    env = diagnostics.collect_env()
    registered = {"loaded": "libonnxruntime_providers_cuda.so"}
    env["cuda"] = {"provider_library": registered, "provider_registers": {"ok": True}}
    env["cuda"]["usable"] = diagnostics._cuda_usable(env["cuda"])
    assert "--provider cuda: available" in diagnostics.render_env(env).splitlines()
    env["cuda"] = {
        "provider_library": registered,
        "provider_registers": {"ok": False, "error": "ProviderError: no GPU"},
    }
    env["cuda"]["usable"] = diagnostics._cuda_usable(env["cuda"])
    assert env["cuda"]["usable"] == {"ok": False, "error": "ProviderError: no GPU"}
    assert (
        "with --allow-fallback runs on the CPU (CUDA cannot be used: ProviderError: no GPU)"
        in diagnostics.render_env(env)
    )


def test_env_report_flags_both_builds_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    versions = {"onnxruntime": "1.32.0", "onnxruntime-gpu": "1.31.1"}
    monkeypatch.setattr(diagnostics, "_dist_version", versions.get)
    problems = diagnostics.collect_env()["onnxruntime"]["problems"]
    assert any("both onnxruntime 1.32.0 and onnxruntime-gpu 1.31.1" in p for p in problems), problems


def test_env_report_without_onnxruntime_still_completes(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(provider: str = "cpu") -> str:
        raise FileNotFoundError(f"ONNX Runtime is not installed: {INSTALL_CPU} or {INSTALL_CUDA}")

    monkeypatch.setattr(_ort, "find_ort_library", missing)
    env = diagnostics.collect_env()
    assert env["onnxruntime"]["library"] is None
    assert env["cuda"]["provider_library"]["loaded"] is None
    text = diagnostics.render_env(env)
    assert "libonnxruntime: NOT FOUND" in text and f"PROBLEM: ONNX Runtime is not installed: {INSTALL_CPU}" in text


def test_env_command_prints_the_report_and_json() -> None:
    exe = Path(sys.executable).parent / "specrt"
    out = subprocess.run([str(exe), "env"], capture_output=True, text=True, timeout=120, check=True).stdout
    assert "libonnxruntime version:" in out and "execution providers built in:" in out
    raw = subprocess.run([str(exe), "env", "--json"], capture_output=True, text=True, timeout=120, check=True).stdout
    assert json.loads(raw)["onnxruntime"]["library"]


GPU_BUILD_LIBRARY = os.environ.get("SPECRT_TEST_ORT_GPU_LIBRARY")


@pytest.mark.skipif(GPU_BUILD_LIBRARY is None, reason="set SPECRT_TEST_ORT_GPU_LIBRARY to an onnxruntime-gpu library")
def test_gpu_build_without_a_gpu_reports_the_cuda_provider_and_a_provider_error(tmp_path: Path) -> None:
    # One ONNX Runtime per process: load the GPU build in a child process.
    code = (
        "import json, sys\n"
        "from specrt import _specrt\n"
        "info = _specrt.runtime_info(sys.argv[1])\n"
        "try:\n"
        "    _specrt.OrtModel.check_cuda(sys.argv[1])\n"
        "    err = None\n"
        "except _specrt.ProviderError as e:\n"
        "    err = str(e)\n"
        "print(json.dumps({'providers': info['providers'], 'version': info['version'], 'error': err}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(GPU_BUILD_LIBRARY)], capture_output=True, text=True, timeout=300, check=True
    ).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert "CUDAExecutionProvider" in result["providers"]
    assert result["error"] is not None and "CUDA execution provider could not be registered" in result["error"]
