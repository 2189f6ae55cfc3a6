"""The Markdown report of a run (``report.md``), from its summary."""

from __future__ import annotations

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
                  "task, and graded there; in-place: in the agent's own sandbox, once its processes were gone)."]
    if summary.get("interrupted_tries"):
        lines += ["", f"{summary['interrupted_tries']} tries were interrupted by a stopped runner and run again "
                  "on resume (their sandboxes deleted)."]
    if plots:
        lines += ["", "## Plots", ""] + [f"![{p}]({p})" for p in plots]
    else:
        lines += ["", "(No plots: matplotlib is not installed.)"]
    return "\n".join(lines) + "\n"
