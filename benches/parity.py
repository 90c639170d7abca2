"""Greedy parity on real models: speculative output vs target-only output, token for token.

For each prompt: greedy target-only and greedy speculative (same Decoder, K given) for ``--max-new-tokens``. Where they
differ, report the first divergence and the target's top-2 logit gap there (computed by a separate one-row pass of the
target over the common prefix). In fp32 the outputs must be identical; in int4 the one-row and multi-row MatMulNBits
kernels round differently, so a near-tie (gap below ``--tolerance``) may flip: that is reported, and only a flip at a
larger gap fails.

Usage::

    python benches/parity.py --target qwen2.5-coder-1.5b-instruct --draft qwen2.5-coder-0.5b-instruct \
        --dtype fp32 --prompt-set peers --max-new-tokens 128
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

import specrt
from specrt import _specrt
from specrt._ort import find_ort_library

REPO = Path(__file__).resolve().parent.parent


def top2_gap(model: _specrt.OrtModel, ids: list[int]) -> tuple[float, int, int]:
    """Top-2 logit gap of the target's next-token logits after ``ids`` (one-row pass), and the two ids."""
    logits = model.forward(np.asarray(ids, np.int64), 0, 1)[0]
    top = np.argsort(logits)[-2:][::-1]
    return float(logits[top[0]] - logits[top[1]]), int(top[0]), int(top[1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--prompt-set", default="peers")
    ap.add_argument("-k", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--tolerance", type=float, default=0.05, help="int4: largest top-2 gap a flip may have")
    ap.add_argument("--out", default=str(REPO / "benches" / "out" / "parity.json"))
    a = ap.parse_args()

    from specrt.bench import load_prompts

    prompts = load_prompts(REPO / "benches" / "prompts.json", set_name=a.prompt_set)
    dec = specrt.Decoder(a.target, a.draft, dtype=a.dtype, max_seq_len=2048)
    oracle = _specrt.OrtModel(str(dec.target_path), ort_library=find_ort_library(), max_seq_len=2048)
    rows = []
    ok = True
    for p in prompts:
        kw = {"messages": list(p.messages)} if p.messages else {"prompt": p.prompt}
        t0 = time.perf_counter()
        ref = dec.generate(**kw, max_new_tokens=a.max_new_tokens, temperature=0, num_speculative_tokens=0)
        spec = dec.generate(**kw, max_new_tokens=a.max_new_tokens, temperature=0, num_speculative_tokens=a.k)
        row = {
            "prompt": p.id,
            "n_tokens": len(ref.token_ids),
            "identical": ref.token_ids == spec.token_ids,
            "acceptance_rate": spec.stats.acceptance_rate,
            "seconds": round(time.perf_counter() - t0, 1),
        }
        if not row["identical"]:
            i = next(
                (j for j, (x, y) in enumerate(zip(ref.token_ids, spec.token_ids, strict=False)) if x != y),
                min(len(ref.token_ids), len(spec.token_ids)),
            )
            gap, t1, t2 = top2_gap(oracle, ref.prompt_token_ids + ref.token_ids[:i])
            row.update(first_divergence=i, top2_gap=gap, top2=[t1, t2])
            row["within_tolerance"] = a.dtype != "fp32" and gap < a.tolerance
            ok &= row["within_tolerance"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    report = {
        "command": " ".join(sys.argv),
        "machine": platform.processor() or platform.machine(),
        "dtype": a.dtype,
        "k": a.k,
        "tolerance": a.tolerance,
        "rows": rows,
        "pass": ok,
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(report, indent=2))
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
