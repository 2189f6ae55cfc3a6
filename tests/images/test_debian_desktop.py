"""``grove image build-debian NAME --preset desktop`` for real: Debian's own packages, a sandbox of the image, and a
computer action in it (Chromium showing a page, a click seen in the next screenshot).

Opt-in (``slow``: ``--run-slow`` or ``make test-slow``): the build fetches ~280 packages from Debian's mirror
(70 s to two minutes measured here with deb.debian.org, the whole test 2 min 10 s; longer without a nearby
mirror), and no other test of the suite needs the network.
"""

from __future__ import annotations

import io
import json
import time
import urllib.parse

import pytest
from PIL import Image

from grove.client import Sandbox
from grove.statedir import StateDir
from tests.support.router_fixtures import RouterProcess

pytestmark = [pytest.mark.slow, pytest.mark.local_only]

GREEN = (0, 160, 0)
WHITE = (255, 255, 255)
# A button at a fixed place of the page; clicked, the page turns green.
PAGE = "data:text/html," + urllib.parse.quote(
    "<body style='margin:0;background:#fff'><button style='position:absolute;left:100px;top:100px;width:300px;"
    "height:150px;font-size:24px' onclick=\"document.body.style.background='rgb(0,160,0)'\">Go</button></body>")


def pixel(png: bytes, x: int, y: int) -> tuple[int, int, int]:
    """One pixel of a screenshot."""
    with Image.open(io.BytesIO(png)) as image:
        found = image.convert("RGB").getpixel((x, y))
    assert isinstance(found, tuple)
    return (int(found[0]), int(found[1]), int(found[2]))


def screen_shows(sandbox: Sandbox, colour: tuple[int, int, int], timeout: float = 30.0) -> None:
    """Wait until the page's lower part (below the browser's toolbar, away from the button) is ``colour``."""
    deadline = time.monotonic() + timeout
    while (seen := pixel(sandbox.computer.screenshot().png, 900, 600)) != colour:
        assert time.monotonic() < deadline, f"the screen shows {seen}, not {colour}"
        time.sleep(0.3)


def test_the_desktop_preset_builds_an_image_a_computer_action_works_in(router: RouterProcess) -> None:
    started = time.monotonic()
    done = router.cli("image", "build-debian", "desk", "--preset", "desktop", timeout=1800)
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert b"Debian bookworm (desktop) from" in done.stderr
    record = json.loads((StateDir(router.state_dir).images / "desk" / "image.json").read_text())
    assert record["source"] == "debian:bookworm (desktop)"
    installed = record["debian"]["packages"]
    assert record["debian"]["preset"] == "desktop" and record["debian"]["requested"] == []
    assert {"xvfb", "xdotool", "matchbox-window-manager", "chromium", "fonts-dejavu-core"} <= set(installed), took
    try:
        with router.client() as client:
            sandbox = client.create("desk", heartbeat=False, memory_mb=2048)
            try:
                status = sandbox.computer.start(browser=PAGE)
                assert status["browser"] is True and (status["width"], status["height"]) == (1280, 800)
                screen_shows(sandbox, WHITE)
                after = sandbox.computer.click(250, 260)  # the button: page y 175 under the toolbar's ~85 px
                assert after.cursor == (250, 260)
                screen_shows(sandbox, GREEN)
                names = sandbox.exec("cat /proc/[0-9]*/comm").stdout.decode().split("\n")
                assert {"Xvfb", "matchbox-window", "chromium"} <= set(names), names
            finally:
                sandbox.close()
    finally:
        router.cli("image", "rm", "desk")
