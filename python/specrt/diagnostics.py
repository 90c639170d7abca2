"""``specrt env``: what specrt would run on, for bug reports (like ``vllm collect-env``).

Collects, without loading a model: specrt, Python and platform versions; which ONNX Runtime distributions are
installed (``onnxruntime``, ``onnxruntime-gpu``: exactly one should be); the ``libonnxruntime`` the Rust side
loads, its version and the execution providers it was built with; whether the CUDA provider library, the CUDA
runtime, cuBLAS and cuDNN load (naming what is missing); the NVIDIA driver, and each GPU's name and memory; and
whether the CUDA provider can really be registered, and so whether ``--provider cuda`` runs on CUDA here or (with
``--allow-fallback``) on the CPU. Every probe reports its own failure instead of raising, so the report is complete on
any machine.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
from typing import Any

from specrt._ort import INSTALL_CPU, INSTALL_CUDA

__all__ = ["INSTALL_CPU", "INSTALL_CUDA", "collect_env", "render_env"]


# Shared libraries the CUDA provider needs, newest soname first (onnxruntime-gpu 1.31 is built for CUDA 13).
_CUDA_LIBRARIES: dict[str, tuple[str, ...]] = {
    "cuda_runtime": ("libcudart.so.13", "libcudart.so.12"),
    "cublas": ("libcublas.so.13", "libcublas.so.12"),
    "cudnn": ("libcudnn.so.9",),
}


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _load(path_or_name: str) -> tuple[bool, str | None]:
    """``dlopen`` a library (``RTLD_GLOBAL`` like ONNX Runtime's own preloading); ``(ok, error)``."""
    try:
        ctypes.CDLL(path_or_name, mode=ctypes.RTLD_GLOBAL)
    except OSError as e:
        return False, str(e)
    return True, None


def _first_loadable(names: tuple[str, ...]) -> dict[str, Any]:
    errors = []
    for name in names:
        ok, err = _load(name)
        if ok:
            return {"loaded": name}
        errors.append(err)
    return {"loaded": None, "error": "; ".join(e for e in errors if e)}


def _onnxruntime_section() -> dict[str, Any]:
    from specrt._ort import ORT_LIBRARY_ENV, cuda_provider_library, find_ort_library

    cpu, gpu = _dist_version("onnxruntime"), _dist_version("onnxruntime-gpu")
    out: dict[str, Any] = {
        "onnxruntime": cpu,
        "onnxruntime_gpu": gpu,
        "override": os.environ.get(ORT_LIBRARY_ENV),
        "problems": [],
    }
    if cpu and gpu:
        out["problems"].append(
            f"both onnxruntime {cpu} and onnxruntime-gpu {gpu} are installed: they share one onnxruntime folder, "
            f"so which library is there depends on install order; uninstall both, then {INSTALL_CPU} or "
            f"{INSTALL_CUDA}"
        )
    try:
        library = find_ort_library("cpu")
    except FileNotFoundError as e:
        out["library"] = None
        out["problems"].append(str(e))
        return out
    out["library"] = library
    out["cuda_provider_library"] = cuda_provider_library(library)
    try:
        from specrt import _specrt

        info = _specrt.runtime_info(library)
        out.update(version=info["version"], providers=info["providers"], build_info=info["build_info"])
        out["loaded_library"] = str(info["library"])
    except Exception as e:  # report, never raise: the report must be complete
        out["problems"].append(f"loading {library}: {type(e).__name__}: {e}")
    return out


def _gpu_section() -> dict[str, Any]:
    """Driver version and per-GPU name and memory: NVML (``nvidia-ml-py``) when installed, else ``nvidia-smi``."""
    try:
        import pynvml  # from nvidia-ml-py, part of specrt[cuda]
    except ImportError:
        pynvml = None
    if pynvml is not None:
        try:
            pynvml.nvmlInit()
            try:
                gpus = []
                for i in range(pynvml.nvmlDeviceGetCount()):
                    h = pynvml.nvmlDeviceGetHandleByIndex(i)
                    mem = pynvml.nvmlDeviceGetMemoryInfo(h)
                    name = pynvml.nvmlDeviceGetName(h)
                    gpus.append(
                        {
                            "index": i,
                            "name": name.decode() if isinstance(name, bytes) else name,
                            "memory_total_bytes": int(mem.total),
                            "memory_free_bytes": int(mem.free),
                        }
                    )
                driver = pynvml.nvmlSystemGetDriverVersion()
                return {
                    "source": "nvml",
                    "driver": driver.decode() if isinstance(driver, bytes) else driver,
                    "gpus": gpus,
                }
            finally:
                pynvml.nvmlShutdown()
        except Exception as e:  # no driver: NVMLError_LibraryNotFound / DriverNotLoaded
            nvml_error = f"NVML: {e}"
    else:
        nvml_error = "nvidia-ml-py not installed"
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return {"source": None, "driver": None, "gpus": [], "error": f"{nvml_error}; no nvidia-smi on PATH"}
    query = "index,name,memory.total,memory.free,driver_version"
    try:
        text = subprocess.run(
            [smi, f"--query-gpu={query}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return {"source": "nvidia-smi", "driver": None, "gpus": [], "error": str(e)}
    gpus, driver = [], None
    for line in text.strip().splitlines():
        index, name, total, free, driver = (x.strip() for x in line.split(","))
        mib = 1 << 20
        gpus.append(
            {
                "index": int(index),
                "name": name,
                "memory_total_bytes": int(float(total)) * mib,
                "memory_free_bytes": int(float(free)) * mib,
            }
        )
    return {"source": "nvidia-smi", "driver": driver, "gpus": gpus}


def _cuda_section(ort: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    provider_lib = ort.get("cuda_provider_library")
    if ort.get("library") is None:
        out["provider_library"] = {"loaded": None, "error": "no ONNX Runtime library"}
        return out
    if provider_lib is None:
        out["provider_library"] = {
            "loaded": None,
            "error": f"no libonnxruntime_providers_cuda.so beside {ort['library']}: this is the CPU build of "
            f"ONNX Runtime; for CUDA: pip uninstall onnxruntime, then {INSTALL_CUDA}",
        }
    # The pip CUDA / cuDNN libraries (site-packages/nvidia/*/lib) loaded as a CUDA run loads them (never importing
    # onnxruntime: its Python module is a second ONNX Runtime).
    from specrt._ort import preload_cuda_dlls

    out["preload"] = preload_cuda_dlls(ort["library"])
    for key, names in _CUDA_LIBRARIES.items():
        out[key] = _first_loadable(names)
    if provider_lib is not None:
        ok, err = _load(provider_lib)
        out["provider_library"] = {"loaded": provider_lib if ok else None, **({} if ok else {"error": err})}
        if ok:
            try:
                from specrt import _specrt

                _specrt.OrtModel.check_cuda(ort["library"], 0)
                out["provider_registers"] = {"ok": True}
            except Exception as e:
                out["provider_registers"] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    return out


def _cuda_usable(cuda: dict[str, Any]) -> dict[str, Any]:
    """Whether ``provider="cuda"`` can run here: ``{"ok": True}``, or ``{"ok": False, "error": why}`` (the first
    failure of the provider library or its registration; ``allow_fallback`` then runs on the CPU)."""
    reg = cuda.get("provider_registers")
    if reg is not None:
        return {"ok": True} if reg["ok"] else {"ok": False, "error": reg["error"]}
    lib = cuda.get("provider_library") or {}
    return {"ok": False, "error": lib.get("error") or "the CUDA provider library did not load"}


def collect_env() -> dict[str, Any]:
    """Collect the environment report (see the module docstring).

    Returns:
        dict with ``specrt``, ``python``, ``platform``, ``onnxruntime`` (distributions, ``library``, ``version``,
        ``providers``, ``problems``), ``cuda`` (per library ``{"loaded": soname or None, "error": ...}``,
        ``preload``: what :func:`specrt._ort.preload_cuda_dlls` loaded, ``provider_registers``, and ``usable``:
        ``{"ok": bool, "error": why not}``, whether ``provider="cuda"`` runs on CUDA) and ``gpu``
        (``driver``, ``gpus``: name, ``memory_total_bytes``, ``memory_free_bytes``). Never raises for a missing
        piece: each failure is reported in its section.
    """
    from specrt import __version__

    ort = _onnxruntime_section()
    cuda = _cuda_section(ort)
    cuda["usable"] = _cuda_usable(cuda)
    return {
        "specrt": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "glibc": "-".join(platform.libc_ver()),
        "onnxruntime": ort,
        "cuda": cuda,
        "gpu": _gpu_section(),
    }


def _lib_line(name: str, entry: dict[str, Any] | None) -> str:
    if entry is None:
        return f"{name}: not checked"
    if entry.get("loaded"):
        return f"{name}: {entry['loaded']}"
    return f"{name}: MISSING ({entry.get('error') or 'not found'})"


def _preload_lines(report: dict[str, Any] | None) -> list[str]:
    """The pip CUDA / cuDNN libraries :func:`specrt._ort.preload_cuda_dlls` loaded, and what failed."""
    if report is None:
        return []
    loaded = report.get("loaded") or []
    if not report.get("directories"):
        head = "pip CUDA libraries (site-packages/nvidia/*/lib): none installed"
    else:
        major = report.get("cuda_major")
        head = f"pip CUDA libraries (CUDA {major or '?'}) preloaded: " + (
            ", ".join(os.path.basename(p) for p in loaded) or "none"
        )
    lines = [head]
    lines.extend(f"  failed to load {path}: {err}" for path, err in (report.get("failed") or {}).items())
    if report.get("directories") and report.get("not_found"):
        lines.append(f"  not in site-packages/nvidia: {', '.join(report['not_found'])}")
    return lines


def render_env(env: dict[str, Any], *, as_json: bool = False) -> str:
    """The report as text (paste it into a bug report) or JSON."""
    if as_json:
        return json.dumps(env, indent=2, sort_keys=True)
    ort, cuda, gpu = env["onnxruntime"], env["cuda"], env["gpu"]
    lines = [
        f"specrt: {env['specrt']}",
        f"python: {env['python']}",
        f"platform: {env['platform']} ({env['glibc']})",
        f"onnxruntime (CPU build) installed: {ort.get('onnxruntime') or 'no'}",
        f"onnxruntime-gpu installed: {ort.get('onnxruntime_gpu') or 'no'}",
        f"libonnxruntime: {ort.get('library') or 'NOT FOUND'}",
        f"libonnxruntime version: {ort.get('version') or 'unknown'}",
        f"execution providers built in: {', '.join(ort.get('providers') or []) or 'unknown'}",
        _lib_line("CUDA provider library", cuda.get("provider_library")),
        _lib_line("CUDA runtime", cuda.get("cuda_runtime")),
        _lib_line("cuBLAS", cuda.get("cublas")),
        _lib_line("cuDNN", cuda.get("cudnn")),
    ]
    lines.extend(_preload_lines(cuda.get("preload")))
    reg = cuda.get("provider_registers")
    if reg is not None:
        lines.append("CUDA provider registers: " + ("yes" if reg["ok"] else f"NO ({reg['error']})"))
    usable = cuda.get("usable")
    if usable is not None:
        lines.append(
            "--provider cuda: available"
            if usable["ok"]
            else "--provider cuda: fails here, or with --allow-fallback runs on the CPU (CUDA cannot be used: "
            f"{usable['error']})"
        )
    lines.append(f"NVIDIA driver: {gpu.get('driver') or 'none found'}")
    lines.extend(
        f"GPU {g['index']}: {g['name']}, {g['memory_total_bytes'] / 2**30:.1f} GiB "
        f"({g['memory_free_bytes'] / 2**30:.1f} GiB free)"
        for g in gpu.get("gpus", [])
    )
    if not gpu.get("gpus"):
        lines.append(f"GPUs: none ({gpu.get('error', 'no NVIDIA GPU visible')})")
    lines.extend(f"PROBLEM: {p}" for p in ort.get("problems", []))
    return "\n".join(lines)
