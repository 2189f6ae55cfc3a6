"""Issue 29, medium 3: non-finite numbers. NaN and Infinity are refused at the door, never crash a run.

Before the fix a reward command printing ``nan`` or ``inf`` crashed ``rollouts run`` and ``rollouts report``
(``statistics.pstdev`` on a NaN) with no summary written for any task, and ``POST .../events`` took a NaN
reward and answered it back as invalid JSON (``NaN``), which broke the viewer's trajectory list for every
user. Now: a 422 naming the field (JSON and msgpack alike), a reward of NaN is the attempt's ``fail`` with its
reason, and what grove sends is always valid JSON.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from grove.client import Grove
from grove.rollouts import Policy
from grove.rollouts.journal import Journal
from grove.rollouts.report import FILES
from tests.rollouts.runs import results, run
from tests.support.router_fixtures import RouterProcess, error_of


def _strict(body: bytes) -> Any:
    """Parse as JSON that has no NaN or Infinity (what a browser's JSON.parse accepts)."""
    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    return json.loads(body, parse_constant=refuse)


def test_events_with_nan_or_infinity_are_refused_naming_the_field(router: RouterProcess, grove: Grove) -> None:
    sb = grove.create()
    path = f"/v1/sandboxes/{sb.id}/events"
    raw = b'{"events": [{"kind": "note", "data": {"ok": 1}}, {"kind": "reward", "data": {"reward": NaN}}]}'
    reply = router.http("POST", path, raw, headers={"Content-Type": "application/json"})
    assert reply.status == 422, reply.body
    assert "events[1].data.reward" in error_of(reply)["message"] and "NaN" in error_of(reply)["message"]
    reply = router.http("POST", path, msgpack_body={"events": [{"kind": "reward", "data": {"r": [1.0, math.inf]}}]})
    assert reply.status == 422 and "events[0].data.r[1]" in error_of(reply)["message"], reply.body
    reply = router.http("POST", "/v1/sandboxes", b'{"cpu": Infinity}', headers={"Content-Type": "application/json"})
    assert reply.status == 422 and "cpu" in error_of(reply)["message"], reply.body
    reply = router.http("POST", "/v1/sandboxes", msgpack_body={"cpu": -math.inf})
    assert reply.status == 422 and "'cpu'" in error_of(reply)["message"], reply.body
    # Nothing of the refused calls reached the record, and every answer is JSON a browser parses.
    sb.post_event("reward", {"reward": 0.5})
    record = _strict(router.http("GET", f"/v1/sandboxes/{sb.id}/trajectory").body)
    kinds = [step.get("kind") for step in record["steps"]]
    assert kinds.count("reward") == 1 and "note" not in kinds, kinds
    sb.close()
    _strict(router.http("GET", "/v1/trajectories").body)


def test_a_reward_of_nan_or_inf_is_a_fail_with_its_reason(router: RouterProcess, tmp_path: Path) -> None:
    base = {"prompt": "p", "workdir": "/workspace", "resources": {"cpu": 0.5, "memory_mb": 128}}
    lines = [{**base, "id": "nan", "check": {"reward": "echo nan"}},
             {**base, "id": "inf", "check": {"reward": "echo -inf"}},
             {**base, "id": "good", "check": {"reward": "echo 1"}}]
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "run"
    summary = run(router, tasks, out, Policy(attempts=2), concurrency=3)
    assert all((out / name).exists() for name in FILES)
    by_task: dict[str, list[dict[str, Any]]] = {}
    for r in results(out):
        by_task.setdefault(r["task"], []).append(r)
    for task, printed in (("nan", "nan"), ("inf", "-inf")):
        for r in by_task[task]:
            assert (r["outcome"], r["reward"]) == ("fail", 0.0), r
            assert printed in r["check"]["reason"] and "finite" in r["check"]["reason"], r
    assert [r["outcome"] for r in by_task["good"]] == ["pass", "pass"]
    assert summary["variants"][0]["pass_at_k"]["1"] == round(1 / 3, 4)
    for line in (out / "results.jsonl").read_text().splitlines():
        _strict(line.encode())

    # A journal written before the fix may hold a NaN reward: the report takes it as a fail, and does not crash.
    done = [json.loads(x) for x in (out / "journal.jsonl").read_text().splitlines() if '"e":"done"' in x]
    good = next(e for e in done if e["task"] == "good")
    journal = Journal(out)
    journal.write({**good, "result": {**good["result"], "reward": float("nan")}})
    journal.close()
    report = router.cli("rollouts", "report", str(out))
    assert report.returncode == 0, report.stderr.decode()
    rewritten = {(r["task"], r["attempt"]): r for r in results(out)}
    assert rewritten[("good", good["attempt"])]["outcome"] == "fail"
