"""What a sandbox or harness wrote never runs in the viewer: a record full of script, markup and
``javascript:`` payloads renders as text on every page, and nothing of it executes."""

from __future__ import annotations

import pytest

from grove.client import Grove
from tests.ui.conftest import Viewer
from tests.ui.samples import HOSTILE, PAYLOADS, episode, hostile

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
    """Open every output and every clipped step."""
    for summary in viewer.css("#timeline details summary, #aligned details summary"):
        summary.click()
    viewer.wait(lambda: not [p for p in viewer.css("pre.term") if p.text == "loading…"], what="the outputs")
    for button in viewer.css("button.whole"):
        button.click()
    viewer.wait(lambda: not viewer.css("button.whole"), what="the whole steps")


def test_a_hostile_record_renders_as_text_on_the_trajectory_page(viewer: Viewer) -> None:
    viewer.store(hostile(SID))
    viewer.login()
    viewer.open(f"/ui/trajectories/{SID}")
    viewer.wait(lambda: len(viewer.css("#timeline .step")) == 10, what="the steps")
    expand_everything(viewer)
    text = viewer.text("main")
    for payload in PAYLOADS:  # shown, as the characters they are
        assert text.count(payload) >= 10, payload
    outputs = " ".join(p.text for p in viewer.css("pre.term"))
    assert all(p in outputs for p in PAYLOADS) and "\x1b" not in outputs
    assert "/tmp/" + PAYLOADS[0] in viewer.text("#timeline")  # the file name
    assert PAYLOADS[1] in viewer.text("#infra-faults") and PAYLOADS[2] in viewer.text("#meta")
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
    viewer.wait(lambda: len(viewer.css("#aligned tbody tr")) >= 10, what="the aligned steps")
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
