"""Target-only greedy decoding speed of a converted model: specrt vs onnxruntime-genai on the same files.

For each prompt of a set in ``benches/prompts.json`` (default: the four peers.md prompts), decode ``--max-new-tokens``
greedy tokens target-only with ``specrt.Decoder`` and, when ``onnxruntime_genai`` is importable, with onnxruntime-genai
loading the very same ``model.onnx`` (a ``genai_config.json`` is written into a temporary folder of symlinks: our
decoder contract uses genai's input/output names and its shared past/present buffer). Runs alternate between the two
so both see the same machine load. tokens/s = new tokens / wall time including prefill (peers.md's definition).

Usage::

    python benches/bench_int4.py MODEL_FOLDER [--set peers] [--repeats 3] [--threads 2] [--json out.json]

Prints one line per prompt and runtime (median and [min-max] over repeats, new-token count) and a summary.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def load_prompts(set_name: str) -> list[dict[str, Any]]:
    """The prompts of ``set_name`` from ``benches/prompts.json``, in the set's order."""
    data = json.loads((HERE / "prompts.json").read_text())
    by_id = {p["id"]: p for p in data["prompts"]}
    return [by_id[i] for i in data["sets"][set_name]]


def genai_folder(model: Path, threads: int, max_length: int) -> Path:
    """A temporary folder with symlinks to ``model``'s files and a ``genai_config.json`` describing them."""
    cfg = json.loads((model / "specrt_config.json").read_text())
    gen = json.loads((model / "generation_config.json").read_text())
    tmp = Path(tempfile.mkdtemp(prefix="genai-"))
    for f in model.iterdir():
        (tmp / f.name).symlink_to(f)
    eos = gen.get("eos_token_id") or cfg["eos_token_ids"]
    genai = {
        "model": {
            "bos_token_id": cfg.get("bos_token_id") or 0,
            "context_length": cfg["max_position_embeddings"],
            "eos_token_id": eos,
            "pad_token_id": cfg.get("pad_token_id") or eos[0],
            "type": cfg["architecture"],
            "vocab_size": cfg["vocab_size"],
            "decoder": {
                "session_options": {
                    "log_id": "onnxruntime-genai",
                    "provider_options": [],
                    "intra_op_num_threads": threads,
                },
                "filename": "model.onnx",
                "head_size": cfg["head_dim"],
                "hidden_size": cfg["hidden_size"],
                "num_attention_heads": cfg["num_attention_heads"],
                "num_hidden_layers": cfg["num_layers"],
                "num_key_value_heads": cfg["num_kv_heads"],
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
            },
        },
        "search": {
            "do_sample": False,
            "max_length": max_length,
            "min_length": 0,
            "num_beams": 1,
            "num_return_sequences": 1,
            "past_present_share_buffer": True,
            "repetition_penalty": 1.0,
            "temperature": 1.0,
            "top_k": 1,
            "top_p": 1.0,
        },
    }
    (tmp / "genai_config.json").write_text(json.dumps(genai, indent=2))
    tok_cfg = {"add_bos_token": bool(cfg.get("add_bos_token")), "tokenizer_class": "PreTrainedTokenizerFast"}
    (tmp / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    return tmp


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--set", default="peers")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--no-genai", action="store_true")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()

    import specrt

    dec = specrt.Decoder(a.model, max_seq_len=1024, intra_op_threads=a.threads)
    prompts = load_prompts(a.set)
    ids = {p["id"]: dec.encode(p.get("prompt"), p.get("messages")) for p in prompts}

    og = None
    if not a.no_genai:
        try:
            import onnxruntime_genai as og
        except ImportError:
            print("onnxruntime_genai not importable: specrt only")
    if og is not None:
        gdir = genai_folder(a.model, a.threads, max_length=1024)
        gmodel = og.Model(str(gdir))

    def run_specrt(p: dict[str, Any]) -> tuple[float, int, list[int]]:
        t = time.perf_counter()
        r = dec.generate(ids[p["id"]], max_new_tokens=a.max_new_tokens, temperature=0, num_speculative_tokens=0)
        return time.perf_counter() - t, len(r.token_ids), r.token_ids

    def run_genai(p: dict[str, Any]) -> tuple[float, int, list[int]]:
        params = og.GeneratorParams(gmodel)
        prompt_ids = ids[p["id"]]
        params.set_search_options(max_length=len(prompt_ids) + a.max_new_tokens, do_sample=False)
        t = time.perf_counter()
        gen = og.Generator(gmodel, params)
        gen.append_tokens(prompt_ids)
        out: list[int] = []
        while not gen.is_done() and len(out) < a.max_new_tokens:
            gen.generate_next_token()
            out.append(int(gen.get_next_tokens()[0]))
        return time.perf_counter() - t, len(out), out

    runners = {"specrt": run_specrt} | ({"genai": run_genai} if og is not None else {})
    for fn in runners.values():  # warm-up (first-run allocations, page cache)
        fn(prompts[0])
    results: dict[str, dict[str, Any]] = {}
    for p in prompts:
        for name in runners:
            results.setdefault(p["id"], {})[name] = {"tok_s": [], "n": 0, "tokens": None}
        for _ in range(a.repeats):
            for name, fn in runners.items():
                dt, n, toks = fn(p)
                r = results[p["id"]][name]
                r["tok_s"].append(n / dt)
                r["n"], r["tokens"] = n, toks
        line = [f"{p['id']:20s} prompt {len(ids[p['id']]):4d} tok"]
        for name in runners:
            r = results[p["id"]][name]
            line.append(
                f"{name} {statistics.median(r['tok_s']):6.2f} tok/s [{min(r['tok_s']):.2f}-{max(r['tok_s']):.2f}] "
                f"({r['n']} new)"
            )
        if "genai" in runners:
            same = results[p["id"]]["specrt"]["tokens"] == results[p["id"]]["genai"]["tokens"]
            line.append("same tokens" if same else "tokens differ")
        print("  ".join(line), flush=True)
    if a.json:
        a.json.write_text(
            json.dumps(
                {
                    "model": str(a.model),
                    "threads": a.threads,
                    "max_new_tokens": a.max_new_tokens,
                    "load_average": os.getloadavg(),
                    "results": {
                        k: {n: {"tok_s": r["tok_s"], "n": r["n"]} for n, r in v.items()} for k, v in results.items()
                    },
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
