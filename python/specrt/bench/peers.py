"""The optional peers (onnxruntime-genai, Hugging Face transformers, llama.cpp), each run by a script of
``specrt/bench/peer_scripts`` in its own process (and virtual environment), and the reading of their records.

The peer scripts ship inside the package (maturin packs every file under ``python/specrt`` that git does not
ignore), so an installed wheel runs them as a checkout does: :func:`peer_script` finds them through
:mod:`importlib.resources`, never through a path relative to the repository. They are standalone scripts, not
modules of specrt: each runs under its peer's python (which has no specrt) and imports only ``peer_stats`` beside it
(the script's folder is first on ``sys.path``).

What a peer needs besides (its virtual environment, the llama.cpp build) is made by a setup script shipped beside them
in ``specrt/bench/peer_setup`` (:func:`setup_script`; ``specrt bench --setup-peer <peer>`` runs it, a checkout's
``benches/peers/setup_*.sh`` wrap it), at the place the bench looks: :func:`specrt.bench.config.default_peer_venv`,
:func:`llama_cpp_bin`. A peer that is not set up is skipped with the exact command that sets it up
(:func:`setup_hint`).
"""

from __future__ import annotations

import importlib.resources
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from specrt.bench.config import BenchConfig, default_out_dir, default_peer_venv, model_dtype
from specrt.bench.prompts import Prompt


def peer_warnings(cfg: BenchConfig) -> list[str]:
    """What will make a peer be skipped, said before the specrt phases run (the run goes on; the JSON records it)."""
    out = []
    for peer in ("genai", "hf"):
        python = _peer_python(cfg, peer)
        if peer in cfg.peers and not python.exists():
            out.append(f"peer {peer} will be skipped: no interpreter at {python}; {setup_hint(cfg, peer)}")
    if "llama.cpp" in cfg.peers and not _llama_cpp_ready(llama_cpp_bin(cfg)):
        out.append(
            f"peer llama.cpp will be skipped: no llama-bench / llama-speculative-simple in {llama_cpp_bin(cfg)}; "
            f"{setup_hint(cfg, 'llama.cpp')}"
        )
    if "hf" in cfg.peers and model_dtype(cfg) != "fp32":
        out.append(f"peer hf will be skipped: it runs float32 only (dtype {model_dtype(cfg)!r})")
    if "hf" not in cfg.peers and tuple(cfg.hf_modes) != BenchConfig.hf_modes:
        out.append("--hf-modes has no effect without --peers hf")
    return out


def _peer_python(cfg: BenchConfig, peer: str) -> Path:
    """The interpreter of a peer's venv: ``--genai-python`` / ``--hf-python``, else the python of
    :func:`~specrt.bench.config.default_peer_venv` (``benches/out/venv-<peer>`` in a checkout,
    ``<specrt cache>/bench/venv-<peer>`` installed)."""
    given = cfg.genai_python if peer == "genai" else cfg.hf_python
    return Path(given) if given else default_peer_venv(peer) / "bin" / "python"


#: The llama.cpp peer's default target-only method (``target_only_method`` of each prompt): ``llama-bench -d <depth>``.
LLAMA_BENCH_DEPTH = "llama-bench -d"

#: The llama-cpp-python sdist whose vendored llama.cpp ``setup_llama_cpp.sh`` builds (``--setup-peer`` passes it).
LLAMA_CPP_PYTHON_VERSION = "0.3.36"


def llama_cpp_bin(cfg: BenchConfig) -> Path:
    """``--llama-cpp-bin``, else the build folder of ``setup_llama_cpp.sh`` in specrt's cache (checkout or not)."""
    if cfg.llama_cpp_bin:
        return Path(cfg.llama_cpp_bin)
    return _default_llama_cpp_bin()


def _default_llama_cpp_bin() -> Path:
    from specrt.models import cache_dir

    return cache_dir() / "llama.cpp" / LLAMA_CPP_PYTHON_VERSION / "build" / "bin"


def _llama_cpp_ready(bin_dir: Path) -> bool:
    return all((bin_dir / name).is_file() for name in ("llama-bench", "llama-speculative-simple"))


def gguf_source(model_path: Path) -> Path | None:
    """The GGUF file a converted model folder came from, when it is in specrt's cache (``<cache>/gguf``), else None."""
    from specrt.models import cache_dir

    try:
        cfg = json.loads((Path(model_path) / "specrt_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    source = str(cfg.get("source") or "")
    path = cache_dir() / "gguf" / source
    return path if source.endswith(".gguf") and path.is_file() else None


#: The peer scripts shipped in ``specrt/bench/peer_scripts`` (``peer_stats.py`` beside them is their shared helper).
PEER_SCRIPTS = ("genai_peer.py", "hf_peer.py", "llama_cpp_peer.py")


def peer_script(name: str) -> Path:
    """The file of the shipped peer script ``name``, in site-packages or in a checkout alike.

    Raises:
        FileNotFoundError: ``name`` is not one of :data:`PEER_SCRIPTS`, or the package lacks it (a broken install).
    """
    if name not in PEER_SCRIPTS:
        raise FileNotFoundError(f"peer script {name!r} is unknown (expected one of: {', '.join(PEER_SCRIPTS)})")
    # A real file, not a resource to copy out: the script imports peer_stats.py from its own folder.
    path = Path(str(importlib.resources.files("specrt.bench") / "peer_scripts" / name))
    if not path.is_file():
        raise FileNotFoundError(f"peer script {name} is missing from the installed specrt package (looked at {path})")
    return path


#: The setup script of each peer, shipped in ``specrt/bench/peer_setup`` (a checkout's ``benches/peers/`` wraps them).
SETUP_SCRIPTS = {"genai": "setup_genai_venv.sh", "hf": "setup_hf_venv.sh", "llama.cpp": "setup_llama_cpp.sh"}

#: The option naming where the bench looks for each peer (``specrt bench --setup-peer`` honours it).
_LOCATION_OPTION = {"genai": "--genai-python", "hf": "--hf-python", "llama.cpp": "--llama-cpp-bin"}


def setup_script(peer: str) -> Path:
    """The shipped setup script of ``peer`` (:data:`SETUP_SCRIPTS`), in site-packages or in a checkout alike.

    Raises:
        ValueError: ``peer`` is not one of :data:`SETUP_SCRIPTS`.
        FileNotFoundError: the package lacks the script (a broken install).
    """
    if peer not in SETUP_SCRIPTS:
        raise ValueError(f"peer {peer!r} has no setup script (expected one of: {', '.join(SETUP_SCRIPTS)})")
    path = Path(str(importlib.resources.files("specrt.bench") / "peer_setup" / SETUP_SCRIPTS[peer]))
    if not path.is_file():
        raise FileNotFoundError(f"setup script {path.name} is missing from the installed specrt package ({path})")
    return path


def _location(cfg: BenchConfig, peer: str) -> str | None:
    return {"genai": cfg.genai_python, "hf": cfg.hf_python, "llama.cpp": cfg.llama_cpp_bin}[peer]


def setup_command(cfg: BenchConfig, peer: str) -> list[str]:
    """The command that sets ``peer`` up where ``cfg`` looks for it (what ``specrt bench --setup-peer`` runs).

    ``["bash", ".../setup_<peer>_venv.sh", <venv>]`` for genai and hf, the venv holding :func:`_peer_python`
    (``--genai-python`` / ``--hf-python`` when given, else :func:`~specrt.bench.config.default_peer_venv`);
    ``["bash", ".../setup_llama_cpp.sh", LLAMA_CPP_PYTHON_VERSION]`` for llama.cpp, which builds into the default of
    :func:`llama_cpp_bin`.

    Raises:
        ValueError: the script cannot make what ``cfg`` names: a ``--genai-python`` / ``--hf-python`` that is not
            ``<venv>/bin/python`` with ``<venv>`` new, empty or a virtual environment already (``/usr/bin/python3``
            is refused: a venv over ``/usr`` would take over the system python), or a ``--llama-cpp-bin`` (the
            build goes to specrt's cache only).
    """
    script = setup_script(peer)
    if peer == "llama.cpp":
        if cfg.llama_cpp_bin:
            raise ValueError(
                f"--llama-cpp-bin {cfg.llama_cpp_bin} is a build of your own: `specrt bench --setup-peer llama.cpp` "
                f"(bash {shlex.quote(str(script))}) builds into {_default_llama_cpp_bin()}, the folder used without "
                "--llama-cpp-bin"
            )
        return ["bash", str(script), LLAMA_CPP_PYTHON_VERSION]
    python = _peer_python(cfg, peer)
    venv = python.parent.parent
    # Never point `python -m venv` and pip at a folder that holds something else (a venv over /usr would take over
    # the system python): only a new or empty folder, or an existing venv (pyvenv.cfg), is set up.
    is_venv_place = not venv.exists() or (venv / "pyvenv.cfg").is_file() or (venv.is_dir() and not any(venv.iterdir()))
    if python.parent.name != "bin" or not is_venv_place:
        raise ValueError(
            f"{_LOCATION_OPTION[peer]} {python} is not <venv>/bin/python of a new folder or an existing virtual "
            f"environment, where {script.name} could make one; `specrt bench --setup-peer {peer}` makes the default "
            f"one, {default_peer_venv(peer)} (bash {shlex.quote(str(script))} DIR makes one at a new DIR)"
        )
    return ["bash", str(script), str(venv)]


def setup_hint(cfg: BenchConfig, peer: str) -> str:
    """How to set ``peer`` up where ``cfg`` looks for it, for the message of a skipped peer: the exact
    ``specrt bench --setup-peer`` command and the script command it runs (or why neither can, :func:`setup_command`)."""
    try:
        command = setup_command(cfg, peer)
    except (ValueError, FileNotFoundError) as e:
        return str(e)
    given = _location(cfg, peer)
    argv = ["specrt", "bench", "--setup-peer", peer, *([_LOCATION_OPTION[peer], given] if given else [])]
    return f"set it up with `{shlex.join(argv)}` (runs `{shlex.join(command)}`)"


def _run_peer_script(python: Path, script: str, work: Path, request: dict[str, Any]) -> dict[str, Any]:
    """Run the peer script ``script`` (:func:`peer_script`) under ``python`` with a request file; its result, or the
    error as a record."""
    try:
        path = peer_script(script)
    except FileNotFoundError as e:
        return {"status": "error", "reason": str(e), "elapsed_s": 0.0}
    work.mkdir(parents=True, exist_ok=True)
    req_path, res_path = work / "request.json", work / "result.json"
    req_path.write_text(json.dumps(request), encoding="utf-8")
    res_path.unlink(missing_ok=True)
    t0 = time.perf_counter()
    proc = subprocess.run(
        [str(python), str(path), str(req_path), str(res_path)], capture_output=True, text=True, check=False
    )
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0 or not res_path.exists():
        return {
            "status": "error",
            "returncode": proc.returncode,
            "stderr_tail": proc.stderr[-3000:],
            "elapsed_s": elapsed,
        }
    return {"status": "ok", **json.loads(res_path.read_text(encoding="utf-8")), "elapsed_s": elapsed}


def run_peers(
    cfg: BenchConfig,
    target_path: Path,
    draft_path: Path,
    prompts: list[Prompt],
    prompt_tokens: dict[str, list[int]],
    prompt_texts: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run the peers named in ``cfg.peers`` in subprocesses; a failure is recorded, never raised.

    Both get the same prompt token ids as specrt, greedy decoding, ``cfg.max_new_tokens`` and ``cfg.repeats``, and
    K = ``cfg.k`` (4 when ``cfg.k`` is ``"auto"``); each peer's record carries ``status`` (``"ok"``, ``"skipped"``
    with a ``reason``, ``"error"`` with the script's stderr) and ``elapsed_s`` (wall seconds, load included).

    ``"genai"``: ``peer_scripts/genai_peer.py`` under ``cfg.genai_python`` (a virtual environment with
    onnxruntime-genai 0.18; ``specrt bench --setup-peer genai``), on the same ONNX files through a generated
    genai_config.json, target-only and speculative, interleaved.
    ``"hf"``: ``peer_scripts/hf_peer.py`` under ``cfg.hf_python`` (torch + transformers;
    ``specrt bench --setup-peer hf``), on the GGUF files the models were converted from (dequantized to float32 by
    transformers, so fp32 runs only), modes ``cfg.hf_modes`` (``target_only``, ``assisted`` = K drafts per round,
    ``assisted_dynamic`` = transformers' default schedule), interleaved.
    ``"llama.cpp"``: ``peer_scripts/llama_cpp_peer.py`` (standard library only) driving ``llama-bench`` (target-only
    token generation at the prompt's depth) and ``llama-speculative-simple --spec-type draft-simple`` (K =
    ``--spec-draft-n-max``) from ``cfg.llama_cpp_bin`` on the GGUF files the models were converted from, with the
    prompt texts ``prompt_texts`` (chat template rendered by specrt). Where ``llama-bench -d`` fails (a signal, a
    nonzero exit, no result row), target-only is ``llama-completion`` on the same prompt text instead; each prompt's
    ``target_only_method`` says which (:data:`LLAMA_BENCH_DEPTH` or the fallback tool's name) and the report's label
    names a fallback.
    """
    out: dict[str, Any] = {}
    k = 4 if cfg.k == "auto" else int(cfg.k)
    ids = {p.id: prompt_tokens[p.id] for p in prompts}
    common = {
        "prompts": ids,
        "max_new_tokens": cfg.max_new_tokens,
        "k": k,
        "repeats": cfg.repeats,
        "warmup_tokens": cfg.warmup_tokens,
        "threads": cfg.threads or 0,
        "ignore_eos": cfg.ignore_eos,
    }
    work_root = Path(cfg.out_dir or default_out_dir())
    for peer in cfg.peers:
        if peer == "genai":
            python = _peer_python(cfg, peer)
            if not python.exists():
                out[peer] = {"status": "skipped", "reason": f"no interpreter at {python}; {setup_hint(cfg, peer)}"}
                continue
            request = {
                **common,
                "target": str(target_path),
                "draft": str(draft_path),
                "work_dir": str(work_root / "genai"),
                "interleave": cfg.peer_interleave,
            }
            out[peer] = _run_peer_script(python, "genai_peer.py", work_root / "genai", request)
        elif peer == "hf":
            python = _peer_python(cfg, peer)
            sources = {role: gguf_source(path) for role, path in (("target", target_path), ("draft", draft_path))}
            missing = [role for role, src in sources.items() if src is None]
            if not python.exists():
                out[peer] = {"status": "skipped", "reason": f"no interpreter at {python}; {setup_hint(cfg, peer)}"}
            elif model_dtype(cfg) != "fp32":
                out[peer] = {
                    "status": "skipped",
                    "reason": f"transformers runs the GGUF dequantized to float32; dtype {model_dtype(cfg)!r} would "
                    "not compare the same precision (use --dtype fp32)",
                }
            elif missing:
                out[peer] = {
                    "status": "skipped",
                    "reason": f"no cached GGUF source for the {' and '.join(missing)} (transformers loads the GGUF "
                    "the model was converted from; `specrt models pull` keeps it under ~/.cache/specrt/gguf)",
                }
            else:
                target_cfg = json.loads((Path(target_path) / "specrt_config.json").read_text(encoding="utf-8"))
                request = {
                    **common,
                    "target_gguf": str(sources["target"]),
                    "draft_gguf": str(sources["draft"]),
                    "eos_token_ids": target_cfg["eos_token_ids"],
                    "modes": list(cfg.hf_modes),
                }
                out[peer] = _run_peer_script(python, "hf_peer.py", work_root / "hf", request)
        elif peer == "llama.cpp":
            bin_dir = llama_cpp_bin(cfg)
            sources = {role: gguf_source(path) for role, path in (("target", target_path), ("draft", draft_path))}
            missing = [role for role, src in sources.items() if src is None]
            if not _llama_cpp_ready(bin_dir):
                out[peer] = {
                    "status": "skipped",
                    "reason": f"no llama-bench / llama-speculative-simple in {bin_dir}; {setup_hint(cfg, peer)}",
                }
            elif missing or prompt_texts is None:
                out[peer] = {
                    "status": "skipped",
                    "reason": f"no cached GGUF source for the {' and '.join(missing) or 'models'} (llama.cpp runs the "
                    "GGUF the model was converted from; `specrt models pull` keeps it under ~/.cache/specrt/gguf)",
                }
            else:
                request = {
                    **common,
                    "bin_dir": str(bin_dir),
                    "llama_cpp_python": None if cfg.llama_cpp_bin else LLAMA_CPP_PYTHON_VERSION,
                    "target_gguf": str(sources["target"]),
                    "draft_gguf": str(sources["draft"]),
                    "prompts": {p.id: prompt_texts[p.id] for p in prompts},
                    "prompt_tokens": {pid: len(t) for pid, t in ids.items()},
                }
                out[peer] = _run_peer_script(
                    Path(sys.executable), "llama_cpp_peer.py", work_root / "llama.cpp", request
                )
        else:
            out[peer] = {"status": "error", "reason": f"unknown peer {peer!r} (expected one of: genai, hf, llama.cpp)"}
    return out


def peer_modes(name: str, peer: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """``(prompt id, label, figures)`` per prompt and speculative mode of one peer's ``ok`` record.

    ``figures`` holds ``target_only`` and ``speculative`` (each ``{"decode_tokens_per_s", "tokens_per_s", ...}``
    spreads), ``speedup``, ``e2e_speedup``, ``acceptance_rate`` and ``same_tokens_as_specrt`` when known; the label
    names the peer and mode (``genai K=4``, ``hf assisted K=4``, ``hf assisted dynamic``) and, for llama.cpp, a
    target-only method other than ``llama-bench -d`` (``llama.cpp K=4 (target-only: llama-completion)``).
    """
    out: list[tuple[str, str, dict[str, Any]]] = []
    k = peer.get("k")
    for pid, g in peer["prompts"].items():
        if name in ("genai", "llama.cpp"):
            label = f"{name} K={k}" if k else name
            # A target-only figure not from llama-bench -d (its fallback, or none) is named in the label.
            method = g.get("target_only_method", LLAMA_BENCH_DEPTH)
            if name == "llama.cpp" and method != LLAMA_BENCH_DEPTH:
                label += f" (target-only: {method or 'none'})"
            modes = [("speculative", g, label)]
        else:
            modes = [
                (m, g[m], f"{name} assisted K={k}" if m == "assisted" else f"{name} {m.replace('_', ' ')}")
                for m in peer.get("modes", [])
                if m != "target_only" and m in g
            ]
        for mode, figs, label in modes:
            out.append(
                (
                    pid,
                    label,
                    {
                        "target_only": g["target_only"],
                        "speculative": g[mode],
                        "speedup": figs.get("speedup"),
                        "e2e_speedup": figs.get("e2e_speedup"),
                        "acceptance_rate": figs.get("acceptance_rate"),
                        "same_tokens_as_specrt": g.get("same_tokens_as_specrt"),
                    },
                )
            )
    return out
