"""Task services and the assistant demo: the ``services`` field and its errors; the office service started before
the agent acts (in a sibling sandbox on a private network with the agent's, or beside the agent), called over HTTP
by name by the scripted assistant policy from inside the agent's sandbox, spared when the agent's processes are
ended, and queried by the check for its final state; siblings deleted with the attempt, leaving no private network
behind; a service that never gets ready is the task's infrastructure fault; and ``python -m grove.demo
--assistant`` itself (on a subset of its tasks)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from grove.demo.assistant.tasks import CHORES, SEED, task_line, task_lines
from grove.rollouts import Policy, TaskFileError
from grove.rollouts.tasks import parse_task
from tests.conftest import free_tcp_port
from tests.rollouts.runs import demo_output, results, right_and_wrong, run
from tests.support.router_fixtures import RouterProcess, private_hubs

pytestmark = pytest.mark.local_only  # services run beside the agent through the executor; curl is the host's /usr

OFFICE = {"name": "office", "command": "python3 server.py", "port": 8025, "ready": {"http": "/health"},
          "in_agent_sandbox": True}
BASE = {"id": "t", "prompt": "p", "check": {"test": "true", "grading": "in-place"}}


def _parse(line: dict[str, Any]) -> Any:
    return parse_task(line, "tasks.jsonl, line 3", base=Path("/nonexistent"))


def _chore(name: str) -> Any:
    return next(c for c in CHORES if c.name == name)


@pytest.mark.fast
@pytest.mark.parametrize(("services", "error"), [
    ({"name": "office"}, "field 'services' must be a list of {name, command, port, ready: {http: PATH}}"),
    ([{**OFFICE, "name": "Office_1"}], "field 'services[0].name' must be a host name"),
    ([OFFICE, OFFICE], "field 'services[1].name' 'office' is taken"),
    ([{**OFFICE, "port": 70000}], "field 'services[0].port' must be a port number (1-65535), got 70000"),
    ([{**OFFICE, "ready": {"tcp": 8025}}], "field 'services[0].ready' must be {\"http\": PATH}"),
    ([{**OFFICE, "restart": True}], "field 'services[0].restart' is unknown; known: command, cwd, env"),
    ([{k: v for k, v in OFFICE.items() if k != "command"}], "field 'services[0].command'"),
    ([{**OFFICE, "in_agent_sandbox": "no"}], "field 'services[0].in_agent_sandbox' must be true or false"),
    ([{**OFFICE, "image": "debian"}], "field 'services[0].image' goes with a sibling sandbox"),
])
def test_the_services_field_is_checked_and_each_error_names_its_entry(services: Any, error: str) -> None:
    with pytest.raises(TaskFileError) as caught:
        _parse({**BASE, "services": services})
    assert caught.value.message.startswith("tasks.jsonl, line 3: "), caught.value.message
    assert error in caught.value.message, caught.value.message


@pytest.mark.fast
def test_a_task_with_services_is_graded_where_they_run() -> None:
    with pytest.raises(TaskFileError, match=re.escape('field \'check.grading\' must be "in-place"')):
        _parse({**BASE, "check": {"test": "true"}, "services": [OFFICE]})
    task = _parse({**BASE, "services": [{**OFFICE, "ready": {"http": "/health", "timeout_s": 5}}]})
    [office] = task.services
    assert (office.name, office.port, office.ready_http, office.ready_s, office.in_agent_sandbox) == \
        ("office", 8025, "/health", 5.0, True)
    sibling = {k: v for k, v in OFFICE.items() if k != "in_agent_sandbox"}
    [office] = _parse({**BASE, "services": [{**sibling, "image": "python:3.11-slim"}]}).services
    assert (office.in_agent_sandbox, office.image) == (False, "python:3.11-slim")  # the default: a sibling


@pytest.mark.fast
def test_the_demo_ships_ten_valid_assistant_tasks_of_graded_difficulty() -> None:
    tasks = [_parse(line) for line in task_lines()]
    assert len(tasks) == 10 and len({t.id for t in tasks}) == 10
    assert {t.labels["difficulty"] for t in tasks} == {"easy", "medium", "hard"}
    assert all(t.check.grading == "in-place" and [s.name for s in t.services] == ["office"] for t in tasks)
    assert all(t.scripted and t.scripted["calls"] for t in tasks)
    assert json.loads(task_lines(["groceries"])[0]["files"]["/srv/office/seed.json"]) == SEED


@pytest.mark.fast
def test_the_office_service_refuses_bad_requests_by_name_and_its_check_says_what_is_missing(
        tmp_path: Path) -> None:
    office = Path(__file__).resolve().parents[2] / "grove" / "demo" / "assistant" / "office"
    seed = tmp_path / "seed.json"
    seed.write_text(json.dumps(SEED))
    port = free_tcp_port()
    server = subprocess.Popen([sys.executable, str(office / "server.py"), "--port", str(port), "--seed", str(seed)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert server.stdout is not None and b"serving" in server.stdout.readline()
        url = f"http://127.0.0.1:{port}"
        for method, path, body, status, message in (
                ("POST", "/mail/send", {"to": "ada@example.org"}, 400, "missing field(s): subject, body"),
                ("POST", "/mail/send", {"to": "ada", "subject": "s", "body": "b"}, 400, "must be an email address"),
                ("PATCH", "/calendar/events/e2", {"start": "16:00", "end": "15:00"}, 400, "must end after it starts"),
                ("POST", "/calendar/events", {"title": "t", "date": "tomorrow", "start": "09:00", "end": "10:00"},
                 400, "'date' must be YYYY-MM-DD"),
                ("DELETE", "/calendar/events/e9", None, 404, "no event with id 'e9'"),
                ("PATCH", "/notes/n1", {"colour": "red"}, 400, "unknown field(s): colour")):
            answer = _http(method, url + path, body)
            assert answer[0] == status and message in answer[1]["error"]["message"], (path, answer)
        assert _http("POST", url + "/mail/messages/m2/archive", None)[0] == 200
        state = _http("GET", url + "/state", None)[1]
        assert [m["id"] for m in state["archived"]] == ["m2"] and state["events"] == SEED["events"]
        checker = subprocess.run([sys.executable, str(office / "check.py"), url + "/state", "-"], input=json.dumps(
            _chore("archive-news").expect), capture_output=True, text=True, timeout=60, check=False)
    finally:
        server.kill()
        server.wait()
        assert server.stdout is not None
        server.stdout.close()
    assert checker.returncode == 1
    assert "FAIL archived: wanted exactly 2 matching" in checker.stdout and "FAIL inbox" in checker.stdout


def _http(method: str, url: str, body: Any) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_the_right_plan_passes_and_the_wrong_one_fails_graded_by_the_services_final_state(
        router: RouterProcess, tmp_path: Path) -> None:
    tasks = right_and_wrong(tmp_path / "tasks.jsonl", lambda name, p: task_line(_chore(name), p_solve=p),
                            ("alan-sync", "archive-news"))
    beside = {**task_line(_chore("alan-sync"), p_solve=1.0, in_agent_sandbox=True), "id": "assistant-beside"}
    tasks.write_text(tasks.read_text() + json.dumps(beside) + "\n")
    run(router, tasks, tmp_path / "run", Policy(attempts=1), concurrency=2, max_infra_retries=0)
    by_task = {r["task"]: r for r in results(tmp_path / "run")}
    for name in ("alan-sync", "archive-news"):
        right, wrong = by_task[f"assistant-{name}-right"], by_task[f"assistant-{name}-wrong"]
        assert (right["outcome"], wrong["outcome"]) == ("pass", "fail"), (right, wrong)
        assert right["grading"] == "in-place" and right["infra_errors"] == [], right
    assert by_task["assistant-beside"]["outcome"] == "pass", by_task["assistant-beside"]
    # The check queried the service after the agent's processes were ended: what it printed names the state it read.
    said = {name: _check_output(router, by_task[name]) for name in by_task}
    assert said["assistant-alan-sync-right"].strip().endswith("PASS")
    assert said["assistant-beside"].strip().endswith("PASS")
    assert "FAIL events: wanted exactly 1 matching" in said["assistant-alan-sync-wrong"]
    assert "FAIL sent" not in said["assistant-alan-sync-wrong"]  # the reply was sent: only the date was wrong
    assert "FAIL archived: wanted exactly 2" in said["assistant-archive-news-wrong"]

    # A sibling: its own sandbox on the try's private network, linked to the attempt by labels, its process there.
    agent = _trajectory(router, by_task["assistant-alan-sync-right"]["trajectory_id"])
    office = _office_of(agent)
    assert office["url"] == "http://office:8025/" and not office["in_agent_sandbox"]
    assert office["address"].startswith("10.232.0.") and office["sandbox_id"] != agent["sandbox"]["id"]
    assert agent["sandbox"]["labels"]["service_sandboxes"] == office["sandbox_id"]
    sibling = _trajectory(router, office["sandbox_id"])
    assert sibling["sandbox"]["labels"]["role"] == "service" and sibling["sandbox"]["labels"]["service"] == "office"
    for label in ("run_id", "group_id", "attempt", "try"):
        assert sibling["sandbox"]["labels"][label] == agent["sandbox"]["labels"][label]
    assert _process_starts(agent) == []  # nothing of the service runs in the agent's sandbox
    assert [s["pid"] for s in _process_starts(sibling)] == [office["pid"]]
    calls = [s for s in agent["steps"] if s["type"] == "exec" and "curl" in _text(s["command"])]
    assert len(calls) == 4, [s["command"] for s in calls]  # the agent's four tool calls, each an exec step
    assert agent["steps"].index(_setup_done(agent)) < agent["steps"].index(calls[0])  # up before the agent acted

    # Beside the agent: the service is a process of the agent's own sandbox.
    beside_record = _trajectory(router, by_task["assistant-beside"]["trajectory_id"])
    office = _office_of(beside_record)
    assert office["in_agent_sandbox"] and "sandbox_id" not in office
    started = _process_starts(beside_record)
    assert [s["pid"] for s in started] == [office["pid"]] and "server.py" in started[0]["command"][-1]

    # Nothing is left: no sandbox (siblings included) and no private network.
    assert router.live_ids() == set() and private_hubs(router.state_dir) == []


def _trajectory(router: RouterProcess, sandbox_id: str) -> dict[str, Any]:
    with router.client() as grove:
        record: dict[str, Any] = grove.request("GET", f"/v1/trajectories/{sandbox_id}")
    return record


def _setup_done(record: dict[str, Any]) -> dict[str, Any]:
    return next(s for s in record["steps"] if s.get("kind") == "setup" and s["data"]["status"] == "finished")


def _office_of(record: dict[str, Any]) -> dict[str, Any]:
    [office] = _setup_done(record)["data"]["services"]
    assert office["name"] == "office"
    return dict(office)


def _process_starts(record: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in record["steps"] if s["type"] == "process" and s["event"] == "start"]


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return " ".join(value) if isinstance(value, list) else str(value)


def _check_output(router: RouterProcess, result: dict[str, Any]) -> str:
    """What the check printed: its exec step in the agent's trajectory (an in-place check runs there)."""
    with router.client() as grove:
        record = grove.request("GET", f"/v1/trajectories/{result['trajectory_id']}")
    [check] = [s for s in record["steps"] if s["type"] == "exec" and "/grader/check.py" in _text(s["command"])]
    return _text(check["stdout"])


def test_a_service_that_never_becomes_ready_is_an_infrastructure_fault(router: RouterProcess, tmp_path: Path) -> None:
    silent = {**OFFICE, "command": "exec sleep 300", "ready": {"http": "/health", "timeout_s": 2}}
    dying = {**OFFICE, "name": "crashy", "port": 8026, "command": "echo 'cannot open the database' >&2; exit 4"}
    sibling = {k: v for k, v in {**dying, "name": "sibling"}.items() if k != "in_agent_sandbox"}
    lines = [{**BASE, "id": name, "services": services, "scripted": {"inspect": ["true"]},
              "resources": {"memory_mb": 128}}
             for name, services in (("silent", [silent]), ("dying", [dying]), ("sibling", [sibling]))]
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(line) + "\n" for line in lines))
    run(router, tasks, tmp_path / "run", Policy(attempts=1), concurrency=2, max_infra_retries=0)
    by_task = {r["task"]: r for r in results(tmp_path / "run")}
    for name in ("silent", "dying", "sibling"):
        assert by_task[name]["outcome"] == "infra_error" and by_task[name]["infra_errors"] == ["service_not_ready"]
    journal = (tmp_path / "run" / "journal.jsonl").read_text()
    assert "service 'office' did not answer GET http://127.0.0.1:8025/health below 400 within 2s" in journal
    assert "service 'crashy' exited with code 4 before it answered" in journal
    assert "service 'sibling' exited with code 4 before it answered" in journal
    assert "cannot open the database" in journal
    # The sibling that never got ready was deleted with its try; no private network is left either.
    assert router.live_ids() == set() and private_hubs(router.state_dir) == []


def test_the_assistant_demo_runs_bar_end_to_end() -> None:
    out = demo_output("--assistant", "--tasks", "3")
    assert "3 offline assistant tasks" in out and "This proves the plumbing, not a model's skill" in out
    assert "NOT AS THE POLICY PLAYED IT" not in out
    assert "sandboxes left behind: 0" in out and "Infrastructure faults\n\nNone." in out, out[-4000:]
    for task in ("assistant-reply-ada", "assistant-standup", "assistant-cancel-dentist"):
        assert f"| {task} | " in out
