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
        for t in (0.5, 0.7, 1, 1.5, 2, 3, 4, 5, 7, 10, 15, 20, 30, 50, 70, 100, 200, 500, 1000, 2000, 5000, 10000,
                  20000, 50000, 100000)
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


def burst_timeline(
    series: Mapping[str, Mapping[str, Sequence[float]]],
    path: Path,
    *,
    title: str,
) -> Path | None:
    """One panel per burst: sandboxes alive and in creation (left axis) and commands answered per second
    (right axis) over time. ``series`` maps a panel title to :func:`perf.burst.timeline`'s dict."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (`make install` brings it): plot skipped", file=sys.stderr)
        return None
    fig, axes = plt.subplots(len(series), 1, figsize=(12, 3.6 * len(series)), dpi=100, squeeze=False)
    for ax, (name, data) in zip(axes[:, 0], series.items(), strict=True):
        t = list(data["t_s"])
        alive = list(data["alive"])
        ax.fill_between(t, alive, step="post", alpha=0.35, color="tab:green", label="alive (ready, not deleted)")
        ax.step(t, list(data["creating"]), where="post", color="tab:orange", linewidth=1.3, label="being created")
        ax.set_ylabel("sandboxes")
        ax.set_ylim(bottom=0)
        ax.set_xlim(0, t[-1] if t else 1)
        ax.grid(True, alpha=0.3)
        rate = ax.twinx()
        window = 10  # 1 s moving average of the 0.1 s bins
        cps = list(data["commands_per_s"])
        smooth = [sum(cps[max(0, i - window + 1) : i + 1]) / min(window, i + 1) for i in range(len(cps))]
        rate.plot(t, smooth, color="tab:blue", linewidth=1.2, label="commands answered /s (1 s average)")
        rate.set_ylabel("commands / s")
        rate.set_ylim(bottom=0)
        ax.set_title(name, fontsize=10)
        lines = ax.get_legend_handles_labels()[0] + rate.get_legend_handles_labels()[0]
        labels = ax.get_legend_handles_labels()[1] + rate.get_legend_handles_labels()[1]
        ax.legend(lines, labels, loc="center right", fontsize=8, frameon=False)
    axes[-1, 0].set_xlabel("seconds since the burst started")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
