"""The Markdown report of a run (``report.md``), from its summary."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def _pass_cell(variant: dict[str, Any], k: str) -> str:
    """``0.700 [0.500, 0.900]``, and how many groups it covers when fewer than all of the variant's."""
    value = variant["pass_at_k"].get(k)
    if value is None:
        return "-"
    cell = _fmt(value)
    if ci := (variant.get("pass_at_k_ci") or {}).get(k):
        cell += f" [{ci[0]:.3f}, {ci[1]:.3f}]"
    groups = (variant.get("pass_at_k_groups") or {}).get(k)
    if groups is not None and groups < variant["groups"]:
        cell += f" ({groups} groups)"
    return cell


def _pass_notes(variants: list[dict[str, Any]], names: list[str]) -> list[str]:
    """Paragraphs: what the pass@k figures are, what they cover, and why any is not given."""
    first = variants[0]
    lines: list[str] = []
    if first.get("estimator", "chen") == "chen":
        lines.append("pass@k is Chen et al.'s unbiased estimator 1 - C(n-c, k)/C(n, k) per group, averaged over the "
                     "groups with at least k scored attempts (a group has fewer only by losing attempts to "
                     "infrastructure faults, which do not depend on its outcomes).")
    else:
        limits = [v["pass_at_k_limit"] for v in variants]
        given = (str(limits[0]) if len(set(limits)) == 1
                 else ", ".join(f"{k} ({n})" for k, n in zip(limits, names, strict=True)))
        lines.append("This is a BAR run: how many attempts a group gets depends on its results, so Chen's estimator "
                     "averaged over the groups that reached k attempts would be biased (it drops the groups that "
                     "stopped early because they passed). Here pass@k is, for every group, whether one of its first k "
                     "scored attempts passed (order within a BAR stage taken as random), averaged over all groups: "
                     "unbiased, and it cannot fall as k grows. With rewards of 0 (fail) and 1 (pass), BAR stops a "
                     "group early only once it holds a pass or after its patience of agreeing results, so this is "
                     f"known for every group for k up to the patience, and not given above it. Given here for k <= "
                     f"{given}.")
        odd = [n for n, v in zip(names, variants, strict=True) if not v.get("binary_rewards", True)]
        if odd:
            lines.append(f"Rewards of {', '.join(odd)} are not only 0 and 1 (a reward check with pass_threshold): "
                         "BAR stops a group once its rewards differ, even if none passed, so only k up to BAR's first "
                         "stage is given for them.")
    target = first.get("target_groups")
    if target:
        lines.append(f"The run stopped starting groups once {target} were informative (--target-groups): the "
                     "figures cover only the groups that started, the first tasks in task order, and where the cut "
                     "fell depends on results, so they do not estimate the whole task set.")
    boot = first.get("bootstrap")
    if boot:
        lines.append(f"In brackets: {boot['level']:.0%} percentile bootstrap intervals over tasks (tasks resampled "
                     f"with replacement, {boot['resamples']} resamples, seed {boot['seed']}: a rebuilt report shows "
                     "the same). They count which tasks were drawn as well as the attempts' luck; with few tasks they "
                     "run narrow (in simulation, 95% intervals covered about 90% of the time with 10 tasks, 95% with "
                     "40), and there is none with fewer than 2 tasks.")
    missing: dict[tuple[str, str], list[str]] = {}
    for name, v in zip(names, variants, strict=True):
        for k, why in (v.get("pass_at_k_missing") or {}).items():
            missing.setdefault((k, why), []).append(name)
    if missing:
        lines.append("Not given:\n\n" + "\n".join(
            f"- pass@{k} ({', '.join(who)}): {why}."
            for (k, why), who in sorted(missing.items(), key=lambda item: int(item[0][0]))))
    return lines


def _size(value: float) -> str:
    """Bytes, readably (decimal units)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if value >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value:.0f} B"


_COST_ROWS: tuple[tuple[str, str, Callable[[float], str]], ...] = (
    ("CPU-seconds", "cpu_s", "{:.1f}".format), ("memory reserved, GiB-seconds", "memory_gb_s", "{:.1f}".format),
    ("largest memory peak of one sandbox, MiB", "memory_peak_mb", "{:.1f}".format),
    ("disk held at the end", "disk_bytes", _size), ("object storage", "s3_bytes", _size),
    ("running time, sandbox-seconds", "running_s", "{:.1f}".format))


def _cost_cell(cost: dict[str, Any], key: str, show: Callable[[float], str]) -> str:
    value = cost["total"].get(key)
    return "-" if value is None else show(value)


def _cost_section(summary: dict[str, Any], names: list[str]) -> list[str]:
    """The run's cost per variant, in all and per project, and what each figure is."""
    overall = summary.get("cost")
    if overall is None:  # a summary from a grove before costs
        return []
    columns = [v["cost"] for v in summary["variants"]] + [overall]
    lines = ["", "## Cost", "", "What the router measured of the attempts' sandboxes (each agent's and its isolated "
             "grader's), added up.", "", "| | " + " | ".join([*names, "all"]) + " |", "|---|" + "---|" * len(columns)]
    for label, key, show in _COST_ROWS:
        lines.append(f"| {label} | " + " | ".join(_cost_cell(c, key, show) for c in columns) + " |")
    lines.append("| sandboxes | " + " | ".join(str(c["sandboxes"]) for c in columns) + " |")
    projects = summary.get("cost_by_project") or {}
    if projects:
        lines += ["", "Per project (the router key's):", "",
                  "| project | " + " | ".join(label for label, _, _ in _COST_ROWS) + " | sandboxes |",
                  "|---|" + "---|" * (len(_COST_ROWS) + 1)]
        for project, cost in projects.items():
            lines.append(f"| {project} | " + " | ".join(_cost_cell(cost, key, show) for _, key, show in _COST_ROWS)
                         + f" | {cost['sandboxes']} |")
    lines += ["", "CPU-seconds: user and system time of every process of the sandboxes, their executors' own "
              "included, from each sandbox's cgroup. Memory reserved: each sandbox's memory limit in GiB times the "
              "seconds it ran. Largest memory peak: the most one sandbox held at once (its processes and the page "
              "cache of its files). Disk: what the sandboxes' writable layers held when they ended. Object storage: "
              "their trajectory records, artifacts and commands' full outputs. Running time: from ready (or claimed "
              "from a warm pool) to scaled to zero or deleted, over every run; a sandbox scaled to zero costs no "
              "running time, memory or CPU while it sleeps. '-': not measured (the Knative backend reads no CPU "
              "time, memory peak or disk of its pods).",
              "",
              "Only the sandboxes of each attempt's last try are counted: tries lost to infrastructure faults are "
              "not. The headline's sandbox-seconds are the tries' wall time as the runner saw it (from create to "
              "delete, faulted tries included), and its CPU-seconds what the processes of the agent's sandbox had used "
              "when grading began, read from /proc inside it (the grader not included)."]
    if overall["unknown"]:
        lines += ["", f"{overall['unknown']} sandboxes' cost is not in the figures above: their delete failed (their "
                  "TTL reaps them), or the router no longer remembered them when asked (a restart)."]
    if overall["attempts_without"]:
        lines += ["", f"{overall['attempts_without']} attempts carry no cost (lost to infrastructure faults, or run "
                  "by a grove that did not record costs)."]
    return lines


def render(summary: dict[str, Any], plots: list[str]) -> str:
    """The report: pass@1 and unbiased pass@k per variant side by side, per task, group yield, faults."""
    variants = summary["variants"]
    names = [f"{v['harness']}" + (f" / {v['model']}" if v["model"] else "") for v in variants]
    lines = [f"# Rollouts {summary['run_id']}", ""]
    lines += [f"{summary['attempts']} attempts ({summary['tries']} tries), {summary['groups']} groups, "
              f"{summary['informative_groups']} informative "
              f"({_fmt(summary['informative_per_100_attempts'])} per 100 attempts); "
              f"{summary['lost_attempts']} attempts lost to infrastructure faults and "
              f"{summary.get('harness_errors', 0)} to harness errors (neither ever scored); "
              f"{summary['sandbox_seconds']:.1f} sandbox-seconds, {summary['cpu_seconds']:.1f} CPU-seconds.", ""]
    ks = sorted({int(k) for v in variants for k in v["pass_at_k"]})
    lines += ["## Pass rates", "", "| | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for k in ks:
        lines.append(f"| pass@{k} | " + " | ".join(_pass_cell(v, str(k)) for v in variants) + " |")
    for label, key in (("attempts scored", "scored"), ("passed", "passed"), ("mean reward", "mean_reward"),
                       ("groups", "groups"), ("informative groups", "informative_groups")):
        lines.append(f"| {label} | " + " | ".join(_fmt(v[key]) for v in variants) + " |")
    for paragraph in _pass_notes(variants, names):
        lines += ["", paragraph]
    lines += ["", "## Per task (passes / scored attempts)", "",
              "| task | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for task, row in summary["tasks"].items():
        lines.append(f"| {task} | " + " | ".join(row) + " |")
    lines += _cost_section(summary, names)
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
    if summary.get("unreachable_creates"):
        lines += ["", f"The router was unreachable for {summary['unreachable_creates']} creates (down or away: "
                  "not busy); each create waited for it, and the sandboxes of the tries it cut short were "
                  "deleted once it answered again."]
    lines += ["", "## Harness errors", ""]
    if summary.get("harness_errors"):
        lines += [f"{summary['harness_errors']} attempts ended with the harness's own exception (its bug, not the "
                  "policy's failure): never scored, their tracebacks in results.jsonl and the trajectories.", "",
                  "| task | attempt | variant | error |", "|---|---|---|---|"]
        for e in summary.get("harness_error_examples", []):
            variant = names[e["variant"]] if e["variant"] < len(names) else "?"
            error = str(e["error"] or "").replace("|", "/")[:200]
            lines.append(f"| {e['task']} | {e['attempt']} | {variant} | {error} |")
    else:
        lines.append("None.")
    if summary.get("grading"):
        modes = ", ".join(f"{n} {mode}" for mode, n in sorted(summary["grading"].items()))
        lines += ["", f"Graded: {modes} (isolated: the attempt's changes applied to a fresh sandbox made from the "
                  "task, and graded there; in-place: in the agent's own sandbox, once its processes were gone"
                  + ("; judge: by the task's judge, on the trajectory and the final screen" if "judge" in
                     summary["grading"] else "") + ")."]
    if summary.get("interrupted_tries"):
        lines += ["", f"{summary['interrupted_tries']} tries were interrupted by a stopped runner and run again "
                  "on resume (their sandboxes deleted)."]
    if plots:
        lines += ["", "## Plots", ""] + [f"![{p}]({p})" for p in plots]
    else:
        lines += ["", "(No plots: matplotlib is not installed.)"]
    return "\n".join(lines) + "\n"
