"""Replay against a real router, real sandboxes and S3: every trajectory of a demo run replays with its steps
matching; a record edited behind grove's back is reported at the step that differs; an image gone or changed is a
409; lineage on the replayed sandbox's own trajectory."""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import pytest

from artifacts.archive import TrajectoryArchive
from artifacts.replay import normalize
from artifacts.store import ObjectStore
from grove.client import Sandbox
from grove.demo.mini import run_one
from grove.demo.tasks import make_tasks, task_lines
from grove.rollouts import Policy, TaskFileError, load_tasks
from grove.statedir import StateDir
from tests.rollouts.runs import results, run
from tests.support.executor_fixtures import Reply
from tests.support.imagetools import make_busybox_rootfs
from tests.support.router_fixtures import RouterProcess
from tests.ui.conftest import s3_config

pytestmark = pytest.mark.embedded_s3  # the edited record goes into the router's own bucket


@pytest.fixture(scope="module")
def demo_run(router: RouterProcess, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    """The demo's five tasks (easy to impossible), two attempts each, through the scripted agent."""
    tasks = tmp_path_factory.mktemp("demo") / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(line) + "\n" for line in task_lines(5)))
    out = tasks.parent / "run"
    run(router, tasks, out, Policy(attempts=2), concurrency=4)
    return tasks, results(out)


def replay(router: RouterProcess, sandbox_id: str, **body: Any) -> Reply:
    return router.http("POST", f"/v1/trajectories/{sandbox_id}/replay", json_body=body)


def test_every_demo_trajectory_replays_with_every_step_matching(
        router: RouterProcess, demo_run: tuple[Path, list[dict[str, Any]]]) -> None:
    _, lines = demo_run
    assert len(lines) == 10 and {r["outcome"] for r in lines} == {"pass", "fail"}
    for line in lines:
        reply = replay(router, line["trajectory_id"], env={"PYTHONDONTWRITEBYTECODE": "1"}, keep=False)
        assert reply.status == 200, reply.body
        report = reply.json()
        assert report["total"] == report["matched"] and report["first_mismatch"] is None, report["steps"]
        kinds = [s["type"] for s in report["steps"]]
        # Setup's two files, three inspections, the read, the edit, the check again; no grading step.
        assert kinds.count("exec") == 4 and kinds.count("file_write") == 3 and kinds.count("file_read") == 1, kinds
        assert report["volatile"] == [] and report["kept"] is False
    assert router.live_ids() == set()


def test_a_record_edited_behind_groves_back_is_reported_at_the_step_that_differs(
        router: RouterProcess, demo_run: tuple[Path, list[dict[str, Any]]]) -> None:
    _, lines = demo_run
    with router.client() as grove:
        record = grove.request("GET", f"/v1/trajectories/{lines[0]['trajectory_id']}")
    steps = record["steps"]
    # The stored output of `cat <module>` altered: the re-run prints the real file.
    cat = next(i for i, s in enumerate(steps) if s["type"] == "exec" and str(s["command"]).startswith("cat "))
    edited = dict(record, steps=[dict(s) for s in steps])
    edited["steps"][cat]["stdout"] = b"def add(a, b):\n    return 42\n"
    edited["sandbox"] = dict(record["sandbox"], id=f"sb-{secrets.token_hex(8)}")
    store(router, edited)
    report = replay(router, edited["sandbox"]["id"], env={"PYTHONDONTWRITEBYTECODE": "1"}, keep=False).json()
    assert report["first_mismatch"] == cat and report["matched"] == report["total"] - 1
    bad = next(s for s in report["steps"] if s["index"] == cat)
    assert bad["differs"] == ["stdout"] and bad["exit_code"] == bad["recorded_exit_code"] == 0

    # A stored file write whose content was swapped: the write's hash no longer matches, and what ran after differs.
    write = next(i for i, s in enumerate(steps) if s["type"] == "file_write" and i > cat)
    swapped = dict(record, steps=[dict(s) for s in steps])
    swapped["steps"][write]["content"] = "def add(a, b):\n    return 0\n"
    swapped["sandbox"] = dict(record["sandbox"], id=f"sb-{secrets.token_hex(8)}")
    store(router, swapped)
    report = replay(router, swapped["sandbox"]["id"], env={"PYTHONDONTWRITEBYTECODE": "1"}, keep=False).json()
    assert report["first_mismatch"] == write, report["steps"]
    assert "edited" in next(s for s in report["steps"] if s["index"] == write)["reason"]

    # A command's cwd edited to one that is not there: the executor refuses it now; the replay says so and goes on.
    moved = dict(record, steps=[dict(s) for s in steps])
    moved["steps"][cat]["cwd"] = "/no/such/dir"
    moved["sandbox"] = dict(record["sandbox"], id=f"sb-{secrets.token_hex(8)}")
    store(router, moved)
    report = replay(router, moved["sandbox"]["id"], env={"PYTHONDONTWRITEBYTECODE": "1"}, keep=False).json()
    refused = next(s for s in report["steps"] if s["index"] == cat)
    assert report["first_mismatch"] == cat and "refused" in refused["reason"] and refused["exit_code"] is None
    assert report["matched"] == report["total"] - 1


def test_until_keeps_the_state_after_that_step_with_replay_lineage(
        router: RouterProcess, demo_run: tuple[Path, list[dict[str, Any]]]) -> None:
    _, lines = demo_run
    line = next(r for r in lines if r["outcome"] == "pass")
    with router.client() as grove:
        record = grove.request("GET", f"/v1/trajectories/{line['trajectory_id']}")
    steps = record["steps"]
    grading = next(i for i, s in enumerate(steps) if s.get("kind") == "grading")
    edit = max(i for i, s in enumerate(steps[:grading]) if s["type"] == "file_write")  # the agent's edit
    reply = replay(router, line["trajectory_id"], until=edit, env={"PYTHONDONTWRITEBYTECODE": "1"})
    report = reply.json()
    assert report["until"] == edit and max(s["index"] for s in report["steps"]) == edit and report["kept"]
    with router.client() as grove:
        rebuilt = grove.attach(report["sandbox_id"])
        assert rebuilt.read_file(steps[edit]["path"]).decode() == steps[edit]["content"]  # the state after the edit
        own = grove.request("GET", f"/v1/sandboxes/{rebuilt.id}/trajectory")
        rebuilt.close()
    assert own["sandbox"]["lineage"] == {"parent": line["trajectory_id"], "step": edit, "checkpoint": None,
                                         "kind": "replay"}
    assert [s["type"] for s in own["steps"]].count("exec") == 3  # the replay's steps, recorded as any others


def test_bad_requests_and_a_gone_or_changed_image_are_clear(router: RouterProcess, tmp_path: Path) -> None:
    assert replay(router, "sb-0000000000000000").status == 404
    sandbox = router.http("POST", "/v1/sandboxes", json_body={"image": "default"}).json()["id"]
    assert router.http("DELETE", f"/v1/sandboxes/{sandbox}").status == 200
    assert replay(router, sandbox, until=-1).status == 422
    assert replay(router, sandbox, surprise=1).status == 400
    nothing = replay(router, sandbox)
    assert nothing.status == 422 and "no step to replay" in nothing.json()["error"]["message"]

    assert router.cli("image", "import", "replay-bb", str(make_busybox_rootfs(tmp_path / "v1"))).returncode == 0
    with router.client() as grove:
        sb = grove.create(image="replay-bb")
        assert sb.exec("echo hi").exit_code == 0
        sb.close()
    assert replay(router, sb.id, keep=False).json()["matched"] == 1
    v2 = make_busybox_rootfs(tmp_path / "v2")
    (v2 / "etc" / "changed").write_text("another image now\n")
    assert router.cli("image", "import", "--force", "replay-bb", str(v2)).returncode == 0
    changed = replay(router, sb.id)
    assert changed.status == 409 and "now has digest" in changed.json()["error"]["message"]
    assert router.cli("image", "rm", "replay-bb").returncode == 0
    gone = replay(router, sb.id)
    assert gone.status == 409 and "is gone" in gone.json()["error"]["message"]
    assert router.live_ids() == set()


def test_the_normalizer_keeps_what_a_command_said_and_drops_what_differs_per_run() -> None:
    one = b"-rw-r--r-- 1 root root 83 Dec  3 16:12 mathops.py\nran in 0.05s at 0x7f3a12 pid 4242 sb-0123456789abcdef\n"
    two = b"-rw-r--r-- 1 root root 83 Jan 11 09:01 mathops.py\nran in 12 ms at 0x55aa00 pid=17 sb-fedcba9876543210\n"
    assert normalize(one) == normalize(two)
    assert normalize(b"size 83") != normalize(b"size 84")
    assert normalize(b"2026-12-03T16:12:26.5Z done") == b"<timestamp> done"


def store(router: RouterProcess, record: dict[str, Any]) -> None:
    """A record into the router's bucket, stored by grove's own archive."""
    with ObjectStore(s3_config(router)) as objects:
        assert not TrajectoryArchive(objects, router.state_dir / "test-spool").store(record).spooled


def test_the_cli_replays_and_says_which_steps_matched(
        router: RouterProcess, demo_run: tuple[Path, list[dict[str, Any]]]) -> None:
    _, lines = demo_run
    done = router.cli("trajectories", "replay", lines[0]["trajectory_id"], "--env", "PYTHONDONTWRITEBYTECODE=1")
    assert done.returncode == 0, done.stderr.decode()
    text = done.stdout.decode()
    assert "8/8 steps matched (0 volatile)" in text and "ok   #" in text and "DIFF" not in text
    assert router.live_ids() == set()  # not kept unless --keep
    bad = router.cli("trajectories", "replay", lines[0]["trajectory_id"], "--env", "NOEQUALS")
    assert bad.returncode != 0 and "KEY=VALUE" in bad.stderr.decode()


def noisy(task: dict[str, Any], sandbox: Sandbox) -> None:
    """A harness whose second command prints something new every run."""
    sandbox.exec("cat /workspace/a.txt")
    sandbox.exec("head -c 16 /dev/urandom | od -An -tx1")
    sandbox.exec("echo done")


def test_steps_a_task_marks_volatile_are_run_but_reported_apart(router: RouterProcess, tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "noisy", "prompt": "p", "workdir": "/workspace", "files": {"a.txt": "x\n"},
                                 "check": {"test": "true"}, "volatile": ["/dev/urandom"],
                                 "resources": {"cpu": 0.5, "memory_mb": 128}}) + "\n")
    run(router, tasks, tmp_path / "run", Policy(attempts=1), variants=[("tests.replay.test_replay:noisy", None)])
    trajectory = results(tmp_path / "run")[0]["trajectory_id"]
    report = replay(router, trajectory, keep=False).json()
    assert report["matched"] == report["total"] == 3  # the task's file, `cat`, `echo`
    assert [s["command"] for s in report["volatile"]] == ["head -c 16 /dev/urandom | od -An -tx1"]
    assert report["volatile"][0]["match"] is False  # ran, and differed, as expected
    without = dict(json.loads(tasks.read_text()))
    without.pop("volatile")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({**without, "volatile": ["("]}) + "\n")
    with pytest.raises(TaskFileError, match="volatile"):
        load_tasks(bad)
    assert replay(router, trajectory, volatile=["("]).status == 422


def test_lineage_on_create_survives_a_router_restart(fresh_router: RouterProcess) -> None:
    lineage = {"parent": "sb-00000000000000aa", "step": 3, "checkpoint": None, "kind": "replay"}
    reply = fresh_router.http("POST", "/v1/sandboxes", json_body={"lineage": lineage})
    assert reply.status == 201, reply.body
    sandbox = reply.json()["id"]
    bad = fresh_router.http("POST", "/v1/sandboxes", json_body={"lineage": {**lineage, "kind": "teleport"}})
    assert bad.status in (400, 422) and "kind" in bad.json()["error"]["message"]
    fresh_router.stop()
    fresh_router.start()
    with fresh_router.client() as grove:
        record = grove.request("GET", f"/v1/sandboxes/{sandbox}/trajectory")
    assert record["sandbox"]["lineage"] == lineage


def test_an_image_file_altered_behind_groves_back_is_reported_at_the_step_that_reads_it(
        router: RouterProcess, tmp_path: Path) -> None:
    rootfs = make_busybox_rootfs(tmp_path / "rootfs")
    (rootfs / "etc" / "greeting").write_text("hello\n")
    assert router.cli("image", "import", "altered-bb", str(rootfs)).returncode == 0
    with router.client() as grove:
        sb = grove.create(image="altered-bb")
        sb.exec("echo first")
        sb.exec("cat /etc/greeting")
        sb.exec("echo last")
        sb.close()
    stored = list(StateDir(router.state_dir).images.rglob("etc/greeting"))
    assert stored, "the imported image's file is not in the state dir"
    for path in stored:  # the same digest on record, other bytes on disk
        path.unlink()
        path.write_text("tampered\n")
    report = replay(router, sb.id, keep=False).json()
    assert report["first_mismatch"] == 1 and report["matched"] == 2, report["steps"]
    assert report["steps"][1]["differs"] == ["stdout"]
    assert router.cli("image", "rm", "altered-bb").returncode == 0


def test_the_mini_swe_agent_demos_trajectories_replay(router: RouterProcess) -> None:
    """``python -m grove.demo --harness mini-swe-agent`` drives each task with :func:`grove.demo.mini.run_one`."""
    for task, right in zip(make_tasks(2), (True, False), strict=True):
        outcome = run_one(router.url, router.key, task, right=right)
        assert outcome.error is None and outcome.solved == right, outcome
        report = replay(router, str(outcome.sandbox_id), env={"PYTHONDONTWRITEBYTECODE": "1"}, keep=False).json()
        assert report["matched"] == report["total"] >= 7, report["steps"]
    assert router.live_ids() == set()


def test_a_continuation_whose_replay_does_not_reproduce_the_state_is_retried_then_lost(
        router: RouterProcess, demo_run: tuple[Path, list[dict[str, Any]]], tmp_path: Path) -> None:
    """Progress runs are infrastructure-fault-safe: a rebuilt state that differs (here: a stored output edited) is
    a fault of the try, retried in a fresh sandbox, then lost and left out of the estimate; nothing is left behind."""
    tasks, lines = demo_run
    row = lines[0]
    with router.client() as grove:
        record = grove.request("GET", f"/v1/trajectories/{row['trajectory_id']}")
    cat = next(i for i, s in enumerate(record["steps"]) if s["type"] == "exec" and str(s["command"]).startswith("cat "))
    record["steps"][cat]["stdout"] = b"not what the file says\n"
    record["sandbox"] = dict(record["sandbox"], id=f"sb-{secrets.token_hex(8)}")
    store(router, record)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.json").write_bytes((tasks.parent / "run" / "run.json").read_bytes())
    (run_dir / "results.jsonl").write_text(json.dumps({**row, "outcome": "fail",
                                                      "trajectory_id": record["sandbox"]["id"]}) + "\n")
    done = router.cli("rollouts", "progress", str(run_dir), "--continuations", "2", "--steps", "4",
                      "--max-infra-retries", "1", timeout=600)
    assert done.returncode == 0, done.stderr.decode()
    (line,) = [json.loads(x) for x in (run_dir / "progress.jsonl").read_text().splitlines()]
    assert line["lost"] == 2 and line["successes"] == 0 and line["estimate"] is None and not line["rising"]
    assert line["infra_faults"] == ["replay_mismatch"] * 4  # two tries of each of the two continuations
    assert router.live_ids() == set()
