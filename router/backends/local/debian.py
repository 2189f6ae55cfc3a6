"""``grove image build-debian``: a real Debian image from Debian's own archive, no registry involved.

``mmdebstrap --variant=minbase --include=PKGS SUITE OUT.tar MIRROR`` builds the root filesystem (about
20 s and 200 MB with python3); a customize hook lists every installed package and its version, which
the image records in its ``image.json`` (``debian.packages``) so that a trajectory's image digest leads
to exactly what was installed. The tarball is then imported like any rootfs tarball (one layer).

A preset is a named package set the build starts from, ``--packages`` adding to it: ``minbase`` (nothing but
Debian's minimal base, the default), ``desktop`` (a screen for computer use: Xvfb, xdotool, a window manager
and Chromium, what :mod:`executor.computer` drives) and ``code-interpreter`` (grove's server of E2B's code
interpreter protocol, :mod:`grove.integrations.e2b_interpreter`, on Debian's ``jupyter_client``, ``ipykernel`` and
``aiohttp``; the image's ``Cmd`` starts it on port 49999 and its ``ExposedPorts`` says so: an E2B create of a
template of this image starts it and waits for the port, as E2B's ``code-interpreter-v1`` does).
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grove.core.errors import GroveError, Invalid
from router.backends.local.images import Image, ImageStore

_PACKAGE = re.compile(r"[a-z0-9][a-z0-9+.-]+")
_SUITE = re.compile(r"[a-z][a-z0-9-]{1,30}")
_DEFAULT_MIRROR = "http://deb.debian.org/debian"
_TIMEOUT_S = 1800
PRESETS: dict[str, tuple[str, ...]] = {
    "minbase": (),
    # What executor/computer/desktop.py runs: Xvfb (with xkbcomp and the keymaps xserver-common brings), xdotool,
    # matchbox as the window manager (a maximised window, no decorations), and Debian's Chromium with a font to
    # draw pages in. Recommends stay out (mmdebstrap's default): Chromium runs headful in Xvfb without them.
    # ca-certificates: the browser and a task's own tools reach https sites.
    "desktop": ("xvfb", "xdotool", "matchbox-window-manager", "chromium", "fonts-dejavu-core", "ca-certificates"),
    # What grove.integrations.e2b_interpreter imports (bookworm's aiohttp 3.8 serves it: no app keys used).
    "code-interpreter": ("python3-jupyter-client", "python3-ipykernel", "python3-aiohttp"),
}
"""The package sets a build can start from (``--preset``), by name."""
INTERPRETER_PATH = "/opt/grove/e2b_interpreter.py"
"""Where the ``code-interpreter`` preset puts grove's interpreter server in the image."""
INTERPRETER_PORT = 49999
"""The port it listens on: E2B's code interpreter SDK's."""


@dataclass(frozen=True)
class PresetSetup:
    """What a preset adds beyond packages: files copied in, and the image's OCI config."""

    files: dict[str, str] = field(default_factory=dict)
    """Host file → absolute path in the image."""
    config: dict[str, Any] = field(default_factory=dict)
    """The image config (``Cmd``, ``Env``, ``ExposedPorts``...) its ``image.json`` records."""


def _module_file(module: str) -> str:
    spec = importlib.util.find_spec(module)  # its path only: the router imports none of its libraries
    if spec is None or spec.origin is None:
        raise GroveError(f"{module} is not installed with this grove")
    return spec.origin


def preset_setup(preset: str) -> PresetSetup:
    """The files and config of ``preset`` (none for a packages-only preset)."""
    if preset != "code-interpreter":
        return PresetSetup()
    # Started on the interpreter's loopback: the port proxy reaches it there. PYDEVD_DISABLE_FILE_VALIDATION quiets
    # ipykernel's debugger warning on every kernel start.
    return PresetSetup(
        files={_module_file("grove.integrations.e2b_interpreter"): INTERPRETER_PATH},
        config={"Cmd": ["python3", INTERPRETER_PATH, str(INTERPRETER_PORT)],
                "Env": ["PYDEVD_DISABLE_FILE_VALIDATION=1"], "ExposedPorts": {f"{INTERPRETER_PORT}/tcp": {}}})


def build_debian(
    store: ImageStore, name: str, packages: list[str], *, suite: str = "bookworm", mirror: str | None = None,
    preset: str = "minbase",
) -> Image:
    """Build ``name`` from ``suite`` with the preset's packages and ``packages`` included (replacing an image of
    that name)."""
    if preset not in PRESETS:
        raise Invalid(f"unknown preset {preset!r}: {', '.join(PRESETS)}")
    for package in packages:
        if not _PACKAGE.fullmatch(package):
            raise Invalid(f"invalid Debian package name {package!r}")
    if not _SUITE.fullmatch(suite):
        raise Invalid(f"invalid Debian suite {suite!r} (e.g. bookworm)")
    mirror = mirror or host_mirror()
    if not re.fullmatch(r"https?://[^\s'\"]+", mirror):
        raise Invalid(f"invalid mirror URL {mirror!r}")
    with tempfile.TemporaryDirectory(prefix=".debian-", dir=store.root) as tmp:
        out, versions = Path(tmp) / "rootfs.tar", Path(tmp) / "versions"
        hook = f"chroot \"$1\" dpkg-query -W -f='${{Package}}\\t${{Version}}\\n' > {versions}"
        argv = ["mmdebstrap", "--variant=minbase", "--quiet", f"--customize-hook={hook}"]
        setup = preset_setup(preset)
        for source, target in setup.files.items():
            parent = target.rpartition("/")[0]
            # upload writes exactly ``target`` (copy-in would keep the source's own name in ``parent``).
            argv += [f"--customize-hook=mkdir -p \"$1{parent}\"",
                     f"--customize-hook=upload {shlex.quote(source)} {shlex.quote(target)}"]
        included = preset_packages(preset, packages)
        if included:
            argv.append(f"--include={','.join(included)}")
        argv += [suite, str(out), mirror]
        try:
            # stdin closed: mmdebstrap would read apt sources from a non-terminal stdin.
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=_TIMEOUT_S,
                                  check=False)
        except FileNotFoundError:
            raise GroveError("mmdebstrap is not installed: apt-get install -y mmdebstrap") from None
        if done.returncode != 0:
            tail = done.stderr.decode(errors="replace").strip().splitlines()[-5:]
            raise GroveError(f"mmdebstrap failed ({done.returncode}): {' | '.join(tail)}")
        installed = dict(
            line.split("\t", 1) for line in versions.read_text().splitlines() if "\t" in line
        )
        extra: dict[str, Any] = {"debian": {"suite": suite, "mirror": mirror, "preset": preset,
                                            "requested": packages, "packages": installed}}
        if setup.config:
            extra["config"] = setup.config
        named = [preset] if preset != "minbase" else []
        label = f"debian:{suite} ({','.join(named + packages) or 'minbase'})"
        return store.import_image(name, out, force=True, extra=extra, label=label)


def preset_packages(preset: str, packages: list[str]) -> list[str]:
    """What a build includes: the preset's packages, then the requested ones not among them."""
    base = list(PRESETS[preset])
    return base + [p for p in packages if p not in base]


def host_mirror() -> str:
    """The first Debian archive this host's apt uses (deb822 or one-line sources), else deb.debian.org."""
    for path in (Path("/etc/apt/sources.list.d/debian.sources"), Path("/etc/apt/sources.list")):
        try:
            text = path.read_text()
        except OSError:
            continue
        for match in re.finditer(r"^(?:URIs:\s*|deb\s+(?:\[[^\]]*\]\s+)?)(https?://\S+)", text, re.MULTILINE):
            if "security" not in match[1]:
                return match[1]
    return _DEFAULT_MIRROR
