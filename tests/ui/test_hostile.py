"""What a sandbox or harness wrote never runs in the viewer: a record full of script, markup and
``javascript:`` payloads renders as text on every page, and nothing of it executes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from selenium.common.exceptions import StaleElementReferenceException

from grove.client import Grove
from grove.rollouts.journal import open_run
from grove.rollouts.report import groups_of, summarize
from tests.ui.conftest import Viewer
from tests.ui.samples import BEFORE, HOSTILE, PAYLOADS, episode, hostile

# Stores records behind the router's back in its embedded S3 (tests/ui/conftest.py).
pytestmark = pytest.mark.embedded_s3

SID = "sb-hostile00000001"


def assert_nothing_ran(viewer: Viewer) -> None:
    """No payload executed, and the page holds no element a payload could have made."""
    browser = viewer.browser
    assert browser.execute_script("return window.__pwned === undefined"), "a payload ran"
    assert browser.title != "pwned"
    assert not viewer.css("main img, main svg, main iframe, main script, main [onerror], main [onload]")
    hrefs = [a.get_attribute("href") or "" for a in viewer.css("a")]
    assert not [h for h in hrefs if not h.startswith(viewer.router.url + "/ui/")], hrefs
    scripts = [s.get_attribute("src") for s in viewer.css("script")]
    assert all(src and src.startswith(viewer.router.url + "/ui/static/") for src in scripts), scripts
    # Nor did anything try (the CSP would report a blocked inline handler) or break the page's scripts.
    assert not viewer.console_problems()


def expand_everything(viewer: Viewer) -> None:
    """Show every clipped step whole, then open every fold, output and file, and load every file whole."""
    for button in viewer.css("button.whole"):
        button.click()
    viewer.wait(lambda: not viewer.css("button.whole"), what="the whole steps")
    for button in viewer.css("#open-grading"):
        button.click()
    # Opening a fold shows the closed details inside it, and rows still loading bring more: again until none is
    # left closed (an element re-rendered meanwhile is looked up afresh on the next round).
    viewer.wait(lambda: _open_all(viewer), what="every fold open")
    viewer.wait(lambda: not [p for p in viewer.css("pre.term") if p.text == "loading…"], what="the outputs")
    for button in viewer.css("button.all-lines"):
        button.click()
    viewer.wait(lambda: not viewer.css("button.all-lines"), what="the whole files")  # each goes with its preview


def _open_all(viewer: Viewer) -> bool:
    """Open the closed details shown now; True once none was left."""
    try:
        closed = [d for d in viewer.css("main details") if d.get_attribute("open") is None and d.is_displayed()]
        for box in closed:
            box.find_element("css selector", ":scope > summary").click()
    except StaleElementReferenceException:
        return False
    return not closed


def test_a_hostile_record_renders_as_text_on_the_trajectory_page(viewer: Viewer) -> None:
    viewer.store(hostile(SID))
    viewer.login()
    viewer.open(f"/ui/trajectories/{SID}")
    viewer.wait(lambda: len(viewer.css("#timeline .step")) == 15, what="the steps")
    viewer.wait(lambda: viewer.css("#changes details.change"), what="the final diff")
    expand_everything(viewer)
    text = viewer.text("main")
    for payload in PAYLOADS:  # shown, as the characters they are
        assert text.count(payload) >= 10, payload
    outputs = " ".join(p.text for p in viewer.css("pre.term"))
    assert all(p in outputs for p in PAYLOADS) and "\x1b" not in outputs
    assert "/tmp/" + PAYLOADS[0] in viewer.text("#timeline")  # the file name
    assert PAYLOADS[1] in viewer.text("#infra-faults") and PAYLOADS[2] in viewer.text("#meta")
    # A file's text and its diff: every payload a line of text in a cell, all 80 lines there.
    listing = [c.get_attribute("textContent") for c in viewer.css("#timeline table.listing td.src")]
    assert listing == BEFORE.splitlines()
    added = [c.get_attribute("textContent") for c in viewer.css("#timeline table.diff tr.add td.src")]
    assert added == ["+" + PAYLOADS[3] + " 3 " + HOSTILE, "+" + PAYLOADS[2] + " seventy"]
    # The final diff: paths, statuses, reasons, the diff and the grader's id, all text.
    changes = viewer.text("#changes")
    assert all(p in changes for p in PAYLOADS) and "symlink → " + PAYLOADS[0] in changes
    dropped = viewer.css("#changes details.change.dropped summary")[0]
    for part in (".badge.status", ".path", ".why"):
        assert dropped.find_element("css selector", part).get_attribute("textContent") == HOSTILE, part
    grader = viewer.css("#changes a.grader")[0].get_attribute("href") or ""
    assert grader.startswith(viewer.router.url + "/ui/trajectories/%3Cscript%3E")
    fold = viewer.css("#timeline details.phase.grading > summary")[0].get_attribute("textContent") or ""
    assert fold.startswith("Grading · 3 steps · " + HOSTILE[:200] + " · result " + HOSTILE[:200])
    viewer.snap("hostile")
    assert_nothing_ran(viewer)


def test_a_hostile_record_renders_as_text_in_search_and_comparison(viewer: Viewer) -> None:
    viewer.store(hostile(SID), episode("sb-hostile00000002", task="hostile-task"))
    viewer.login()
    viewer.open("/ui/trajectories?task_id=hostile-task")
    row = viewer.wait(lambda: viewer.css(f'tr[data-id="{SID}"]'), what="the hostile row")[0]
    assert PAYLOADS[0] in row.text and PAYLOADS[1] in row.text
    assert_nothing_ran(viewer)
    viewer.open(f"/ui/compare?a={SID}&b=sb-hostile00000002")
    viewer.wait(lambda: len(viewer.css("#aligned tbody tr.pair")) >= 10, what="the aligned steps")
    expand_everything(viewer)
    assert PAYLOADS[3] in viewer.text("#side-a")
    assert_nothing_ran(viewer)
    # Ids in URLs are data too: a payload there is only a sandbox that does not exist.
    viewer.open("/ui/trajectories/%22%3E%3Cimg%20src%3Dx%20onerror%3D%22window.__pwned%3D9%22%3E")
    viewer.wait(lambda: "not a sandbox id" in viewer.text("#error"), what="the error")
    assert_nothing_ran(viewer)


def test_hostile_output_of_a_live_sandbox_renders_as_text(viewer: Viewer, grove: Grove) -> None:
    viewer.login()
    sandbox = grove.create(heartbeat=False)
    payload = PAYLOADS[1]
    sandbox.exec(["printf", "%s\\n", payload, HOSTILE])
    sandbox.exec(["sh", "-c", f"echo {PAYLOADS[0]!r} >&2; exit 3"])
    viewer.open(f"/ui/sandboxes/{sandbox.id}")
    viewer.wait(lambda: len(viewer.css("#timeline .step.exec")) == 2, what="both steps")
    expand_everything(viewer)
    outputs = [p.text for p in viewer.css("pre.term")]
    assert payload in outputs[0] and PAYLOADS[0] in outputs[1], outputs
    assert_nothing_ran(viewer)


def test_a_hostile_run_renders_as_text_in_the_run_list_and_its_page(viewer: Viewer, tmp_path: Path) -> None:
    # A run's files are a runner's upload: harness, model and task names are whatever the task set said.
    run = open_run(tmp_path, {"variants": [[HOSTILE, HOSTILE]]})
    results = [{"run_id": run["run_id"], "variant": 0, "task": HOSTILE, "attempt": a, "group_id": HOSTILE,
                "outcome": "pass" if a else "fail", "reward": float(a), "harness": HOSTILE, "harness_version": HOSTILE,
                "model": HOSTILE, "tries": 1, "infra_errors": [HOSTILE], "trajectory_id": HOSTILE} for a in (0, 1)]
    files = {"run.json": (tmp_path / "run.json").read_bytes(),
             "summary.json": json.dumps(summarize(run, results)).encode(),
             "groups.jsonl": "".join(json.dumps(g) + "\n" for g in groups_of(results)).encode()}
    for name, data in files.items():
        viewer.put_object(f"runs/{run['run_id']}/{name}", data)
    viewer.login()
    viewer.open("/ui/runs")
    row = viewer.wait(lambda: viewer.css(f'#runs tr[data-id="{run["run_id"]}"]'), what="the run")[0]
    assert row.find_element("css selector", ".models").text == HOSTILE[:200]
    assert_nothing_ran(viewer)
    row.find_element("css selector", "a").click()
    viewer.wait(lambda: viewer.css("#groups tbody tr"), what="the run's groups")
    label = viewer.css("#tasks thead th")[1].get_attribute("textContent")
    assert label == HOSTILE + " " + HOSTILE + " · " + HOSTILE
    assert PAYLOADS[0] in viewer.text("#groups") and PAYLOADS[3] in viewer.text("#faults")
    assert_nothing_ran(viewer)
