"""Computer use through a real router into a real sandbox: a real Xvfb and a real Chromium inside it, driven
with both vendors' action vocabularies; every action a step of the record, its screenshot stored once."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from grove.client import Sandbox
from grove.errors import Invalid, NoDisplay
from tests.conftest import short_tempdir
from tests.support.gui_site import URL, box, centre, fresh_page, site_sandbox, site_state, wait_state
from tests.support.imagetools import make_busybox_rootfs
from tests.support.router_fixtures import RouterProcess, cgroup_procs, error_of, wait_for

GREEN = (0, 160, 0)


@pytest.fixture(scope="module")
def desk(router: RouterProcess) -> Iterator[Sandbox]:
    """A sandbox with the test site served and Chromium showing it."""
    with site_sandbox(router, desktop={"width": 1280, "height": 800}) as sandbox:
        yield sandbox


@pytest.fixture
def page(desk: Sandbox) -> Sandbox:
    """The site's page, freshly loaded (its state file emptied first)."""
    return fresh_page(desk)


def pixel(png: bytes, x: int, y: int) -> tuple[int, int, int]:
    """One pixel of a screenshot."""
    with Image.open(io.BytesIO(png)) as image:
        found = image.convert("RGB").getpixel((x, y))
    assert isinstance(found, tuple)
    return (int(found[0]), int(found[1]), int(found[2]))


def steps(router: RouterProcess, sandbox: Sandbox) -> list[dict[str, Any]]:
    """The computer steps of the sandbox's live trajectory."""
    trajectory = router.http("GET", f"/v1/sandboxes/{sandbox.id}/trajectory").json()
    return [s for s in trajectory["steps"] if s["type"] == "computer"]


def test_a_click_changes_the_page_seen_in_the_screenshot_and_the_sites_state(page: Sandbox) -> None:
    x, y = centre(page, "go")
    before = page.computer.screenshot()
    assert (before.width, before.height) == (1280, 800) and before.png.startswith(b"\x89PNG")
    assert pixel(before.png, x, y + 50) != GREEN  # below the button: the page's white
    after = page.computer.click(x, y)
    assert wait_state(page, "click")["id"] == "go"
    assert after.sha256 != before.sha256 and after.cursor == (x, y)
    assert after.settle["settled"] is True and 0 <= after.settle["waited_ms"] <= after.settle["cap_ms"] + 500
    assert pixel(after.png, x, y + 80) == GREEN  # the page turned green, in the very next screenshot


def test_acting_where_the_pointer_already_is_takes_no_longer(page: Sandbox) -> None:
    """xdotool's ``mousemove --sync`` to where the pointer already is waits ~15 s: grove never uses it."""
    first = page.computer.act({"action": "left_click", "coordinate": [700, 600], "settle": {"quiet_ms": 0}})
    again = page.computer.act({"action": "left_click", "coordinate": [700, 600], "settle": {"quiet_ms": 0}})
    moved = page.computer.act({"type": "drag", "path": [{"x": 700, "y": 600}, {"x": 720, "y": 600}],
                               "settle": {"quiet_ms": 0}})
    assert max(first.settle["waited_ms"], again.settle["waited_ms"], moved.settle["waited_ms"]) < 3000


def test_typing_fills_a_field_and_key_combinations_work(page: Sandbox) -> None:
    page.computer.click(*centre(page, "name"))
    page.computer.type("héllo grove")
    page.computer.key("ctrl+a")  # select it all, then replace it
    page.computer.type("Ada <b>Lovelace</b>")
    page.computer.key("Return")
    assert wait_state(page, "submit")["name"] == "Ada <b>Lovelace</b>"
    # OpenAI's vocabulary on the same page: select all with a chord, type, submit.
    page.computer.act({"type": "keypress", "keys": ["CTRL", "A"]})
    page.computer.act({"type": "type", "text": "Grace"})
    page.computer.act({"type": "keypress", "keys": ["ENTER"]})
    assert wait_state(page, "submit")["name"] == "Grace"


def test_scrolling_moves_the_page_in_both_vocabularies(page: Sandbox) -> None:
    page.computer.scroll(640, 500, "down", 5)
    first = wait_state(page, "scroll")["y"]
    assert first > 100
    page.computer.act({"type": "scroll", "x": 640, "y": 500, "scroll_x": 0, "scroll_y": 1000})
    assert wait_state(page, "scroll")["y"] > first
    page.computer.scroll(640, 500, "up", 50)
    assert wait_state(page, "scroll")["y"] == 0


def test_a_drag_moves_a_slider(page: Sandbox) -> None:
    x, y, w, h = box(page, "level")
    page.computer.drag((x + 4, y + h // 2), (x + w * 3 // 4, y + h // 2))
    value = wait_state(page, "slider")["value"]
    assert 60 <= value <= 90, value
    # OpenAI's drag: a path, back to the start.
    page.computer.act({"type": "drag", "path": [{"x": x + w * 3 // 4, "y": y + h // 2}, {"x": x + 2, "y": y + h // 2}]})
    assert [e["value"] for e in site_state(page) if e.get("event") == "slider"][-1] <= 5


def test_every_action_is_a_step_with_its_screenshot_stored_once(router: RouterProcess, page: Sandbox) -> None:
    known = len(steps(router, page))
    shots = [page.computer.screenshot(), page.computer.screenshot(), page.computer.move(300, 300)]
    recorded = steps(router, page)[known:]
    assert [s["action"] for s in recorded] == ["screenshot", "screenshot", "mouse_move"]
    for step, shot in zip(recorded, shots, strict=True):
        assert step["screenshot"]["sha256"] == shot.sha256 == hashlib.sha256(shot.png).hexdigest()
        assert step["screenshot"]["stored"] is True and step["screenshot"]["bytes"] == len(shot.png)
        assert step["protocol"] == "anthropic" and step["schema"] == "computer_20250124"
    assert recorded[2]["args"] == {"coordinate": [300, 300]} and recorded[2]["cursor"] == [300, 300]
    assert shots[0].sha256 == shots[1].sha256  # an unchanged screen: one image
    # The exact image the model was given, from storage, and a thumbnail beside it.
    stored = router.http("GET", f"/v1/screenshots/{shots[2].sha256}")
    assert stored.status == 200 and stored.body == shots[2].png
    thumb = router.http("GET", f"/v1/screenshots/{shots[2].sha256}?thumb=1")
    assert thumb.status == 200
    with Image.open(io.BytesIO(thumb.body)) as small:
        assert small.size == (320, 200)
    assert router.http("GET", "/v1/screenshots/" + "0" * 64).status == 404


def test_zoom_enlarges_a_region_in_the_later_schema_only(page: Sandbox) -> None:
    zoomed = page.computer.zoom(100, 100, 420, 300)  # 320x200: enlarged 4x to fill the 1280x800 screen
    assert (zoomed.width, zoomed.height) == (1280, 800)
    with pytest.raises(Invalid, match="zoom came with computer_20251124"):
        page.computer.act({"action": "zoom", "region": [0, 0, 10, 10]})


@pytest.mark.parametrize(("body", "words"), [
    ({"action": "left_click", "coordinate": [1280, 10]}, "outside the 1280x800 screen"),
    ({"action": "left_click", "coordinate": [-1, 10]}, "outside the 1280x800 screen"),
    ({"type": "click", "button": "left", "x": 10, "y": 800}, "outside the 1280x800 screen"),
    ({"action": "key", "text": "ctrl+Bogus"}, "unknown key 'Bogus'"),
    ({"type": "keypress", "keys": ["CTRL", "NOPE"]}, "unknown key 'NOPE'"),
    ({"action": "left_click", "type": "click"}, "not both"),
    ({"action": "teleport"}, "'teleport' is not an action of computer_20250124"),
    ({"action": "left_click", "coord": [1, 1]}, "does not take 'coord'"),
    ({"action": "scroll", "coordinate": [5, 5], "scroll_direction": "sideways", "scroll_amount": 1},
     "scroll_direction"),
    ({"type": "click", "button": "thumb", "x": 1, "y": 1}, "'button' must be one of"),
    ({"action": "screenshot", "schema": "computer_1999"}, "not a computer-use tool version"),
    ({}, "needs 'action'"),
])
def test_bad_actions_are_clear_422s_recorded_and_press_nothing(router: RouterProcess, desk: Sandbox,
                                                                body: dict[str, Any], words: str) -> None:
    reply = router.http("POST", f"/v1/sandboxes/{desk.id}/computer", json_body=body)
    assert reply.status == 422, reply.body[:300]
    err = error_of(reply)
    assert err["code"] == "invalid" and words in err["message"], err
    last = steps(router, desk)[-1]
    assert last["error"] == err and last["status"] == 422


def test_an_image_without_a_display_says_how_to_get_one(router: RouterProcess) -> None:
    with short_tempdir() as tmp:
        rootfs = make_busybox_rootfs(Path(tmp) / "rootfs")
        done = router.cli("image", "import", "no-screen", str(rootfs))
        assert done.returncode == 0, done.stderr
    try:
        with router.client() as client:
            sandbox = client.create("no-screen", heartbeat=False)
            try:
                with pytest.raises(NoDisplay, match="--preset desktop"):
                    sandbox.computer.screenshot()
                assert sandbox.exec("echo still here").stdout == b"still here\n"
            finally:
                sandbox.close()
            # Asked for at create, the screen's absence fails the create itself, with the same words.
            with pytest.raises(Invalid, match="no display"):
                client.create("no-screen", heartbeat=False, desktop={"start": True})
    finally:
        router.cli("image", "rm", "no-screen")


HOSTILE = """<!doctype html><html><body><script>
const targets = %s;
async function probe(url) {
  try {
    const reply = await fetch(url, {mode: 'no-cors', signal: AbortSignal.timeout(4000)});
    return 'reached (' + reply.type + ')';
  } catch (e) { return 'blocked: ' + e.name; }
}
(async () => {
  const results = {};
  for (const url of targets) results[url] = await probe(url);
  navigator.sendBeacon('/state', JSON.stringify({event: 'hostile', results: results}));
})();
</script></body></html>"""


def test_a_hostile_page_reaches_nothing_outside_its_sandbox(router: RouterProcess, desk: Sandbox,
                                                            s3_server: Any) -> None:
    """The page runs in Chromium inside the sandbox: the router's port, the host's addresses, object storage and
    the metadata address are all out of its reach (the sandbox's own loopback is not the host's), and every
    process of the screen is in the sandbox's cgroup."""
    host_ips = sorted({a for a in subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split()
                       if ":" not in a})
    targets = [f"http://127.0.0.1:{router.port}/healthz", s3_server.endpoint + "/",
               "http://169.254.169.254/latest/meta-data/", *(f"http://{ip}:{router.port}/healthz" for ip in host_ips)]
    desk.write_file("/workspace/site/hostile.html", HOSTILE % json.dumps(targets))
    desk.computer.start(browser=URL + "hostile.html")
    results = wait_state(desk, "hostile", timeout=30)["results"]
    assert set(results) == set(targets)
    assert all(r.startswith("blocked") for r in results.values()), results
    # Xvfb, the window manager and Chromium run in the sandbox, counted against its limits.
    procs = cgroup_procs(router.state_dir, desk.id)
    names = {Path(f"/proc/{pid}/comm").read_text().strip() for pid in procs if Path(f"/proc/{pid}/comm").exists()}
    assert {"Xvfb", "chromium"} <= names, names
    sockets = desk.exec("ls /tmp/.X11-unix").stdout.decode().split()
    assert sockets == ["X99"], sockets  # its own display only: no host X server to reach


def test_a_warm_pool_keeps_desktops_with_the_browser_up(router: RouterProcess) -> None:
    """A member is ready only once its screen and browser are: a claim's first screenshot is the page, at once."""
    page = "data:text/html,<body style='background:rgb(0,160,0)'><h1>pooled</h1></body>"
    desktop = {"width": 1024, "height": 768, "browser": page, "start": True}
    made = router.http("POST", "/v1/pools", json_body={"name": "desktops", "size": 1, "desktop": desktop,
                                                      "resources": {"memory_mb": 2048}})
    assert made.status == 201, made.body[:300]
    try:
        wait_for(lambda: router.http("GET", "/v1/pools/desktops").json()["ready"] == 1, 90, what="a ready desktop")
        with router.client() as client:
            sandbox = client.create(pool="desktops", heartbeat=False)
            try:
                shown = router.http("GET", "/v1/pools/desktops").json()
                assert (shown["claims"], shown["misses"], shown["desktop"]) == (1, 0, {**desktop, "quiet_ms": 250,
                                                                                     "cap_ms": 3000}), shown
                status = sandbox.computer.status()
                assert status["display"] == ":99" and status["browser"] is True, status
                shot = sandbox.computer.screenshot()
                assert (shot.width, shot.height) == (1024, 768)
                assert pixel(shot.png, 512, 700) == GREEN  # the page, painted before the claim
            finally:
                sandbox.close()
    finally:
        router.http("DELETE", "/v1/pools/desktops")
