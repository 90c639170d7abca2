"""Structured output under speculation: constrained speculative vs constrained target-only vs unconstrained speculative
tokens/s on prompts asking for JSON of the schema set (issue 28: goals >= 2x constrained target-only, >= 1.2x
unconstrained speculative, mask work under 5% of a round).

    python benches/bench_structured.py                                   # Qwen pair: fp32 1.5B target, int4 0.5B draft
    python benches/bench_structured.py --target smollm2-135m-instruct --draft smollm2-135m-instruct --limit 20
    python benches/bench_structured.py --json benches/results/structured.json
    python benches/bench_structured.py --llama-server ~/.cache/specrt/llama.cpp/0.3.36/build/bin   # + the peer

Each prompt of ``tests/data/json_schemas.json`` (a system message asking for JSON only, the schema's request as the user
message, the chat template's prompt) is decoded greedily three ways on one Decoder, interleaved per prompt:
``constrained-spec`` (``json_schema=`` the schema, K = ``--k``), ``constrained-target`` (the same, K = 0) and
``free-spec`` (no constraint, K = ``--k``, at most as many tokens as the constrained run emitted, EOS ignored so both
decode the same number of tokens). Reports the sums over prompts: decode tokens/s (tokens after the first / decode
time, so prefill is left out of all three alike), the ratios, the share of emitted tokens that were grammar-forced
free drafts, the constraint's time per emitted token and its share of decode time, and the validity of the
constrained outputs (``jsonschema``, format checks on; outputs cut by ``--max-new-tokens`` counted apart).

With ``--llama-server BIN`` the same prompts go, after specrt's runs, to llama.cpp's ``llama-server`` (built by
``benches/peers/setup_llama_cpp.sh``) on 127.0.0.1 with the GGUF files specrt converted from (the Q4_K_M target
and its draft, ``--draft-max K``), greedy, OpenAI's ``response_format`` json_schema: its own decode tokens/s
(``timings.predicted_per_second``) and validity, target-only (no ``-md``) and with the draft.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

import jsonschema

import specrt
from specrt import models

ROOT = Path(__file__).resolve().parents[1]
SYSTEM = "You are a helpful assistant. Answer with JSON only."


def run(dec: specrt.Decoder, messages: list[dict[str, str]], **kwargs: Any) -> dict[str, Any]:
    t0 = time.perf_counter()
    r = dec.generate(messages=messages, temperature=0.0, **kwargs)
    wall_s = time.perf_counter() - t0
    s = r.stats.as_dict()
    return {
        "text": r.text,
        "finish_reason": r.finish_reason,
        "n_tokens": len(r.token_ids),
        "wall_s": wall_s,
        "decode_ms": s["draft_ms"] + s["target_ms"] + s["core_ms"],
        "prefill_ms": s["prefill_ms"],
        "mask_ms": s.get("mask_ms", 0.0),
        "n_rounds": s["n_rounds"],
        "n_drafted": s["n_drafted"],
        "n_accepted": s["n_accepted"],
        "n_drafted_forced": s.get("n_drafted_forced", 0),
        "n_accepted_forced": s.get("n_accepted_forced", 0),
    }


def valid(schema: dict[str, Any], text: str) -> bool:
    cls = jsonschema.validators.validator_for(schema)
    try:
        cls(schema, format_checker=cls.FORMAT_CHECKER).validate(json.loads(text))
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def llama_server_sweep(
    bin_dir: Path, target: str, draft: str | None, entries: list[dict[str, Any]], k: int, max_tokens: int
) -> dict[str, Any]:
    """llama-server on the schema prompts (one slot, greedy, json_schema response_format): tokens/s and validity."""
    import httpx

    gguf = models.cache_dir() / "gguf"
    names = {e.name: e for e in gguf.iterdir() if e.suffix == ".gguf"}
    pick = lambda stem: next(p for n, p in names.items() if n.lower().startswith(stem))  # noqa: E731
    port = 18731
    cmd = [str(bin_dir / "llama-server"), "-m", str(pick(target)), "--port", str(port), "--host", "127.0.0.1"]
    cmd += ["-c", "4096", "-np", "1", "--no-webui"]
    if draft:
        cmd += ["-md", str(pick(draft)), "--spec-draft-n-max", str(k), "--spec-draft-n-min", "0"]
    log = Path(tempfile.gettempdir()) / f"bench_structured_llama_server_{port}.log"
    print(f"llama-server: {' '.join(cmd)} (log: {log})", flush=True)
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(600):
            if proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {proc.returncode} (see {log})")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        n_tokens = 0
        decode_ms = 0.0
        n_valid = n_cut = 0
        for e in entries:
            body = {
                "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": e["prompt"]}],
                "temperature": 0.0,
                "max_tokens": max_tokens,
                "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": e["schema"]}},
            }
            r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=600).json()
            if "choices" not in r:
                print(f"llama-server refused {e['name']}: {str(r)[:200]}", flush=True)
                continue
            choice = r["choices"][0]
            t = r.get("timings", {})
            n_tokens += max(0, t.get("predicted_n", 0) - 1)
            decode_ms += t.get("predicted_ms", 0.0)
            n_cut += choice["finish_reason"] == "length"
            n_valid += choice["finish_reason"] != "length" and valid(e["schema"], choice["message"]["content"] or "")
        return {
            "command": " ".join(cmd),
            "tokens_per_s": n_tokens / (decode_ms / 1000) if decode_ms else None,
            "valid": n_valid,
            "cut_by_length": n_cut,
            "n_prompts": len(entries),
        }
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--dtype", default="fp32", help="target weights")
    ap.add_argument("--draft-dtype", default="int4", help="draft weights")
    ap.add_argument("--k", type=int, default=4, help="num_speculative_tokens of the speculative runs")
    ap.add_argument("--max-new-tokens", type=int, default=320)
    ap.add_argument("--limit", type=int, default=None, help="first N schemas only")
    ap.add_argument("--json", type=Path, default=None, help="write per-prompt results here")
    ap.add_argument("--llama-server", type=Path, default=None, help="folder of llama.cpp's llama-server: run the peer")
    ap.add_argument("--peer-limit", type=int, default=None, help="first N schemas only for the peer")
    ap.add_argument("--peers-only", action="store_true", help="run only the peer (no specrt runs)")
    a = ap.parse_args()

    entries = json.loads((ROOT / "tests" / "data" / "json_schemas.json").read_text())[: a.limit]
    summary: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "machine": f"{platform.machine()} {platform.processor() or ''} {platform.node()}".strip(),
    }
    rows: list[dict[str, Any]] = []
    if not a.peers_only:
        rows = specrt_sweep(a, entries)
        summary.update(summarize(rows))
        save(a.json, summary, rows)
    if a.llama_server:
        peer_entries = entries[: a.peer_limit]
        summary["llama-server"] = {}
        for mode, draft in (("target-only", None), ("draft", a.draft)):
            try:
                out = llama_server_sweep(a.llama_server, a.target, draft, peer_entries, a.k, a.max_new_tokens)
            except Exception as e:  # a peer's failure is recorded, never lost with specrt's figures
                out = {"error": f"{type(e).__name__}: {e}"}
            summary["llama-server"][mode] = out
            save(a.json, summary, rows)
    print(json.dumps(summary, indent=1))


MODES = ("constrained-spec", "constrained-target", "free-spec")


def save(path: Path | None, summary: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))


def specrt_sweep(a: argparse.Namespace, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """specrt's three modes on each prompt, interleaved."""
    dec = specrt.Decoder(
        models.pull(a.target, a.dtype, progress=False),
        models.pull(a.draft, a.draft_dtype, progress=False),
        max_seq_len=1024,
    )
    rows: list[dict[str, Any]] = []
    warm = [{"role": "user", "content": "Say hi."}]
    run(dec, warm, max_new_tokens=8, num_speculative_tokens=a.k)
    for i, e in enumerate(entries):
        msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": e["prompt"]}]
        cs = run(dec, msgs, json_schema=e["schema"], max_new_tokens=a.max_new_tokens, num_speculative_tokens=a.k)
        ct = run(dec, msgs, json_schema=e["schema"], max_new_tokens=a.max_new_tokens, num_speculative_tokens=0)
        fs = run(dec, msgs, max_new_tokens=cs["n_tokens"], ignore_eos=True, num_speculative_tokens=a.k)
        row = {"name": e["name"], **dict(zip(MODES, (cs, ct, fs), strict=True))}
        for m in MODES[:2]:
            row[m]["valid"] = row[m]["finish_reason"] != "length" and valid(e["schema"], row[m]["text"])
        row["same_tokens"] = cs["text"] == ct["text"]
        rows.append(row)
        print(
            f"[{i + 1}/{len(entries)}] {e['name']}: {cs['n_tokens']} tokens, spec {cs['decode_ms']:.0f} ms, "
            f"target {ct['decode_ms']:.0f} ms, free {fs['decode_ms']:.0f} ms, forced {cs['n_drafted_forced']}, "
            f"mask {cs['mask_ms']:.1f} ms, valid {cs['valid']}/{ct['valid']}, same {row['same_tokens']}",
            flush=True,
        )
    return rows


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def tps(m: str) -> float:
        n = sum(r[m]["n_tokens"] - 1 for r in rows)
        return n / (sum(r[m]["decode_ms"] for r in rows) / 1000)

    cs_rows = [r["constrained-spec"] for r in rows]
    n_emitted = sum(r["n_tokens"] for r in cs_rows)
    return {
        "n_prompts": len(rows),
        "tokens_per_s": {m: tps(m) for m in MODES},
        "spec_vs_target": tps("constrained-spec") / tps("constrained-target"),
        "spec_vs_free_spec": tps("constrained-spec") / tps("free-spec"),
        "forced_share": sum(r["n_accepted_forced"] for r in cs_rows) / n_emitted,
        "forced_drafted_share": sum(r["n_drafted_forced"] for r in cs_rows)
        / max(1, sum(r["n_drafted"] for r in cs_rows)),
        "mask_ms_per_token": sum(r["mask_ms"] for r in cs_rows) / n_emitted,
        "mask_share_of_decode": sum(r["mask_ms"] for r in cs_rows) / sum(r["decode_ms"] for r in cs_rows),
        "mean_tokens_per_round": n_emitted / max(1, sum(r["n_rounds"] for r in cs_rows)),
        "valid": {m: sum(r[m]["valid"] for r in rows) for m in MODES[:2]},
        "cut_by_length": {m: sum(r[m]["finish_reason"] == "length" for r in rows) for m in MODES[:2]},
        "same_tokens": sum(r["same_tokens"] for r in rows),
    }


if __name__ == "__main__":
    main()
