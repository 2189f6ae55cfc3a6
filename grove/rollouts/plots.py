"""PNG plots of a run (matplotlib, imported only here: the engine runs without it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def draw(out: Path, summary: dict[str, Any], results: list[dict[str, Any]]) -> list[str]:
    """``pass_at_k.png`` (pass@k per variant) and ``tasks.png`` (pass rate per task); the file names."""
    names = []
    fig, ax = plt.subplots(figsize=(5, 3.2))
    for v in summary["variants"]:
        points = sorted((int(k), p) for k, p in v["pass_at_k"].items() if p is not None)
        if points:
            ax.plot([k for k, _ in points], [p for _, p in points], marker="o",
                    label=v["harness"] + (f" / {v['model']}" if v["model"] else ""))
    ax.set_xlabel("k")
    ax.set_ylabel("pass@k")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "pass_at_k.png", dpi=110)
    plt.close(fig)
    names.append("pass_at_k.png")

    tasks = sorted({r["task"] for r in results})
    if tasks:
        fig, ax = plt.subplots(figsize=(6, max(2.0, 0.28 * len(tasks) + 1)))
        width = 0.8 / max(1, len(summary["variants"]))
        for i, _ in enumerate(summary["variants"]):
            rates = []
            for task in tasks:
                scored = [r for r in results if r["task"] == task and r["variant"] == i
                          and r["outcome"] != "infra_error"]
                rates.append(sum(r["outcome"] == "pass" for r in scored) / len(scored) if scored else 0.0)
            ax.barh([j + i * width for j in range(len(tasks))], rates, height=width)
        ax.set_yticks([j + 0.4 - width / 2 for j in range(len(tasks))], tasks, fontsize=7)
        ax.set_xlabel("pass rate")
        ax.set_xlim(0, 1)
        fig.tight_layout()
        fig.savefig(out / "tasks.png", dpi=110)
        plt.close(fig)
        names.append("tasks.png")
    return names
