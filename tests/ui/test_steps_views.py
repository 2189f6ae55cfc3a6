"""What the viewer's API makes of a record, without a browser: each step's phase, the file views, the pages."""

from __future__ import annotations

from typing import Any

import pytest

from router.trajectory.recorder import CONTENT_RECORDED
from router.ui.files import DIFF_COST, PAGE_COST, PREVIEW_LINES, split_lines, unified, views, weight
from router.ui.phases import phase_of_each, segments
from router.ui.steps import page
from tests.support.trajectory_samples import make_record
from tests.ui.samples import CALC, FIXED, NOTES, grader_record, rollout, sha

pytestmark = pytest.mark.fast


def bracket(kind: str, status: str, **data: Any) -> dict[str, Any]:
    """A setup or grading event as a rollout posts it."""
    return {"type": "event", "kind": kind, "data": {"status": status, **data}}


def run(*commands: str) -> list[dict[str, Any]]:
    """Exec steps, one a command."""
    return [{"type": "exec", "command": c, "exit_code": 0, "stdout": "", "stderr": ""} for c in commands]


def steps_of(steps: list[dict[str, Any]]) -> list[Any]:
    """The steps as the recorder and journal keep them (no result event at the end)."""
    recorded: list[Any] = make_record("sb-steps0000000001", steps=steps, outcome=None)["steps"]
    return recorded


def test_a_rollouts_phases_are_setup_agent_grading_and_what_came_after() -> None:
    record = rollout("sb-phases00000001")
    each = phase_of_each(record["steps"])
    assert each == ["setup"] * 5 + ["agent"] * 6 + ["grading"] * 6 + ["agent"]
    assert segments(record["steps"], each) == [
        {"phase": "setup", "start": 0, "end": 5}, {"phase": "agent", "start": 5, "end": 11},
        {"phase": "grading", "start": 11, "end": 17, "mode": "in-place", "result": "pass", "reward": 1.0},
        {"phase": "agent", "start": 17, "end": 18}]


def test_a_graders_setup_inside_its_grading_is_grading() -> None:
    record = grader_record("sb-grader0000009", "sb-graded0000009")
    each = phase_of_each(record["steps"])
    assert set(each) == {"grading"}
    assert segments(record["steps"], each) == [
        {"phase": "grading", "start": 0, "end": len(each), "mode": "isolated", "result": "pass", "reward": 1.0}]


def test_brackets_that_do_not_pair_up_still_give_every_step_one_phase() -> None:
    steps = steps_of([*run("a"), bracket("setup", "finished"), *run("b"), bracket("grading", "started"),
                      *run("c"), bracket("grading", "finished", result="fail"), bracket("grading", "started"),
                      *run("d"), {"type": "event", "kind": "grading", "data": "started"}])
    each = phase_of_each(steps)
    # A finish never started is its phase's; a grading started again is a second segment; one never finished
    # runs to the end; an event whose data is no bracket's is just a step.
    assert each == ["agent", "setup", "agent", "grading", "grading", "grading", "grading", "grading", "grading"]
    assert [(s["phase"], s["start"], s["end"]) for s in segments(steps, each)] == [
        ("agent", 0, 1), ("setup", 1, 2), ("agent", 2, 3), ("grading", 3, 6), ("grading", 6, 9)]


def test_a_phases_facts_are_its_own_brackets_and_short() -> None:
    steps = steps_of([bracket("grading", "started", mode="isolated" * 100), bracket("setup", "started"),
                      bracket("setup", "finished", result="setup-ok"), bracket("grading", "finished", reward=True)])
    (only,) = segments(steps, phase_of_each(steps))
    assert only["mode"] == ("isolated" * 100)[:200] and "result" not in only and "reward" not in only


def test_a_page_of_one_phase_counts_its_own_steps() -> None:
    record = rollout("sb-phasepage00001", long_setup=True)
    body = page(record, 1, 3, "grading")
    assert [s["i"] for s in body["steps"]] == [14, 15, 16] and body["phase"] == "grading"
    assert body["phase_counts"] == {"setup": 7, "agent": 7, "grading": 6}
    assert body["changes"] == {"i": 17, "grader": None, "files": 6}
    assert page(record, 0, 0)["steps"] == [] and page(record, 0, 0)["step_count"] == len(record["steps"])


def write(path: str, content: str | None, *, size: int | None = None, status: int = 200) -> dict[str, Any]:
    """A file write step as the recorder makes it (content kept when it is small UTF-8 text)."""
    data = (content or "").encode()
    step = {"type": "file_write", "path": path, "size": len(data) if size is None else size, "sha256": sha(data),
            "status": status}
    return step if content is None else {**step, "content": content}


def test_a_write_is_a_diff_against_what_the_record_last_held_of_the_path() -> None:
    steps = steps_of([{**write("/repo/calc.py", CALC), "type": "file_read"},
                      write("/repo/calc.py", "broken", status=500),  # failed: changes nothing known
                      write("/repo/./calc.py", FIXED),  # the same path, spelt otherwise
                      write("/repo/calc.py", FIXED),
                      write("/repo/calc.py", None, size=10),  # binary now: what was known is gone
                      write("/repo/calc.py", CALC),
                      write("/repo/big.txt", None, size=CONTENT_RECORDED + 1),
                      write("/repo/nul.txt", "a\x00b")])
    shown = views(steps, range(len(steps)))
    assert shown[0]["show"] == "content" and shown[0]["lines"] == 6
    assert shown[1] == {"show": "failed"}
    assert shown[2]["show"] == "diff" and shown[2]["against"] == 0 and shown[2]["against_type"] == "file_read"
    assert (shown[2]["added"], shown[2]["removed"]) == (1, 1) and shown[2]["body"] == unified(CALC, FIXED)
    assert shown[3]["show"] == "same" and shown[3]["against"] == 2
    assert shown[4]["show"] == "binary"
    assert shown[5]["show"] == "content"  # nothing known to compare with
    assert shown[6]["show"] == "large" and shown[7]["show"] == "binary"


def test_a_long_view_is_cut_in_an_outline_and_whole_on_request() -> None:
    steps = steps_of([write("/repo/NOTES.md", NOTES)])
    preview, whole = views(steps, [0])[0], views(steps, [0], whole=True)[0]
    assert preview["cut"] and preview["body"] == "".join(NOTES.splitlines(keepends=True)[:PREVIEW_LINES])
    assert not whole["cut"] and whole["body"] == NOTES and whole["lines"] == preview["lines"] == 100


def test_a_diff_says_a_missing_final_newline_and_numbers_lines_at_newlines_only() -> None:
    assert unified("a\nb\n", "a\nc") == "@@ -1,2 +1,2 @@\n a\n-b\n+c\n\\ No newline at end of file\n"
    # A form feed is no line break here (str.splitlines would make it one and shift every number after it).
    assert unified("x\fy\nz\n", "x\fy\nZ\n") == "@@ -1,2 +1,2 @@\n x\fy\n-z\n+Z\n"


def scattered(lines: int, mark: str) -> str:
    """A text whose every other line carries ``mark``: two of them differ all over, the costly case to align."""
    return "".join(f"{n} {mark if n % 2 else ''}\n" for n in range(lines))


def test_a_costly_diff_waits_to_be_asked_for_and_past_a_bound_is_one_replacement() -> None:
    steps = steps_of([write("/repo/a.txt", scattered(1200, "x")), write("/repo/a.txt", scattered(1200, "y"))])
    assert weight(split_lines(scattered(1200, "x")), split_lines(scattered(1200, "y"))) > DIFF_COST
    deferred = views(steps, [1])[1]
    assert deferred == {"show": "diff", "against": 0, "against_type": "file_write", "deferred": True, "lines": 1200}
    asked = views(steps, [1], whole=True)[1]
    assert not asked["coarse"] and (asked["added"], asked["removed"]) == (600, 600)
    # Past the bound for one diff asked alone: the changed middle replaced whole (still a correct diff).
    huge = steps_of([write("/repo/b.txt", scattered(6000, "x")), write("/repo/b.txt", scattered(6000, "y"))])
    coarse = views(huge, [1], whole=True)[1]
    assert coarse["coarse"] and (coarse["added"], coarse["removed"]) == (5999, 5999)
    assert coarse["body"].startswith("@@ -1,6000 +1,6000 @@\n 0 \n-1 x\n")


def test_a_page_of_many_diffs_stays_within_its_budget() -> None:
    edits = [write("/repo/a.txt", scattered(900, str(n))) for n in range(8)]  # each 900 x 900 = 810,000 pairs
    shown = views(steps_of(edits), range(8))
    computed = [i for i in range(1, 8) if "body" in shown[i]]
    assert computed == [1, 2, 3, 4] and all(shown[i].get("deferred") for i in range(5, 8))
    assert PAGE_COST // 810_000 == 4
