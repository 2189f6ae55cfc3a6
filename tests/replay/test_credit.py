"""Progress from step k and the credit-assignment export, on the demo's tasks through a real router: resumed
continuations find the rising span exactly where the scripted policy made its right edit, and the export holds
exactly those spans as targets (loaded by ``datasets``, as TRL reads it); a teacher hook gives estimates instead;
a harness that cannot resume is refused. A run with ``--checkpoint-every`` checkpoints its attempts and progress
restores from those checkpoints (no replay), replays where one is missing, with the same estimates, and
``--release`` leaves nothing behind."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import datasets
import pytest
from datasets import load_dataset

from grove.client import Sandbox
from grove.demo.tasks import task_lines
from grove.rollouts import Policy
from grove.rollouts.continuations import CONTINUATION_ATTEMPTS, wilson
from grove.rollouts.keeping import kept_sandboxes
from grove.rollouts.scripted import draws_right
from tests.rollouts.runs import results, run
from tests.support.readme import readme_block
from tests.support.router_fixtures import RouterProcess, wait_for

N = 4
READ, WRITE = 4, 5
"""The demo policy's turns: three inspections, the read (turn 4), the edit (turn 5), the check again (turn 6)."""


@pytest.fixture(scope="module")
def demo_run(router: RouterProcess,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[dict[str, Any]]]]:
    """The demo's medium and hard tasks, two attempts each, checkpointed after every turn (their sandboxes kept for
    that, and deleted after the module's tests)."""
    tasks = tmp_path_factory.mktemp("credit") / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(line) + "\n" for line in task_lines(2, ("medium", "hard"))))
    out = tasks.parent / "run"
    try:
        run(router, tasks, out, Policy(attempts=2), concurrency=4, checkpoint_every=1)
        yield out, results(out)
    finally:
        for sandbox_id in kept_sandboxes(out) if (out / "results.jsonl").exists() else []:
            router.http("DELETE", f"/v1/sandboxes/{sandbox_id}")


def copy_of(out: Path, to: Path) -> Path:
    """A run directory with ``out``'s run and results (a progress run of its own)."""
    to.mkdir()
    for name in ("run.json", "results.jsonl"):
        (to / name).write_bytes((out / name).read_bytes())
    return to


@pytest.fixture(scope="module")
def restored(router: RouterProcess, demo_run: tuple[Path, list[dict[str, Any]]],
             tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    """``rollouts progress`` over the demo run at the read and the edit, every state restored from its checkpoint;
    its run directory and lines."""
    out = copy_of(demo_run[0], tmp_path_factory.mktemp("restored") / "run")
    done = router.cli("rollouts", "progress", str(out), "--continuations", str(N), "--steps", f"{READ},{WRITE}",
                      "--include-resolved", timeout=900)
    assert done.returncode == 0, done.stderr.decode()
    return out, [json.loads(x) for x in (out / "progress.jsonl").read_text().splitlines()]


def p_solve(task: str) -> float:
    return next(line["scripted"]["p_solve"] for line in task_lines(2, ("medium", "hard")) if line["id"] == task)


def test_progress_finds_the_right_edit_and_the_export_holds_exactly_those_spans(
        router: RouterProcess, demo_run: tuple[Path, list[dict[str, Any]]],
        restored: tuple[Path, list[dict[str, Any]]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = demo_run[1]
    out, lines = restored
    assert len(lines) == 2 * len(rows)
    expected_rising = set()
    for row in rows:
        mine = {line["turn"]: line for line in lines if line["trajectory_id"] == row["trajectory_id"]}
        # Before the edit, continuation i draws as attempt CONTINUATION_ATTEMPTS + i does; after it, the edit is made.
        draws = [draws_right(row["task"], CONTINUATION_ATTEMPTS + i, p_solve(row["task"])) for i in range(N)]
        before, after = mine[READ], mine[WRITE]
        assert before["successes"] == sum(draws) and before["lost"] == 0 and before["infra_faults"] == [], before
        assert after["successes"] == (N if row["outcome"] == "pass" else 0), after
        for line in (before, after):
            assert line["interval"] == "wilson-95" and line["source"] == "monte_carlo"
            assert (line["ci_low"], line["ci_high"]) == tuple(round(b, 4) for b in wilson(line["successes"], N))
            assert line["ci_low"] <= line["estimate"] <= line["ci_high"]
        if row["outcome"] == "pass" and sum(draws) < N:
            expected_rising.add(row["trajectory_id"])
    rising = {line["trajectory_id"] for line in lines if line["rising"]}
    assert rising == expected_rising and rising, lines
    assert all(line["span"] == [WRITE, WRITE] for line in lines if line["rising"])
    assert router.live_ids() == set(kept_sandboxes(out))  # the attempts' own, kept for their checkpoints

    export = tmp_path / "credit.jsonl"
    done = router.cli("rollouts", "export", str(out), "--sft", "credit", "-o", str(export))
    assert done.returncode == 0, done.stderr.decode()
    examples = [json.loads(x) for x in export.read_text().splitlines()]
    assert {e["metadata"]["trajectory_id"] for e in examples} == rising and len(examples) == len(rising)
    for example in examples:
        target = example["completion"]
        assert len(target) == 1 and target[0]["role"] == "assistant"
        call = target[0]["tool_calls"][0]["function"]
        assert call["name"] == "write_file" and "Replacing" in target[0]["content"]
        task = example["metadata"]["task"]
        right = next(line["scripted"]["edit"]["right"] for line in task_lines(2, ("medium", "hard"))
                     if line["id"] == task)
        assert right in json.loads(call["arguments"])["content"]
        assert example["messages"] == example["prompt"] + target
        assert example["loss_mask"] == [0] * len(example["prompt"]) + [1]
        roles = [m["role"] for m in example["prompt"]]
        assert roles[0] == "user" and roles.count("tool") == READ  # earlier turns answered, all masked
    dataset = load_dataset("json", data_files=str(export), split="train", cache_dir=str(tmp_path / "cache"))
    assert dataset.num_rows == len(examples) and {"prompt", "completion", "loss_mask"} <= set(dataset.column_names)
    # The README's loading for TRL, as written, on this export (its cache off the user's ~/.cache).
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    namespace: dict[str, Any] = {}
    exec(compile(readme_block('ds = load_dataset("json", data_files="credit.jsonl"'), "README.md", "exec"), namespace)
    ready = namespace["ds"]
    assert ready.column_names == ["prompt", "completion", "tools"] and ready.num_rows == len(examples)
    assert ready[0]["completion"][0]["role"] == "assistant"

    plain = tmp_path / "plain.jsonl"
    done = router.cli("rollouts", "export", str(out), "--sft", "plain", "-o", str(plain))
    assert done.returncode == 0, done.stderr.decode()
    chats = [json.loads(x) for x in plain.read_text().splitlines()]
    assert sorted(c["metadata"]["sandbox_id"] for c in chats) == sorted(r["trajectory_id"] for r in rows)


def lineage(router: RouterProcess, sandbox_id: str) -> dict[str, Any]:
    reply = router.http("GET", f"/v1/trajectories/{sandbox_id}")
    assert reply.status == 200, reply.body[:300]
    found: dict[str, Any] = reply.json()["sandbox"]["lineage"]
    return found


def test_the_states_are_restored_from_the_run_s_checkpoints_without_replay(
        router: RouterProcess, demo_run: tuple[Path, list[dict[str, Any]]],
        restored: tuple[Path, list[dict[str, Any]]]) -> None:
    rows, lines = demo_run[1], restored[1]
    for row in rows:
        kept = row["checkpoints"]
        assert [k["turn"] for k in kept] == list(range(WRITE + 2)) and row["kept_sandbox"] is True
        assert all(k["checkpoint"].startswith("ck-") and "error" not in k for k in kept), kept
        listed = router.http("GET", f"/v1/sandboxes/{row['sandbox_id']}/checkpoints").json()["checkpoints"]
        assert [c["id"] for c in listed] == [k["checkpoint"] for k in kept]
        for line in (x for x in lines if x["trajectory_id"] == row["trajectory_id"]):
            state = kept[line["turn"]]
            assert line["checkpoint"] == state["checkpoint"] and line["step"] == state["step"]
            assert line["rebuilt_by"] == "checkpoint" and line["base_rebuilt_by"] == "checkpoint", line
            assert len(line["sandboxes"]) == N
            for sandbox_id in line["sandboxes"]:  # made from the checkpoint: no replay ran
                assert lineage(router, sandbox_id) == {"parent": row["trajectory_id"], "step": state["step"] + 1,
                                                       "checkpoint": state["checkpoint"], "kind": "restore"}


def test_a_missing_checkpoint_falls_back_to_replay_with_the_same_estimates_and_release_leaves_nothing(
        router: RouterProcess, demo_run: tuple[Path, list[dict[str, Any]]],
        restored: tuple[Path, list[dict[str, Any]]], tmp_path: Path) -> None:
    rows = demo_run[1]
    for row in rows:  # the state after setup and at the read are gone; the edit's is kept
        for turn in (0, READ):
            reply = router.http("DELETE", f"/v1/sandboxes/{row['sandbox_id']}/checkpoints/"
                                          f"{row['checkpoints'][turn]['checkpoint']}")
            assert reply.status == 200, reply.body[:300]
    out = copy_of(demo_run[0], tmp_path / "run")
    done = router.cli("rollouts", "progress", str(out), "--continuations", str(N), "--steps", f"{READ},{WRITE}",
                      "--include-resolved", "--release", timeout=900)
    assert done.returncode == 0, done.stderr.decode()
    lines = [json.loads(x) for x in (out / "progress.jsonl").read_text().splitlines()]
    before = {(x["trajectory_id"], x["turn"]): x for x in restored[1]}
    assert len(lines) == len(before) == 2 * len(rows)
    for line in lines:
        same = before[line["trajectory_id"], line["turn"]]
        for key in ("successes", "lost", "estimate", "ci_low", "ci_high", "rise", "rising", "span"):
            assert line[key] == same[key], (key, line, same)
        assert line["base_rebuilt_by"] == "replay"
        by = "replay" if line["turn"] == READ else "checkpoint"
        assert line["rebuilt_by"] == by and {lineage(router, s)["kind"] for s in line["sandboxes"]} == {
            "replay" if by == "replay" else "restore"}, line
    # --release: the kept sandboxes are gone, and their checkpoints' records and files with them.
    assert router.live_ids() == set()
    assert list((router.state_dir / "checkpoints").glob("ck-*")) == []
    wait_for(lambda: [p for row in rows for p in router.layout.sandboxes.glob(f"{row['sandbox_id']}*")] == [], 30,
             what="the released sandboxes' files removed (the teardown's passes follow a delete)")


def test_the_cli_takes_checkpoint_every_and_records_the_kept_states(router: RouterProcess, tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps(task_lines(1, ("easy",))[0]) + "\n")
    out = tmp_path / "run"
    done = router.cli("rollouts", "run", str(tasks), "--harness", "scripted", "--attempts", "1", "--out", str(out),
                      "--checkpoint-every", "3", "--quiet", "--no-upload", timeout=300)
    assert done.returncode == 0, done.stderr.decode()
    (row,) = results(out)
    assert [c["turn"] for c in row["checkpoints"]] == [0, 3, 6]
    assert all(c["checkpoint"].startswith("ck-") for c in row["checkpoints"])
    assert router.live_ids() == {row["sandbox_id"]}  # kept for its checkpoints, idle
    bad = router.cli("rollouts", "run", str(tasks), "--harness", "scripted", "--attempts", "1", "--out",
                     str(tmp_path / "other"), "--checkpoint-every", "-1")
    assert bad.returncode != 0 and "--checkpoint-every" in bad.stderr.decode()
    done = router.cli("rollouts", "export", str(out), "--sft", "credit")
    assert done.returncode != 0 and "rollouts progress" in done.stderr.decode()
    done = router.cli("rollouts", "progress", str(out), "--teacher", "tests.replay.test_credit:teacher",
                      "--include-resolved", "--release")
    assert done.returncode == 0, done.stderr.decode()
    assert router.live_ids() == set()


def three_turns(task: dict[str, Any], sandbox: Sandbox, resume: Any = None) -> None:
    """Three commands, each appending to a file; resumed, only the ones the prefix does not hold."""
    for turn in range(resume.turns if resume is not None else 0, 3):
        sandbox.exec(f"echo {turn} >> /workspace/log")


def test_a_checkpoint_that_fails_is_recorded_the_attempt_goes_on_and_progress_replays(
        router: RouterProcess, tmp_path: Path) -> None:
    key = router.member_key("tight", "tight-user")
    # Room for the attempt's sandbox and nothing more: every checkpoint is over the project's disk quota.
    assert router.cli("project", "set", "tight", "--disk-mb", "256").returncode == 0
    wait_for(lambda: router.http("GET", "/v1/projects/tight", key=key).json()["quotas"]["disk_mb"] == 256, 5,
             what="the quota taken")
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "tight", "prompt": "append three lines", "workdir": "/workspace",
                                 "files": {"log": ""}, "check": {"test": "test $(wc -l < log) = 3",
                                                                "grading": "in-place"},
                                 "resources": {"cpu": 0.5, "memory_mb": 128, "disk_mb": 256}}) + "\n")
    out = tmp_path / "run"
    try:
        done = router.cli("rollouts", "run", str(tasks), "--harness", "tests.replay.test_credit:three_turns",
                          "--attempts", "1", "--out", str(out), "--checkpoint-every", "1", "--quiet", "--no-upload",
                          key=key, timeout=300)
        assert done.returncode == 0, done.stderr.decode()
        (row,) = results(out)
        assert row["outcome"] == "pass" and "kept_sandbox" not in row, row  # the attempt went on, and ended
        assert [c["turn"] for c in row["checkpoints"]] == [0, 1, 2, 3]
        for kept in row["checkpoints"]:
            assert kept["checkpoint"] is None and "quota_exceeded" in kept["error"] and "disk_mb" in kept["error"]
        assert router.live_ids() == set()
        done = router.cli("rollouts", "progress", str(out), "--continuations", "1", "--steps", "2",
                          "--include-resolved", key=key, timeout=300)
        assert done.returncode == 0, done.stderr.decode()
        (line,) = [json.loads(x) for x in (out / "progress.jsonl").read_text().splitlines()]
        assert (line["rebuilt_by"], line["base_rebuilt_by"], line["checkpoint"]) == ("replay", "replay", None)
        assert line["successes"] == 1 and [lineage(router, s)["kind"] for s in line["sandboxes"]] == ["replay"]
        assert router.live_ids() == set()
    finally:
        router.cli("project", "set", "tight", "--disk-mb", "none")


def teacher(trajectory: dict[str, Any], outcome: dict[str, Any] | None) -> list[float]:
    """A teacher that knows: nothing changes until the edit (turn 5), then the outcome is settled."""
    solved = 1.0 if (outcome or {}).get("result") == "pass" else 0.0
    return [0.5] * WRITE + [solved, solved]


def test_a_teacher_gives_the_estimates_at_the_kept_states(
        router: RouterProcess, demo_run: tuple[Path, list[dict[str, Any]]], tmp_path: Path) -> None:
    out, rows = demo_run
    copy = copy_of(out, tmp_path / "run")
    done = router.cli("rollouts", "progress", str(copy), "--teacher", "tests.replay.test_credit:teacher",
                      "--include-resolved")
    assert done.returncode == 0, done.stderr.decode()
    lines = [json.loads(x) for x in (copy / "progress.jsonl").read_text().splitlines()]
    assert sorted({line["turn"] for line in lines}) == list(range(WRITE + 2))  # the kept states
    for line in lines:
        assert line["source"] == "teacher" and "ci_low" not in line
    rising = [line for line in lines if line["rising"]]
    assert {line["trajectory_id"] for line in rising} == {r["trajectory_id"] for r in rows if r["outcome"] == "pass"}
    assert all(line["span"] == [WRITE, WRITE] for line in rising)  # every turn kept: the rise is at the edit


def not_resumable(task: dict[str, Any], sandbox: Sandbox) -> None:
    """A harness without ``resume``."""
    sandbox.exec("true")


def test_a_harness_that_cannot_resume_is_refused_for_progress(router: RouterProcess, tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "nr", "prompt": "p", "workdir": "/workspace", "files": {"a.txt": "x"},
                                 "check": {"test": "false"}, "resources": {"cpu": 0.5, "memory_mb": 128}}) + "\n")
    out = tmp_path / "run"
    run(router, tasks, out, Policy(attempts=1), variants=[("tests.replay.test_credit:not_resumable", None)])
    done = router.cli("rollouts", "progress", str(out))
    assert done.returncode != 0
    assert "cannot resume from a step" in done.stderr.decode() and "resume=" in done.stderr.decode()
    assert not (out / "progress.jsonl").exists()
    assert router.live_ids() == set()


def test_mini_swe_agent_replays_and_resumes_from_a_step(router: RouterProcess, tmp_path: Path) -> None:
    """mini-swe-agent's real loop (its deterministic model): its trajectories replay step for step, and resumed at a
    step it goes on from the recorded conversation: the rise is at its patch (turn 4: three looks, then the patch)."""
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(line) + "\n" for line in task_lines(2, ("medium", "hard"))))
    out = tmp_path / "run"
    run(router, tasks, out, Policy(attempts=2), concurrency=4, variants=[("mini-swe-agent", None)])
    rows = results(out)
    assert {r["outcome"] for r in rows} <= {"pass", "fail"} and len(rows) == 4
    for row in rows:
        reply = router.http("POST", f"/v1/trajectories/{row['trajectory_id']}/replay",
                            json_body={"env": {"PYTHONDONTWRITEBYTECODE": "1"}, "keep": False})
        report = reply.json()
        assert report["total"] == report["matched"] and report["total"] >= 8, report["steps"]
    done = router.cli("rollouts", "progress", str(out), "--continuations", str(N), "--steps", "3,4",
                      "--include-resolved", timeout=900)
    assert done.returncode == 0, done.stderr.decode()
    lines = [json.loads(x) for x in (out / "progress.jsonl").read_text().splitlines()]
    expected = set()
    for row in rows:
        mine = {line["turn"]: line for line in lines if line["trajectory_id"] == row["trajectory_id"]}
        draws = [draws_right(row["task"], CONTINUATION_ATTEMPTS + i, p_solve(row["task"])) for i in range(N)]
        assert mine[3]["successes"] == sum(draws), mine[3]
        assert mine[4]["successes"] == (N if row["outcome"] == "pass" else 0), mine[4]
        if row["outcome"] == "pass" and sum(draws) < N:
            expected.add(row["trajectory_id"])
    assert {line["trajectory_id"] for line in lines if line["rising"]} == expected and expected
    assert router.live_ids() == set()
