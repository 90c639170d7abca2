"""onnxruntime-genai 0.18 as a peer of ``specrt bench``, on the very same ONNX files, in its own environment.

Run by ``specrt bench --peers genai`` (``specrt.bench.run_peers``) as ``<venv>/bin/python
<specrt>/bench/peer_scripts/genai_peer.py REQUEST.json RESULT.json`` (``<specrt>``: the installed package's folder); it
imports only onnxruntime_genai and numpy (and ``peer_stats`` beside it), never specrt. specrt's model folders follow
genai's decoder I/O names (``input_ids``, ``attention_mask``, ``past_key_values.N.key/value``, ``present.N.key/value``,
``logits``, a shared past/present buffer), so this script writes a ``genai_config.json`` beside symlinks to the model
files: one folder for the target alone, one holding the target and the draft (``model.draft``, genai's base speculative
decoding).

Request (JSON): ``target``, ``draft`` (model folders), ``work_dir``, ``prompts`` ({id: token ids, tokenized by
specrt so both runtimes see the same ids}), ``max_new_tokens``, ``k``, ``repeats``, ``warmup_tokens``, ``threads``
(0 = genai's default), ``interleave`` (default true: both models loaded, target-only and speculative run back to
back per repetition; false: one model at a time, less memory). Greedy only.

Result (JSON): versions, and per prompt: ``target_only`` / ``speculative`` with ``decode_tokens_per_s``,
``tokens_per_s``, ``prefill_ms``, ``n_emitted`` as ``{"median", "min", "max", "n"}``; ``speedup`` (paired decode
tokens/s ratio), ``e2e_speedup``, ``acceptance_rate`` (genai's draft_tokens_accepted / draft_tokens_evaluated),
``mean_tokens_per_round``, ``token_ids`` of the first repetition of each mode and genai's raw speculative stats.
Timing: ``prefill_ms`` = ``append_tokens(prompt)`` (genai runs the prompt there); decode = the
``generate_next_token`` loop; wall = both.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime_genai as og
from peer_stats import mode_summary, paired_ratios, spread


def _link(src: Path, dst_dir: Path) -> None:
    """Symlink model.onnx and model.onnx.data of ``src`` into ``dst_dir`` (external data resolves next to it)."""
    dst_dir.mkdir(parents=True, exist_ok=True)
    for name in ("model.onnx", "model.onnx.data"):
        if (src / name).exists():
            link = dst_dir / name
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to((src / name).resolve())


def _decoder_block(cfg: dict[str, Any], filename: str, threads: int) -> dict[str, Any]:
    session: dict[str, Any] = {"log_id": "onnxruntime-genai", "provider_options": []}
    if threads:
        session["intra_op_num_threads"] = threads
        session["inter_op_num_threads"] = 1
    return {
        "session_options": session,
        "filename": filename,
        "head_size": cfg["head_dim"],
        "hidden_size": cfg["hidden_size"],
        "inputs": {
            "input_ids": "input_ids",
            "attention_mask": "attention_mask",
            "past_key_names": "past_key_values.%d.key",
            "past_value_names": "past_key_values.%d.value",
        },
        "outputs": {
            "logits": "logits",
            "present_key_names": "present.%d.key",
            "present_value_names": "present.%d.value",
        },
        "num_attention_heads": cfg["num_attention_heads"],
        "num_hidden_layers": cfg["num_layers"],
        "num_key_value_heads": cfg["num_kv_heads"],
    }


def write_genai_folder(out: Path, target: Path, draft: Path | None, *, threads: int, max_length: int, k: int) -> Path:
    """A folder genai can load: ``genai_config.json`` + symlinks (``target/``, and ``draft/`` when given)."""
    cfg = json.loads((target / "specrt_config.json").read_text(encoding="utf-8"))
    _link(target, out / "target")
    eos = cfg["eos_token_ids"]
    config: dict[str, Any] = {
        "model": {
            "bos_token_id": cfg["bos_token_id"],
            "context_length": cfg["max_position_embeddings"],
            "decoder": _decoder_block(cfg, "target/model.onnx", threads),
            "eos_token_id": eos if len(eos) > 1 else eos[0],
            "pad_token_id": cfg.get("pad_token_id", eos[0]),
            "type": cfg["architecture"],
            "vocab_size": cfg["vocab_size"],
        },
        "search": {
            "diversity_penalty": 0.0,
            "do_sample": False,
            "early_stopping": True,
            "length_penalty": 1.0,
            "max_length": max_length,
            "min_length": 0,
            "no_repeat_ngram_size": 0,
            "num_beams": 1,
            "num_return_sequences": 1,
            "past_present_share_buffer": True,
            "repetition_penalty": 1.0,
            "temperature": 1.0,
            "top_k": 1,
            "top_p": 1.0,
        },
    }
    if draft is not None:
        dcfg = json.loads((draft / "specrt_config.json").read_text(encoding="utf-8"))
        _link(draft, out / "draft")
        config["model"]["draft"] = _decoder_block(dcfg, "draft/model.onnx", threads)
        config["speculative"] = {"max_draft_tokens": k}
    out.mkdir(parents=True, exist_ok=True)
    (out / "genai_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    return out


def _generate(model: og.Model, ids: list[int], max_new_tokens: int, k: int | None) -> dict[str, Any]:
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(ids) + max_new_tokens)
    if k is not None:
        params.set_speculative_options(max_draft_tokens=k)
    t0 = time.perf_counter()
    gen = og.Generator(model, params)
    gen.append_tokens(np.asarray([ids], dtype=np.int32))
    t1 = time.perf_counter()
    while not gen.is_done():
        gen.generate_next_token()
    t2 = time.perf_counter()
    seq = [int(t) for t in gen.get_sequence(0)]
    new = seq[len(ids) :]
    stats = gen.get_speculative_stats() if k is not None else {}
    n = len(new)
    return {
        "prefill_ms": (t1 - t0) * 1e3,
        "decode_ms": (t2 - t1) * 1e3,
        "wall_ms": (t2 - t0) * 1e3,
        "n_emitted": n,
        "decode_tokens_per_s": n / (t2 - t1) if t2 > t1 else None,
        "tokens_per_s": n / (t2 - t0),
        "token_ids": new,
        "stats": {key: (v if isinstance(v, (int, float, bool, str)) else str(v)) for key, v in dict(stats).items()},
    }


def main(request_path: str, result_path: str) -> int:
    req = json.loads(Path(request_path).read_text(encoding="utf-8"))
    work = Path(req["work_dir"])
    target, draft = Path(req["target"]), Path(req["draft"])
    prompts: dict[str, list[int]] = req["prompts"]
    max_new, k, reps = int(req["max_new_tokens"]), int(req["k"]), int(req["repeats"])
    threads = int(req.get("threads") or 0)
    warm = int(req.get("warmup_tokens", 8))
    interleave = bool(req.get("interleave", True))
    max_length = max(len(v) for v in prompts.values()) + max_new + 8
    folders = {
        "target_only": write_genai_folder(
            work / "target_only", target, None, threads=threads, max_length=max_length, k=k
        ),
        "speculative": write_genai_folder(
            work / "speculative", target, draft, threads=threads, max_length=max_length, k=k
        ),
    }
    modes = {"target_only": None, "speculative": k}
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {m: {p: [] for p in prompts} for m in modes}
    t_load: dict[str, float] = {}

    def load(mode: str) -> og.Model:
        t0 = time.perf_counter()
        m = og.Model(str(folders[mode]))
        t_load[mode] = time.perf_counter() - t0
        return m

    def bench(models: dict[str, og.Model], order_modes: list[str]) -> None:
        for mode in order_modes:
            for ids in prompts.values():
                if warm > 0:
                    _generate(models[mode], ids, warm, modes[mode])
        for r in range(reps):
            for pid, ids in prompts.items():
                order = order_modes if r % 2 == 0 else order_modes[::-1]
                for mode in order:
                    runs[mode][pid].append(_generate(models[mode], ids, max_new, modes[mode]))
                    print(f"genai {mode} rep {r + 1}/{reps} {pid}", file=sys.stderr, flush=True)

    if interleave:
        models = {m: load(m) for m in modes}
        bench(models, list(modes))
        del models
    else:
        for mode in modes:
            models = {mode: load(mode)}
            bench(models, [mode])
            del models

    out: dict[str, Any] = {
        "onnxruntime_genai": og.__version__,
        "onnxruntime": _ort_version(),
        "interleaved": interleave,
        "k": k,
        "load_s": t_load,
        "genai_config": {m: str(f / "genai_config.json") for m, f in folders.items()},
        "prompts": {},
    }
    for pid in prompts:
        base, spec = runs["target_only"][pid], runs["speculative"][pid]
        acc, tpr = [], []
        for s in spec:
            st = s["stats"]
            evaluated = st.get("draft_tokens_evaluated") or 0
            if evaluated:
                acc.append(st.get("draft_tokens_accepted", 0) / evaluated)
            rounds = st.get("rounds") or 0
            if rounds:
                tpr.append(s["n_emitted"] / rounds)
        out["prompts"][pid] = {
            "target_only": mode_summary(base),
            "speculative": mode_summary(spec),
            **paired_ratios(base, spec),
            "acceptance_rate": spread(acc),
            "mean_tokens_per_round": spread(tpr),
            "greedy_parity": all(s["token_ids"] == b["token_ids"] for b, s in zip(base, spec, strict=True)),
            "token_ids": {"target_only": base[0]["token_ids"], "speculative": spec[0]["token_ids"]},
            "speculative_stats": [s["stats"] for s in spec],
            "runs": {
                m: [{k2: v for k2, v in r.items() if k2 != "token_ids"} for r in rs]
                for m, rs in (("target_only", base), ("speculative", spec))
            },
        }
    Path(result_path).write_text(json.dumps(out, indent=1), encoding="utf-8")
    return 0


def _ort_version() -> str | None:
    # This script runs in the genai venv, in a process of its own that never imports specrt: importing onnxruntime
    # here is no second ONNX Runtime beside specrt's.
    try:
        import onnxruntime

        return onnxruntime.__version__
    except ImportError:
        return None


if __name__ == "__main__":
    os.environ.setdefault("ORTGENAI_LOG_LEVEL", "warning")
    sys.exit(main(sys.argv[1], sys.argv[2]))
