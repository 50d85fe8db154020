"""The PNG: latency distributions, throughput ratios to the peers, and the scale plot.

matplotlib is a dev extra; without it the harness says so and writes no picture.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .stats import SAMPLES, Result
from .targets import Row


def write_png(path: Path, results: list[Result], rows: list[Row]) -> str | None:
    """Write the figure; None on success, else why not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install -e '.[dev]'): no PNG written"
    fig, axes = plt.subplots(1, 3, figsize=(19, 6))
    try:
        _latencies(axes[0])
        _ratios(axes[1], rows)
        _scale(axes[2], results)
        fig.suptitle("claim-gateway bench: one run, peers side by side")
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=90)
    except (ValueError, OSError) as exc:
        return f"the figure could not be drawn: {exc}"
    finally:
        plt.close(fig)
    return None


def _log_if_any(ax: Any, drawn: bool, x: bool, y: bool = False) -> None:
    """Log axes only when something positive was drawn (matplotlib refuses otherwise)."""
    if not drawn:
        ax.text(0.5, 0.5, "not measured in this run", ha="center", transform=ax.transAxes)
        return
    if x:
        ax.set_xscale("log")
    if y:
        ax.set_yscale("log")


def _latencies(ax: Any) -> None:
    """Empirical CDF of each latency sample set, log x."""
    drawn = False
    for name, values in sorted(SAMPLES.items()):
        if not values:
            continue
        ordered = sorted(v * 1000.0 for v in values if v > 0)
        if not ordered:
            continue
        n = len(ordered)
        step = max(1, n // 2000)
        xs = ordered[::step]
        ys = [i * step / n for i in range(len(xs))]
        ax.plot(xs, ys, label=f"{name} (n={n:,})")
        drawn = True
    _log_if_any(ax, drawn, x=True)
    ax.set_xlabel("latency, ms (log)")
    ax.set_ylabel("fraction of requests at or below")
    ax.set_title("latency distributions")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=6, loc="lower right")
    ax.grid(True, which="both", alpha=0.3)


def _ratios(ax: Any, rows: list[Row]) -> None:
    """Each x-ratio target: measured against its bound."""
    picked = [r for r in rows if r.unit == "x" and r.value]
    names = [r.target.replace(", largest size vs", "\nvs") for r in picked]
    ys = range(len(picked))
    colors = ["tab:green" if r.verdict == "PASS" else "tab:red" for r in picked]
    ax.barh(list(ys), [r.value for r in picked], color=colors)
    ax.scatter(
        [r.bound for r in picked], list(ys), marker="|", s=300, color="black", label="target"
    )
    ax.set_yticks(list(ys), names, fontsize=6)
    _log_if_any(ax, bool(picked), x=True)
    ax.set_xlabel("ratio (log); green PASS, red MISS, | target")
    ax.set_title("ratios to peers and baselines")
    ax.invert_yaxis()


def _scale(ax: Any, results: list[Result]) -> None:
    """Median cost of each operation against the rows in the table, log x."""
    drawn = False
    for r in results:
        if r.scenario != "scale":
            continue
        sizes = r.numbers.get("sizes") or []
        p50 = r.numbers.get("p50_ms") or []
        pts = [(s, v) for s, v in zip(sizes, p50, strict=False) if s > 0 and v]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=r.cache)
            drawn = True
    _log_if_any(ax, drawn, x=True, y=True)
    ax.set_xlabel("rows in the table (log)")
    ax.set_ylabel("median, ms (log)")
    ax.set_title("scale: cost against data size")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
