"""What a rollout run cost, through a real router: each attempt's result carries its sandboxes' cost (the agent's
and its isolated grader's, as the router recorded them), and the summary and report add it up per variant, in
all and per project."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from grove.core.cost import FIELDS
from grove.rollouts import Policy
from tests.rollouts.runs import results, run, write_tasks
from tests.support.router_fixtures import RouterProcess


def added(costs: list[dict[str, Any]]) -> dict[str, float]:
    """The costs summed figure by figure (the peak: the largest), as the test reads the contract."""
    return {k: max(c[k] for c in costs) if k == "memory_peak_mb" else sum(c[k] for c in costs) for k in FIELDS}


def test_results_carry_each_attempts_cost_and_the_report_adds_it_up(router: RouterProcess, tmp_path: Path) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", ("easy", "impossible"), prefix="cost")
    out = tmp_path / "run"
    summary = run(router, tasks, out, Policy(attempts=2), concurrency=4)
    lines = results(out)
    assert len(lines) == 4 and {r["outcome"] for r in lines} <= {"pass", "fail"}

    with router.client() as grove:
        for r in lines:
            # The fields that were there before keep their meaning.
            assert r["sandbox_s"] > 0 and r["cpu_s"] is not None, r
            # Two sandboxes: the agent's, and the grader its changes were applied to.
            record = grove.request("GET", f"/v1/trajectories/{r['sandbox_id']}")
            [grader] = [s["data"]["grader"] for s in record["steps"] if s.get("kind") == "changes"]
            agent_info = grove.request("GET", f"/v1/sandboxes/{r['sandbox_id']}")
            grader_info = grove.request("GET", f"/v1/sandboxes/{grader}")
            assert agent_info["status"] == grader_info["status"] == "deleted"
            assert record["cost"] == agent_info["cost"]
            assert r["cost_sandboxes"] == 2 and "cost_unknown" not in r, r
            assert r["project"] == agent_info["project"] == "default"
            assert r["cost"] == pytest.approx(added([agent_info["cost"], grader_info["cost"]]), abs=0.002), r
            cost = r["cost"]
            assert cost["cpu_s"] > 0 and cost["running_s"] > 0 and cost["memory_peak_mb"] > 0, cost
            assert cost["memory_gb_s"] == pytest.approx(128 / 1024 * cost["running_s"], abs=0.005)
            assert cost["s3_bytes"] > 0 and cost["disk_bytes"] > 0, cost

    whole = added([r["cost"] for r in lines])
    for where in (summary["cost"], summary["variants"][0]["cost"], summary["cost_by_project"]["default"]):
        assert where["total"] == pytest.approx(whole, abs=0.01), where
        assert where["sandboxes"] == 8 and where["unknown"] == 0 and where["attempts_without"] == 0, where
    assert list(summary["cost_by_project"]) == ["default"]
    assert json.loads((out / "summary.json").read_text())["cost"] == summary["cost"]

    report = (out / "report.md").read_text()
    section = report.split("## Cost", 1)[1].split("\n## ", 1)[0]
    cpu_row = next(line for line in section.splitlines() if line.startswith("| CPU-seconds |"))
    assert cpu_row == f"| CPU-seconds | {whole['cpu_s']:.1f} | {whole['cpu_s']:.1f} |", cpu_row
    assert f"| default | {whole['cpu_s']:.1f} |" in section
    assert "Memory reserved: each sandbox's memory limit in GiB times the seconds it ran" in section
