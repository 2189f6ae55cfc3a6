"""A run's results files: ``results.jsonl``, ``groups.jsonl`` (for trainers), ``summary.json``, ``report.md``.

Everything is computed from the journal, so ``grove rollouts report DIR`` rebuilds the same files from
a run directory at any time (a finished run, or one still going). Attempts lost to infrastructure faults
and attempts whose harness raised are never scored: they count in their own tables, not in pass@k or in any
group's rewards.
"""

from __future__ import annotations

import json
import os
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from grove.rollouts import costs
from grove.rollouts.estimates import estimate, groups_from_results, policy_of
from grove.rollouts.journal import RUN_FILE, UNSCORED, read_journal
from grove.rollouts.metrics import advantages, informative

FILES = ("results.jsonl", "groups.jsonl", "summary.json", "report.md")


def load_results(out: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The run's ``run.json`` and its finished attempts, in a stable order."""
    run = json.loads((out / RUN_FILE).read_text())
    state = read_journal(out)
    results = sorted(state.done.values(), key=lambda r: (r["variant"], r["task"], r["attempt"]))
    run["interrupted_tries"] = state.interrupted
    run["throttled_creates"] = state.throttled
    run["unreachable_creates"] = state.unreachable
    return run, results


def groups_of(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each group with its scored rewards and group-relative advantages (what a trainer consumes)."""
    by_group: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in results:
        by_group[r["group_id"]].append(r)
    groups = []
    for gid, members in by_group.items():
        scored = [m for m in members if m["outcome"] not in UNSCORED]
        rewards = [float(m["reward"]) for m in scored]
        first = members[0]
        groups.append({
            "run_id": first["run_id"], "group_id": gid, "task": first["task"], "variant": first["variant"],
            "harness": first["harness"], "harness_version": first["harness_version"], "model": first["model"],
            "informative": informative(rewards),
            "lost_attempts": sum(m["outcome"] == "infra_error" for m in members),
            "harness_errors": sum(m["outcome"] == "harness_error" for m in members),
            "attempts": [{"attempt": m["attempt"], "reward": float(m["reward"]), "advantage": round(a, 6),
                          "trajectory_id": m.get("trajectory_id")}
                         for m, a in zip(scored, advantages(rewards), strict=True)],
        })
    return groups


def summarize(run: dict[str, Any], results: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's figures, per variant and per task."""
    groups = groups_of(results)
    variants: dict[int, dict[str, Any]] = {}
    for v, (harness, model) in enumerate(run["spec"]["variants"]):
        mine = [r for r in results if r["variant"] == v]
        scored = [r for r in mine if r["outcome"] not in UNSCORED]
        resolved = mine[0] if mine else {}  # the model a harness chose when none was given, and its version
        variants[v] = {
            "harness": harness, "model": resolved.get("model", model),
            "harness_version": resolved.get("harness_version"), "attempts": len(mine), "scored": len(scored),
            "harness_errors": sum(r["outcome"] == "harness_error" for r in mine),
            "passed": sum(r["outcome"] == "pass" for r in scored),
            # pass_at_k and its intervals, groups, estimator and gaps (see grove/rollouts/estimates.py).
            **estimate(groups_from_results(mine), policy_of(run["spec"])).as_summary(),
            "groups": sum(g["variant"] == v for g in groups),
            "informative_groups": sum(g["variant"] == v and g["informative"] for g in groups),
            "mean_reward": _round(sum(float(r["reward"]) for r in scored) / len(scored)) if scored else None,
            "cost": costs.summarize(mine),
        }
    faults = Counter(reason for r in results for reason in r.get("infra_errors") or [])
    tries = sum(int(r.get("tries") or 1) for r in results)
    informative_groups = sum(g["informative"] for g in groups)
    return {
        "run_id": run["run_id"], "attempts": len(results), "tries": tries,
        "lost_attempts": sum(r["outcome"] == "infra_error" for r in results),
        "interrupted_tries": run.get("interrupted_tries", 0),
        "throttled_creates": run.get("throttled_creates", 0),
        "unreachable_creates": run.get("unreachable_creates", 0),
        "harness_errors": sum(r["outcome"] == "harness_error" for r in results),
        "harness_error_examples": [{"task": r["task"], "attempt": r["attempt"], "variant": r["variant"],
                                    "error": (r.get("harness_error") or {}).get("error")}
                                   for r in results if r["outcome"] == "harness_error"][:10],
        "grading": dict(Counter(str(r["grading"]) for r in results if r.get("grading"))),
        "groups": len(groups), "informative_groups": informative_groups,
        "informative_per_100_attempts": _round(100 * informative_groups / len(results)) if results else None,
        "infra_faults": dict(faults), "infra_fault_rate": _round(sum(faults.values()) / tries) if tries else None,
        "sandbox_seconds": round(sum(float(r.get("sandbox_s") or 0) for r in results), 1),
        "cpu_seconds": round(sum(float(r.get("cpu_s") or 0) for r in results), 1),
        # What the router measured of every attempt's sandboxes (grove/rollouts/costs.py), in all and per project.
        "cost": costs.summarize(results),
        "cost_by_project": costs.by_project(results),
        "variants": list(variants.values()),
        "tasks": _per_task(results, len(variants)),
    }


def _per_task(results: list[dict[str, Any]], n_variants: int) -> dict[str, list[str]]:
    """task → per variant ``passes/scored`` (and ``+L lost``)."""
    table: dict[str, list[str]] = {}
    for task in sorted({r["task"] for r in results}):
        row = []
        for v in range(n_variants):
            mine = [r for r in results if r["task"] == task and r["variant"] == v]
            scored = [r for r in mine if r["outcome"] not in UNSCORED]
            lost = sum(r["outcome"] == "infra_error" for r in mine)
            broken = sum(r["outcome"] == "harness_error" for r in mine)
            passes = sum(r["outcome"] == "pass" for r in scored)
            row.append(f"{passes}/{len(scored)}" + (f" +{lost} lost" if lost else "")
                       + (f" +{broken} harness errors" if broken else ""))
        table[task] = row
    return table


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def write_reports(out: Path) -> dict[str, Any]:
    """(Re)write every results file of the run directory; returns the summary."""
    from grove.rollouts.markdown import render

    run, results = load_results(out)
    summary = summarize(run, results)
    _atomic(out / "results.jsonl", "".join(json.dumps(r) + "\n" for r in results))
    _atomic(out / "groups.jsonl", "".join(json.dumps(g) + "\n" for g in groups_of(results)))
    _atomic(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    plots: list[str] = []
    try:
        from grove.rollouts.plots import draw

        plots = draw(out, summary, results)
    except ImportError:
        pass  # matplotlib is optional at run time: the report says the plots were skipped
    _atomic(out / "report.md", render(summary, plots))
    return summary


def _atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
