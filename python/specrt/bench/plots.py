"""The K sweep and temperature sweep as PNGs (:func:`write_plots`; matplotlib, optional)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from specrt.bench.report import model_label
from specrt.bench.stats import med

_PRED_LABEL = "predicted from measured E, c_q, c_p, c_verify(K)"


def write_plots(report: dict[str, Any], out_prefix: str | os.PathLike[str]) -> list[Path]:
    """Draw the K sweep and the temperature sweep (measured and predicted speedup) as PNGs.

    Returns the written paths (``<prefix>-k-sweep.png``, ``<prefix>-temperature-sweep.png``); empty when there are
    no sweeps or matplotlib is not installed (``pip install specrt[bench]``).
    """
    sw = report.get("sweeps")
    if not sw:
        return []
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
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
