"""PNG plots of benchmark results (matplotlib, a dev dependency; without it the plots are skipped, not the run)."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from perf.common import percentile


def latency_cdf(
    series: Mapping[str, Sequence[float]],
    path: Path,
    *,
    title: str,
    marks: Mapping[str, float] | None = None,
) -> Path | None:
    """Empirical CDFs of latencies (seconds in, milliseconds on a log x axis); ``marks`` are labelled
    vertical lines (e.g. ``{"4x floor p50": 0.004}``). Returns the file, or None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter, NullFormatter
    except ImportError:
        print("matplotlib is not installed (`make install` brings it): plot skipped", file=sys.stderr)
        return None
    fig, ax = plt.subplots(figsize=(12, 5.4), dpi=100)
    styles = ["-", "-", "--", "-.", ":", "-", "--", "-."]
    lo, hi = float("inf"), 0.0
    for i, (label, samples) in enumerate(series.items()):
        if not samples:
            continue
        xs = sorted(s * 1000 for s in samples)
        ys = [(k + 1) / len(xs) for k in range(len(xs))]
        lo, hi = min(lo, xs[0]), max(hi, xs[-1])
        ax.step(
            xs,
            ys,
            where="post",
            linestyle=styles[i % len(styles)],
            linewidth=2.0 if i == 0 else 1.5,
            label=f"{label}  (p50 {percentile(xs, 50):.2f} ms)",
        )
    for label, value in (marks or {}).items():
        ax.axvline(value * 1000, color="grey", linestyle=":", linewidth=1.2)
        ax.annotate(
            label,
            (value * 1000, 0.5),
            rotation=90,
            fontsize=9,
            color="dimgrey",
            xytext=(4, 0),
            textcoords="offset points",
            va="center",
        )
        hi = max(hi, value * 1000 * 1.1)
    ax.set_xscale("log")
    ticks = [
        t
        for t in (0.5, 0.7, 1, 1.5, 2, 3, 4, 5, 7, 10, 15, 20, 30, 50, 70, 100, 200, 500, 1000)
        if lo <= t * 1.15 and t <= hi
    ]
    ax.set_xticks(ticks)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("latency (ms, log scale)")
    ax.set_ylabel("fraction of calls ≤ latency")
    ax.set_ylim(0, 1.01)
    ax.grid(True, which="major", alpha=0.35)
    ax.set_title(title, fontsize=11)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9, frameon=False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
