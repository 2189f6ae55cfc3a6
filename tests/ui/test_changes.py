"""What changed, in a real browser: file writes as numbered text and diffs, an attempt's final diff at the top,
grading folded, two attempts compared phase by phase, and runs named by their harnesses and models."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.remote.webelement import WebElement

from grove.rollouts.journal import open_run
from grove.rollouts.report import groups_of, summarize
from tests.support.trajectory_samples import CREATED, make_record
from tests.ui.conftest import Viewer
from tests.ui.samples import CALC, FIXED, LOGO, NOTES, grader_record, rollout, sha

# Stores records behind the router's back in its embedded S3 (tests/ui/conftest.py).
pytestmark = pytest.mark.embedded_s3

MINUS = "\u2212"
"""The sign before the count of lines a diff removes (a minus sign, not a hyphen)."""


def index_of(record: dict[str, Any], **fields: Any) -> int:
    """The index of the record's first step with these fields."""
    return next(i for i, s in enumerate(record["steps"]) if all(s.get(k) == v for k, v in fields.items()))


def step(viewer: Viewer, i: int, within: str = "#timeline") -> WebElement:
    """The rendered step ``i``."""
    return viewer.css(f'{within} .step[data-i="{i}"]')[0]


def cells(table: WebElement, kind: str = "") -> list[list[str]]:
    """A code table's rows (of one class) as their cells' exact text."""
    rows = table.find_elements("css selector", f"tr{'.' + kind if kind else ''}")
    return [[c.get_attribute("textContent") or "" for c in r.find_elements("css selector", "td")] for r in rows]


def open_trajectory(viewer: Viewer, record: dict[str, Any]) -> None:
    """Load a stored record's page and wait for every step."""
    viewer.open(f"/ui/trajectories/{record['sandbox']['id']}")
    viewer.wait(lambda: len(viewer.css("#timeline .step")) == len(record["steps"]), what="every step")


def test_file_writes_show_numbered_content_and_diffs(viewer: Viewer) -> None:
    record = rollout("sb-files000000001")
    viewer.store(record)
    viewer.login()
    open_trajectory(viewer, record)
    # Setup wrote calc.py: its text, every line numbered.
    first = step(viewer, index_of(record, type="file_write", path="/repo/calc.py", content=CALC))
    listing = first.find_element("css selector", "details.file-content[open] table.listing")
    assert cells(listing) == [[str(n), line] for n, line in enumerate(CALC.splitlines(), 1)]
    # The agent read it (folded), then wrote the fix: a diff against what it read, both sides numbered.
    read = index_of(record, type="file_read")
    assert step(viewer, read).find_element("css selector", "details.file-content").get_attribute("open") is None
    fix = step(viewer, index_of(record, type="file_write", content=FIXED))
    assert f"+1 {MINUS}1 against #{read} (file read)" in fix.text
    table = fix.find_element("css selector", "table.diff")
    assert cells(table, "hunk") == [["", "", "@@ -1,5 +1,5 @@"]]
    assert cells(table, "del") == [["2", "", "-    return a - b"]]
    assert cells(table, "add") == [["", "2", "+    return a + b"]]
    assert cells(table, "ctx")[0] == ["1", "1", " def add(a, b):"]
    # A new file of 100 lines: the outline brought its first 60; the rest comes on request.
    notes = step(viewer, index_of(record, type="file_write", path="/repo/NOTES.md"))
    assert len(notes.find_elements("css selector", "table.listing tr")) == 60
    notes.find_element("css selector", "button.all-lines").click()
    viewer.wait(lambda: len(notes.find_elements("css selector", "table.listing tr")) == 100, what="all 100 lines")
    assert cells(notes.find_element("css selector", "table.listing"))[-1] == ["100", "note 100"]
    assert "note 100" in NOTES
    # Binary, and too large to keep: size and sha256.
    logo = step(viewer, index_of(record, type="file_write", path="/repo/assets/logo.png")).text
    assert "binary: content not kept" in logo and "2.0 kB" in logo and "sha256 " + sha(LOGO) in logo
    big = step(viewer, index_of(record, type="file_write", path="/repo/data.bin")).text
    assert "over 64 kB: content not kept" in big and "98 kB" in big
    assert not viewer.css("#timeline .step.transfer pre.json")  # no step fell back to a JSON dump
    assert not viewer.console_problems()
    # What crossed the wire for the page is the preview; the whole text has its own call.
    session = viewer.session()
    sid, n = record["sandbox"]["id"], index_of(record, type="file_write", path="/repo/NOTES.md")
    page = viewer.get(f"/ui/api/trajectories/{sid}", session).json()
    shown = next(s for s in page["steps"] if s["i"] == n)
    assert "content" not in shown and shown["file"]["cut"] and shown["file"]["lines"] == 100
    whole = viewer.get(f"/ui/api/trajectories/{sid}/steps/{n}/file", session).json()
    assert whole["body"] == NOTES and not whole["cut"]
    assert viewer.get(f"/ui/api/trajectories/{sid}/steps/0/file", session).status == 404  # not a file step


def test_a_diff_too_costly_for_the_outline_is_computed_when_asked(viewer: Viewer) -> None:
    before = "".join(f"{n} {'x' if n % 2 else ''}\n" for n in range(1200))
    after = before.replace(" x\n", " y\n")
    steps = [{"type": "file_write", "path": "/repo/table.txt", "size": len(t), "sha256": sha(t.encode()),
              "content": t, "status": 200, "t": CREATED + n} for n, t in enumerate((before, after))]
    record = make_record("sb-costly00000001", steps=steps)
    viewer.store(record)
    viewer.login()
    open_trajectory(viewer, record)
    second = step(viewer, 1)
    assert "changed against #0 (file write) · 1200 lines" in second.text and not second.find_elements(
        "css selector", "table.diff")
    second.find_element("css selector", "button.all-lines").click()
    viewer.wait(lambda: second.find_elements("css selector", "table.diff tr.add"), what="the diff")
    assert f"+600 {MINUS}600 against #0 (file write)" in second.text
    assert len(second.find_elements("css selector", "table.diff tr.del")) == 600
    assert not viewer.console_problems()


def test_the_final_diff_is_at_the_top_with_what_grading_took_and_why_not(viewer: Viewer) -> None:
    record = rollout("sb-final00000001", grading="isolated", grader="sb-grader0000001")
    viewer.store(record, grader_record("sb-grader0000001", "sb-final00000001"))
    viewer.login()
    open_trajectory(viewer, record)
    box = viewer.wait(lambda: [b for b in viewer.css("#changes") if b.is_displayed()], what="the final diff")[0]
    assert box.location["y"] < viewer.css("#timeline")[0].location["y"]
    assert "6 files against the state after setup · 5 applied · 1 dropped" in box.text
    assert "graded in a fresh sandbox (isolated)" in box.text
    files = {f.get_attribute("data-path") or "": f for f in viewer.css("#changes details.change")}
    assert sorted(files) == ["NOTES.md", "assets/logo.png", "calc.py", "old.txt", "run.sh", "tests/test_calc.py"]
    calc = files["calc.py"]
    assert calc.get_attribute("open") is not None and "applied" in calc.text and f"+1 {MINUS}1" in calc.text
    assert cells(calc.find_element("css selector", "table.diff"), "add") == [["", "2", "+    return a + b"]]
    assert cells(calc.find_element("css selector", "table.diff"), "info") == [["", "", "--- a/calc.py"],
                                                                             ["", "", "+++ b/calc.py"]]
    assert "added" in files["NOTES.md"].text and f"+100 {MINUS}0" in files["NOTES.md"].text
    logo = files["assets/logo.png"].find_element("css selector", ".change-body").get_attribute("textContent") or ""
    assert "binary" in logo and "2.0 kB" in logo and sha(LOGO) in logo
    assert "mode 100644 → 100755" in files["run.sh"].text and "deleted" in files["old.txt"].text
    dropped = files["tests/test_calc.py"]
    assert "dropped" in (dropped.get_attribute("class") or "") and dropped.get_attribute("open") is None
    assert "reset by the test patch" in dropped.text
    viewer.snap("rollout")
    assert not viewer.console_problems()
    # The grader's own trajectory: the whole of it is grading (the task's setup ran inside), folded.
    box.find_element("css selector", "a.grader").click()
    viewer.wait(lambda: viewer.browser.current_url.endswith("/ui/trajectories/sb-grader0000001"), what="the grader")
    fold = viewer.wait(lambda: viewer.css("#timeline details.phase.grading"), what="the grading fold")
    assert len(fold) == 1 and not viewer.css("#timeline section.phase")
    label = fold[0].find_element("css selector", "summary").get_attribute("textContent")
    assert label == "Grading · 7 steps · isolated · result pass · reward 1"
    assert not [s for s in viewer.css("#timeline .step") if s.is_displayed()]


def test_grading_steps_are_folded_into_one_line_until_opened(viewer: Viewer) -> None:
    record = rollout("sb-fold000000001")
    viewer.store(record)
    viewer.login()
    open_trajectory(viewer, record)
    heads = [h.get_attribute("textContent") for h in viewer.css("#timeline .phase-head")]
    assert heads == ["Setup · 5 steps", "Agent · 6 steps",
                     "Grading · 6 steps · in-place · result pass · reward 1", "After grading · 1 step"]
    grading = list(range(11, 17))
    assert [record["steps"][i].get("kind") for i in (11, 16)] == ["grading", "grading"]
    assert not [i for i in grading if step(viewer, i).is_displayed()]
    assert all(step(viewer, i).is_displayed() for i in range(11))
    viewer.css("#timeline details.phase.grading summary")[0].click()
    viewer.wait(lambda: all(step(viewer, i).is_displayed() for i in grading), what="the grading steps")
    # The final diff's event, inside grading, is a list of its files (the whole diff is at the top).
    brief = step(viewer, index_of(record, kind="changes")).find_elements("css selector", ".changes-brief li")
    assert len(brief) == 6 and "calc.py" in brief[2].text
    assert not viewer.console_problems()


def test_two_attempts_are_compared_phase_by_phase(viewer: Viewer) -> None:
    a = rollout("sb-phasea00000001", model="m-large", long_setup=True)
    b = rollout("sb-phaseb00000001", model="m-small", result="fail", grading="isolated", grader="sb-grader0000002")
    viewer.store(a, b)
    viewer.login()
    viewer.open("/ui/compare?a=sb-phasea00000001&b=sb-phaseb00000001")
    viewer.wait(lambda: len(viewer.css("#aligned tbody.agent tr.pair")) == 7, what="the agent's rows")
    titles = [t.text for t in viewer.css("#aligned tr.phase-row th")]
    assert titles[0] == "Setup — A: 7 steps · B: 5 steps"
    assert titles[1] == "Agent — A: 7 steps · B: 7 steps"
    assert titles[2].startswith("Grading — A: 6 steps (in-place, result pass) · B: 3 steps (isolated, result fail)")
    setup = viewer.css("#aligned tbody.setup tr.pair")
    assert len(setup) == 7 and setup[6].find_elements("css selector", "td")[2].text == "—"
    # Aligned by phase, the agents' first steps sit side by side although A's setup was two steps longer.
    first = viewer.css("#aligned tbody.agent tr.pair")[0]
    sides = first.find_elements("css selector", "td .step")
    assert [s.get_attribute("data-i") for s in sides] == ["7", "5"]
    assert all("Fix add in calc.py." in s.text for s in sides)
    # Grading is one line until opened.
    assert not viewer.css("#aligned tbody.grading tr.pair")
    viewer.browser.find_element("id", "open-grading").click()
    rows = viewer.wait(lambda: [r for r in viewer.css("#aligned tbody.grading tr.pair") if r.is_displayed()],
                       what="the grading rows")
    assert len(rows) == 6 and rows[3].find_elements("css selector", "td")[2].text == "—"
    viewer.browser.find_element("id", "open-grading").click()
    viewer.wait(lambda: not [r for r in viewer.css("#aligned tbody.grading tr.pair") if r.is_displayed()],
                what="grading folded again")
    # Each side's final diff in its box, folded.
    viewer.wait(lambda: len(viewer.css("#changes-a details.change, #changes-b details.change")) == 12,
                what="both final diffs")
    for side in ("a", "b"):
        changes = viewer.css(f"#changes-{side} details.change")
        assert len(changes) == 6 and not [c for c in changes if c.get_attribute("open") is not None]
    assert "1 dropped" in viewer.text("#changes-b") and "0 dropped" in viewer.text("#changes-a")
    viewer.snap("compare")
    assert not viewer.console_problems()
    # The API behind it: a phase's steps, paged by their place in the phase.
    session = viewer.session()
    page = viewer.get("/ui/api/trajectories/sb-phasea00000001?phase=agent&offset=2&limit=2", session).json()
    assert [s["i"] for s in page["steps"]] == [9, 10] and {s["phase"] for s in page["steps"]} == {"agent"}
    assert page["phase_counts"] == {"setup": 7, "agent": 7, "grading": 6}
    bad = viewer.get("/ui/api/trajectories/sb-phasea00000001?phase=review", session)
    assert bad.status == 400 and "phase must be one of" in bad.json()["error"]["message"]


def run_files(out: Path, variants: list[list[str]], versions: list[str], tasks: list[str]) -> dict[str, bytes]:
    """A run's files as `grove rollouts` writes them: run.json from its journal, summary and groups from its report."""
    run = open_run(out, {"variants": variants})
    results = []
    for v, (harness, model) in enumerate(variants):
        for task in tasks:
            for attempt in range(2):
                outcome = "pass" if (attempt + v + len(task)) % 3 else "fail"
                results.append({"run_id": run["run_id"], "variant": v, "task": task, "attempt": attempt,
                                "group_id": f"{task}-v{v}", "outcome": outcome,
                                "reward": 1.0 if outcome == "pass" else 0.0, "harness": harness,
                                "harness_version": versions[v], "model": model, "tries": 1, "infra_errors": []})
    summary = summarize(run, results)
    return {"run.json": (out / "run.json").read_bytes(), "summary.json": json.dumps(summary).encode(),
            "groups.jsonl": "".join(json.dumps(g) + "\n" for g in groups_of(results)).encode()}


def test_the_run_list_and_a_run_name_variants_by_harness_and_model(viewer: Viewer, tmp_path: Path) -> None:
    files = run_files(tmp_path / "one", [["mini-swe-agent", "m-large"], ["swe-agent", "m-small"]], ["2.4", "1.0"],
                      ["astropy-1", "django-7", "flask-3"])
    run_id = json.loads(files["run.json"])["run_id"]
    summary = json.loads(files["summary.json"])
    for name, data in files.items():
        viewer.put_object(f"runs/{run_id}/{name}", data)
    viewer.put_object("runs/plots-only/attempts.png", b"\x89PNG\r\n\x1a\n")  # a run whose summary is not there yet
    viewer.login()
    viewer.open("/ui/runs")
    row = viewer.wait(lambda: viewer.css(f'#runs tr[data-id="{run_id}"]'), what="the run's row")[0]
    created = json.loads(files["run.json"])["created_at"]
    assert row.find_element("css selector", ".date").text == time.strftime("%Y-%m-%d %H:%M:%S UTC",
                                                                          time.gmtime(created))
    assert row.find_element("css selector", ".harnesses").text == "mini-swe-agent 2.4, swe-agent 1.0"
    assert row.find_element("css selector", ".models").text == "m-large, m-small"
    assert row.find_element("css selector", ".tasks").text == "3"
    assert row.find_element("css selector", ".attempts").text == "12"
    passed = sum(v["passed"] for v in summary["variants"])
    scored = sum(v["scored"] for v in summary["variants"])
    rate = f"{round(passed / scored * 1000) / 10:g}%"
    assert row.find_element("css selector", ".rate").text == f"{rate} {passed}/{scored}"
    other = viewer.css('#runs tr[data-id="plots-only"]')[0]
    assert "no summary.json (yet)" in other.text and "UTC" in other.find_element("css selector", ".date").text
    viewer.snap("runs")
    assert not viewer.console_problems()
    row.find_element("css selector", "a").click()
    viewer.wait(lambda: len(viewer.css("#groups tbody tr")) == 6, what="the run's groups")
    heads = [h.text for h in viewer.css("#tasks thead th")]
    assert heads == ["Task", "mini-swe-agent 2.4 · m-large", "swe-agent 1.0 · m-small"]
    variants = {r.find_elements("css selector", "td")[1].text for r in viewer.css("#groups tbody tr")}
    assert variants == {"mini-swe-agent 2.4 · m-large", "swe-agent 1.0 · m-small"}
    assert not viewer.console_problems()
