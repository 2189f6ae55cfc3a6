"""``grove image build-debian``'s checks before it runs mmdebstrap, and what a preset includes.

A real build takes 20 s with a nearby mirror and minutes without one (3 min 40 s measured here), too
slow for the suite: the build itself was verified by hand (``grove image build-debian deb --packages
hello``: 97 packages recorded with their versions); the sandbox tests use busybox-based images. The
desktop preset's real build, with a computer action in it, is ``test_debian_desktop.py`` (opt-in: ``slow``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from grove.core.errors import Invalid
from router.backends.local.debian import (
    INTERPRETER_PATH,
    PRESETS,
    build_debian,
    host_mirror,
    preset_packages,
    preset_setup,
)
from router.backends.local.images import ImageStore

pytestmark = pytest.mark.fast


@pytest.mark.parametrize(("packages", "suite", "mirror", "message"), [
    (["python3", "Bad_Name"], "bookworm", None, "invalid Debian package name 'Bad_Name'"),
    (["git;rm"], "bookworm", None, "invalid Debian package name"),
    (["git"], "../etc", None, "invalid Debian suite"),
    (["git"], "bookworm", "file:///etc", "invalid mirror URL"),
    (["git"], "bookworm", "http://x y", "invalid mirror URL"),
])
def test_bad_input_is_refused_before_building(
    tmp_path: Path, packages: list[str], suite: str, mirror: str | None, message: str
) -> None:
    store = ImageStore(tmp_path / "images")
    with pytest.raises(Invalid, match=message):
        build_debian(store, "deb", packages, suite=suite, mirror=mirror)
    assert store.list() == [] and not list(store.root.glob(".debian-*"))


def test_an_unknown_preset_is_refused_before_building(tmp_path: Path) -> None:
    store = ImageStore(tmp_path / "images")
    with pytest.raises(Invalid, match="unknown preset 'gnome': minbase, desktop"):
        build_debian(store, "deb", [], preset="gnome")
    assert store.list() == [] and not list(store.root.glob(".debian-*"))


def test_a_preset_is_a_base_the_requested_packages_add_to() -> None:
    assert preset_packages("minbase", ["python3", "git"]) == ["python3", "git"]
    # The desktop: what the executor drives a screen with, each package once however often it is asked for.
    desktop = preset_packages("desktop", ["python3", "chromium"])
    assert desktop == [*PRESETS["desktop"], "python3"]
    assert {"xvfb", "xdotool", "matchbox-window-manager", "chromium", "fonts-dejavu-core"} <= set(desktop)


def test_the_mirror_is_the_hosts_own() -> None:
    mirror = host_mirror()
    assert mirror.startswith(("http://", "https://")) and "security" not in mirror


def test_the_code_interpreter_preset_carries_the_server_and_says_how_to_start_it() -> None:
    setup = preset_setup("code-interpreter")
    [(source, target)] = setup.files.items()
    assert target == INTERPRETER_PATH and Path(source).name == "e2b_interpreter.py"
    assert "def make_app" in Path(source).read_text()  # grove's own server, from this checkout
    assert setup.config["Cmd"] == ["python3", INTERPRETER_PATH, "49999"] and "49999/tcp" in setup.config["ExposedPorts"]
    assert {"python3-jupyter-client", "python3-ipykernel", "python3-aiohttp"} <= set(PRESETS["code-interpreter"])
    assert preset_setup("desktop").files == {} and preset_setup("minbase").config == {}
