"""Cheap drafts side by side: the draft model, pruned-vocabulary drafts, a layer-truncated target, prompt lookup.

For each proposer, one ``Decoder`` (target + that draft) decodes every prompt target-only (``proposer="none"``, the
same session) and speculatively, alternating, so the ratio compares like with like. Reported per proposer: acceptance
rate, mean tokens per round, c_q (ms per draft pass: draft time / drafted tokens), decode tokens/s of both, the
speedup (ratio of mean tokens/s over the prompts, the definition of benches/RESULTS.md) and whether greedy output
equals target-only output token for token.

Draft weights: fp32 and int4 (``--draft-dtypes``; MatMulNBits, 4-bit blocks): an int4 draft of the fp32 target is
another cheap proposer; the target stays fp32, so greedy output must still equal the fp32 target's token for token.

Pruned drafts keep the ``N`` most frequent tokens (specrt.convert.vocab_subset) of the 0.5B draft's 151,936; their
``q`` is zero elsewhere and verification stays exactly lossless (rust/specrt-core/src/subset.rs).

Usage::

    python benches/bench_drafts.py --json benches/results/drafts-fp32.json
    python benches/bench_drafts.py --subsets 8192,32768 --truncated 4 --max-new-tokens 64   # quicker
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import specrt
from specrt import models
from specrt.bench import load_prompts
from specrt.bench.runner import _machine

TARGET = "qwen2.5-coder-1.5b-instruct"
DRAFT = "qwen2.5-coder-0.5b-instruct"


def _run(dec: specrt.Decoder, prompt: Any, **kw: Any) -> Any:
    args = {"messages": prompt.messages} if prompt.messages else {"prompt": prompt.prompt}
    return dec.generate(**args, temperature=0, ignore_eos=True, **kw)


def measure(label: str, draft: Path | None, proposer: str, prompts: list[Any], k: int | str, n: int) -> dict:
    dec = specrt.Decoder(models.resolve_model(TARGET), draft, max_seq_len=2048)
    _run(dec, prompts[0], max_new_tokens=8, proposer="none", num_speculative_tokens=0)  # warm-up
    rows = []
    for p in prompts:
        ref = _run(dec, p, max_new_tokens=n, proposer="none", num_speculative_tokens=0)
        out = _run(dec, p, max_new_tokens=n, proposer=proposer, num_speculative_tokens=k)
        s = out.stats
        rows.append(
            {
                "prompt": p.id,
                "target_tokens_per_s": ref.stats.decode_tokens_per_s,
                "spec_tokens_per_s": s.decode_tokens_per_s,
                "acceptance_rate": s.acceptance_rate,
                "mean_tokens_per_round": s.mean_tokens_per_round,
                "c_q_ms": s.draft_ms / s.n_drafted if s.n_drafted and proposer != "ngram" else None,
                "c_p_ms": ref.stats.target_ms / max(ref.stats.n_rounds, 1),
                "identical": out.token_ids == ref.token_ids,
            }
        )
        print(
            f"  {label:<30} {p.id:<20} target {rows[-1]['target_tokens_per_s']:6.2f} tok/s  spec "
            f"{rows[-1]['spec_tokens_per_s']:6.2f} tok/s  a={s.acceptance_rate or 0:.3f}  "
            f"E={s.mean_tokens_per_round or 0:.2f}  same={rows[-1]['identical']}",
            flush=True,
        )
    del dec
    gc.collect()
    mean_t = statistics.mean(r["target_tokens_per_s"] for r in rows)
    mean_s = statistics.mean(r["spec_tokens_per_s"] for r in rows)
    c_q = [r["c_q_ms"] for r in rows if r["c_q_ms"] is not None]
    acc = [r["acceptance_rate"] for r in rows if r["acceptance_rate"] is not None]
    return {
        "label": label,
        "draft": str(draft) if draft else None,
        "proposer": proposer,
        "k": k,
        "speedup": mean_s / mean_t,
        "target_tokens_per_s": mean_t,
        "spec_tokens_per_s": mean_s,
        "acceptance_rate": statistics.mean(acc) if acc else None,
        "mean_tokens_per_round": statistics.mean(r["mean_tokens_per_round"] or 0 for r in rows),
        "c_q_ms": statistics.median(c_q) if c_q else None,
        "c_p_ms": statistics.median(r["c_p_ms"] for r in rows),
        "all_identical": all(r["identical"] for r in rows),
        "prompts": rows,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompt-set", default="peers", help="set of benches/prompts.json (default: peers)")
    ap.add_argument("--max-new-tokens", type=int, default=128, help="tokens per prompt (default 128)")
    ap.add_argument("-k", default="4", help="K for the model drafts, or 'auto' (default 4)")
    ap.add_argument("--subsets", default="8192,16384,32768", help="pruned-draft sizes N (default 8192,16384,32768)")
    ap.add_argument("--draft-dtypes", default="fp32,int4", help="weights of the 0.5B drafts (default fp32,int4)")
    ap.add_argument("--truncated", default="4", help="target layers kept for a truncated draft, '' = none (default 4)")
    ap.add_argument("--json", default=None, help="write the results here")
    a = ap.parse_args()
    k: int | str = a.k if a.k == "auto" else int(a.k)
    prompts = load_prompts(set_name=a.prompt_set)
    t0 = time.perf_counter()
    configs: list[tuple[str, Path | None, str]] = []
    for dtype in [d for d in a.draft_dtypes.split(",") if d]:
        tag = "" if dtype == "fp32" else f" {dtype}"
        configs.append((f"draft 0.5B{tag} (full vocab)", models.pull(DRAFT, dtype, progress=False), "draft"))
        for n in [int(x) for x in a.subsets.split(",") if x]:
            t = time.perf_counter()
            folder = models.pruned(DRAFT, n, dtype, progress=False)
            print(f"pruned draft {dtype} N={n}: {folder} ({time.perf_counter() - t:.0f} s)", flush=True)
            configs.append((f"draft 0.5B{tag} pruned N={n}", folder, "draft"))
    if a.truncated:
        layers = int(a.truncated)
        configs.append((f"target truncated L={layers}", models.truncated(TARGET, layers, progress=False), "draft"))
    configs.append(("prompt lookup (n-gram)", None, "ngram"))
    results = []
    for label, draft, proposer in configs:
        print(label, flush=True)
        results.append(measure(label, draft, proposer, prompts, k, a.max_new_tokens))
    print()
    print(
        f"{'proposer':<32} {'accept':>7} {'E':>5} {'c_q ms':>7} {'c_p ms':>7} {'spec/target':>11} {'greedy same':>11}"
    )
    for r in results:
        c_q = f"{r['c_q_ms']:.1f}" if r["c_q_ms"] is not None else "-"
        acc = f"{r['acceptance_rate']:.3f}" if r["acceptance_rate"] is not None else "-"
        print(
            f"{r['label']:<32} {acc:>7} {r['mean_tokens_per_round']:>5.2f} {c_q:>7} {r['c_p_ms']:>7.1f} "
            f"{r['speedup']:>10.2f}x {r['all_identical']!s:>11}"
        )
    report = {
        "command": "python benches/bench_drafts.py "
        + " ".join(f"--{k.replace('_', '-')}={v}" for k, v in vars(a).items() if v),
        "machine": _machine(),
        "python": platform.python_version(),
        "target": TARGET,
        "max_new_tokens": a.max_new_tokens,
        "prompt_set": a.prompt_set,
        "seconds": time.perf_counter() - t0,
        "results": results,
    }
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
