"""Hugging Face transformers assisted generation as a peer of ``specrt bench``, in its own environment.

Run by ``specrt bench --peers hf`` (``specrt.bench.run_peers``) as ``<venv>/bin/python
<specrt>/bench/peer_scripts/hf_peer.py REQUEST.json RESULT.json`` (``<specrt>``: the installed package's folder); it
imports torch, transformers and numpy (and ``peer_stats`` beside it), never specrt. The models are the GGUF files specrt
converts from (``~/.cache/specrt/gguf``): transformers loads a GGUF by dequantizing every tensor to float32
(``from_pretrained(folder, gguf_file=name)``), which is what specrt's fp32 conversion does, so both runtimes run the
same fp32 weights. torch runs on the CPU (on Linux x86_64 PyPI's torch is the CUDA build; it runs on a machine without a
GPU, ``torch.cuda.is_available()`` is False).

Request (JSON): ``target_gguf``, ``draft_gguf`` (paths), ``prompts`` ({id: token ids, tokenized by specrt so both
runtimes see the same ids}), ``eos_token_ids``, ``max_new_tokens``, ``k``, ``repeats``, ``warmup_tokens``,
``threads`` (0 = torch's default), ``ignore_eos``, ``modes`` (default ``["target_only", "assisted"]``; also
``"assisted_dynamic"``: transformers' default schedule, up to 20 drafts with a confidence threshold). Greedy only.

Modes: ``target_only`` = ``target.generate``; ``assisted`` = ``generate(assistant_model=draft)`` with
``num_assistant_tokens = k``, schedule ``"constant"`` and no confidence threshold (K drafts per round, as specrt
and onnxruntime-genai do at a fixed K).

Result (JSON): versions, and per prompt and mode ``decode_tokens_per_s``, ``tokens_per_s``, ``prefill_ms``,
``n_emitted`` as ``{"median", "min", "max", "n"}``; per assisted mode ``speedup`` (paired decode tokens/s ratio
over target-only), ``e2e_speedup``, ``acceptance_rate`` and ``mean_tokens_per_round``; ``token_ids`` of the first
repetition of each mode. Timing, from forward hooks: ``prefill_ms`` = target-only: start to the end of the target's
first pass; assisted: start to the end of the draft's first pass (its prompt) plus the target's first pass (the
prompt and the first round's drafts); decode = the rest; wall = both. Rounds = target forward passes of an assisted
run; drafted = draft forward passes (one per drafted token); accepted = emitted - rounds (each round emits its
accepted drafts plus one target token; the last round can be cut by ``max_new_tokens``, so this is exact up to one
round).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import transformers
from peer_stats import mode_summary, paired_ratios, spread
from transformers import AutoModelForCausalLM


def load_gguf(path: Path) -> torch.nn.Module:
    """A causal LM from one GGUF file, dequantized to float32, in eval mode."""
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    model.eval()
    return model


class Counter:
    """Start and end time of each forward pass of one module (forward pre-hook and hook)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []
        module.register_forward_pre_hook(lambda _m, _i: self.starts.append(time.perf_counter()))
        module.register_forward_hook(lambda _m, _i, _o: self.ends.append(time.perf_counter()))

    def reset(self) -> None:
        self.starts.clear()
        self.ends.clear()


def _set_assistant_config(draft: torch.nn.Module, mode: str, k: int, defaults: dict[str, Any]) -> None:
    cfg = draft.generation_config
    for key, value in defaults.items():
        setattr(cfg, key, value)
    if mode == "assisted":
        cfg.num_assistant_tokens = k
        cfg.num_assistant_tokens_schedule = "constant"
        if hasattr(cfg, "assistant_confidence_threshold"):
            cfg.assistant_confidence_threshold = 0.0


def run_one(
    target: torch.nn.Module,
    draft: torch.nn.Module,
    counters: tuple[Counter, Counter],
    ids: list[int],
    mode: str,
    max_new_tokens: int,
    eos: list[int] | None,
) -> dict[str, Any]:
    t_count, d_count = counters
    t_count.reset()
    d_count.reset()
    input_ids = torch.tensor([ids], dtype=torch.long)
    kwargs: dict[str, Any] = {"assistant_model": draft} if mode != "target_only" else {}
    with torch.inference_mode():
        t0 = time.perf_counter()
        out = target.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            do_sample=False,
            max_new_tokens=max_new_tokens,
            eos_token_id=eos,
            pad_token_id=(eos or [0])[0],
            **kwargs,
        )
        t2 = time.perf_counter()
    new = [int(t) for t in out[0, len(ids) :].tolist()]
    n = len(new)
    rounds = len(t_count.ends)
    drafted = len(d_count.ends)
    if not t_count.ends:
        prefill = 0.0
    elif mode == "target_only":
        prefill = t_count.ends[0] - t0
    else:
        # The draft's prompt pass (from the start, setup included) and the target's first pass (the prompt and the
        # first round's drafts); the draft's later passes of round one count as decoding.
        d_end = d_count.ends[0] if d_count.ends else t0
        prefill = (d_end - t0) + (t_count.ends[0] - t_count.starts[0])
    t1 = t0 + prefill
    res: dict[str, Any] = {
        "prefill_ms": prefill * 1e3,
        "decode_ms": (t2 - t1) * 1e3,
        "wall_ms": (t2 - t0) * 1e3,
        "n_emitted": n,
        "decode_tokens_per_s": n / (t2 - t1) if t2 > t1 else None,
        "tokens_per_s": n / (t2 - t0),
        "target_passes": rounds,
        "draft_passes": drafted,
        "token_ids": new,
    }
    if mode != "target_only" and rounds:
        res["mean_tokens_per_round"] = n / rounds
        res["acceptance_rate"] = max(0, n - rounds) / drafted if drafted else None
    return res


def main(request_path: str, result_path: str) -> int:
    req = json.loads(Path(request_path).read_text(encoding="utf-8"))
    prompts: dict[str, list[int]] = req["prompts"]
    max_new, k, reps = int(req["max_new_tokens"]), int(req["k"]), int(req["repeats"])
    warm = int(req.get("warmup_tokens", 8))
    threads = int(req.get("threads") or 0)
    modes: list[str] = list(req.get("modes") or ["target_only", "assisted"])
    if "target_only" not in modes:
        modes.insert(0, "target_only")
    for m in modes:
        if m not in ("target_only", "assisted", "assisted_dynamic"):
            raise ValueError(f"unknown mode {m!r} (expected target_only, assisted or assisted_dynamic)")
    eos: list[int] | None = None if req.get("ignore_eos") else [int(t) for t in req["eos_token_ids"]]
    if threads:
        torch.set_num_threads(threads)
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()

    t_load: dict[str, float] = {}
    t0 = time.perf_counter()
    target = load_gguf(Path(req["target_gguf"]))
    t_load["target"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    draft = load_gguf(Path(req["draft_gguf"]))
    t_load["draft"] = time.perf_counter() - t0
    counters = (Counter(target), Counter(draft))
    gc = draft.generation_config
    defaults = {
        key: getattr(gc, key)
        for key in ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")
        if hasattr(gc, key)
    }

    runs: dict[str, dict[str, list[dict[str, Any]]]] = {m: {p: [] for p in prompts} for m in modes}

    def one(mode: str, ids: list[int], n: int) -> dict[str, Any]:
        _set_assistant_config(draft, mode, k, defaults)
        return run_one(target, draft, counters, ids, mode, n, eos)

    if warm > 0:
        for mode in modes:
            for ids in prompts.values():
                one(mode, ids, warm)
    for r in range(reps):
        for pid, ids in prompts.items():
            order = modes if r % 2 == 0 else modes[::-1]
            for mode in order:
                runs[mode][pid].append(one(mode, ids, max_new))
                print(f"hf {mode} rep {r + 1}/{reps} {pid}", file=sys.stderr, flush=True)

    out: dict[str, Any] = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cuda_available": torch.cuda.is_available(),
        "load_s": t_load,
        "k": k,
        "modes": modes,
        "assistant_defaults": {
            key: (v if v is None or isinstance(v, (int, float, str)) else str(v)) for key, v in defaults.items()
        },
        "prompts": {},
    }
    for pid in prompts:
        base = runs["target_only"][pid]
        entry: dict[str, Any] = {"token_ids": {}}
        for mode in modes:
            rs = runs[mode][pid]
            entry[mode] = mode_summary(rs)
            entry["token_ids"][mode] = rs[0]["token_ids"]
            if mode != "target_only":
                entry[mode].update(paired_ratios(base, rs))
                entry[mode]["acceptance_rate"] = spread([r.get("acceptance_rate") for r in rs])
                entry[mode]["mean_tokens_per_round"] = spread([r.get("mean_tokens_per_round") for r in rs])
                entry[mode]["greedy_parity"] = all(
                    s["token_ids"] == b["token_ids"] for b, s in zip(base, rs, strict=True)
                )
        entry["runs"] = {m: [{k2: v for k2, v in r.items() if k2 != "token_ids"} for r in runs[m][pid]] for m in modes}
        out["prompts"][pid] = entry
    Path(result_path).write_text(json.dumps(out, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main(sys.argv[1], sys.argv[2]))
