"""Browser tasks: the task format's fields and their errors, real sites in real sandboxes with a screen driven by
the scripted browser policy, graded in place from the site's own log or by a judge recorded as a grading step,
and ``python -m grove.demo --gui`` itself (on a subset of its tasks: the whole ten take about two minutes)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from grove.demo.gui.tasks import SITES, WORKDIR, site_files, task_line, task_lines
from grove.rollouts import Policy, TaskFileError
from grove.rollouts.browser.layout import Page
from grove.rollouts.browser.policy import Hand
from grove.rollouts.tasks import BROWSER_MEMORY_MB, parse_task
from tests.rollouts.runs import demo_output, results, right_and_wrong, run
from tests.support.router_fixtures import RouterProcess

pytestmark = pytest.mark.local_only  # the browser runs from the local backend's host /usr

BASE = {"id": "t", "prompt": "p", "check": {"test": "true"}}
HERE = Path(__file__).resolve().parent


def _site(name: str) -> Any:
    return next(s for s in SITES if s.name == name)


def _parse(line: dict[str, Any]) -> Any:
    return parse_task(line, "tasks.jsonl, line 3", base=Path("/nonexistent"))


# -- the task format ------------------------------------------------------------------------------------------


@pytest.mark.fast
@pytest.mark.parametrize(("extra", "error"), [
    ({"start_url": "ftp://example.org/"}, "field 'start_url' must be an http(s), file, about or data URL"),
    ({"serve": "python3 server.py"}, "field 'serve' starts the task's site: give 'start_url' too"),
    ({"start_url": "http://127.0.0.1:8000/", "desktop": {"browser": "http://x/"}},
     "field 'desktop.browser' is unknown (the screen opens at 'start_url'); known: width, height"),
    ({"desktop": {"width": "wide"}}, "field 'desktop.width' must be a whole number of pixels or milliseconds"),
    ({"start_url": "http://127.0.0.1:8000/", "resources": {"memory_mb": 512}},
     f"field 'resources.memory_mb' must be at least {BROWSER_MEMORY_MB} for a browser task"),
    ({"check": {"judge": "no_function_here"}}, "field 'check.judge' must name a function as module:function"),
    ({"check": {"judge": "m:f", "test": "true"}}, "field 'check' needs exactly one of 'test' (exit 0 = pass), "
                                                 "'reward' and 'judge'"),
    ({"check": {"judge": "m:f", "grading": "in-place"}}, "field 'check.grading' does not go with 'judge'"),
    ({"check": {"judge": "m:f", "files": {"a": "b"}}}, "field 'check.files' does not go with 'judge'"),
])
def test_browser_fields_are_checked_and_each_error_names_its_field(extra: dict[str, Any], error: str) -> None:
    with pytest.raises(TaskFileError) as caught:
        _parse({**BASE, **extra})
    assert caught.value.message.startswith("tasks.jsonl, line 3: "), caught.value.message
    assert error in caught.value.message, caught.value.message


@pytest.mark.fast
def test_a_browser_task_gets_a_screen_and_the_memory_it_needs() -> None:
    task = _parse({**BASE, "serve": "python3 server.py", "start_url": "http://127.0.0.1:8000/"})
    assert task.serve == "python3 server.py" and task.start_url == "http://127.0.0.1:8000/"
    assert task.desktop == {} and task.resources == {"memory_mb": BROWSER_MEMORY_MB}
    plain = _parse(BASE)
    assert plain.desktop is None and plain.start_url is None and plain.resources == {}
    judged = _parse({**BASE, "check": {"judge": "my_judges:rate", "pass_threshold": 0.5}})
    assert judged.check.judge == "my_judges:rate" and judged.check.test is None and judged.check.grading == "judge"


@pytest.mark.fast
def test_the_demo_ships_ten_valid_browser_tasks_of_graded_difficulty() -> None:
    lines = task_lines()
    tasks = [_parse(line) for line in lines]
    assert len(tasks) == 10 and len({t.id for t in tasks}) == 10
    assert {t.labels["difficulty"] for t in tasks} == {"easy", "medium", "hard"}
    assert all(t.start_url == "http://127.0.0.1:8000/" and t.serve for t in tasks)
    assert sum(t.check.judge is not None for t in tasks) == 1
    assert all(t.check.grading == "in-place" for t in tasks if t.check.judge is None)
    # What the site kit ships, read as package data (so it works from an installed grove too).
    assert {"server.py", "www/kit.js", "www/style.css", "www/index.html"} <= set(site_files("shop"))


# -- real sites, real screens ---------------------------------------------------------------------------------


def judge_final_screen_none(trajectory: dict[str, Any], final_screenshot: bytes | None) -> float:
    """A judge of a task without a screen: the screenshot is None, the trajectory the agent's."""
    assert final_screenshot is None
    return 1.0 if any(s.get("type") == "exec" for s in trajectory["steps"]) else 0.0


def judge_that_raises(trajectory: dict[str, Any], final_screenshot: bytes | None) -> float:
    """A judge whose own code fails: no verdict."""
    raise RuntimeError("the judge's model is down")


@pytest.fixture(scope="module")
def gui_run(router: RouterProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, Any]]]:
    """One rollout run of four browser tasks: the form (its right plan, its wrong plan) graded in place from the
    site's log, and the museum (right and wrong) graded by the demo's judge."""
    root = tmp_path_factory.mktemp("gui")
    tasks = right_and_wrong(root / "tasks.jsonl", lambda name, p: task_line(_site(name), p_solve=p),
                            ("form", "museum"))
    summary = run(router, tasks, root / "run", Policy(attempts=1), concurrency=2)
    yield root / "run", summary


def _record(router: RouterProcess, out: Path, task: str) -> tuple[dict[str, Any], dict[str, Any]]:
    result = next(r for r in results(out) if r["task"] == task)
    with router.client() as grove:
        return result, grove.request("GET", f"/v1/trajectories/{result['trajectory_id']}")


def _phases(record: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """The record's steps by phase: setup, the agent's, grading."""
    phases: dict[str, list[dict[str, Any]]] = {"setup": [], "agent": [], "grading": []}
    phase = "agent"
    for step in record["steps"]:
        if step.get("type") == "event" and step.get("kind") in ("setup", "grading"):
            started = step["data"].get("status") == "started"
            phase = step["kind"] if started else "agent" if step["kind"] == "setup" else "after"
            continue
        phases.setdefault(phase, []).append(step)
    return phases



def test_the_right_plan_passes_and_the_wrong_one_fails_graded_in_place_from_the_sites_log(
        router: RouterProcess, gui_run: tuple[Path, dict[str, Any]]) -> None:
    out, _ = gui_run
    right, record = _record(router, out, "gui-form-right")
    wrong, _ = _record(router, out, "gui-form-wrong")
    assert (right["outcome"], right["reward"], wrong["outcome"], wrong["reward"]) == ("pass", 1.0, "fail", 0.0), \
        (right, wrong)
    assert right["grading"] == wrong["grading"] == "in-place" and right["infra_errors"] == [], right
    assert right["actions"] >= 8 and right["agent_error"] is None, right  # an action per click, per text typed
    phases = _phases(record)
    # The site and its screen are setup: the serve command, the wait for its port, the display opened there.
    assert next(s for s in phases["setup"] if s["type"] == "display")["browser"] == "http://127.0.0.1:8000/"
    acting = [s for s in phases["agent"] if s["type"] == "computer"]
    assert {s["action"] for s in acting} >= {"mouse_move", "left_click", "type", "key"}
    assert all(s["screenshot"]["sha256"] and "error" not in s for s in acting)
    clicks = [s["args"]["coordinate"] for s in acting if s["action"] == "left_click"]
    assert all(87 <= y < 800 for _, y in clicks), clicks  # on the page, below Chromium's toolbar
    assert not any(s["type"] == "exec" for s in phases["agent"])  # it acts through the screen only
    # The check read the site's own log, once the agent had stopped; the record shows what the site wrote.
    changes = next(s for s in phases["grading"] if s.get("kind") == "changes")["data"]
    log = next(f for f in changes["files"] if f["path"] == "data/log.jsonl")
    assert '"kind": "contact"' in log["diff"] and "ada@example.org" in log["diff"]
    finished = next(s for s in record["steps"] if s.get("kind") == "grading" and s["data"]["status"] == "finished")
    assert finished["data"]["mode"] == "in-place" and finished["data"]["result"] == "pass"


def test_a_judge_grades_the_trajectory_and_final_screen_recorded_as_a_grading_step(
        router: RouterProcess, gui_run: tuple[Path, dict[str, Any]]) -> None:
    out, summary = gui_run
    right, record = _record(router, out, "gui-museum-right")
    wrong, _ = _record(router, out, "gui-museum-wrong")
    assert (right["outcome"], wrong["outcome"]) == ("pass", "fail") and right["grading"] == "judge", (right, wrong)
    assert right["check"]["judge"] == "grove.demo.gui.judge:opening_hours"
    assert wrong["check"]["answer"]["answer"] == "On Sundays the museum is open 09:00-17:00."
    grading = _phases(record)["grading"]
    judged = next(s for s in grading if s.get("kind") == "judge")["data"]
    shot = judged["inputs"]["final_screenshot"]
    assert judged["judge"] == "grove.demo.gui.judge:opening_hours" and judged["result"] == "pass"
    assert judged["answer"]["reward"] == 1.0 and "10:00-16:00" in judged["answer"]["answer"]
    assert judged["inputs"]["trajectory_steps"] > judged["inputs"]["screen_actions"] >= 2
    # The final screen is itself a (grading) step, its image stored and served by its hash.
    final = [s for s in grading if s["type"] == "computer" and s["action"] == "screenshot"]
    assert [s["screenshot"]["sha256"] for s in final] == [shot["sha256"]]
    png = router.http("GET", f"/v1/screenshots/{shot['sha256']}")
    assert png.status == 200 and png.body.startswith(b"\x89PNG")
    assert "judge: by the task's judge" in (out / "report.md").read_text()
    assert summary["grading"] == {"in-place": 2, "judge": 2}, results(out)


def test_a_judge_without_a_screen_and_a_judge_that_fails(router: RouterProcess, tmp_path: Path) -> None:
    module = "tests.rollouts.test_gui_tasks"
    lines = [{"id": "judged", "prompt": "say hi", "check": {"judge": f"{module}:judge_final_screen_none"},
              "scripted": {"inspect": ["echo hi"]}, "resources": {"memory_mb": 128}},
             {"id": "broken", "prompt": "say hi", "check": {"judge": f"{module}:judge_that_raises"},
              "scripted": {"inspect": ["echo hi"]}, "resources": {"memory_mb": 128}}]
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(line) + "\n" for line in lines))
    run(router, tasks, tmp_path / "run", Policy(attempts=1), concurrency=2, max_infra_retries=0)
    by_task = {r["task"]: r for r in results(tmp_path / "run")}
    assert by_task["judged"]["outcome"] == "pass" and by_task["judged"]["check"]["final_screenshot"] is None
    # A judge that raises gave no verdict: an infrastructure fault, never scored.
    assert by_task["broken"]["outcome"] == "infra_error" and by_task["broken"]["infra_errors"] == ["check_broken"]

    lines[0]["check"] = {"judge": "no_such_module_here:rate"}
    tasks.write_text(json.dumps(lines[0]) + "\n")
    with pytest.raises(TaskFileError) as caught:
        run(router, tasks, tmp_path / "run2", Policy(attempts=1))
    assert "task judged: field 'check.judge': judge 'no_such_module_here:rate': cannot import" in caught.value.message


def test_a_click_on_a_button_changes_the_page_seen_in_the_next_screenshot_and_in_the_sites_state(
        router: RouterProcess) -> None:
    with router.client() as grove:
        sandbox = grove.create(heartbeat=False, memory_mb=BROWSER_MEMORY_MB, desktop={"width": 1280, "height": 800})
        try:
            for path, text in site_files("scroll").items():
                sandbox.write_file(f"{WORKDIR}/{path}", text)
            sandbox.exec(["/bin/sh", "-c", "setsid python3 server.py >/tmp/serve.log 2>&1 </dev/null &"], cwd=WORKDIR)
            sandbox.exec("python3 -c 'import socket,time\nfor _ in range(100):\n  try: socket.create_connection("
                         "(\"127.0.0.1\", 8000)); break\n  except OSError: time.sleep(0.1)'")
            sandbox.computer.start(browser="http://127.0.0.1:8000/")
            hand = Hand(sandbox, Page(sandbox), think_s=0.0)
            hand.calibrate()
            before = sandbox.computer.screenshot()
            layout = hand.click("#decline")
            after = sandbox.computer.screenshot()
            assert after.sha256 != before.sha256  # the page changed, in the very next screenshot
            status = layout.find("#status")
            assert status is not None and status["text"] == "Declined."
            log = [json.loads(x) for x in sandbox.read_file(f"{WORKDIR}/data/log.jsonl").decode().splitlines()]
            assert [e["accepted"] for e in log if e["kind"] == "terms"] == [False]  # and in the site's own state
        finally:
            sandbox.close()


def test_the_gui_demo_runs_bar_end_to_end_and_says_where_to_look() -> None:
    out = demo_output("--gui", "--tasks", "3")
    assert "This proves the plumbing, not a model's skill" in out
    assert "3 offline web tasks" in out and "NOT AS THE POLICY PLAYED IT" not in out
    assert "sandboxes left behind: 0" in out and "Infrastructure faults\n\nNone." in out, out[-4000:]
    for task in ("gui-links", "gui-scroll", "gui-form"):
        assert f"| {task} | " in out
    assert "where to look: the run at http://127.0.0.1:8471/ui/runs/" in out
