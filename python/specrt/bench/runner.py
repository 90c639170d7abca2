"""Running the bench: verify costs, the main table, the sweeps and the peers (:func:`run_bench`)."""

from __future__ import annotations

import contextlib
import gc
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from specrt.bench.config import (
    QWEN_CODER_ACCEPTANCE_SOURCE,
    BenchConfig,
    checkout_root,
    config_dict,
    config_warnings,
    resolve_config,
    validate_config,
)
from specrt.bench.peers import peer_warnings, run_peers
from specrt.bench.prompts import Prompt, load_prompts
from specrt.bench.random_models import ensure_random_models
from specrt.bench.stats import Run, aggregate, med, predict_from_acceptance, spread, summarize_pair

#: JSON schema tag of the report.
SCHEMA = "specrt.bench/1"


def check_provider(provider: str) -> None:
    """Fail before any model is pulled, written or loaded when ``provider`` cannot run here.

    Raises:
        ProviderError: ``"cuda"`` and the CUDA provider does not register: the CPU build of ONNX Runtime (the message
            says ``pip install 'specrt[cuda]'``), no GPU or driver, or missing CUDA / cuDNN libraries.
        FileNotFoundError: no ONNX Runtime is installed (the message names both install lines).
    """
    if provider == "cuda":
        from specrt._ort import check_cuda

        check_cuda()


def measure_verify_costs(
    model_path: str | os.PathLike[str],
    prompt_tokens: dict[str, list[int]],
    ks: Iterable[int],
    *,
    repeats: int = 7,
    threads: int | None = None,
    max_seq_len: int | None = None,
    ort_library: str | None = None,
    provider: str = "cpu",
    on_step: Callable[[], None] | None = None,
) -> dict[str, dict[str, Any]]:
    """c_verify(K) / c_p of one model on a warm cache of each prompt's length.

    For each prompt (L tokens): prefill the first L - 1 tokens, then time ``forward(n tokens, n_past=L - 1,
    n_logits=n)`` for n = 1 and n = K + 1 (what a verification round feeds: the last committed token and K drafts;
    the filler tokens are the prompt's own), each rolled back to the same n_past, one warm-up call per n, then
    ``repeats`` calls per n interleaved across n.

    Args:
        model_path: a converted model folder.
        prompt_tokens: prompt id -> token ids (>= 2 tokens).
        ks: the K values whose ratio is wanted (0 gives 1.0).
        repeats: timed calls per n (the median is used).
        threads: ONNX Runtime intra-op threads.
        max_seq_len: KV cache length (>= longest prompt + max K + 1).
        ort_library: path of libonnxruntime (default: :func:`specrt._ort.find_ort_library`).
        provider: ``"cpu"`` or ``"cuda"`` (t(n) on the GPU; the logits come back to host memory, as in decoding).
        on_step: called after each timed or warm-up call (progress).

    Returns:
        ``{prompt_id: {"n_prompt_tokens": L, "forward_ms": {str(n): spread}, "c_verify_ratio": {str(K): float},
        "c_verify_ratio_min": {str(K): float}}}`` (ms of wall time per forward; ratio = median ms at n = K + 1 /
        median ms at n = 1; ``_min``: the same with the fastest call of each, for a machine under load).
    """
    import numpy as np

    from specrt import _specrt
    from specrt._ort import find_ort_library

    ks = sorted(set(int(k) for k in ks) | {0})
    ns = [k + 1 for k in ks]
    longest = max(len(t) for t in prompt_tokens.values())
    model = _specrt.OrtModel(
        str(model_path),
        ort_library=ort_library or find_ort_library(provider),
        provider=provider,
        max_seq_len=max_seq_len or (longest + max(ns) + 1),
        intra_op_threads=threads,
    )
    out: dict[str, dict[str, Any]] = {}
    try:
        for pid, ids in prompt_tokens.items():
            n_past = len(ids) - 1
            # [n_past] int64: the prompt without its last token (prefilled once).
            prefix = np.asarray(ids[:n_past], dtype=np.int64)
            # [max n] int64: the last prompt token, then filler "drafts" taken from the prompt itself.
            filler = np.asarray(([ids[-1]] + list(ids) * (max(ns) // len(ids) + 1))[: max(ns)], dtype=np.int64)
            if n_past > 0:
                model.forward(prefix, 0, 1)
            samples: dict[int, list[float]] = {n: [] for n in ns}
            for n in ns:  # warm-up: first call at a new shape allocates
                model.forward(filler[:n], n_past, n)
                if on_step:
                    on_step()
            for r in range(repeats):
                order = ns if r % 2 == 0 else ns[::-1]
                for n in order:
                    t0 = time.perf_counter()
                    model.forward(filler[:n], n_past, n)
                    samples[n].append((time.perf_counter() - t0) * 1e3)
                    if on_step:
                        on_step()
            fwd = {str(n): spread(v) for n, v in samples.items()}
            base = statistics.median(samples[1])
            out[pid] = {
                "n_prompt_tokens": len(ids),
                "forward_ms": fwd,
                "c_verify_ratio": {str(k): statistics.median(samples[k + 1]) / base for k in ks},
                # Fastest over fastest: less sensitive to other processes on a shared machine (not used to predict).
                "c_verify_ratio_min": {str(k): min(samples[k + 1]) / min(samples[1]) for k in ks},
            }
    finally:
        del model
        gc.collect()
    return out


def _generate(
    dec: Any,
    prompt: Prompt,
    *,
    k: int | str,
    temperature: float,
    max_new_tokens: int,
    seed: int,
    ignore_eos: bool,
    **extra: Any,
) -> Run:
    """One timed ``dec.generate`` call; ``extra`` = further generate options (proposer, prompt_lookup_min, ...).
    No log-probabilities are asked for: greedy rounds then read only argmax ids, as a service would run them."""
    kwargs = prompt.generate_kwargs() | extra
    t0 = time.perf_counter()
    res = dec.generate(
        **kwargs,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        num_speculative_tokens=k,
        seed=seed,
        ignore_eos=ignore_eos,
        logprobs=False,
    )
    wall_ms = (time.perf_counter() - t0) * 1e3
    return Run(
        wall_ms=wall_ms,
        n_emitted=len(res.token_ids),
        stats=res.stats.as_dict(),
        token_ids=list(res.token_ids),
        finish_reason=res.finish_reason,
    )


class _Progress:
    """A tqdm bar when available and wanted, else silent."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.bar = None
        if enabled:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, unit="run", file=sys.stderr, dynamic_ncols=True)
            except ImportError:  # pragma: no cover - tqdm is a dependency
                self.bar = None

    def describe(self, text: str) -> None:
        if self.bar is not None:
            self.bar.set_description(text, refresh=True)

    def step(self, n: int = 1) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def write(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _gpu_name() -> str | None:
    """``name, driver`` of GPU 0 from nvidia-smi, or None."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        query = ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader", "--id=0"]
        return subprocess.run(query, capture_output=True, text=True, timeout=10, check=False).stdout.strip() or None
    return None


def _machine(provider: str = "cpu") -> dict[str, Any]:
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import specrt
    from specrt._ort import find_ort_library, ort_version

    # The version of the library specrt loads (its file name), never `import onnxruntime`: a second ONNX Runtime.
    ort_library = find_ort_library()

    # git metadata only from a checkout (an installed specrt is no git tree): the version is recorded either way.
    root, commit = checkout_root(), None
    if root is not None:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            git = ["git", "-C", str(root), "rev-parse", "--short", "HEAD"]
            commit = subprocess.run(git, capture_output=True, text=True, timeout=5, check=False).stdout.strip() or None

    out = {
        "cpu": cpu,
        "n_cpus": os.cpu_count(),
        "python": platform.python_version(),
        "onnxruntime": ort_version(ort_library),
        "ort_library": ort_library,
        "provider": provider,
        "specrt_version": specrt.__version__,
        # The checkout specrt runs from (git_commit is its HEAD), or None: an installed specrt (git_commit None).
        "specrt_checkout": str(root) if root is not None else None,
        "git_commit": commit,
        "load_avg_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }
    if provider == "cuda":
        out["gpu"] = _gpu_name()
    return out


def _verify_ks(cfg: BenchConfig, sweeps: bool) -> list[int]:
    """The Ks whose c_verify(K) is measured: the main K (0..8 for auto), the K sweep, and n - 1 for each verify n."""
    ks = set(range(9)) if cfg.k == "auto" else {0, int(cfg.k)}
    if sweeps:
        ks |= set(cfg.k_sweep)
    ks |= {n - 1 for n in cfg.verify_ns}
    return sorted(ks)


def _estimate_s(cfg: BenchConfig, fwd1_ms: float, n_main: int, n_sweep: int) -> float:
    """Rough wall time of the generation phases from the measured one-token forward time (E = 3, c_q = c_p / 3)."""
    k = 4 if cfg.k == "auto" else int(cfg.k)
    per_tok_spec = (k * fwd1_ms / 3 + 1.3 * fwd1_ms) / 3

    def pair(n: int) -> float:
        return n * fwd1_ms + n * per_tok_spec

    main = cfg.repeats * n_main * pair(cfg.max_new_tokens)
    n_points = len(cfg.k_sweep) + len([t for t in cfg.temperatures if t != 0])
    sweep = (
        cfg.repeats
        * n_sweep
        * (cfg.sweep_max_new_tokens * fwd1_ms + n_points * cfg.sweep_max_new_tokens * per_tok_spec)
        if cfg.sweeps
        else 0.0
    )
    return (main + sweep) / 1e3


def run_main(
    cfg: BenchConfig, base_dec: Any, spec_dec: Any, prompts: list[Prompt], costs: dict[str, Any], progress: _Progress
) -> dict[str, Any]:
    """Target-only and speculative decoding interleaved over ``prompts`` (warm-up first); per-prompt and total rows."""
    warm = max(1, cfg.warmup_tokens)
    if cfg.warmup_tokens > 0:
        for p in prompts:
            progress.describe(f"warm-up {p.id}")
            for dec, k in ((base_dec, 0), (spec_dec, cfg.k)):
                _generate(dec, p, k=k, temperature=cfg.temperature, max_new_tokens=warm, seed=cfg.seed, ignore_eos=True)
                progress.step()
    base: dict[str, list[Run]] = {p.id: [] for p in prompts}
    spec: dict[str, list[Run]] = {p.id: [] for p in prompts}
    for r in range(cfg.repeats):
        for p in prompts:
            order = [("target_only", base_dec, 0), ("speculative", spec_dec, cfg.k)]
            if r % 2 == 1:
                order.reverse()
            for mode, dec, k in order:
                progress.describe(f"main rep {r + 1}/{cfg.repeats} {p.id} {mode}")
                run = _generate(
                    dec,
                    p,
                    k=k,
                    temperature=cfg.temperature,
                    max_new_tokens=cfg.max_new_tokens,
                    seed=cfg.seed + r,
                    ignore_eos=cfg.ignore_eos,
                )
                (base if mode == "target_only" else spec)[p.id].append(run)
                progress.step()
    rows = []
    for p in prompts:
        row = {
            "id": p.id,
            "kind": p.kind,
            "peer": p.peer,
            "n_prompt_tokens": costs[p.id]["n_prompt_tokens"],
            **summarize_pair(base[p.id], spec[p.id], cfg.k, costs[p.id]["c_verify_ratio"], cfg.temperature),
        }
        rows.append(row)
    groups = {"all": [p.id for p in prompts]}
    peer_ids = [p.id for p in prompts if p.peer]
    if peer_ids and len(peer_ids) != len(prompts):
        groups["peer_prompts"] = peer_ids
    totals = {
        name: aggregate([row for row in rows if row["id"] in ids], [base[i] for i in ids], [spec[i] for i in ids], ids)
        for name, ids in groups.items()
    }
    if peer_ids and "peer_prompts" not in totals:
        totals["peer_prompts"] = totals["all"]
    return {
        "k": cfg.k,
        "temperature": cfg.temperature,
        "max_new_tokens": cfg.max_new_tokens,
        "prompts": rows,
        "totals": totals,
    }


def run_sweeps(
    cfg: BenchConfig, base_dec: Any, spec_dec: Any, prompts: list[Prompt], costs: dict[str, Any], progress: _Progress
) -> dict[str, Any]:
    """K sweep (greedy) and temperature sweep (at the main K), each point paired with a target-only baseline run.

    The baseline is one greedy target-only run per prompt and repetition, shared by all points of that repetition:
    a target-only step costs the same at any temperature (sampling is well under 1% of a forward). Point order
    rotates between repetitions.
    """
    main_k = cfg.k
    points: list[tuple[str, int | str, float]] = [("k", k, 0.0) for k in cfg.k_sweep]
    for t in cfg.temperatures:
        if t == 0 and main_k in cfg.k_sweep:
            continue  # the K sweep's point at the main K is this one
        points.append(("t", main_k, float(t)))
    base: dict[str, list[Run]] = {p.id: [] for p in prompts}
    runs: dict[tuple[str, int | str, float, str], list[Run]] = {}
    for r in range(cfg.repeats):
        for p in prompts:
            progress.describe(f"sweep rep {r + 1}/{cfg.repeats} {p.id} target-only")
            base[p.id].append(
                _generate(
                    base_dec,
                    p,
                    k=0,
                    temperature=0.0,
                    max_new_tokens=cfg.sweep_max_new_tokens,
                    seed=cfg.seed,
                    ignore_eos=cfg.ignore_eos,
                )
            )
            progress.step()
            shift = r % len(points)
            for _, k, t in points[shift:] + points[:shift]:
                progress.describe(f"sweep rep {r + 1}/{cfg.repeats} {p.id} K={k} T={t}")
                runs.setdefault((p.id, k, t, ""), []).append(
                    _generate(
                        spec_dec,
                        p,
                        k=k,
                        temperature=t,
                        max_new_tokens=cfg.sweep_max_new_tokens,
                        seed=cfg.seed + r,
                        ignore_eos=cfg.ignore_eos,
                    )
                )
                progress.step()

    def point(p: Prompt, k: int | str, t: float) -> dict[str, Any]:
        s = summarize_pair(base[p.id], runs[(p.id, k, t, "")], k, costs[p.id]["c_verify_ratio"], t)
        s.pop("runs")
        s.pop("token_ids")
        return {"k": k, "temperature": t, **s}

    k_sweep, t_sweep = [], []
    for p in prompts:
        kp = [point(p, k, 0.0) for k in cfg.k_sweep]
        # The cost model's curve over K from one a (fitted at the main K) and that point's c_q.
        ref = next((x for x in kp if x["k"] == main_k and x.get("alpha_fit") is not None), None)
        model_curve = []
        if ref is not None and med(ref["c_q_ms"]) and med(ref["c_p_ms"]):
            from specrt import _specrt

            c_q, c_p = med(ref["c_q_ms"]), med(ref["c_p_ms"])
            for k in cfg.k_sweep:
                ratio = costs[p.id]["c_verify_ratio"][str(k)]
                model_curve.append(
                    {"k": k, "speedup": _specrt.speedup(ref["alpha_fit"], k, c_q, c_p, c_verify=ratio * c_p)}
                )
        k_sweep.append(
            {
                "id": p.id,
                "kind": p.kind,
                "peer": p.peer,
                "points": kp,
                "model_curve": model_curve,
                "alpha_ref": None if ref is None else ref["alpha_fit"],
            }
        )
        tp = []
        for t in cfg.temperatures:
            key = (p.id, main_k, float(t), "")
            if key in runs:
                tp.append(point(p, main_k, float(t)))
        t_sweep.append({"id": p.id, "kind": p.kind, "peer": p.peer, "points": tp})
    return {
        "max_new_tokens": cfg.sweep_max_new_tokens,
        "k_sweep": {"temperature": 0.0, "ks": list(cfg.k_sweep), "prompts": k_sweep},
        "temperature_sweep": {"k": main_k, "temperatures": list(cfg.temperatures), "prompts": t_sweep},
    }


def _run_pair(
    cfg: BenchConfig,
    target_path: Path,
    draft_path: Path,
    *,
    prompts: list[Prompt],
    sweep_prompts: list[Prompt],
    costs: dict[str, Any],
    max_seq: int,
    progress: _Progress,
    phase_done: Callable[[str], None],
    phase_prefix: str = "",
    expected_tokens: dict[str, list[int]] | None = None,
) -> dict[str, Any]:
    """Load one target / draft pair, run the main table (and the sweeps when ``sweep_prompts``), release the pair.

    ``expected_tokens``: prompt id -> the ids the bench encoded, checked against ``Decoder.encode``.
    """
    import specrt

    progress.describe("loading models")
    spec_dec = base_dec = None
    try:
        opts = {
            "provider": cfg.provider,
            "max_seq_len": max_seq,
            "intra_op_threads": cfg.threads,
            "cuda_graph": cfg.cuda_graph,
        }
        spec_dec = specrt.Decoder(target_path, draft_path, **opts)
        base_dec = spec_dec if cfg.baseline == "k0" else specrt.Decoder(target_path, None, **opts)
        all_prompts = {p.id: p for p in [*prompts, *sweep_prompts]}
        for pid, ids in (expected_tokens or {}).items():
            p = all_prompts[pid]
            if spec_dec.encode(p.prompt, [dict(m) for m in p.messages] if p.messages else None) != ids:
                raise RuntimeError(f"prompt {pid}: the bench's tokenization differs from Decoder.encode")
        phase_done(phase_prefix + "load")
        out = {"main": run_main(cfg, base_dec, spec_dec, prompts, costs, progress)}
        phase_done(phase_prefix + "main")
        if sweep_prompts:
            out["sweeps"] = run_sweeps(cfg, base_dec, spec_dec, sweep_prompts, costs, progress)
            phase_done(phase_prefix + "sweeps")
    finally:
        del base_dec, spec_dec
        gc.collect()
    return out


def run_bench(cfg: BenchConfig) -> dict[str, Any]:
    """Run the whole bench (verify costs, main table, sweeps, peers) and return the JSON-ready report.

    The settings are completed first (:func:`resolve_config`: fp16 and t(n) for n = 1..16 on CUDA) and checked
    (:func:`validate_config`, :func:`check_provider`) before any model is pulled, written or loaded.

    Baseline: ONNX Runtime sessions created later in a process decode faster than the first one (measured on the
    bench machine: the same int4 model loaded three times in one process, 38.8 / 34.7 / 33.1 ms per step), so a
    separate target-only Decoder (loaded after the speculative one) is biased against speculation; the default
    ``"k0"`` times target-only decoding on the speculative Decoder's own target session at K = 0 (the draft is then
    neither prefilled nor run). ``benches/bench_int4.py --runtimes specrt,specrt-k0`` compares a Decoder without
    draft against K = 0 with one process each.

    Random weights (``random_shapes``, :mod:`specrt.bench.random_models`): the verify costs and the main table run
    on the real shapes (target and random draft: ``report["main"]``), then the main table and the sweeps on the
    full-acceptance pair (the same target, its layer-truncated copy as draft:
    ``report["random_weights"]["full_acceptance"]``, ``report["sweeps"]``); ``report["random_weights"]["prediction"]``
    is the real pair's speedup over K from the costs measured on the real shapes and ``acceptance``
    (:func:`predict_from_acceptance`).

    Memory: the verify-cost model is released before the decoders load; with ``baseline="separate"`` the target is
    loaded twice (a target-only Decoder and the speculative one; fp32 1.5B: about 7 GB each), with ``"k0"`` the
    speculative Decoder at K = 0 is the baseline (one copy). Each pair is released before the next loads.

    With ``cfg.suite`` set, runs that suite instead (``"spec-bench"``: :func:`specrt.bench.spec_bench.run_spec_bench`,
    whose report has its own fields).

    Raises:
        ValueError: invalid settings (:func:`validate_config`).
        ProviderError: CUDA asked for and unusable here (:func:`check_provider`).
    """
    if cfg.suite is not None:
        from specrt.bench.spec_bench import run_spec_bench

        return run_spec_bench(cfg)
    t_start = time.perf_counter()
    given_acceptance = cfg.acceptance
    cfg = resolve_config(cfg)
    validate_config(cfg)
    check_provider(cfg.provider)
    for line in [*config_warnings(cfg), *peer_warnings(cfg)]:
        print(f"specrt bench: warning: {line}", file=sys.stderr)
    prompts = load_prompts(cfg.prompts_file, set_name=cfg.prompt_set, ids=cfg.prompt_ids or None)
    sweep_prompts = (
        load_prompts(cfg.prompts_file, set_name=cfg.sweep_set, ids=cfg.sweep_ids or None) if cfg.sweeps else []
    )
    machine = _machine(cfg.provider)
    from specrt.folder_text import folder_text
    from specrt.models import resolve_model

    phase_s: dict[str, Any] = {}
    t_phase = time.perf_counter()

    def phase_done(name: str) -> None:
        nonlocal t_phase
        now = time.perf_counter()
        phase_s[name] = now - t_phase
        t_phase = now

    assert cfg.dtype is not None  # resolve_config
    rand = None
    if cfg.random_shapes is not None:
        rand = ensure_random_models(
            cfg.random_shapes,
            cfg.dtype,
            tokenizer=cfg.random_tokenizer,
            log=lambda line: print(f"specrt bench: {line}", file=sys.stderr),
            attention="gqa-graph" if cfg.cuda_graph else "gqa",
        )
        target_path, draft_path = rand.target, rand.draft
        phase_done("random_models")
    else:
        attention = "gqa-graph" if cfg.cuda_graph else "gqa"
        target_path = resolve_model(cfg.target, cfg.dtype, attention=attention)
        draft_path = resolve_model(cfg.draft, cfg.dtype, attention=attention)
    tokenizer, template = folder_text(target_path)  # as the Decoder encodes and renders prompts

    def render(p: Prompt) -> str:
        """The prompt as text: chat messages through the model's chat template, a completion prompt as it is."""
        if p.messages is None:
            return p.prompt or ""
        return template.render([dict(m) for m in p.messages], True) if template is not None else ""

    def encode(p: Prompt) -> list[int]:
        # The same ids Decoder.encode gives (checked against it below), without loading a model.
        if p.messages is not None:
            return tokenizer.encode(render(p), add_special_tokens=False).ids
        return tokenizer.encode(p.prompt).ids

    all_prompts = {p.id: p for p in [*prompts, *sweep_prompts]}
    prompt_tokens = {pid: encode(p) for pid, p in all_prompts.items()}
    longest = max(len(t) for t in prompt_tokens.values())
    max_seq = max(cfg.max_seq_len, longest + max(cfg.max_new_tokens, cfg.sweep_max_new_tokens) + 16)
    ks = _verify_ks(cfg, bool(sweep_prompts))

    n_pairs = 1 if rand is None else 2
    n_warm = 2 * len(prompts) if cfg.warmup_tokens > 0 else 0
    n_main = 2 * cfg.repeats * len(prompts)
    n_points = len(cfg.k_sweep) + len([t for t in cfg.temperatures if not (t == 0 and cfg.k in cfg.k_sweep)])
    n_sweep = cfg.repeats * len(sweep_prompts) * (1 + n_points)
    n_verify = len(prompt_tokens) * len(ks) * (cfg.verify_repeats + 1)
    progress = _Progress(n_verify + n_pairs * (n_warm + n_main) + n_sweep, cfg.progress)
    pair_args: dict[str, Any] = {"max_seq": max_seq, "progress": progress, "phase_done": phase_done}
    t_phase = time.perf_counter()  # pulling registry models and encoding the prompts are not bench phases

    try:
        progress.describe("verify costs (target alone)")
        costs = measure_verify_costs(
            target_path,
            prompt_tokens,
            ks,
            repeats=cfg.verify_repeats,
            threads=cfg.threads,
            max_seq_len=longest + max(ks) + 2,
            provider=cfg.provider,
            on_step=progress.step,
        )
        fwd1 = statistics.median(c["forward_ms"]["1"]["median"] for c in costs.values())
        est = _estimate_s(cfg, fwd1, len(prompts), len(sweep_prompts))
        est += (n_pairs - 1) * _estimate_s(replace(cfg, sweeps=False), fwd1, len(prompts), 0)
        progress.write(
            f"specrt bench: one-token target forward {fwd1:.3g} ms; generation phases need "
            + (f"~{est / 60:.0f} min" if est >= 60 else "< 1 min")
        )
        phase_done("verify_costs")
        report: dict[str, Any] = {
            "schema": SCHEMA,
            "config": config_dict(cfg),
            "models": {"target": str(target_path), "draft": str(draft_path)},
            "machine": machine,
            "prompts": {
                pid: {"kind": p.kind, "peer": p.peer, "n_prompt_tokens": len(prompt_tokens[pid]), "note": p.note}
                for pid, p in all_prompts.items()
            },
            "verify_costs": costs,
        }
        # With random weights the sweeps run on the full-acceptance pair, where acceptance is known.
        first = _run_pair(
            cfg,
            target_path,
            draft_path,
            prompts=prompts,
            sweep_prompts=sweep_prompts if rand is None else [],
            costs=costs,
            expected_tokens=prompt_tokens,
            **pair_args,
        )
        report.update(first)
        if rand is not None:
            full = _run_pair(
                cfg,
                rand.target,
                rand.truncated_draft,
                prompts=prompts,
                sweep_prompts=sweep_prompts,
                costs=costs,
                phase_prefix="full_acceptance_",
                **pair_args,
            )
            if "sweeps" in full:
                report["sweeps"] = {"pair": "full_acceptance", **full["sweeps"]}
            assert cfg.acceptance is not None  # resolve_config
            report["random_weights"] = {
                **rand.describe(),
                "acceptance": cfg.acceptance,
                "acceptance_source": "--acceptance" if given_acceptance is not None else QWEN_CODER_ACCEPTANCE_SOURCE,
                "prediction": predict_from_acceptance(cfg.acceptance, report["main"]["prompts"], costs, cfg.k),
                "full_acceptance": {
                    "models": {"target": str(rand.target), "draft": str(rand.truncated_draft)},
                    "main": full["main"],
                },
            }
    finally:
        progress.close()
    phase_s["specrt"] = time.perf_counter() - t_start
    if cfg.peers:
        texts = {p.id: render(p) for p in prompts}
        report["peers"] = run_peers(cfg, target_path, draft_path, prompts, prompt_tokens, texts)
        for name, peer in report["peers"].items():
            phase_s[f"peer_{name}"] = peer.pop("elapsed_s", None)
            for row in report["main"]["prompts"] if peer.get("status") == "ok" else []:
                theirs = peer["prompts"].get(row["id"], {}).get("token_ids", {}).get("target_only")
                if theirs is not None and cfg.temperature == 0:
                    # Same greedy target (genai: the same ONNX files; hf: the GGUF they came from, in torch).
                    peer["prompts"][row["id"]]["same_tokens_as_specrt"] = theirs == row["token_ids"]["target_only"]
    machine["load_avg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    report["wall_s"] = time.perf_counter() - t_start
    report["phase_s"] = phase_s
    return report
