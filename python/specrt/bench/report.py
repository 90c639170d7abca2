"""The report as text: speed, cost-model, sweep and peer tables (:func:`render_table`, plain or with rich)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from specrt.bench.peers import peer_modes
from specrt.bench.stats import med


def _f(x: float | None, fmt: str = ".2f") -> str:
    return "-" if x is None else format(x, fmt)


def _ms(x: float | None) -> str:
    """Milliseconds with about 3 significant digits, never in exponent form (``1234``, ``83.1``, ``0.42``)."""
    if x is None:
        return "-"
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}"


def _sp(s: dict[str, Any] | None, fmt: str = ".2f") -> str:
    """``median [min-max]``."""
    if s is None:
        return "-"
    if s["n"] == 1 or s["min"] == s["max"]:
        return format(s["median"], fmt)
    return f"{s['median']:{fmt}} [{s['min']:{fmt}}-{s['max']:{fmt}}]"


def _label(p: dict[str, Any]) -> str:
    label = p["id"] + (f" ({p['peer']})" if p["peer"] else "")
    return label + (" !parity" if p.get("greedy_parity") is False else "")


def _main_tables(report: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]], int]]:
    """The main results as two tables (speed; cost model): (title, columns, rows, number of per-prompt rows)."""
    prompts = report["main"]["prompts"]
    all_ids = report["main"]["totals"]["all"]["prompts"]
    totals = {n: t for n, t in report["main"]["totals"].items() if n == "all" or t["prompts"] != all_ids}
    speed_cols = ["prompt", "kind", "L", "n", "target tok/s", "spec tok/s", "speedup", "e2e", "prefill ms t / s"]
    speed = [
        [
            _label(p),
            p["kind"],
            str(p["n_prompt_tokens"]),
            _f(med(p["speculative"]["n_emitted"]), ".0f"),
            _sp(p["target_only"]["decode_tokens_per_s"]),
            _sp(p["speculative"]["decode_tokens_per_s"]),
            _sp(p["speedup"]),
            _f(med(p["e2e_speedup"])),
            f"{_ms(med(p['target_only']['prefill_ms']))} / {_ms(med(p['speculative']['prefill_ms']))}",
        ]
        for p in prompts
    ]
    for name, t in totals.items():
        for how in ("total", "mean"):
            tps = t[f"{how}_decode_tokens_per_s"]
            speed.append(
                [
                    f"{how} {name}",
                    f"{len(t['prompts'])} prompts",
                    "",
                    "",
                    _sp(tps["target_only"]),
                    _sp(tps["speculative"]),
                    _sp(t[f"{how}_speedup"]),
                    "",
                    "",
                ]
            )
    cost_cols = ["prompt", "K", "acc", "E", "a", "c_q ms", "c_p ms", "cv/cp", "in run", "pred", "meas/pred", "round ms"]
    cost = []
    for p in prompts:
        r = p.get("round_ms") or {}
        k = str(p["k_model"]) if isinstance(report["main"]["k"], int) else f"{p['k_mean']:.1f}~{p['k_model']}"
        cost.append(
            [
                _label(p),
                k,
                _f(med(p["acceptance_rate"])),
                _f(med(p["mean_tokens_per_round"])),
                _f(p["alpha_fit"]),
                _ms(med(p["c_q_ms"])),
                _ms(med(p["c_p_ms"])),
                _f(p["c_verify_ratio"]),
                _f(p["c_verify_ratio_in_run"]),
                _f(p["predicted_speedup"]),
                _f(p["measured_over_predicted"]),
                f"{_ms(r.get('measured'))} / {_ms(r.get('model'))}" if r else "-",
            ]
        )
    for name, t in totals.items():
        cost.append(
            [
                f"mean {name}",
                "",
                _f(t["mean_acceptance_rate"]),
                _f(t["mean_tokens_per_round"]),
                "",
                "",
                "",
                "",
                "",
                _f(t["mean_predicted_speedup"]),
                _f(t["mean_measured_over_predicted"]),
                "",
            ]
        )
    return [("speed", speed_cols, speed, len(prompts)), ("cost model", cost_cols, cost, len(prompts))]


def _tn_table(report: dict[str, Any]) -> tuple[str, list[str], list[list[str]], int] | None:
    """t(n), the target's ms per forward over n tokens on each prompt's cache, when ``verify_ns`` was asked for."""
    if not report["config"].get("verify_ns"):
        return None
    costs = report["verify_costs"]
    ids = list(costs)
    ns = sorted({int(n) for c in costs.values() for n in c["forward_ms"]})
    cols = ["n", *(f"{pid} (L={costs[pid]['n_prompt_tokens']}) ms" for pid in ids), "t(n)/t(1)"]
    rows = []
    for n in ns:
        ms = [costs[pid]["forward_ms"][str(n)]["median"] for pid in ids]
        ratios = [m / costs[pid]["forward_ms"]["1"]["median"] for m, pid in zip(ms, ids, strict=True)]
        rows.append([str(n), *(_ms(m) for m in ms), _f(sum(ratios) / len(ratios))])
    return ("t(n): target forward over n tokens (median ms)", cols, rows, 0)


def _random_tables(report: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]], int]]:
    """Random weights: the real shapes' costs, the real pair's predicted speedup over K, the cost-model check."""
    rw = report["random_weights"]
    prompts = report["main"]["prompts"]
    costs = report["verify_costs"]
    cost_cols = ["prompt", "L", "n", "target tok/s", "c_p ms", "t(1) ms", "c_q ms", "K", "cv/cp"]
    cost_rows = [
        [
            p["id"],
            str(p["n_prompt_tokens"]),
            _f(med(p["target_only"]["n_emitted"]), ".0f"),
            _sp(p["target_only"]["decode_tokens_per_s"]),
            _ms(med(p["c_p_ms"])),
            _ms(costs[p["id"]]["forward_ms"]["1"]["median"]),
            _ms(med(p["c_q_ms"])),
            str(p["k_model"]),
            _f(p["c_verify_ratio"]),
        ]
        for p in prompts
    ]
    pred = rw["prediction"]
    main_k = pred["k"] if isinstance(pred["k"], int) else pred["best_k"]
    pred_cols = ["K", "E(a, K)", "cv/cp", "pred speedup", "pred spec tok/s", "note"]
    e_at = {x["k"]: x["expected_tokens"] for p in pred["prompts"] for x in p["per_k"]}
    pred_rows = [
        [
            str(x["k"]),
            _f(e_at.get(x["k"])),
            _f(x["c_verify_ratio"]),
            _f(x["predicted_speedup"]),
            _f(x["predicted_tokens_per_s"], ".1f"),
            " ".join(t for t, on in (("best", x["k"] == pred["best_k"]), ("main K", x["k"] == main_k)) if on),
        ]
        for x in pred["mean_per_k"]
    ]
    pairs = [("random draft", report["main"]), ("truncated draft", rw["full_acceptance"]["main"])]
    check_cols = ["pair", "prompt", "K", "acc", "E", "a", "target tok/s", "spec tok/s", "speedup", "pred", "meas/pred"]
    check_rows = [
        [
            label,
            _label(p),
            str(p["k_model"]),
            _f(med(p["acceptance_rate"])),
            _f(med(p["mean_tokens_per_round"])),
            _f(p["alpha_fit"]),
            _sp(p["target_only"]["decode_tokens_per_s"]),
            _sp(p["speculative"]["decode_tokens_per_s"]),
            _sp(p["speedup"]),
            _f(p["predicted_speedup"]),
            _f(p["measured_over_predicted"]),
        ]
        for label, main in pairs
        for p in main["prompts"]
    ]
    for label, main in pairs:
        t = main["totals"]["all"]
        tps = t["mean_decode_tokens_per_s"]
        check_rows.append(
            [
                label,
                f"mean, {len(t['prompts'])} prompts",
                "",
                _f(t["mean_acceptance_rate"]),
                _f(t["mean_tokens_per_round"]),
                "",
                _sp(tps["target_only"]),
                _sp(tps["speculative"]),
                _sp(t["mean_speedup"]),
                _f(t["mean_predicted_speedup"]),
                _f(t["mean_measured_over_predicted"]),
            ]
        )
    n_prompt_rows = sum(len(main["prompts"]) for _, main in pairs)
    return [
        ("real shapes, random weights: target-only speed and costs", cost_cols, cost_rows, len(cost_rows)),
        (
            f"predicted speedup of the real pair at a = {rw['acceptance']:.3f} (mean over prompts)",
            pred_cols,
            pred_rows,
            0,
        ),
        ("cost-model check on synthetic pairs (measured acceptance)", check_cols, check_rows, n_prompt_rows),
    ]


def _sweep_rows(report: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    cols = ["prompt", "K", "T", "speedup", "pred", "model(a_ref)", "acc", "E", "a", "cv/cp"]
    rows = []
    sw = report.get("sweeps")
    if not sw:
        return cols, rows
    for entry in sw["k_sweep"]["prompts"]:
        curve = {c["k"]: c["speedup"] for c in entry["model_curve"]}
        rows.extend(
            [
                [
                    entry["id"],
                    str(pt["k"]),
                    "0",
                    _sp(pt["speedup"]),
                    _f(pt["predicted_speedup"]),
                    _f(curve.get(pt["k"])),
                    _f(med(pt["acceptance_rate"])),
                    _f(med(pt["mean_tokens_per_round"])),
                    _f(pt["alpha_fit"]),
                    _f(pt["c_verify_ratio"]),
                ]
                for pt in entry["points"]
            ]
        )
    in_k_sweep = sw["temperature_sweep"]["k"] in sw["k_sweep"]["ks"]
    for entry in sw["temperature_sweep"]["prompts"]:
        for pt in entry["points"]:
            if pt["temperature"] == 0 and in_k_sweep:
                continue  # already a row of the K sweep
            rows.append(
                [
                    entry["id"],
                    str(pt["k"]),
                    _f(pt["temperature"], "g"),
                    _sp(pt["speedup"]),
                    _f(pt["predicted_speedup"]),
                    "",
                    _f(med(pt["acceptance_rate"])),
                    _f(med(pt["mean_tokens_per_round"])),
                    _f(pt["alpha_fit"]),
                    _f(pt["c_verify_ratio"]),
                ]
            )
    return cols, rows


def _peer_rows(report: dict[str, Any]) -> tuple[list[str], list[list[str]], list[str]]:
    cols = [
        "prompt",
        "peer",
        "peer target tok/s",
        "peer spec tok/s",
        "peer speedup",
        "peer e2e",
        "peer acc",
        "same tokens",
        "specrt spec / peer spec",
    ]
    rows: list[list[str]] = []
    notes: list[str] = []
    ours = {p["id"]: p for p in (report.get("main") or {}).get("prompts", [])}
    for name, peer in (report.get("peers") or {}).items():
        if peer.get("status") != "ok":
            last = [line.strip() for line in (peer.get("stderr_tail") or "").splitlines() if line.strip()]
            why = peer.get("reason") or (last[-1] if last else f"exit code {peer.get('returncode')}")
            notes.append(f"peer {name}: {peer.get('status')}: {why}" + (" (stderr in the JSON)" if last else ""))
            continue
        rows_before = len(rows)
        for pid, label, g in peer_modes(name, peer):
            mine = med(ours[pid]["speculative"]["decode_tokens_per_s"]) if pid in ours else None
            theirs = med(g["speculative"]["decode_tokens_per_s"])
            rows.append(
                [
                    pid,
                    label,
                    _sp(g["target_only"]["decode_tokens_per_s"]),
                    _sp(g["speculative"]["decode_tokens_per_s"]),
                    _sp(g["speedup"]),
                    _f(med(g["e2e_speedup"])),
                    _f(med(g.get("acceptance_rate"))),
                    {True: "yes", False: "NO"}.get(g.get("same_tokens_as_specrt"), "-"),
                    _f(mine / theirs if mine and theirs else None),
                ]
            )
        if len(rows) == rows_before:
            base = ", ".join(
                f"{pid} {_sp(g['target_only']['decode_tokens_per_s'])}" for pid, g in peer["prompts"].items()
            )
            notes.append(f"peer {name}: target-only decode tok/s (no speculative mode was asked for): {base}")
    return cols, rows, notes


def _plain_table(cols: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)), "  ".join("-" * w for w in widths)]
    lines += [
        "  ".join(v.rjust(w) if i >= 2 else v.ljust(w) for i, (v, w) in enumerate(zip(r, widths, strict=True)))
        for r in rows
    ]
    return "\n".join(lines)


def model_label(path: str) -> str:
    """``.../qwen2.5-coder-1.5b-instruct/fp32`` -> ``qwen2.5-coder-1.5b-instruct/fp32``, ``.../random/tiny-fp32/draft``
    -> ``tiny-fp32/draft``; other folders: their name."""
    p = Path(path)
    if p.name in ("fp32", "fp16", "int4", "int8", "gguf") or p.parent.parent.name == "random":
        return f"{p.parent.name}/{p.name}"
    return p.name


def _header(report: dict[str, Any]) -> str:
    cfg, m = report["config"], report["machine"]
    load = m.get("load_avg_start")
    busy = load is not None and load[0] > 0.5
    provider = cfg.get("provider", "cpu")
    where = f"{m['cpu']} ({m['n_cpus']} CPUs)" + (f"; CUDA on {m.get('gpu') or 'GPU 0'}" if provider == "cuda" else "")
    rw = report.get("random_weights")
    if rw:
        t, d = rw["target_shape"], rw["draft_shape"]
        models = (
            f"random weights in the {rw['name']} shapes ({cfg['dtype']}): target {t['name']} (layers x"
            f"{rw['target_layer_scale']:g}), draft {d['name']} and the target's first {rw['truncated_layers']} layers"
        )
        if rw["tokenizer"]["stand_in"]:
            models += "; byte-level stand-in tokenizer (prompts longer in tokens than with the real one)"
    else:
        models = f"target {model_label(report['models']['target'])}, draft {model_label(report['models']['draft'])}"
    text = (
        f"specrt bench: {models}, K={cfg['k']}, T={cfg['temperature']}, {cfg['max_new_tokens']} new "
        f"tokens, {cfg['repeats']} interleaved repetitions, threads={cfg['threads']}; {where}"
    )
    if busy:
        text += f"\nwarning: load average {load[0]:.2f} when the bench started (CPU shared): timings are noisy"
    return text


_LEGEND = (
    "tok/s: decode tokens/s (prefill excluded), median [min-max] over repetitions; speedup: spec/target paired per "
    "repetition; e2e: with prefill; prefill ms t / s: target-only / speculative; acc: accepted/drafted; "
    "E: tokens/round; a: per-token a fitted to E; c_q: draft ms/pass; c_p: target-only ms/token; "
    "cv/cp: c_verify(K)/c_p measured on the prompt's cache (in run: target ms "
    "per round / per target-only step); pred: c_p E/(K c_q + c_verify(K)); round ms: measured / K c_q + c_verify(K); "
    "K with -k auto: mean drafts per round ~ the K used for the prediction"
)


_RANDOM_LEGEND = (
    "Random weights: GPU (or CPU) time does not depend on the weight values, acceptance does. real shapes: the "
    "target and draft in the real pair's shapes; c_p: target-only ms/token; t(1): one-token forward; c_q: draft "
    "ms/pass; cv/cp: c_verify(K)/c_p. pred speedup: c_p E(a, K)/(K c_q + c_verify(K)) at the real pair's a "
    "(config 'acceptance'). cost-model check: random draft (a ~ 0) and truncated draft (the target's first layers, "
    "a ~ 1) measured against the model at their measured E: pred = c_p E/(K c_q + c_verify(K)), meas/pred = "
    "speedup/pred"
)


def _timing_line(report: dict[str, Any]) -> str:
    """``wall 21.3 min: specrt 19.0 (verify costs 0.4, load 0.3, main 12.1, sweeps 6.2), peer genai 2.3``."""
    ph = report.get("phase_s") or {}

    def m(x: float | None) -> str:
        return "-" if x is None else f"{x / 60:.1f}"

    inner = ", ".join(
        f"{k.replace('_', ' ')} {m(v)}" for k, v in ph.items() if k != "specrt" and not k.startswith("peer_")
    )
    text = f"wall {m(report.get('wall_s'))} min"
    if "specrt" in ph:
        text += f": specrt {m(ph['specrt'])} ({inner})"
    for k, v in ph.items():
        if k.startswith("peer_"):
            text += f", peer {k.removeprefix('peer_')} {m(v)}"
    return text


def method_label(method: str, k: int | str) -> str:
    """A spec-bench method as the tables and plots name it: ``target-only``, ``draft K=4``, ``ngram K=4``,
    ``ngram+draft K=4``, ``auto K``, ``auto``, ``suffix K=4``."""
    if method == "target_only":
        return "target-only"
    if method == "auto_k":
        return "auto K"
    if method == "auto":
        return "auto"
    return f"{method} K={k}"


def _ratio(x: dict[str, Any] | None) -> str:
    """``n_equal/n`` of an outputs-equal figure."""
    return "-" if x is None else f"{x['n_equal']}/{x['n']}"


def _spec_bench_tables(report: dict[str, Any]) -> tuple[list[tuple[str, list[str], list[list[str]], int]], list[str]]:
    """The spec-bench suite's tables (tok/s, speedup, E / acceptance, outputs equal; peers) and the mismatch notes."""
    from specrt.bench.spec_bench import NOT_COMPARED

    sb, dec = report["spec_bench"], report["decoding"]
    k = report["config"]["k"]
    methods = list(dec["methods"])
    spec = [m for m in methods if m != "target_only"]
    groups = [*sb["categories"].items(), ("overall", sb["overall"])]
    first = ["category", "q", "turns"]

    def head(g: dict[str, Any]) -> list[str]:
        base = g["target_only"]
        return [str(base["n_questions"]), str(base["n_turns"])]

    def table(title: str, ms: list[str], cell: Any) -> tuple[str, list[str], list[list[str]], int]:
        rows = [[name, *head(g), *(cell(g[m]) for m in ms)] for name, g in groups]
        return title, first + [method_label(m, k) for m in ms], rows, len(groups) - 1

    equal = (lambda f: _ratio(f["outputs_equal"])) if dec["outputs_compared"] else (lambda f: NOT_COMPARED)
    tables = [
        table("decode tokens/s", methods, lambda f: _f(f["decode_tokens_per_s"])),
        table("speedup over target-only (median over questions [min-max])", spec, lambda f: _sp(f["speedup"])),
        table(
            "tokens per round E / acceptance rate",
            spec,
            lambda f: f"{_f(f['mean_tokens_per_round'])} / {_f(f['acceptance_rate'])}",
        ),
        table("outputs equal to target-only (questions)", spec, equal),
    ]
    notes = []
    for m in spec if dec["outputs_compared"] else []:
        mism = sb["overall"][m]["outputs_equal"]["mismatches"]
        if mism:
            where = ", ".join(f"q{x['question_id']} turn {x['turn']} at token {x['position']}" for x in mism[:12])
            more = f" and {len(mism) - 12} more (JSON)" if len(mism) > 12 else ""
            notes.append(f"outputs differ from target-only: {method_label(m, k)}: {where}{more}")
    if not dec["outputs_compared"]:
        notes.append(f"outputs equal: {NOT_COMPARED}: {dec['why_not_compared']}")
    ps = report.get("peer_summary") or {}
    if ps:
        cats = list(sb["categories"])
        cols = ["category", *ps]
        rows = [[c, *(_sp(v["categories"].get(c)) for v in ps.values())] for c in cats]
        rows.append(["overall", *(_sp(v["overall"]) for v in ps.values())])
        rows.append(["target-only = specrt", *(_ratio(v["target_only_same_tokens_as_specrt"]) for v in ps.values())])
        tables.append(("peers: speculative over their own target-only (median over questions)", cols, rows, len(cats)))
        tables.append(_peer_speed_table(sb, ps, k))
    return tables, notes


def _peer_speed_table(
    sb: dict[str, Any], ps: dict[str, Any], k: int | str
) -> tuple[str, list[str], list[list[str]], int]:
    """Absolute decode tokens/s beside the peers': specrt's best method per category (chosen after the fact, among
    the methods run), each peer mode's target-only / speculative tokens/s, and specrt's best over the peer's best."""
    cats = [*sb["categories"], "overall"]
    cols = ["category", "specrt best (method)"]
    for label in ps:
        cols += [f"{label} target-only / spec", "specrt best / its best"]
    rows = []
    for c in cats:
        figs = sb["overall"] if c == "overall" else sb["categories"][c]
        rated = [(f["decode_tokens_per_s"], m) for m, f in figs.items() if f.get("decode_tokens_per_s")]
        best = max(rated) if rated else None
        row = [c, f"{best[0]:.2f} ({method_label(best[1], k)})" if best else "-"]
        for v in ps.values():
            r = (v.get("decode_tokens_per_s") or {}).get(c)
            if r is None:
                row += ["-", "-"]
                continue
            theirs = max(r["target_only"], r["speculative"])
            row += [
                f"{_f(r['target_only'])} / {_f(r['speculative'])}",
                _f(best[0] / theirs) if best and theirs else "-",
            ]
        rows.append(row)
    return (
        "decode tokens/s beside the peers (specrt's best: the category's fastest method in this run)",
        cols,
        rows,
        len(cats) - 1,
    )


def _spec_bench_header(report: dict[str, Any]) -> str:
    cfg, m, dec, ds = report["config"], report["machine"], report["decoding"], report["dataset"]
    sampling = "greedy" if dec["temperature"] == 0 else f"T={dec['temperature']:g}, seed {dec['seed']}"
    if dec["temperature"] > 0:
        sampling += ", coupled sampling" if dec["coupled"] else ", min(1, p/q) sampling"
    return (
        f"specrt bench --suite spec-bench: target {model_label(report['models']['target'])}, draft "
        f"{model_label(report['models']['draft'])}; {ds['n_questions']} Spec-Bench questions ({ds['n_turns']} turns) "
        f"in {len(ds['question_ids'])} categories, {dec['max_new_tokens']} new tokens per turn, {sampling}, "
        f"threads={cfg['threads']}; {m['cpu']} ({m['n_cpus']} CPUs)"
    )


_SPEC_BENCH_LEGEND = (
    "q: questions, turns: generations per method. tok/s: decode tokens/s (after prefill, Rust's decode time) summed "
    "over the category's turns; speedup: a question's tok/s over target-only's (turns summed, same run), median "
    "[min-max] over the category's questions; E: emitted tokens per round, acceptance: accepted / drafted, both "
    "pooled over the turns; outputs equal: questions whose every turn's token ids equal target-only's. Second turns "
    "carry target-only's first answer as history"
)


def render_table(report: dict[str, Any], *, use_rich: bool | None = None, file: Any = None) -> str:
    """Print the results (speed, cost model, sweeps, peers) as tables and return them as plain text.

    Args:
        report: what :func:`run_bench` returned (or its JSON).
        use_rich: draw with rich (when installed); default: when ``file`` is a terminal.
        file: where to print (default stdout).
    """
    file = file or sys.stdout
    if report.get("suite") == "spec-bench":
        header = _spec_bench_header(report)
        tables, notes = _spec_bench_tables(report)
        legend_after, legend = tables[3][0], _SPEC_BENCH_LEGEND
        pnotes = notes + _peer_rows(report)[2]
    else:
        header = _header(report)
        random = "random_weights" in report
        tables = _random_tables(report) if random else _main_tables(report)
        tn = _tn_table(report)
        if tn is not None:
            tables.insert(1, tn)
        legend_after = tables[-1][0] if random else "cost model"
        legend = _RANDOM_LEGEND if random else _LEGEND
        scols, srows = _sweep_rows(report)
        if srows:
            pair = (report.get("sweeps") or {}).get("pair")
            tables.append((f"sweeps ({pair.replace('_', '-')} pair)" if pair else "sweeps", scols, srows, 0))
        pcols, prows, pnotes = _peer_rows(report)
        if prows:
            tables.append(("peers", pcols, prows, 0))
    parts = [header]
    for title, cols, rows, _ in tables:
        parts.append(f"{title}\n{_plain_table(cols, rows)}")
        if title == legend_after:
            parts.append(legend)
    parts += pnotes
    parts.append(_timing_line(report))
    plain = "\n\n".join(parts)
    if use_rich is None:
        use_rich = getattr(file, "isatty", lambda: False)()
    try:
        if not use_rich:
            raise ImportError
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text
    except ImportError:
        print(plain, file=file)
        return plain
    # Never narrower than the plain table: rich would elide cells; a narrow terminal wraps lines instead.
    prose = ("tok/s:", "Random weights:", "specrt bench", "q: questions", "outputs ")  # header, legends, notes wrap
    widest = max(len(line) for line in plain.splitlines() if not line.startswith(prose))
    console = Console(file=file)
    console = Console(file=file, width=max(console.width, widest + 3 * 12))
    console.print(Text(header))
    for title, cols, rows, n_prompt_rows in tables:
        t = Table(title=title, header_style="bold", title_justify="left")
        for i, c in enumerate(cols):
            t.add_column(c, justify="left" if i == 0 or c in ("kind", "prompt") else "right", no_wrap=True)
        for i, r in enumerate(rows):
            t.add_row(*(Text(v) for v in r), end_section=i == n_prompt_rows - 1)
        console.print(t)
        if title == legend_after:
            console.print(Text(legend, style="dim"))
    for n in pnotes:
        console.print(Text(n, style="yellow"))
    return plain
