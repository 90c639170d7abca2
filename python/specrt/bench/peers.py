"""The optional peers (onnxruntime-genai, Hugging Face transformers, llama.cpp), each run by a script of
``benches/peers`` in its own process (and virtual environment), and the reading of their records.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from specrt.bench.config import REPO_ROOT, BenchConfig, default_out_dir, model_dtype
from specrt.bench.prompts import Prompt


def peer_warnings(cfg: BenchConfig) -> list[str]:
    """What will make a peer be skipped, said before the specrt phases run (the run goes on; the JSON records it)."""
    out = []
    for peer in ("genai", "hf"):
        python = _peer_python(cfg, peer)
        if peer in cfg.peers and not python.exists():
            out.append(f"peer {peer} will be skipped: no interpreter at {python} (benches/peers/setup_{peer}_venv.sh)")
    if "llama.cpp" in cfg.peers and not _llama_cpp_ready(llama_cpp_bin(cfg)):
        out.append(
            f"peer llama.cpp will be skipped: no llama-bench / llama-speculative-simple in {llama_cpp_bin(cfg)} "
            "(bash benches/peers/setup_llama_cpp.sh builds them)"
        )
    if "hf" in cfg.peers and model_dtype(cfg) != "fp32":
        out.append(f"peer hf will be skipped: it runs float32 only (dtype {model_dtype(cfg)!r})")
    if "hf" not in cfg.peers and tuple(cfg.hf_modes) != BenchConfig.hf_modes:
        out.append("--hf-modes has no effect without --peers hf")
    return out


def _peer_python(cfg: BenchConfig, peer: str) -> Path:
    """The interpreter of a peer's venv: ``--genai-python`` / ``--hf-python``, else ``benches/out/venv-<peer>``."""
    given = cfg.genai_python if peer == "genai" else cfg.hf_python
    return Path(given) if given else REPO_ROOT / "benches" / "out" / f"venv-{peer}" / "bin" / "python"


#: The llama-cpp-python sdist whose vendored llama.cpp ``benches/peers/setup_llama_cpp.sh`` builds by default.
LLAMA_CPP_PYTHON_VERSION = "0.3.36"


def llama_cpp_bin(cfg: BenchConfig) -> Path:
    """``--llama-cpp-bin``, else the build folder of ``benches/peers/setup_llama_cpp.sh`` in specrt's cache."""
    from specrt.models import cache_dir

    if cfg.llama_cpp_bin:
        return Path(cfg.llama_cpp_bin)
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


def _run_peer_script(python: Path, script: str, work: Path, request: dict[str, Any]) -> dict[str, Any]:
    """Run ``benches/peers/<script>`` under ``python`` with a request file; its result, or the error as a record."""
    work.mkdir(parents=True, exist_ok=True)
    req_path, res_path = work / "request.json", work / "result.json"
    req_path.write_text(json.dumps(request), encoding="utf-8")
    res_path.unlink(missing_ok=True)
    path = REPO_ROOT / "benches" / "peers" / script
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

    ``"genai"``: ``benches/peers/genai_peer.py`` under ``cfg.genai_python`` (a virtual environment with
    onnxruntime-genai 0.18; ``benches/peers/setup_genai_venv.sh``), on the same ONNX files through a generated
    genai_config.json, target-only and speculative, interleaved.
    ``"hf"``: ``benches/peers/hf_peer.py`` under ``cfg.hf_python`` (torch + transformers;
    ``benches/peers/setup_hf_venv.sh``), on the GGUF files the models were converted from (dequantized to float32 by
    transformers, so fp32 runs only), modes ``cfg.hf_modes`` (``target_only``, ``assisted`` = K drafts per round,
    ``assisted_dynamic`` = transformers' default schedule), interleaved.
    ``"llama.cpp"``: ``benches/peers/llama_cpp_peer.py`` (standard library only) driving ``llama-bench`` (target-only
    token generation at the prompt's depth) and ``llama-speculative-simple --spec-type draft-simple`` (K =
    ``--spec-draft-n-max``) from ``cfg.llama_cpp_bin`` on the GGUF files the models were converted from, with the
    prompt texts ``prompt_texts`` (chat template rendered by specrt).
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
                out[peer] = {"status": "skipped", "reason": f"no interpreter at {python} (see benches/README.md)"}
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
                out[peer] = {"status": "skipped", "reason": f"no interpreter at {python} (see benches/README.md)"}
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
                    "reason": f"no llama-bench / llama-speculative-simple in {bin_dir} "
                    "(bash benches/peers/setup_llama_cpp.sh)",
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
    names the peer and mode (``genai K=4``, ``hf assisted K=4``, ``hf assisted dynamic``).
    """
    out: list[tuple[str, str, dict[str, Any]]] = []
    k = peer.get("k")
    for pid, g in peer["prompts"].items():
        if name in ("genai", "llama.cpp"):
            modes = [("speculative", g, f"{name} K={k}" if k else name)]
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
