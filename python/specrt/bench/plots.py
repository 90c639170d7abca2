"""The bench's PNGs (:func:`write_plots`; matplotlib, optional): the K sweep and temperature sweep, or the spec-bench
suite's speedup by method per category."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from specrt.bench.report import method_label, model_label
from specrt.bench.stats import med

_PRED_LABEL = "predicted from measured E, c_q, c_p, c_verify(K)"


def _pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend, or None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def write_plots(report: dict[str, Any], out_prefix: str | os.PathLike[str]) -> list[Path]:
    """Draw the K sweep and the temperature sweep (measured and predicted speedup) as PNGs, or for a spec-bench
    suite report the speedup by method per category (:func:`write_spec_bench_plot`).

    Returns the written paths (``<prefix>-k-sweep.png``, ``<prefix>-temperature-sweep.png``; the suite's
    ``<prefix>-speedup.png``); empty when there are no sweeps or matplotlib is not installed
    (``pip install specrt[bench]``).
    """
    if report.get("suite") == "spec-bench":
        path = write_spec_bench_plot(report, out_prefix)
        return [] if path is None else [path]
    sw = report.get("sweeps")
    if not sw:
        return []
    plt = _pyplot()
    if plt is None:
        return []
    prefix = Path(out_prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    written = []
    m, cfg = report["machine"], report["config"]
    machine = f"{m['cpu']}, threads={cfg['threads']}"
    if cfg.get("provider") == "cuda":
        machine += f", CUDA on {m.get('gpu') or 'GPU 0'}"
    # With random weights the sweeps ran on the full-acceptance pair (report["random_weights"]).
    models = (report.get("random_weights") or {}).get(sw.get("pair") or "", {}).get("models") or report["models"]
    subtitle = f"{model_label(models['target'])} / {model_label(models['draft'])}"

    def panel_grid(n: int) -> tuple[Any, list[Any]]:
        fig, axes = plt.subplots(1, n, figsize=(5.2 * n, 4.2), squeeze=False)
        return fig, list(axes[0])

    def errorbar(ax: Any, xs: list[float], pts: list[dict[str, Any]], **kw: Any) -> None:
        medians = [med(p["speedup"]) for p in pts]
        lo = [m - p["speedup"]["min"] for m, p in zip(medians, pts, strict=True)]
        hi = [p["speedup"]["max"] - m for m, p in zip(medians, pts, strict=True)]
        ax.errorbar(xs, medians, yerr=[lo, hi], fmt="o-", capsize=3, **kw)

    entries = sw["k_sweep"]["prompts"]
    fig, axes = panel_grid(len(entries))
    for ax, e in zip(axes, entries, strict=True):
        pts = e["points"]
        xs = [p["k"] for p in pts]
        errorbar(ax, xs, pts, label="measured (median, min-max)")
        ax.plot(xs, [p["predicted_speedup"] for p in pts], "s--", label=_PRED_LABEL)
        if e["model_curve"]:
            ax.plot(
                [c["k"] for c in e["model_curve"]],
                [c["speedup"] for c in e["model_curve"]],
                ":",
                color="gray",
                label=f"cost model, a={e['alpha_ref']:.2f} fitted at K={sw['temperature_sweep']['k']}",
            )
        ax.axhline(1.0, color="black", lw=0.6)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("K (draft tokens per round)")
        ax.set_ylabel("decode speedup over target-only")
        ax.set_title(f"{e['id']}" + (f" (peer {e['peer']})" if e["peer"] else ""))
        ax.set_xticks(xs)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"K sweep, greedy, {sw['max_new_tokens']} new tokens: {subtitle}\n{machine}", fontsize=10)
    fig.tight_layout()
    p = prefix.with_name(prefix.name + "-k-sweep.png")
    fig.savefig(p, dpi=110)
    plt.close(fig)
    written.append(p)

    entries = sw["temperature_sweep"]["prompts"]
    fig, axes = panel_grid(len(entries))
    for ax, e in zip(axes, entries, strict=True):
        pts = e["points"]
        xs = [p["temperature"] for p in pts]
        errorbar(ax, xs, pts, label="measured (median, min-max)")
        ax.plot(xs, [p["predicted_speedup"] for p in pts], "s--", label=_PRED_LABEL)
        ax2 = ax.twinx()
        ax2.plot(xs, [med(p["acceptance_rate"]) for p in pts], "^:", color="gray", label="accepted / drafted")
        ax2.set_ylim(0, 1.05)
        ax2.set_ylabel("acceptance rate (accepted / drafted)", color="gray")
        ax.axhline(1.0, color="black", lw=0.6)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("temperature")
        ax.set_ylabel("decode speedup over target-only")
        ax.set_title(f"{e['id']}" + (f" (peer {e['peer']})" if e["peer"] else ""))
        ax.grid(alpha=0.3)
        handles = ax.get_legend_handles_labels()
        handles2 = ax2.get_legend_handles_labels()
    axes[0].legend(handles[0] + handles2[0], handles[1] + handles2[1], fontsize=8, loc="lower left")
    fig.suptitle(
        f"temperature sweep, K={sw['temperature_sweep']['k']}, {sw['max_new_tokens']} new tokens: "
        f"{subtitle}\n{machine}",
        fontsize=10,
    )
    fig.tight_layout()
    p = prefix.with_name(prefix.name + "-temperature-sweep.png")
    fig.savefig(p, dpi=110)
    plt.close(fig)
    written.append(p)
    return written


#: Bar colours of the spec-bench methods (matplotlib's tab10, one per method, in METHODS order after target-only).
_METHOD_COLORS = {
    "draft": "tab:blue",
    "ngram": "tab:orange",
    "ngram+draft": "tab:green",
    "auto_k": "tab:purple",
    "auto": "tab:red",
    "suffix": "tab:brown",
}


def write_spec_bench_plot(report: dict[str, Any], out_prefix: str | os.PathLike[str]) -> Path | None:
    """The spec-bench suite's speedup over target-only as bars: one panel per category and one for all questions, a
    bar per method at the median over the questions (its value written in the bar), a dot per question where a panel
    has several, a dashed line at 1 (target-only's speed). Written to ``<prefix>-speedup.png``; None without
    matplotlib."""
    plt = _pyplot()
    if plt is None:
        return None
    sb, dec, cfg = report["spec_bench"], report["decoding"], report["config"]
    methods = [m for m in dec["methods"] if m != "target_only"]
    records = sb["questions"]
    groups = [(c, g, [r for r in records if r["category"] == c]) for c, g in sb["categories"].items()]
    groups.append(("all questions", sb["overall"], records))
    ncols = min(7, len(groups))
    nrows = -(-len(groups) // ncols)
    title_in, legend_in = 0.15, 0.4  # inches kept free above (tight_layout places the suptitle itself) and below
    height = 2.6 * nrows + title_in + legend_in
    fig, axes = plt.subplots(nrows, ncols, figsize=(2.3 * ncols, height), sharey=True, squeeze=False)
    per_q = {
        m: [r["figures"][m]["speedup"] for r in records if r["figures"][m]["speedup"] is not None] for m in methods
    }
    top = max([1.0, *(x for v in per_q.values() for x in v)]) * 1.1
    for ax, (name, g, recs) in zip(axes.flat, groups, strict=False):
        for x, m in enumerate(methods):
            sp = g[m]["speedup"]
            if sp is None:
                continue
            y = sp["median"]
            color = _METHOD_COLORS.get(m, "gray")
            ax.bar(x, y, color=color, width=0.8)
            # The median's value at the bar's foot, over the dots (its box hides a dot rather than a dot the digits);
            # above a bar too short to hold it.
            if y >= 0.12 * top:
                box = {"boxstyle": "round,pad=0.15", "facecolor": color, "edgecolor": "none"}
                ax.text(x, 0.03 * top, f"{y:.2f}", ha="center", va="bottom", fontsize=8, color="white",
                        fontweight="bold", bbox=box, zorder=4)  # fmt: skip
            else:
                ax.text(
                    x, y + 0.01 * top, f"{y:.2f}", ha="center", va="bottom", fontsize=8, fontweight="bold", zorder=4
                )
            if sp["n"] > 1:
                ys = [r["figures"][m]["speedup"] for r in recs if r["figures"][m]["speedup"] is not None]
                xs = [x - 0.25 + 0.5 * (i + 0.5) / len(ys) for i in range(len(ys))]
                ax.scatter(xs, ys, s=6, color="black", alpha=0.5, zorder=3, linewidths=0)
        ax.axhline(1.0, color="black", lw=0.8, ls="--")
        n = g["target_only"]["n_questions"]
        ax.set_title(f"{name} (n={n})", fontsize=10, fontweight="bold" if recs is records else "normal")
        ax.set_xticks([])
        ax.set_ylim(0, top)
        ax.grid(axis="y", alpha=0.3)
    for ax in axes.flat[len(groups) :]:
        ax.axis("off")
    for row in axes:
        row[0].set_ylabel("speedup over target-only")
    handles: list[Any] = [plt.Rectangle((0, 0), 1, 1, color=_METHOD_COLORS.get(m, "gray")) for m in methods]
    labels = [method_label(m, cfg["k"]) for m in methods]
    handles.append(plt.Line2D([0], [0], color="black", lw=0.8, ls="--"))
    labels.append("target-only (1.0)")
    if any(g[m]["speedup"] and g[m]["speedup"]["n"] > 1 for _, g, _ in groups for m in methods):
        handles.append(plt.Line2D([0], [0], marker="o", color="black", alpha=0.5, lw=0, markersize=3))
        labels.append("one question")
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=9, frameon=False)
    sampling = "greedy" if dec["temperature"] == 0 else f"T={dec['temperature']:g}"
    m = report["machine"]
    fig.suptitle(
        f"Spec-Bench: decode speedup over target-only, median over each category's questions ({sampling}, "
        f"{dec['max_new_tokens']} new tokens per turn)\n{model_label(report['models']['target'])} / "
        f"{model_label(report['models']['draft'])}; {m['cpu']}, threads={cfg['threads']}",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, legend_in / height, 1, 1 - title_in / height))
    prefix = Path(out_prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    path = prefix.with_name(prefix.name + "-speedup.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
