"""The acceptance cost of coupled sampling: min(1, p/q) acceptance vs coupled acceptance on the same pair and prompts.

Coupled sampling (``coupled=True``) keeps a draft token only when it equals the target's own choice at that position
(the same per-position noise on both sides), so its acceptance is at most the rejection-sampling acceptance
``sum_x min(p(x), q(x))``. This runs both modes at each temperature over the same prompts and seeds, and checks that
coupled speculative text equals coupled target-only text (the point of the mode).

Usage::

    python benches/bench_coupled.py --json benches/results/coupled-fp32.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import specrt
from specrt import models
from specrt.bench import load_prompts
from specrt.bench.runner import _machine


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct", help="target (default: the Qwen 1.5B)")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct", help="draft (default: the Qwen 0.5B)")
    ap.add_argument("--prompt-set", default="peers", help="set of benches/prompts.json (default: peers)")
    ap.add_argument(
        "--temperatures", default="0.7,1.0", help="temperatures (default 0.7,1.0; '' = skip the acceptance part)"
    )
    ap.add_argument("--seeds", type=int, default=2, help="seeds per prompt (default 2)")
    ap.add_argument("--max-new-tokens", type=int, default=96, help="tokens per generation (default 96)")
    ap.add_argument("-k", type=int, default=4, help="K (default 4)")
    ap.add_argument(
        "--parity-seeds",
        type=int,
        default=0,
        help="also check coupled text equality for K = 1, 4, 8, auto x draft model / n-gram on this many seeds of "
        "the first 3 prompts, --parity-tokens each (default 0: skip)",
    )
    ap.add_argument("--parity-tokens", type=int, default=48, help="tokens per parity generation (default 48)")
    ap.add_argument("--json", default=None, help="write the results here")
    a = ap.parse_args()
    t0 = time.perf_counter()
    dec = specrt.Decoder(models.resolve_model(a.target), models.resolve_model(a.draft), max_seq_len=2048)
    prompts = load_prompts(set_name=a.prompt_set)
    results = []
    for temp in [float(x) for x in a.temperatures.split(",") if x.strip()]:
        row: dict = {"temperature": temp}
        for coupled in (False, True):
            drafted = accepted = rounds = emitted = 0
            tps = []
            same = []
            for p in prompts:
                args = {"messages": p.messages} if p.messages else {"prompt": p.prompt}
                for seed in range(a.seeds):
                    kw = {"max_new_tokens": a.max_new_tokens, "temperature": temp, "seed": seed, "coupled": coupled}
                    out = dec.generate(**args, num_speculative_tokens=a.k, **kw)
                    s = out.stats
                    drafted, accepted = drafted + s.n_drafted, accepted + s.n_accepted
                    rounds, emitted = rounds + s.n_rounds, emitted + len(out.token_ids)
                    tps.append(s.decode_tokens_per_s)
                    if coupled:
                        ref = dec.generate(**args, proposer="none", num_speculative_tokens=0, **kw)
                        same.append(ref.token_ids == out.token_ids)
            key = "coupled" if coupled else "rejection_sampling"
            row[key] = {
                "acceptance_rate": accepted / drafted if drafted else None,
                "mean_tokens_per_round": emitted / rounds if rounds else None,
                "decode_tokens_per_s": statistics.median(tps),
                "drafted": drafted,
            }
            if coupled:
                row[key]["text_equals_target_only"] = f"{sum(same)}/{len(same)}"
            print(f"T={temp} {key:<19} {row[key]}", flush=True)
        results.append(row)
    parity = []
    for p in prompts[:3] if a.parity_seeds else []:
        args = {"messages": p.messages} if p.messages else {"prompt": p.prompt}
        for seed in range(a.parity_seeds):
            kw = {"max_new_tokens": a.parity_tokens, "temperature": 1.0, "seed": seed, "coupled": True}
            ref = dec.generate(**args, proposer="none", num_speculative_tokens=0, **kw).token_ids
            for k in (1, 4, 8, "auto"):
                for proposer in ("draft", "ngram"):
                    out = dec.generate(**args, proposer=proposer, num_speculative_tokens=k, **kw)
                    parity.append(
                        {"prompt": p.id, "seed": seed, "k": k, "proposer": proposer, "equal": out.token_ids == ref}
                    )
        print(f"parity {p.id}: {sum(x['equal'] for x in parity)}/{len(parity)} equal so far", flush=True)
    report = {
        "parity": parity,
        "parity_summary": f"{sum(x['equal'] for x in parity)}/{len(parity)}" if parity else None,
        "command": "python benches/bench_coupled.py "
        + " ".join(f"--{k.replace('_', '-')}={v}" for k, v in vars(a).items() if v),
        "machine": _machine(),
        "seconds": time.perf_counter() - t0,
        "results": results,
    }
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
