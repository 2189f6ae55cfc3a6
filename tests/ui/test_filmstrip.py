"""The viewer's screens in a real browser: a GUI trajectory made here by grove's own code (a real sandbox, its
Chromium on its own display, driven through the router) shows as a filmstrip, with each step's click point,
drag path and typed text; a live sandbox's screen follows its actions; another project sees none of it.

The module's tests share one GUI sandbox and run in file order: the last one deletes it and reads its
trajectory back from S3.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from grove.client import Sandbox
from grove.client.computer import Screen
from tests.support.router_fixtures import RouterProcess, error_of, wait_for
from tests.ui.conftest import Viewer

TYPED = '<b>bold</b> & <img src=x onerror="window.__pwned=1">'
"""Typed into the page's input: the viewer must show it as these characters, never as markup."""
CLICK = (640, 520)
DRAG = ((200, 300), (420, 460))
PAGE = ("<title>grove filmstrip</title><body style='margin:0;height:100vh' onclick=\"document.body.style.background"
        "=['rgb(0,160,0)','rgb(0,0,160)'][(window.n=(window.n||0)+1)%2]\"><input id=q autofocus "
        "style='font-size:24px;width:900px'></body>")
"""A page whose every click turns it another colour (a screen that changes on demand) with a focused input."""


@dataclass
class Gui:
    """The module's GUI sandbox and the screen after each of its actions (by step index)."""

    sandbox: Sandbox
    screens: dict[int, Screen]
    refused: int
    """The step of the action the router refused (a click off the screen)."""


def _steps(router: RouterProcess, sandbox_id: str) -> list[dict[str, Any]]:
    reply = router.http("GET", f"/v1/sandboxes/{sandbox_id}/trajectory")
    assert reply.status == 200, reply.body[:300]
    return list(reply.json()["steps"])


@pytest.fixture(scope="module")
def gui(router: RouterProcess) -> Iterator[Gui]:
    """A sandbox with Chromium on its screen, and a trajectory of clicks, typing, keys, a drag, a scroll and a
    refused click, made through the SDK."""
    with router.client() as client:
        sandbox = client.create(heartbeat=False, memory_mb=2048, metadata={"task_id": "gui-task"})
        try:
            sandbox.computer.start(browser="data:text/html," + urllib.parse.quote(PAGE))
            screens: dict[int, Screen] = {}

            def act(do: Any) -> None:
                screen = do()
                screens[len(_steps(router, sandbox.id)) - 1] = screen

            act(sandbox.computer.screenshot)
            act(lambda: sandbox.computer.type(TYPED))
            act(lambda: sandbox.computer.key("ctrl+a"))
            act(lambda: sandbox.computer.click(*CLICK))
            act(lambda: sandbox.computer.drag(*DRAG))
            act(lambda: sandbox.computer.act({"type": "scroll", "x": 600, "y": 400, "scroll_x": 0, "scroll_y": 120}))
            bad = router.http("POST", f"/v1/sandboxes/{sandbox.id}/computer",
                              json_body={"action": "left_click", "coordinate": [99999, 5]})
            assert bad.status == 422, bad.body[:300]
            yield Gui(sandbox, screens, len(_steps(router, sandbox.id)) - 1)
        finally:
            sandbox.close()


def _marker(viewer: Viewer) -> dict[str, Any]:
    """The selected frame's marker: its SVG attributes, and its centre and the image's box on the page."""
    return dict(viewer.browser.execute_script("""
        const m = document.getElementById("frame-marker"), img = document.getElementById("frame-image");
        if (!m || !img || !img.complete || !img.naturalWidth) return null;
        const r = m.getBoundingClientRect(), b = img.getBoundingClientRect();
        return {cx: Number(m.getAttribute("cx")), cy: Number(m.getAttribute("cy")), x: r.left + r.width / 2,
                y: r.top + r.height / 2, left: b.left, top: b.top, width: b.width, height: b.height,
                natural: [img.naturalWidth, img.naturalHeight]};
    """) or {})


def _select(viewer: Viewer, step: int) -> None:
    viewer.css(f'#strip button.frame[data-i="{step}"]')[0].click()
    viewer.wait(lambda: viewer.css(f'#frame-view[data-i="{step}"]'), what=f"step {step} shown whole")


def test_the_filmstrip_shows_each_computer_step_with_its_marks(viewer: Viewer, gui: Gui) -> None:
    viewer.login()
    viewer.open(f"/ui/trajectories/{gui.sandbox.id}")
    computer = [i for i, s in enumerate(_steps(viewer.router, gui.sandbox.id)) if s["type"] == "computer"]
    assert computer == [*sorted(gui.screens), gui.refused]
    frames = viewer.wait(lambda: len(viewer.css("#strip button.frame")) == len(computer) and viewer.css(
        "#strip button.frame"), what="one thumbnail per computer step")
    assert [int(f.get_attribute("data-i")) for f in frames] == computer
    viewer.wait(lambda: all(viewer.browser.execute_script("return arguments[0].naturalWidth", img) > 0
                            for img in viewer.css("#strip img.thumb")), what="the thumbnails")
    assert len(viewer.css("#strip img.thumb")) == len(gui.screens)  # the refused click has no screen

    click = next(i for i, s in gui.screens.items() if s.cursor == CLICK)
    _select(viewer, click)
    found = viewer.wait(lambda: _marker(viewer), what="the click's marker over its screen")
    assert (found["cx"], found["cy"]) == CLICK and found["natural"] == [1280, 800]
    scale = found["width"] / 1280
    assert abs(found["x"] - (found["left"] + CLICK[0] * scale)) < 1.5, found
    assert abs(found["y"] - (found["top"] + CLICK[1] * scale)) < 1.5, found
    assert "left_click" in viewer.text("#frame-caption") and "at (640, 520)" in viewer.text("#frame-caption")
    shown = viewer.css("#frame-image")[0].get_attribute("src")
    assert shown.endswith(f"/screenshots/{gui.screens[click].sha256}")
    viewer.snap("filmstrip")

    drag = next(i for i, s in gui.screens.items() if s.cursor == DRAG[1] and i > click)
    _select(viewer, drag)
    path = viewer.wait(lambda: viewer.css("#frame-path"), what="the drag's path")[0]
    assert path.get_attribute("points") == "200,300 420,460"
    assert "from (200, 300) to (420, 460)" in viewer.text("#frame-caption")

    shot = min(gui.screens)  # the first screenshot; then the typing, then ctrl+a
    _select(viewer, shot + 1)
    caption = viewer.css("#frame-caption .typed .value")[0]
    assert caption.text == TYPED  # the characters, as typed
    assert not viewer.css("#frame-caption b, #frame-caption img, #timeline .caption img")
    _select(viewer, shot + 2)
    assert viewer.css("#frame-caption .keys .value")[0].text == "ctrl+a"

    _select(viewer, gui.refused)
    assert not viewer.css("#frame-image") and "failed" in viewer.text("#frame-view")
    assert "outside the 1280x800 screen" in viewer.text("#frame-caption")
    # The timeline below has the same steps, each with its caption and thumbnail, which selects it above.
    viewer.css(f'#timeline .step.computer[data-i="{drag}"] img.row-thumb')[0].click()
    viewer.wait(lambda: viewer.css(f'#frame-view[data-i="{drag}"]'), what="the row's step in the filmstrip")
    # Nothing of what was typed ran.
    assert TYPED in viewer.text("#timeline")
    assert viewer.browser.execute_script("return window.__pwned === undefined")
    assert not viewer.console_problems()


def test_the_live_screen_follows_the_sandboxs_actions(viewer: Viewer, gui: Gui) -> None:
    viewer.login()
    before = len(_steps(viewer.router, gui.sandbox.id))
    viewer.open(f"/ui/sandboxes/{gui.sandbox.id}")
    first = viewer.wait(lambda: viewer.css("#live-screen[data-sha]"), what="the live screen")[0].get_attribute(
        "data-sha")
    screen = gui.sandbox.computer.click(*CLICK)  # the page turns another colour
    assert screen.sha256 != first
    viewer.wait(lambda: viewer.css("#live-screen")[0].get_attribute("data-sha") == screen.sha256, timeout=10,
                what="the live screen after the click")
    assert viewer.browser.execute_script("return document.getElementById('live-screen').naturalWidth") == 1280
    viewer.snap("live-screen")
    # Watching recorded nothing: the one new step is the click.
    assert len(_steps(viewer.router, gui.sandbox.id)) == before + 1
    assert not viewer.console_problems()


def test_looking_starts_no_screen_and_wakes_no_sandbox(viewer: Viewer, router: RouterProcess) -> None:
    session = viewer.session()
    with router.client() as client:
        plain = client.create(heartbeat=False)
        sleepy = client.create(heartbeat=False, idle_timeout_s=2)
        try:
            reply = viewer.get(f"/ui/api/sandboxes/{plain.id}/screen", session)
            assert reply.status == 409 and "no screen running" in error_of(reply)["message"], reply.body
            assert plain.computer.status()["display"] is None
            assert not [s for s in _steps(router, plain.id) if s["type"] in ("computer", "display")]

            sleepy.computer.screenshot()
            # Looks do not keep it awake: it falls asleep on time while the viewer keeps looking.
            wait_for(lambda: viewer.get(f"/ui/api/sandboxes/{sleepy.id}/screen", session).status == 409, 30,
                     interval=0.5, what="the watched sandbox asleep")
            reply = viewer.get(f"/ui/api/sandboxes/{sleepy.id}/screen", session)
            assert reply.status == 409 and "asleep" in error_of(reply)["message"], reply.body
            assert viewer.get(f"/ui/api/sandboxes/{sleepy.id}", session).json()["sandbox"]["status"] == "idle"
            assert [s["type"] for s in _steps(router, sleepy.id) if s["type"] == "computer"] == ["computer"]
        finally:
            plain.close()
            sleepy.close()


def test_another_project_gets_what_an_unknown_id_gets(viewer: Viewer, router: RouterProcess, gui: Gui) -> None:
    added = router.cli("key", "add", "filmstrip-other", "--project", "filmstrip-other")
    assert added.returncode == 0, added.stderr
    other_key = added.stdout.decode().strip()
    wait_for(lambda: router.http("GET", "/v1/sandboxes", key=other_key).status == 200, 5, what="the new key")
    mine, theirs = viewer.session(), viewer.session(other_key)
    sid, sha = gui.sandbox.id, gui.screens[min(gui.screens)].sha256
    unknown = "sb-0123456789abcdef"
    for tail in (f"/screenshots/{sha}", f"/screenshots/{sha}?thumb=1", "/filmstrip"):
        assert viewer.get(f"/ui/api/trajectories/{sid}{tail}", mine).status == 200, tail
        got, never = (viewer.get(f"/ui/api/trajectories/{s}{tail}", theirs) for s in (sid, unknown))
        assert got.status == 404 and got.body == never.body.replace(unknown.encode(), sid.encode()), tail
    got, never = (viewer.get(f"/ui/api/sandboxes/{s}/screen", theirs) for s in (sid, unknown))
    assert got.status == 404 and got.body == never.body.replace(unknown.encode(), sid.encode())
    assert router.http("GET", f"/v1/screenshots/{sha}", key=other_key).status == 404
    assert router.http("GET", f"/v1/screenshots/{sha}").status == 200
    # The owner gets an image only as its trajectory's: a hash none of its steps names is a 404 too.
    assert viewer.get(f"/ui/api/trajectories/{sid}/screenshots/{'0' * 64}", mine).status == 404
    assert viewer.get(f"/ui/api/trajectories/{sid}/screenshots/..%2Fx", mine).status == 404


def test_a_stored_trajectory_keeps_its_filmstrip(viewer: Viewer, router: RouterProcess, gui: Gui) -> None:
    sid = gui.sandbox.id
    count = len([s for s in _steps(router, sid) if s["type"] == "computer"])
    gui.sandbox.close()
    wait_for(lambda: router.http("GET", f"/v1/trajectories/{sid}").status == 200, 30, what="the stored record")
    viewer.login()
    viewer.open(f"/ui/trajectories/{sid}")
    viewer.wait(lambda: len(viewer.css("#strip button.frame")) == count, what="the stored filmstrip")
    viewer.wait(lambda: all(viewer.browser.execute_script("return arguments[0].naturalWidth", img) > 0
                            for img in viewer.css("#strip img.thumb")), what="the stored thumbnails")
    click = next(i for i, s in gui.screens.items() if s.cursor == CLICK)
    _select(viewer, click)
    found = viewer.wait(lambda: _marker(viewer), what="the stored click's marker")
    assert (found["cx"], found["cy"]) == CLICK
    assert not viewer.console_problems()
