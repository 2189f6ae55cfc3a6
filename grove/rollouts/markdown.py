"""The Markdown report of a run (``report.md``), from its summary."""

from __future__ import annotations

from typing import Any


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def render(summary: dict[str, Any], plots: list[str]) -> str:
    """The report: pass@1 and unbiased pass@k per variant side by side, per task, group yield, faults."""
    variants = summary["variants"]
    names = [f"{v['harness']}" + (f" / {v['model']}" if v["model"] else "") for v in variants]
    lines = [f"# Rollouts {summary['run_id']}", ""]
    lines += [f"{summary['attempts']} attempts ({summary['tries']} tries), {summary['groups']} groups, "
              f"{summary['informative_groups']} informative "
              f"({_fmt(summary['informative_per_100_attempts'])} per 100 attempts); "
              f"{summary['lost_attempts']} attempts lost to infrastructure faults (never scored); "
              f"{summary['sandbox_seconds']:.1f} sandbox-seconds, {summary['cpu_seconds']:.1f} CPU-seconds.", ""]
    ks = sorted({int(k) for v in variants for k in v["pass_at_k"]})
    lines += ["## Pass rates", "", "| | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for k in ks:
        lines.append(f"| pass@{k} | " + " | ".join(_fmt(v["pass_at_k"].get(str(k))) for v in variants) + " |")
    for label, key in (("attempts scored", "scored"), ("passed", "passed"), ("mean reward", "mean_reward"),
                       ("groups", "groups"), ("informative groups", "informative_groups")):
        lines.append(f"| {label} | " + " | ".join(_fmt(v[key]) for v in variants) + " |")
    lines += ["", "pass@k is the unbiased estimator 1 - C(n-c, k)/C(n, k) averaged over the groups with at least "
              "k scored attempts.", "", "## Per task (passes / scored attempts)", "",
              "| task | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for task, row in summary["tasks"].items():
        lines.append(f"| {task} | " + " | ".join(row) + " |")
    lines += ["", "## Infrastructure faults", ""]
    if summary["infra_faults"]:
        lines += [f"Fault rate: {_fmt(summary['infra_fault_rate'])} per try. Each faulted try was retried in a "
                  "fresh sandbox and never scored.", "", "| reason | tries |", "|---|---|"]
        lines += [f"| {reason} | {n} |" for reason, n in sorted(summary["infra_faults"].items())]
    else:
        lines.append("None.")
    if summary.get("throttled_creates"):
        lines += ["", f"The router turned {summary['throttled_creates']} creates away with 503 + Retry-After "
                  "(back-pressure); each waited and was retried, none counted as a fault."]
    if summary.get("interrupted_tries"):
        lines += ["", f"{summary['interrupted_tries']} tries were interrupted by a stopped runner and run again "
                  "on resume (their sandboxes deleted)."]
    if plots:
        lines += ["", "## Plots", ""] + [f"![{p}]({p})" for p in plots]
    else:
        lines += ["", "(No plots: matplotlib is not installed.)"]
    return "\n".join(lines) + "\n"
