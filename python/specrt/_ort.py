"""Locate the ONNX Runtime shared library that the Rust backend loads (``ort`` with ``load-dynamic``).

The Rust side ``dlopen``s ``libonnxruntime.so.1.x`` by absolute path. We use the copy shipped inside the installed
``onnxruntime`` (CPU) or ``onnxruntime-gpu`` wheel: ``<onnxruntime package>/capi/libonnxruntime.so.1.x``. Its CUDA
provider library (``libonnxruntime_providers_cuda.so``, GPU wheel only) sits beside it and is found by ONNX Runtime
from there. ``SPECRT_ORT_LIBRARY`` overrides the search.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import re

__all__ = [
    "INSTALL_CPU",
    "INSTALL_CUDA",
    "ORT_LIBRARY_ENV",
    "cuda_provider_library",
    "find_ort_library",
    "preload_cuda_dlls",
]

#: Install line of specrt with the CPU build of ONNX Runtime.
INSTALL_CPU = "pip install 'specrt[cpu]'"
#: Install line of specrt with the CUDA build of ONNX Runtime (CUDA 13 and cuDNN 9 from pip).
INSTALL_CUDA = "pip install 'specrt[cuda]'"

#: Environment variable naming the library explicitly (an absolute path).
ORT_LIBRARY_ENV = "SPECRT_ORT_LIBRARY"

_CUDA_PROVIDER = "libonnxruntime_providers_cuda.so"


def _version_key(path: str) -> tuple[int, ...]:
    """Sort key: the numeric suffix of ``libonnxruntime.so.1.32.0`` -> ``(1, 32, 0)``."""
    suffix = os.path.basename(path).split(".so", 1)[-1]
    return tuple(int(n) for n in re.findall(r"\d+", suffix))


def _onnxruntime_capi_dir() -> str | None:
    """The wheel's ``capi`` folder, found without importing onnxruntime (importing it loads a second ORT copy)."""
    spec = importlib.util.find_spec("onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.join(next(iter(spec.submodule_search_locations)), "capi")


def find_ort_library(provider: str = "cpu") -> str:
    """Return the absolute path of ``libonnxruntime.so.1.x`` for the Rust backend.

    Order: ``$SPECRT_ORT_LIBRARY`` if set (must exist), else the newest ``libonnxruntime.so.1*`` in the installed
    onnxruntime wheel's ``capi/`` folder. When ``provider == "cuda"`` and ``onnxruntime.preload_dlls`` exists
    (onnxruntime >= 1.21), it is called first so that the pip-installed CUDA/cuDNN libraries
    (``site-packages/nvidia/*/lib``) are loaded before the Rust side registers the CUDA provider.

    Args:
        provider: ``"cpu"`` or ``"cuda"``.

    Returns:
        Absolute path (str).

    Raises:
        FileNotFoundError: the override does not exist, no ONNX Runtime is installed (the message names both
            install lines, ``specrt[cpu]`` and ``specrt[cuda]``), or its wheel has no ``libonnxruntime.so.1*``.
    """
    override = os.environ.get(ORT_LIBRARY_ENV)
    if override:
        path = os.path.abspath(os.path.expanduser(override))
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{ORT_LIBRARY_ENV}={override!r}: no such file {path}")
        library = path
    else:
        capi = _onnxruntime_capi_dir()
        if capi is None:
            raise FileNotFoundError(
                "ONNX Runtime is not installed (specrt depends on neither build; pick one): "
                f"{INSTALL_CPU} for the CPU build, or {INSTALL_CUDA} for the CUDA build; "
                f"or set {ORT_LIBRARY_ENV} to the absolute path of libonnxruntime.so.1.x"
            )
        candidates = sorted(glob.glob(os.path.join(capi, "libonnxruntime.so.1*")), key=_version_key)
        if not candidates:
            raise FileNotFoundError(
                f"no libonnxruntime.so.1* in {capi} (a broken or unusual onnxruntime install?); "
                f"set {ORT_LIBRARY_ENV} to the absolute path of libonnxruntime.so.1.x"
            )
        library = os.path.abspath(candidates[-1])
    if provider.strip().lower() in ("cuda", "gpu", "cudaexecutionprovider"):
        preload_cuda_dlls()
    return library


def cuda_provider_library(ort_library: str) -> str | None:
    """Path of ``libonnxruntime_providers_cuda.so`` beside ``ort_library`` if present (GPU wheel), else ``None``."""
    path = os.path.join(os.path.dirname(ort_library), _CUDA_PROVIDER)
    return path if os.path.isfile(path) else None


def preload_cuda_dlls() -> None:
    """Call ``onnxruntime.preload_dlls()`` when it exists (ORT >= 1.21); a no-op otherwise.

    This imports onnxruntime (its own ORT copy is loaded too; harmless as long as the Rust side owns every CUDA
    session object, see stack.md §1.4).
    """
    try:
        import onnxruntime
    except ImportError:
        return
    preload = getattr(onnxruntime, "preload_dlls", None)
    if preload is not None:
        try:
            preload()
        except Exception:  # the Rust side reports what is really missing, naming it
            return
