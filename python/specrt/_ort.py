"""Locate the ONNX Runtime shared library that the Rust backend loads (``ort`` with ``load-dynamic``).

The Rust side ``dlopen``s ``libonnxruntime.so.1.x`` by absolute path, found by Rust's one search
(``specrt_ort::discover``, :func:`find_ort_library`): usually the copy shipped inside the installed ``onnxruntime``
(CPU) or ``onnxruntime-gpu`` wheel, ``<onnxruntime package>/capi/libonnxruntime.so.1.x``. Its CUDA provider library
(``libonnxruntime_providers_cuda.so``, GPU wheel only) sits beside it and is found by ONNX Runtime from there.
``SPECRT_ORT_LIBRARY`` overrides the search.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import importlib.metadata
import importlib.util
import os
import re
import site
import sys
from typing import Any

__all__ = [
    "INSTALL_CPU",
    "INSTALL_CUDA",
    "ORT_LIBRARY_ENV",
    "check_cuda",
    "cuda_provider_library",
    "find_ort_library",
    "is_cuda",
    "ort_version",
    "preload_cuda_dlls",
]

#: Install line of specrt with the CPU build of ONNX Runtime.
INSTALL_CPU = "pip install 'specrt[cpu]'"
#: Install line of specrt with the CUDA build of ONNX Runtime (CUDA 13 and cuDNN 9 from pip).
INSTALL_CUDA = "pip install 'specrt[cuda]'"

#: Environment variable naming the library explicitly (an absolute path).
ORT_LIBRARY_ENV = "SPECRT_ORT_LIBRARY"

_CUDA_PROVIDER = "libonnxruntime_providers_cuda.so"


def _onnxruntime_package_dir() -> str | None:
    """The installed onnxruntime package folder, found without importing it (importing it loads a second ORT copy)."""
    spec = importlib.util.find_spec("onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        return None
    return next(iter(spec.submodule_search_locations))


def _onnxruntime_capi_dir() -> str | None:
    """The wheel's ``capi`` folder (its libraries), or None without onnxruntime."""
    package = _onnxruntime_package_dir()
    return None if package is None else os.path.join(package, "capi")


def find_ort_library(provider: str = "cpu") -> str:
    """Return the absolute path of ``libonnxruntime.so.1.x`` for the Rust backend.

    The search is Rust's, the one a Rust program's ``specrt_ort::find_ort_library`` makes
    (``specrt_ort::discover``): ``$SPECRT_ORT_LIBRARY`` if set (must exist), ``$ORT_DYLIB_PATH`` likewise, the
    newest ``libonnxruntime.so.1*`` in this interpreter's onnxruntime wheel (``capi/``), then the system library
    folders. When ``provider`` is CUDA, :func:`preload_cuda_dlls` loads the pip-installed CUDA/cuDNN libraries
    (``site-packages/nvidia/*/lib``) first, so that they are there when the Rust side registers the CUDA provider.

    Args:
        provider: ``"cpu"`` or ``"cuda"``.

    Returns:
        Absolute path (str).

    Raises:
        ModelFileNotFoundError (a FileNotFoundError): a variable names no file, or no ONNX Runtime is found (the
            message lists every place searched and names both install lines, ``specrt[cpu]`` and ``specrt[cuda]``).
    """
    from specrt import _specrt

    install = (
        "ONNX Runtime is not installed (specrt depends on neither build; pick one): "
        f"{INSTALL_CPU} for the CPU build, or {INSTALL_CUDA} for the CUDA build; "
        f"or set {ORT_LIBRARY_ENV} to the absolute path of libonnxruntime.so.1.x"
    )
    library = str(_specrt.find_ort_library(_onnxruntime_package_dir(), install))
    if is_cuda(provider):
        preload_cuda_dlls(library)
    return library


def is_cuda(provider: str) -> bool:
    """Whether ``provider`` names the CUDA provider (the names Rust's ``Provider`` parses as CUDA)."""
    return provider.strip().lower() in ("cuda", "gpu", "cudaexecutionprovider")


def cuda_provider_library(ort_library: str) -> str | None:
    """Path of ``libonnxruntime_providers_cuda.so`` beside ``ort_library`` if present (GPU wheel), else ``None``."""
    path = os.path.join(os.path.dirname(ort_library), _CUDA_PROVIDER)
    return path if os.path.isfile(path) else None


def check_cuda(ort_library: str | None = None, device_id: int = 0) -> str:
    """Fail before any work (pulling, converting, loading a model) when the CUDA provider cannot run here.

    Loads the library (``find_ort_library("cuda")`` unless ``ort_library`` is given; the pip CUDA libraries are
    preloaded either way) and asks the Rust side whether the CUDA provider registers: the same check, and the same
    ``ProviderError`` message, as creating a CUDA session later.

    Returns:
        The library path.

    Raises:
        ProviderError: the CPU build of ONNX Runtime (no ``libonnxruntime_providers_cuda.so``: the message says
            ``pip install 'specrt[cuda]'``), no GPU or driver, or missing CUDA / cuDNN libraries.
        FileNotFoundError: no ONNX Runtime is installed (the message names both install lines).
    """
    from specrt import _specrt

    if ort_library is None:
        ort_library = find_ort_library("cuda")
    else:
        preload_cuda_dlls(ort_library)
    _specrt.OrtModel.check_cuda(ort_library, device_id)
    return ort_library


def ort_version(ort_library: str | None = None) -> str | None:
    """Version of the ONNX Runtime specrt loads, without importing onnxruntime.

    The version in the library's file name (``libonnxruntime.so.1.32.0`` -> ``"1.32.0"``, following a symlink), else
    that of the installed distribution (``onnxruntime-gpu``, then ``onnxruntime``), else ``None``.
    """
    if ort_library is None:
        try:
            ort_library = find_ort_library()
        except FileNotFoundError:
            ort_library = None
    if ort_library is not None:
        for name in (os.path.basename(ort_library), os.path.basename(os.path.realpath(ort_library))):
            m = re.fullmatch(r"libonnxruntime\.so\.(\d+\.\d+\.\d+)", name)
            if m:
                return m.group(1)
    return next((v for v in map(_dist_version, ("onnxruntime-gpu", "onnxruntime")) if v), None)


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


# ----- pip CUDA / cuDNN libraries --------------------------------------------------------------------------------
#
# What onnxruntime.preload_dlls() (onnxruntime/__init__.py, 1.32) loads on Linux, from the site-packages folder that
# holds onnxruntime: for CUDA >= 13 the consolidated ``nvidia/cu<major>/lib`` folder, before that one folder per
# component (``nvidia/cublas/lib``, ``nvidia/cuda_runtime/lib``, ...), with libcublasLt.so.<major>,
# libcublas.so.<major>, libnvrtc.so.<major>, libcurand.so.10, libcufft.so.<12 for CUDA 13, 11 for CUDA 12>,
# libcudart.so.<major>, and ``nvidia/cudnn/lib/libcudnn.so.9`` (cufft, nvrtc and cuDNN optional). The CUDA major is
# the wheel's ``cuda_version`` (``capi/build_and_package_info.py``). We load the same set, plus libnvJitLink and
# cuDNN's sub-libraries (onnxruntime leaves those to libcudnn.so.9, which loads them on demand; loading them here
# names a missing one in ``specrt env`` instead of failing in the middle of a run), from every site folder.

#: Handles of the libraries loaded so far (path -> handle): loaded once per process.
_LOADED: dict[str, ctypes.CDLL] = {}

# cuDNN 9's sub-libraries, in dependency order (libcudnn_graph first); others found beside them follow.
_CUDNN_PARTS = (
    "libcudnn_graph.so.9",
    "libcudnn_engines_precompiled.so.9",
    "libcudnn_engines_runtime_compiled.so.9",
    "libcudnn_heuristic.so.9",
    "libcudnn_ops.so.9",
    "libcudnn_cnn.so.9",
    "libcudnn_adv.so.9",
)


def _cuda_library_names(major: int) -> list[str]:
    """The CUDA libraries the provider needs, dependencies first (cublasLt before cublas)."""
    cufft = 12 if major >= 13 else 11
    return [
        f"libcudart.so.{major}",
        f"libnvJitLink.so.{major}",
        f"libnvrtc.so.{major}",
        f"libcublasLt.so.{major}",
        f"libcublas.so.{major}",
        "libcurand.so.10",
        f"libcufft.so.{cufft}",
    ]


def _site_dirs(first: str | None = None) -> list[str]:
    """Folders that may hold ``nvidia/*/lib``: ``first`` (onnxruntime's own site-packages), the site and user site
    folders, then ``sys.path``; existing folders only, each once."""
    dirs: list[str] = [first] if first else []
    with contextlib.suppress(Exception):  # some embedded / old virtualenv interpreters lack these
        dirs += site.getsitepackages()
    with contextlib.suppress(Exception):
        dirs.append(site.getusersitepackages())
    dirs += [p for p in sys.path if p]
    out: list[str] = []
    seen: set[str] = set()
    for d in dirs:
        real = os.path.realpath(d)
        if real not in seen and os.path.isdir(real):
            seen.add(real)
            out.append(d)
    return out


def _built_cuda_major(capi: str | None) -> int | None:
    """The CUDA major version the onnxruntime wheel at ``capi`` was built for, read from its
    ``build_and_package_info.py`` as text (``cuda_version = '13.0'``; the CPU wheel has none)."""
    if capi is None:
        return None
    try:
        with open(os.path.join(capi, "build_and_package_info.py"), encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return None
    m = re.search(r"""^cuda_version\s*=\s*['"](\d+)""", text, re.MULTILINE)
    return int(m.group(1)) if m else None


def preload_cuda_dlls(ort_library: str | None = None) -> dict[str, Any]:
    """Load the pip-installed CUDA and cuDNN libraries (``site-packages/nvidia/*/lib``) with ``RTLD_GLOBAL``.

    What ``onnxruntime.preload_dlls()`` does, without importing onnxruntime (see the module docstring): the dynamic
    loader does not search those folders, so the CUDA provider library would not find them. Each library is loaded
    by absolute path; one whose dependencies are not loaded yet is retried until a pass loads nothing more. Never
    raises: ``specrt env`` prints the report, and the Rust side names what is really missing when CUDA is used.

    Args:
        ort_library: the ``libonnxruntime.so.1.x`` in use (its wheel tells the CUDA major version); default: the
            installed wheel's.

    Returns:
        ``{"cuda_major": int or None, "directories": [nvidia lib folders searched], "loaded": [paths],
        "failed": {path: error}, "not_found": [library names in no folder (left to the system loader)]}``.
    """
    report: dict[str, Any] = {"cuda_major": None, "directories": [], "loaded": [], "failed": {}, "not_found": []}
    try:
        if ort_library is not None:
            capi: str | None = os.path.dirname(os.path.abspath(ort_library))
        else:
            capi = _onnxruntime_capi_dir()
        # onnxruntime's own site-packages first (onnxruntime.preload_dlls() searches only that one).
        ort_site = os.path.dirname(os.path.dirname(capi)) if capi and os.path.basename(capi) == "capi" else None
        lib_dirs = [d for s in _site_dirs(ort_site) for d in sorted(glob.glob(os.path.join(s, "nvidia", "*", "lib")))]
        report["directories"] = lib_dirs
        major = _built_cuda_major(capi)
        if major is None:  # the CPU wheel or an unusual library: the newest CUDA whose runtime pip installed
            found = [
                int(m.group(1))
                for d in lib_dirs
                for f in os.listdir(d)
                if (m := re.fullmatch(r"libcudart\.so\.(\d+)", f))
            ]
            major = max(found, default=None)
        report["cuda_major"] = major
        names = _cuda_library_names(major) if major is not None else []
        wanted: list[str] = []
        for name in [*names, "libcudnn.so.9", *_CUDNN_PARTS]:
            path = next((os.path.join(d, name) for d in lib_dirs if os.path.isfile(os.path.join(d, name))), None)
            if path is None:
                if not name.startswith("libcudnn_") and name != f"libnvJitLink.so.{major}":
                    report["not_found"].append(name)
                continue
            wanted.append(path)
        # Other cuDNN parts beside libcudnn.so.9 (a later cuDNN 9 may add some).
        for d in {os.path.dirname(p) for p in wanted if os.path.basename(p) == "libcudnn.so.9"}:
            wanted += [p for p in sorted(glob.glob(os.path.join(d, "libcudnn_*.so.9"))) if p not in wanted]
        report["loaded"], report["failed"] = _load_all(wanted)
    except Exception as e:  # never raise: the report says what went wrong
        report["failed"]["(search)"] = f"{type(e).__name__}: {e}"
    return report


def _load_all(paths: list[str]) -> tuple[list[str], dict[str, str]]:
    """``dlopen`` each of ``paths`` (``RTLD_GLOBAL``), retrying failures while a pass loads something."""
    loaded = [p for p in paths if p in _LOADED]
    pending = [p for p in paths if p not in _LOADED]
    errors: dict[str, str] = {}
    while pending:
        rest = []
        for path in pending:
            error = _dlopen(path)
            if error is None:
                loaded.append(path)
            else:
                errors[path] = error
                rest.append(path)
        if len(rest) == len(pending):
            break
        pending = rest
    return loaded, {p: errors[p] for p in pending}


def _dlopen(path: str) -> str | None:
    """Load ``path`` with ``RTLD_GLOBAL`` (kept in :data:`_LOADED`); the loader's error, or ``None``."""
    try:
        _LOADED[path] = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except OSError as e:
        return str(e)
    return None
