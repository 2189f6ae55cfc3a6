"""``grove image build-debian``: a real Debian image from Debian's own archive, no registry involved.

``mmdebstrap --variant=minbase --include=PKGS SUITE OUT.tar MIRROR`` builds the root filesystem (about
20 s and 200 MB with python3); a customize hook lists every installed package and its version, which
the image records in its ``image.json`` (``debian.packages``) so that a trajectory's image digest leads
to exactly what was installed. The tarball is then imported like any rootfs tarball (one layer).

A preset is a named package set the build starts from, ``--packages`` adding to it: ``minbase`` (nothing but
Debian's minimal base, the default) and ``desktop`` (a screen for computer use: Xvfb, xdotool, a window manager
and Chromium, what :mod:`executor.computer` drives).
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

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
}
"""The package sets a build can start from (``--preset``), by name."""


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
        extra = {"debian": {"suite": suite, "mirror": mirror, "preset": preset, "requested": packages,
                            "packages": installed}}
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
