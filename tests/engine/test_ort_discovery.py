"""One ONNX Runtime per process, and a CUDA request refused before any work (issue 39).

specrt never imports the ``onnxruntime`` Python package: its native module ``onnxruntime_pybind11_state`` is a second
ONNX Runtime core, and one that was not the library specrt runs crashed every CUDA process on a GPU machine. The CUDA
libraries ``onnxruntime.preload_dlls()`` would load are loaded by ``specrt._ort.preload_cuda_dlls`` itself, and the
bench's version record comes from the library's file name. These tests run specrt's CUDA paths in fresh processes
(this test process has onnxruntime imported by other tests' oracles) and look at ``sys.modules`` and
``/proc/self/maps``.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import specrt
from specrt import _ort, cli, models
from specrt._ort import cuda_provider_library, find_ort_library, ort_version, preload_cuda_dlls
from specrt.convert import convert
from specrt.convert.tiny import write_tiny_gguf
from specrt.diagnostics import _preload_lines
from specrt.errors import ProviderError

REPO = Path(__file__).resolve().parents[2]
ON_CPU_WHEEL = cuda_provider_library(find_ort_library()) is None
needs_cpu_wheel = pytest.mark.skipif(not ON_CPU_WHEEL, reason="onnxruntime-gpu installed: see tests/gpu/test_gpu.py")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("discovery")
    gguf = write_tiny_gguf(root / "tiny.gguf", arch="qwen2", seed=1, n_layers=1)
    return convert(gguf, root / "tiny", progress=False)


_CUDA_PATHS = textwrap.dedent(
    """
    import json, sys

    import specrt
    import specrt.bench.runner
    import specrt.cli
    from specrt import diagnostics
    from specrt._ort import cuda_provider_library, find_ort_library
    from specrt._specrt import OrtModel
    from specrt.errors import ProviderError

    model = sys.argv[1]
    out = {}
    library = find_ort_library("cuda")
    out["gpu_build"] = cuda_provider_library(library) is not None
    try:
        specrt.Decoder(model, provider="cuda")
        out["decoder"] = "ok"
    except ProviderError as e:
        out["decoder"] = "ProviderError: " + str(e)
    # The late path: Rust registers the CUDA provider (preloading through specrt._ort) and falls back to the CPU.
    out["fallback_providers"] = specrt.Decoder(model, provider="cuda", allow_fallback=True).providers
    # `specrt env`, in this process.
    out["env"] = diagnostics.render_env(diagnostics.collect_env())
    out["machine_onnxruntime"] = specrt.bench.runner._machine("cuda")["onnxruntime"]
    out["modules"] = sorted(m for m in sys.modules if m == "onnxruntime" or m.startswith("onnxruntime."))
    with open("/proc/self/maps") as f:
        out["maps"] = sorted({line.split()[-1] for line in f if "onnxruntime_pybind11_state" in line})
    print(json.dumps(out))
    """
)


def test_specrt_cuda_paths_never_load_the_onnxruntime_python_module(tiny_model: Path) -> None:
    res = subprocess.run(
        [sys.executable, "-c", _CUDA_PATHS, str(tiny_model)], capture_output=True, text=True, timeout=300, check=False
    )
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    if not out["gpu_build"]:
        assert out["decoder"].startswith("ProviderError: ") and "libonnxruntime_providers_cuda.so" in out["decoder"]
        assert out["fallback_providers"] == ["CPUExecutionProvider"]
    assert "libonnxruntime version:" in out["env"] and "pip CUDA libraries" in out["env"]
    assert out["machine_onnxruntime"] == ort_version(find_ort_library())
    # The point: no second ONNX Runtime, neither the Python module nor its native library.
    assert "onnxruntime" not in out["modules"], out["modules"]
    assert "onnxruntime.capi.onnxruntime_pybind11_state" not in out["modules"], out["modules"]
    assert out["modules"] == [], out["modules"]
    assert out["maps"] == [], out["maps"]


def test_specrt_sources_never_import_onnxruntime() -> None:
    # The peer scripts run in the onnxruntime-genai venv, in processes that never import specrt.
    pattern = re.compile(r"^\s*(?:import|from)\s+onnxruntime(?:\.|\s|$)|import_module\(\s*['\"]onnxruntime['\"]", re.M)
    offenders = [
        str(path.relative_to(REPO))
        for path in sorted((REPO / "python" / "specrt").rglob("*.py"))
        if "peer_scripts" not in path.parts and pattern.search(path.read_text(encoding="utf-8"))
    ]
    assert offenders == []


# ------------------------------------------------------------------------------------ preloading the pip libraries

_PRELOAD = textwrap.dedent(
    """
    import json, sys
    from specrt._ort import preload_cuda_dlls
    print(json.dumps(preload_cuda_dlls(sys.argv[1])))
    """
)


def _shared_library(cc: str, path: Path, *needed: Path) -> None:
    src = path.parent / f"{path.name}.c"
    src.write_text(f"int {re.sub(r'[^a-z]', '_', path.name)}(void) {{ return 1; }}\n")
    link = ["-Wl,--no-as-needed", *(f"-L{n.parent}" for n in needed), *(f"-l:{n.name}" for n in needed)]
    subprocess.run([cc, "-shared", "-fPIC", f"-Wl,-soname,{path.name}", "-o", str(path), str(src), *link], check=True)
    src.unlink()


def test_preload_loads_the_pip_cuda_libraries_in_any_order_and_reports_failures(tmp_path: Path) -> None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build stand-in libraries")
    site = tmp_path / "site-packages"
    capi = site / "onnxruntime" / "capi"
    capi.mkdir(parents=True)
    (capi / "libonnxruntime.so.1.32.0").write_bytes(b"")  # only its folder is read
    (capi / "build_and_package_info.py").write_text("package_name = 'onnxruntime-gpu'\ncuda_version = '13.0'\n")
    cu13 = site / "nvidia" / "cu13" / "lib"
    cudnn = site / "nvidia" / "cudnn" / "lib"
    cu13.mkdir(parents=True)
    cudnn.mkdir(parents=True)
    # libcudart (loaded first) needs libcublas (loaded later) and has no RUNPATH: it loads on the second pass.
    _shared_library(cc, cu13 / "libcublasLt.so.13")
    _shared_library(cc, cu13 / "libcublas.so.13", cu13 / "libcublasLt.so.13")
    _shared_library(cc, cu13 / "libcudart.so.13", cu13 / "libcublas.so.13")
    _shared_library(cc, cudnn / "libcudnn.so.9")
    (cudnn / "libcudnn_graph.so.9").write_bytes(b"not a shared library")
    res = subprocess.run(
        [sys.executable, "-c", _PRELOAD, str(capi / "libonnxruntime.so.1.32.0")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert report["cuda_major"] == 13
    assert report["directories"][:2] == [str(cu13), str(cudnn)]
    assert [os.path.basename(p) for p in report["loaded"]] == [
        "libcublasLt.so.13",
        "libcublas.so.13",
        "libcudnn.so.9",
        "libcudart.so.13",
    ]
    assert list(report["failed"]) == [str(cudnn / "libcudnn_graph.so.9")]
    assert report["failed"][str(cudnn / "libcudnn_graph.so.9")]  # the loader's reason
    assert report["not_found"] == ["libnvrtc.so.13", "libcurand.so.10", "libcufft.so.12"]
    text = "\n".join(_preload_lines(report))
    assert "pip CUDA libraries (CUDA 13) preloaded: libcublasLt.so.13, libcublas.so.13" in text
    assert f"failed to load {cudnn / 'libcudnn_graph.so.9'}" in text and "libcufft.so.12" in text


def test_preload_without_pip_cuda_libraries_reports_and_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_ort, "_site_dirs", lambda first=None: [])
    report = preload_cuda_dlls("/nonexistent/libonnxruntime.so.1.32.0")
    assert report["directories"] == [] and report["loaded"] == [] and report["failed"] == {}
    assert _preload_lines(report) == ["pip CUDA libraries (site-packages/nvidia/*/lib): none installed"]

    def broken(first: str | None = None) -> list[str]:
        raise PermissionError("site-packages unreadable")

    monkeypatch.setattr(_ort, "_site_dirs", broken)
    assert "site-packages unreadable" in preload_cuda_dlls()["failed"]["(search)"]


def test_ort_version_is_the_loaded_library_file_name(tmp_path: Path) -> None:
    assert ort_version(str(tmp_path / "libonnxruntime.so.1.40.1")) == "1.40.1"
    (tmp_path / "libonnxruntime.so.1.41.0").write_bytes(b"")
    (tmp_path / "libonnxruntime.so").symlink_to("libonnxruntime.so.1.41.0")
    assert ort_version(str(tmp_path / "libonnxruntime.so")) == "1.41.0"
    # No version in the name: the installed distribution's.
    dist = "onnxruntime" if ON_CPU_WHEEL else "onnxruntime-gpu"
    assert ort_version(str(tmp_path / "custom.so")) == importlib.metadata.version(dist)
    assert ort_version() == Path(find_ort_library()).name.split(".so.", 1)[1]


# ------------------------------------------------------------------------------------------- refuse before work

MODEL_NAME = "smollm2-135m-instruct"


@pytest.fixture
def no_pulls(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """An empty model cache, and any pull, download or conversion fails the test."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("SPECRT_CACHE_DIR", str(cache))
    monkeypatch.delenv(_ort.ORT_LIBRARY_ENV, raising=False)

    def pulled(*a: object, **k: object) -> None:
        pytest.fail(f"a model was pulled before the provider was checked: {a}")

    for fn in ("pull", "_pull_into", "_fetch_gguf", "_pip_download"):
        monkeypatch.setattr(models, fn, pulled)
    assert MODEL_NAME in models.MODELS and not models.model_dir(MODEL_NAME).exists()
    return cache


def _empty(cache: Path) -> bool:
    return not cache.exists() or not any(cache.rglob("*"))


@needs_cpu_wheel
def test_cuda_decoder_on_the_cpu_build_refuses_before_pulling(no_pulls: Path) -> None:
    start = time.monotonic()
    with pytest.raises(ProviderError, match=r"libonnxruntime_providers_cuda\.so.*specrt\[cuda\]"):
        specrt.Decoder(MODEL_NAME, provider="cuda")
    with pytest.raises(ProviderError, match=r"libonnxruntime_providers_cuda\.so"):
        specrt.Decoder(MODEL_NAME, MODEL_NAME, provider="CUDAExecutionProvider", ort_library=find_ort_library())
    assert time.monotonic() - start < 10
    assert _empty(no_pulls)


@needs_cpu_wheel
def test_cli_generate_with_cuda_on_the_cpu_build_refuses_before_pulling(
    no_pulls: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(["generate", "--target", MODEL_NAME, "--prompt", "hi", "--provider", "cuda"])
    assert code == 2
    err = capsys.readouterr().err
    assert "specrt: error:" in err and "libonnxruntime_providers_cuda.so" in err and "specrt[cuda]" in err
    assert _empty(no_pulls)
