"""Step costs and speculative speed of the graph form on a GPU, with and without CUDA graphs (issue 39).

For one ``--random-shapes`` pair (``specrt.bench.random_models``: random weights in the real shapes, fp16, graph
form), on the CUDA provider:

- per model (target, draft, the target's truncated copy): the one-token decode step's cost (``forward_argmax`` on a
  growing cache, median ms) with ``cuda_graph`` off and on, and on with ``SPECRT_GRAPH_COPIES=onnxruntime`` (the
  graph steps' inputs and outputs copied by ONNX Runtime identity runs instead of ``cudaMemcpy``);
- for the target: t(n), the cost of an n-token verification (n = 1..9, rolled back to the same cache each time),
  the draft's 2-token catch-up (1 logits row), and a one-token step that returns logits (what sampling and
  log-probabilities read);
- the cost model's prediction (``specrt.cost.speedup``, Leviathan et al. 2023, arXiv:2211.17192) at the real pair's
  acceptance (``--acceptance``, measured on the CPU with the real weights) for K = 1..8, and the best K;
- end to end (``specrt.Decoder``): target-only tokens/s, the full-acceptance truncated draft at K = 4 (measured
  against its prediction at a = 1), the random draft at K = 4 (it must run; its acceptance is ~0), each with graphs
  off and on, greedy, log-probabilities off and on.

The bandwidth floor is the weight bytes (``model.onnx.data``) over the H200's 4.8 TB/s.

Usage (on the GPU machine, after benches/gpu/run_gpu_bench.sh set the library up)::

    python benches/gpu/graph_speed.py --pair qwen2.5-coder --json $OUT/graph-speed.json
    python benches/gpu/graph_speed.py --pair qwen2.5-coder-7b --models-only-target --json $OUT/graph-speed-7b.json

``--provider cpu --pair tiny`` is the dry run of the same code on a CPU (``cpu_graph_steps`` in place of graphs).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HBM_BYTES_PER_S = 4.8e12  # H200 (HBM3e), NVIDIA's datasheet figure


def _weight_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("model.onnx*"))


def _model(folder: Path, lib: str, provider: str, graphs: bool, copies: str | None) -> Any:
    from specrt import _specrt

    if copies is None:
        os.environ.pop("SPECRT_GRAPH_COPIES", None)
    else:
        os.environ["SPECRT_GRAPH_COPIES"] = copies
    kw = {"cuda_graph": graphs} if provider == "cuda" else {"cpu_graph_steps": graphs}
    try:
        return _specrt.OrtModel(folder, ort_library=lib, provider=provider, max_seq_len=1024, **kw)
    finally:
        os.environ.pop("SPECRT_GRAPH_COPIES", None)


def _median_ms(times: list[float], skip: int) -> float:
    return 1e3 * statistics.median(times[skip:])


def step_costs(
    folder: Path, lib: str, provider: str, graphs: bool, copies: str | None, *, verify: bool, steps: int
) -> dict[str, Any]:
    """Median costs (ms) of one model's steps: ``c1`` (1 token, argmax), ``c1_logits`` (1 token, logits to the
    host), and for the target ``t`` (n tokens, n rows, n = 1..9) and ``catch_up`` (2 tokens, 1 row)."""
    m = _model(folder, lib, provider, graphs, copies)
    rng = np.random.default_rng(0)
    ctx = 64
    toks = rng.integers(0, min(1000, m.vocab_size), size=ctx + steps + 32).astype(np.int64)
    m.forward_argmax(toks[:ctx], 0, 1)
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        m.forward_argmax(toks[ctx + i : ctx + i + 1], ctx + i, 1)
        times.append(time.perf_counter() - t0)
    out: dict[str, Any] = {"c1": _median_ms(times, 8), "graph_copies": m.graph_copies}
    p = ctx + steps // 2

    def timed(n: int, rows: int, logits: bool = False, reps: int = 24) -> float:
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            if logits:
                m.forward(toks[p : p + n], p, rows)
            else:
                m.forward_argmax(toks[p : p + n], p, rows)
            ts.append(time.perf_counter() - t0)
        return _median_ms(ts, 4)

    out["c1_logits"] = timed(1, 1, logits=True)
    if verify:
        out["t"] = {n: timed(n, n) for n in range(1, 10)}
        out["catch_up"] = timed(2, 1)
        # Sampling and log-probabilities read the K + 1 verification rows (p) on the host: K = 4.
        out["t5_logits"] = timed(5, 5, logits=True)
    return out


def predictions(a: float, c_q: float, c_p: float, t: dict[int, float]) -> dict[str, Any]:
    """The cost model at acceptance ``a``: speedup over target-only for K = 1..8 with t(K + 1) measured."""
    from specrt import cost

    by_k = {k: cost.speedup(a, k, c_q, c_p, t[k + 1]) for k in range(1, 9)}
    best = max(by_k, key=by_k.__getitem__)
    return {"acceptance": a, "by_k": by_k, "best_k": best, "best": by_k[best]}


def decoder(target: Path, draft: Path | None, lib: str, provider: str, graphs: bool) -> Any:
    import specrt

    kw = {"cuda_graph": graphs} if provider == "cuda" else {}
    return specrt.Decoder(target, draft=draft, provider=provider, ort_library=lib, max_seq_len=1024, **kw)


def e2e(dec: Any, k: int, logprobs: bool, n_new: int) -> dict[str, Any]:
    """Best of 3 greedy generations of ``n_new`` tokens after a 40-token prompt on one Decoder (its device KV reused
    between generations, as a server's would be)."""
    prompt = list(range(100, 140))
    best = None
    for _ in range(3):
        t0 = time.perf_counter()
        out = dec.generate(
            prompt, max_new_tokens=n_new, temperature=0, num_speculative_tokens=k, ignore_eos=True, logprobs=logprobs
        )
        dt = time.perf_counter() - t0
        tps = len(out.token_ids) / dt
        if best is None or tps > best["tok_s"]:
            st = out.stats
            best = {
                "tok_s": tps,
                "tokens": list(out.token_ids),
                "rounds": st.n_rounds,
                "mean_tokens_per_round": len(out.token_ids) / max(1, st.n_rounds),
            }
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", default="qwen2.5-coder")
    ap.add_argument("--provider", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--acceptance", type=float, default=0.907, help="the real pair's per-token acceptance (CPU run)")
    ap.add_argument("--steps", type=int, default=160, help="one-token steps timed per model")
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument(
        "--target-only",
        action="store_true",
        help="time the target only (the draft's costs come from "
        "--draft-costs, a JSON this script wrote for another pair with the same draft)",
    )
    ap.add_argument("--draft-costs", type=Path)
    ap.add_argument("--tokenizer", type=Path, help="the tokenizer folder the random models were written with")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)

    from specrt._ort import find_ort_library
    from specrt.bench.random_models import ensure_random_models

    lib = find_ort_library(a.provider)
    dtype = "fp16" if a.provider == "cuda" else "fp32"
    t0 = time.perf_counter()
    models = ensure_random_models(
        a.pair, dtype, attention="gqa-graph", tokenizer=a.tokenizer, log=lambda s: print(s, flush=True)
    )
    print(f"models ready in {time.perf_counter() - t0:.0f} s: {models.root}", flush=True)
    report: dict[str, Any] = {
        "pair": a.pair,
        "provider": a.provider,
        "dtype": dtype,
        "argv": sys.argv,
        "target_bytes": _weight_bytes(models.target),
    }
    report["floor_ms"] = 1e3 * report["target_bytes"] / HBM_BYTES_PER_S

    def save(r: dict[str, Any]) -> None:
        # After every measurement: a process that dies (a segfault) leaves what it measured.
        if a.json:
            a.json.write_text(json.dumps(r, indent=1, default=str))

    modes = [("no-graph", False, None), ("graph", True, None), ("graph-ort-copies", True, "onnxruntime")]
    costs: dict[str, dict[str, Any]] = {}
    names = {"target": models.target}
    if not a.target_only:
        names |= {"draft": models.draft, "truncated": models.truncated_draft}
    for name, folder in names.items():
        for mode, graphs, copies in modes:
            if name != "target" and mode == "graph-ort-copies":
                continue
            key = f"{name}/{mode}"
            try:
                costs[key] = step_costs(folder, lib, a.provider, graphs, copies, verify=name == "target", steps=a.steps)
                save(report | {"costs": costs, "partial": True})
                print(key, json.dumps(costs[key]), flush=True)
            except Exception as e:  # collected: the run goes on
                costs[key] = {"error": f"{type(e).__name__}: {e}"}
                print(key, "FAILED", costs[key]["error"], flush=True)
    report["costs"] = costs
    if a.draft_costs is not None and a.draft_costs.is_file():
        other = json.loads(a.draft_costs.read_text())["costs"]
        for mode, _, _ in modes[:2]:
            if f"draft/{mode}" in other:
                costs[f"draft/{mode}"] = other[f"draft/{mode}"]
    pred = {}
    for mode in ("no-graph", "graph"):
        tgt, dr = costs.get(f"target/{mode}", {}), costs.get(f"draft/{mode}", {})
        if "t" in tgt and "c1" in dr:
            t = {int(n): v for n, v in tgt["t"].items()}
            pred[mode] = {
                "c_p_ms": tgt["c1"],
                "c_q_ms": dr["c1"],
                "c_q_over_c_p": dr["c1"] / tgt["c1"],
                "target_tok_s": 1e3 / tgt["c1"],
                "floor_fraction": report["floor_ms"] / tgt["c1"],
                "real_pair": predictions(a.acceptance, dr["c1"], tgt["c1"], t),
            }
            if f"truncated/{mode}" in costs and "c1" in costs[f"truncated/{mode}"]:
                pred[mode]["full_acceptance_k4"] = predictions(
                    0.999999, costs[f"truncated/{mode}"]["c1"], tgt["c1"], t
                )["by_k"][4]
    report["predictions"] = pred
    runs: dict[str, Any] = {}
    if not a.target_only:
        cases = [
            ("target-only", None, 0),
            ("truncated-k4", models.truncated_draft, 4),
            ("random-draft-k4", models.draft, 4),
        ]
    else:
        cases = [("target-only", None, 0)]
    for mode, graphs, _ in modes[:2]:
        for case, draft, k in cases:
            dec = None
            for logprobs in (False, True):
                key = f"{case}/{mode}/logprobs-{'on' if logprobs else 'off'}"
                try:
                    dec = dec or decoder(models.target, draft, lib, a.provider, graphs)
                    runs[key] = e2e(dec, k, logprobs, a.new_tokens)
                    save(
                        report
                        | {
                            "runs": {k: {f: v for f, v in r.items() if f != "tokens"} for k, r in runs.items()},
                            "partial": True,
                        }
                    )
                    print(
                        key,
                        f"{runs[key]['tok_s']:.1f} tok/s, {runs[key]['mean_tokens_per_round']:.2f} tokens/round",
                        flush=True,
                    )
                except Exception as e:
                    runs[key] = {"error": f"{type(e).__name__}: {e}"}
                    print(key, "FAILED", runs[key]["error"], flush=True)
    # Greedy output must not depend on graphs, the draft or log-probabilities (near-ties in fp16 aside: reported).
    ref = runs.get("target-only/no-graph/logprobs-off", {}).get("tokens")
    report["same_tokens"] = {key: (r["tokens"] == ref) for key, r in runs.items() if ref is not None and "tokens" in r}
    for r in runs.values():
        r.pop("tokens", None)
    report["runs"] = runs
    for mode in ("no-graph", "graph"):
        base = runs.get(f"target-only/{mode}/logprobs-off", {}).get("tok_s")
        trunc = runs.get(f"truncated-k4/{mode}/logprobs-off", {}).get("tok_s")
        if base and trunc and mode in pred and "full_acceptance_k4" in pred[mode]:
            pred[mode]["full_acceptance_k4_measured"] = trunc / base
    print("\n| pair | mode | c_p ms | c_q/c_p | target tok/s | floor | real pair best (K) | same tokens |")
    print("|---|---|---|---|---|---|---|---|")
    for mode, p in pred.items():
        same = all(v for k, v in report["same_tokens"].items() if f"/{mode}/" in k)
        print(
            f"| {a.pair} | {mode} | {p['c_p_ms']:.2f} | {p['c_q_over_c_p']:.2f} | {p['target_tok_s']:.0f} | "
            f"{p['floor_fraction']:.2f} | {p['real_pair']['best']:.2f}x ({p['real_pair']['best_k']}) | {same} |"
        )
    if a.json:
        a.json.write_text(json.dumps(report, indent=1, default=str))
    failed = [k for k, v in {**costs, **runs}.items() if "error" in v]
    bad = [k for k, v in report["same_tokens"].items() if not v]
    print(f"failures: {failed or 'none'}; token mismatches vs target-only (fp16 near-ties possible): {bad or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
