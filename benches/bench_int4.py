"""Target-only greedy decoding speed of a converted model: specrt vs onnxruntime-genai on the same files.

For each prompt of a set in ``benches/prompts.json`` (default: the four peers.md prompts), decode ``--max-new-tokens``
greedy tokens target-only with ``specrt.Decoder`` and, when ``onnxruntime_genai`` is importable, with onnxruntime-genai
loading the very same ``model.onnx`` (a ``genai_config.json`` is written into a temporary folder of symlinks:
our decoder contract uses genai's input/output names and its shared past/present buffer). Each runtime runs in its
own worker process (both alive for the whole run, asked in turn, the order alternating per repetition) so both see
the same machine load and each session is the only one in its process; both use a KV cache of ``--max-seq-len``
positions. tokens/s = new tokens / wall time including prefill (peers.md's definition).

Usage::

    PYTHONPATH=python benches/out/venv-genai/bin/python benches/bench_int4.py MODEL_FOLDER [--set peers] \\
        [--repeats 3] [--threads 2] [--json out.json]

(the onnxruntime-genai venv of ``benches/peers/setup_genai_venv.sh``; with another python, specrt only).

Prints one line per prompt and runtime (median and [min-max] over repeats, new-token count) and a summary.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
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
    written = ("genai_config.json", "tokenizer_config.json")  # written below: never through a link into the model
    for f in model.iterdir():
        if f.name not in written:
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


def worker(
    runtime: str, model: Path, threads: int, max_new_tokens: int, max_seq_len: int, draft: Path | None = None
) -> int:
    """Serve one runtime in this process: read a JSON list of prompt ids per line, answer with the timing."""
    import specrt
    from specrt.folder_text import folder_text

    tokenizer, template = folder_text(model)

    def encode(p: dict[str, Any]) -> list[int]:
        # Decoder.encode without a session (the specrt worker checks the two agree): the genai worker must hold
        # no specrt session, so that each process has exactly one.
        if p.get("messages") is None:
            return tokenizer.encode(p["prompt"]).ids
        text = template.render(p["messages"], True) if template is not None else ""
        return tokenizer.encode(text, add_special_tokens=False).ids

    if runtime == "specrt":
        dec = specrt.Decoder(model, max_seq_len=max_seq_len, intra_op_threads=threads)
    elif runtime == "specrt-k0":
        # Speculation on (a draft model attached, the speculative loop) with K = 0.
        dec = specrt.Decoder(model, draft, max_seq_len=max_seq_len, intra_op_threads=threads)
    else:
        import onnxruntime_genai as og

        gmodel = og.Model(str(genai_folder(model, threads, max_length=max_seq_len)))
    for line in sys.stdin:
        p = json.loads(line)
        ids = encode(p)
        if runtime != "genai" and ids != dec.encode(p.get("prompt"), p.get("messages")):
            raise RuntimeError("bench tokenization differs from Decoder.encode")
        t = time.perf_counter()
        if runtime != "genai":
            out = list(
                dec.generate(ids, max_new_tokens=max_new_tokens, temperature=0, num_speculative_tokens=0).token_ids
            )
        else:
            params = og.GeneratorParams(gmodel)
            # The same KV buffer length as specrt's (max_seq_len): both scan the same cache size.
            params.set_search_options(max_length=max_seq_len, do_sample=False)
            gen = og.Generator(gmodel, params)
            gen.append_tokens(ids)
            out = []
            while not gen.is_done() and len(out) < max_new_tokens:
                gen.generate_next_token()
                out.append(int(gen.get_next_tokens()[0]))
        dt = time.perf_counter() - t
        print(json.dumps({"n_prompt": len(ids), "seconds": dt, "tokens": out}), flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--set", default="peers")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--max-seq-len", type=int, default=1024, help="KV cache length of both runtimes")
    ap.add_argument("--no-genai", action="store_true")
    ap.add_argument(
        "--runtimes",
        default="specrt,genai",
        help="comma-separated: specrt (target-only Decoder), specrt-k0 (Decoder with --draft, K = 0), genai",
    )
    ap.add_argument("--draft", type=Path, default=None, help="draft model folder for specrt-k0")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--worker", choices=["specrt", "specrt-k0", "genai"], help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker(a.worker, a.model, a.threads, a.max_new_tokens, a.max_seq_len, a.draft)

    runtimes = [r for r in a.runtimes.split(",") if not (a.no_genai and r == "genai")]
    if "specrt-k0" in runtimes and a.draft is None:
        ap.error("--runtimes specrt-k0 needs --draft")
    if "genai" in runtimes:
        try:
            import onnxruntime_genai  # noqa: F401
        except ImportError:
            print("onnxruntime_genai not importable: specrt only")
            runtimes.remove("genai")
    # One process per runtime, both alive for the whole run and asked in turn: each session is the only one in its
    # process (measured: within one process the session created second ran ~10% faster, whichever runtime it was).
    procs = {
        name: subprocess.Popen(
            [
                sys.executable,
                __file__,
                str(a.model),
                "--worker",
                name,
                "--threads",
                str(a.threads),
                "--max-new-tokens",
                str(a.max_new_tokens),
                "--max-seq-len",
                str(a.max_seq_len),
                *(["--draft", str(a.draft)] if a.draft else []),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for name in runtimes
    }

    def ask(name: str, p: dict[str, Any]) -> dict[str, Any]:
        proc = procs[name]
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps({"prompt": p.get("prompt"), "messages": p.get("messages")}) + "\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{name} worker exited (code {proc.wait()})")
        return json.loads(line)

    prompts = load_prompts(a.set)
    for name in runtimes:  # warm-up (first-run allocations, page cache)
        ask(name, prompts[0])
    results: dict[str, dict[str, Any]] = {}
    for p in prompts:
        for name in runtimes:
            results.setdefault(p["id"], {})[name] = {"tok_s": [], "n": 0, "tokens": None}
        n_prompt = 0
        for rep in range(a.repeats):
            for name in runtimes if rep % 2 == 0 else runtimes[::-1]:
                res = ask(name, p)
                r = results[p["id"]][name]
                r["tok_s"].append(len(res["tokens"]) / res["seconds"])
                r["n"], r["tokens"], n_prompt = len(res["tokens"]), res["tokens"], res["n_prompt"]
        line = [f"{p['id']:20s} prompt {n_prompt:4d} tok"]
        for name in runtimes:
            r = results[p["id"]][name]
            line.append(
                f"{name} {statistics.median(r['tok_s']):6.2f} tok/s [{min(r['tok_s']):.2f}-{max(r['tok_s']):.2f}] "
                f"({r['n']} new)"
            )
        toks = [results[p["id"]][name]["tokens"] for name in runtimes]
        line.append("same tokens" if all(t == toks[0] for t in toks) else "tokens differ")
        print("  ".join(line), flush=True)
    means = {name: statistics.fmean(statistics.median(v[name]["tok_s"]) for v in results.values()) for name in runtimes}
    print(
        "mean of medians: "
        + ", ".join(f"{name} {m:.2f} tok/s ({m / means[runtimes[0]]:.3f}x {runtimes[0]})" for name, m in means.items())
    )
    for proc in procs.values():
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait()
    if a.json:
        a.json.write_text(
            json.dumps(
                {
                    "model": str(a.model),
                    "threads": a.threads,
                    "max_new_tokens": a.max_new_tokens,
                    "max_seq_len": a.max_seq_len,
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
