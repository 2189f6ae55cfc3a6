"""PNG plots of a run (matplotlib, imported only here: the engine runs without it).

Figures are built with :class:`~matplotlib.figure.Figure` directly, not pyplot: no global figure state, nothing
to close, and safe from any thread. Each variant keeps one colour in both plots.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from matplotlib import colormaps
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure

_DPI = 110


def draw(out: Path, summary: dict[str, Any], results: list[dict[str, Any]]) -> list[str]:
    """``pass_at_k.png`` (pass@k per variant, with intervals) and ``tasks.png`` (pass rate per task); the names."""
    names = []
    for name, fig in (("pass_at_k.png", pass_at_k_figure(summary)), ("tasks.png", tasks_figure(summary, results))):
        if fig is not None:
            fig.savefig(out / name, dpi=_DPI, bbox_inches="tight")
            names.append(name)
    return names


def variant_name(variant: dict[str, Any]) -> str:
    """How plots and the report name a variant: harness, and model if any."""
    return str(variant["harness"]) + (f" / {variant['model']}" if variant.get("model") else "")


def colour(index: int, count: int) -> tuple[float, float, float, float]:
    """Variant ``index``'s colour: distinct for up to 20 variants, then spread over a continuous map."""
    if count <= 10:
        return to_rgba(colormaps["tab10"](index))
    if count <= 20:
        return to_rgba(colormaps["tab20"](index))
    return to_rgba(colormaps["viridis"](index / (count - 1)))


def pass_at_k_figure(summary: dict[str, Any]) -> Figure:
    """pass@k against k (integer ticks, log2 spacing), one line per variant with its bootstrap intervals."""
    variants = summary["variants"]
    fig = Figure(figsize=(5.6, 3.4))
    ax = fig.subplots()
    given = sorted({int(k) for v in variants for k, p in v["pass_at_k"].items() if p is not None})
    level = next((v["bootstrap"]["level"] for v in variants if v.get("bootstrap")), 0.95)
    for i, v in enumerate(variants):
        points = sorted((int(k), p) for k, p in v["pass_at_k"].items() if p is not None)
        ci = v.get("pass_at_k_ci") or {}
        # Dodge variants a little along k so their intervals do not hide each other.
        shift = 2 ** (0.035 * (i - (len(variants) - 1) / 2))
        xs = [k * shift for k, _ in points]
        c = colour(i, len(variants))
        label = variant_name(v) if points else variant_name(v) + " (no pass@k given)"
        ax.plot(xs, [p for _, p in points], marker="o", color=c, label=label)
        spans = [(x, ci[str(k)]) for x, (k, _) in zip(xs, points, strict=True) if ci.get(str(k))]
        if spans:
            ax.vlines([x for x, _ in spans], [lo for _, (lo, _) in spans], [hi for _, (_, hi) in spans],
                      color=c, alpha=0.55, linewidth=2)
    if given:
        ax.set_xscale("log", base=2)
        ax.set_xticks(given, [str(k) for k in given])
        ax.minorticks_off()
        ax.set_xlim(given[0] / 1.25, given[-1] * 1.25)
    else:
        ax.set_xticks([])
        ax.text(0.5, 0.5, "no pass@k given", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("k")
    ax.set_ylabel("pass@k")
    ax.set_title(f"pass@k, {level:.0%} bootstrap intervals over tasks", fontsize=9)
    ax.set_ylim(0, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside the axes: hides no interval
    fig.tight_layout()
    return fig


def tasks_figure(summary: dict[str, Any], results: list[dict[str, Any]]) -> Figure | None:
    """Pass rate per task and variant, each bar labelled with the scored attempts behind it; None without tasks."""
    tasks = sorted({r["task"] for r in results})
    if not tasks:
        return None
    variants = summary["variants"]
    scored: Counter[tuple[int, str]] = Counter()
    passed: Counter[tuple[int, str]] = Counter()
    for r in results:
        if r["outcome"] != "infra_error":  # lost attempts are never scored: not behind any bar
            scored[(r["variant"], r["task"])] += 1
            passed[(r["variant"], r["task"])] += r["outcome"] == "pass"
    height = 0.8 / len(variants)
    row_inches = max(0.3, 0.17 * len(variants))
    fig = Figure(figsize=(6.5, row_inches * len(tasks) + 1.2))
    ax = fig.subplots()
    for i, v in enumerate(variants):
        ns = [scored[(i, t)] for t in tasks]
        rates = [passed[(i, t)] / n if n else 0.0 for t, n in zip(tasks, ns, strict=True)]
        offset = (i - (len(variants) - 1) / 2) * height
        bars = ax.barh([j + offset for j in range(len(tasks))], rates, height=height,
                       color=colour(i, len(variants)), label=variant_name(v))
        ax.bar_label(bars, labels=[f"n={n}" for n in ns], fontsize=6, padding=2)
    ax.set_yticks(range(len(tasks)), tasks, fontsize=7)
    ax.invert_yaxis()  # tasks read top to bottom in the report's order
    ax.set_xlim(0, 1.18)  # room for the n= labels of a full bar
    ax.set_xticks([0, 0.25, 0.5, 0.75, 1.0])
    ax.set_xlabel("pass rate (passes / n scored attempts)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside the axes: covers no bar
    fig.tight_layout()
    return fig
