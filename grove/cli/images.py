"""``grove image import|pull|build|build-debian|export|ls|rm``: the local backend's images (works on the state dir
directly)."""

from __future__ import annotations

import argparse
import getpass
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from grove.cli.common import state_dir
from grove.cli.image_build import add_build_parser, cmd_build
from grove.statedir import StateDir


def cmd_image(args: argparse.Namespace) -> int:
    """Import, pull, build, list and remove local images."""
    from router.backends.local.images import ImageStore

    layout = StateDir(state_dir(args))
    layout.make_private()
    store = ImageStore(layout.images, unpack_limits(args))
    if args.image_cmd == "build":
        return cmd_build(store, args)
    if args.image_cmd == "import":
        image = store.import_image(args.name, Path(args.source), force=args.force)
        print(f"imported {image.name} {image.digest}")
        return 0
    if args.image_cmd == "pull":
        return _pull(store, args)
    if args.image_cmd == "build-debian":
        return _build_debian(store, args)
    if args.image_cmd == "export":
        from router.backends.local.image_export import export_image

        image = export_image(store, args.name, args.file)
        count = len(image.lowers)
        where = "stdout" if args.file == "-" else args.file
        print(f"exported {image.name} {image.digest} to {where} ({count} layer{'s' if count != 1 else ''}; "
              f"`grove image import NAME {args.file if args.file != '-' else 'FILE'}` or `docker load` takes it back)",
              file=sys.stderr)
        return 0
    if args.image_cmd == "rm":
        for name in args.names:
            store.remove(name)
        # What no image and no sandbox of this state dir uses any more goes now; the rest stays for its sandboxes.
        store.collect_retired(_digests_in_use(StateDir(state_dir(args)).sandboxes))
        for name in args.names:
            print(f"removed {name} (sandboxes made from it keep their copy until they are deleted)")
        return 0
    store.ensure_default()
    usage = store.usage()
    print(f"{'NAME':<40} {'DIGEST':<71} {'SIZE':>9} {'SHARED':>9}  SOURCE")
    for image in store.list():
        use = usage.get(image.name)
        size, shared = (_mib(use.size), _mib(use.shared)) if use is not None and use.size else ("-", "-")
        print(f"{image.name:<40} {image.digest:<71} {size:>9} {shared:>9}  {image.source}")
    return 0


def _pull(store: Any, args: argparse.Namespace) -> int:
    from router.backends.local import references
    from router.backends.local.image_pull import pull_image, write_authfile
    from router.backends.local.registry_pull import PullOptions

    authfile = Path(args.authfile) if args.authfile else None
    with tempfile.TemporaryDirectory(prefix="grove-auth-") as tmp:
        if args.username:
            password = sys.stdin.readline().rstrip("\n") if args.password_stdin else getpass.getpass(
                f"password for {args.username}: ")
            authfile = write_authfile(Path(tmp), references.parse(args.ref).registry, args.username, password)
        options = PullOptions(platform=args.platform, insecure=args.insecure, authfile=authfile)
        image = pull_image(store, args.ref, name=args.name, options=options)
    # A re-pull that replaced an older version: its layers go now unless a sandbox of this state dir uses it.
    store.collect_retired(_digests_in_use(StateDir(state_dir(args)).sandboxes))
    print(f"pulled {image.name} {image.digest} ({len(image.layers)} layer{'s' if len(image.layers) != 1 else ''})")
    return 0


def _build_debian(store: Any, args: argparse.Namespace) -> int:
    from router.backends.local.debian import build_debian, host_mirror

    packages = [p for p in args.packages.split(",") if p]
    mirror = args.mirror or host_mirror()
    # The desktop's Chromium alone is ~100 MB of packages: a minute or two where minbase takes 20 s.
    took = "about 20 s" if args.preset == "minbase" else "a minute or two"
    extra = " + " + ", ".join(packages) if packages else ""
    print(f"building image {args.name}: Debian {args.suite} ({args.preset}{extra}) from {mirror} with mmdebstrap; "
          f"{took} with a nearby mirror, minutes without", file=sys.stderr, flush=True)
    started = time.monotonic()
    with _progress(store.root, started):
        image = build_debian(store, args.name, packages, suite=args.suite, mirror=mirror, preset=args.preset)
    print(f"built {image.name} {image.digest} in {time.monotonic() - started:.0f}s")
    return 0


_TICK_S = 5.0


@contextmanager
def _progress(images: Path, started: float) -> Iterator[None]:
    """A line on stderr every few seconds while a Debian image builds: how long so far, and at which stage
    (read from the build's working files in the image store: mmdebstrap runs quiet, and for a minute or more)."""
    done = threading.Event()

    def tick() -> None:
        while not done.wait(_TICK_S):
            print(f"  {time.monotonic() - started:4.0f}s  {_stage(images)}", file=sys.stderr, flush=True)

    ticker = threading.Thread(target=tick, name="grove-build-progress", daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()


def _stage(images: Path) -> str:
    """Where the newest Debian build in the image store stands."""
    try:
        builds = sorted(images.glob(".debian-*"), key=lambda p: p.stat().st_mtime)
        if not builds:
            return "checking the request"
        if any(images.glob(".tmp-*")):
            return "importing the root filesystem into the image store"
        tar = builds[-1] / "rootfs.tar"
        if (builds[-1] / "versions").exists() and tar.exists():
            return f"packing the root filesystem ({_mib(tar.stat().st_size)})"
    except OSError:  # a working file came or went while looked at: the next tick says
        return "working"
    return "mmdebstrap: fetching the package lists, downloading and installing packages"


def _digests_in_use(sandboxes: Path) -> set[str]:
    """The image digests the sandboxes of a state dir were made from (each records its own)."""
    found = set()
    for directory in sandboxes.iterdir() if sandboxes.is_dir() else ():
        try:
            found.add((directory / "image").read_text(encoding="ascii").strip())
        except OSError:
            continue
    return found


def add_unpack_options(parser: argparse.ArgumentParser) -> None:
    """``--max-layer-gb`` and ``--max-image-gb``: how large an image may unpack (a layer bomb stops there)."""
    parser.add_argument("--max-layer-gb", type=_positive, metavar="GIB", default=16.0,
                        help="refuse a layer that unpacks to more than this (default 16)")
    parser.add_argument("--max-image-gb", type=_positive, metavar="GIB", default=64.0,
                        help="refuse an image whose layers unpack to more than this in all (default 64)")


def unpack_limits(args: argparse.Namespace) -> Any:
    """The :class:`~router.backends.local.rootfs_writer.UnpackLimits` the options give (the defaults where absent)."""
    from router.backends.local.unpack_limits import GIB, UnpackLimits

    return UnpackLimits(layer_bytes=int(getattr(args, "max_layer_gb", 16.0) * GIB),
                        image_bytes=int(getattr(args, "max_image_gb", 64.0) * GIB))


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of GiB, not {text!r}")
    return value


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f}M"


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``image``."""
    image = sub.add_parser("image", parents=[common], help="local images")
    isub = image.add_subparsers(dest="image_cmd", required=True)
    imp = isub.add_parser("import", parents=[common],
                          help="import a directory, rootfs tarball, docker save or OCI tarball")
    imp.add_argument("name")
    imp.add_argument("source")
    imp.add_argument("--force", action="store_true")
    add_unpack_options(imp)
    pull = isub.add_parser("pull", parents=[common], help="pull an image from a registry (layers shared)")
    pull.add_argument("ref", help="registry reference: [registry[:port]/]name[:tag][@sha256:...]")
    pull.add_argument("--name", help="store it under this name instead of the reference")
    pull.add_argument("--platform", help="os/arch[/variant] to take from a multi-platform image (default: this host)")
    pull.add_argument("--insecure", action="store_true", help="allow plain HTTP or unverified TLS (loopback)")
    pull.add_argument("--authfile", help="credentials file (default: REGISTRY_AUTH_FILE, ~/.docker/config.json)")
    pull.add_argument("--username", help="log in as this user (password prompted, or read from stdin)")
    pull.add_argument("--password-stdin", action="store_true", help="read the password from stdin")
    add_unpack_options(pull)
    deb = isub.add_parser("build-debian", parents=[common], help="build a Debian image with mmdebstrap")
    deb.add_argument("name")
    deb.add_argument("--preset", default="minbase",
                     help="the package set to start from: minbase (Debian's minimal base), desktop (Xvfb, "
                          "xdotool, a window manager and Chromium: a screen for computer use) or code-interpreter "
                          "(grove's E2B code interpreter server on Jupyter, started on an E2B create: name the "
                          "image code-interpreter-v1, the SDK's default template)")
    deb.add_argument("--packages", default="", help="comma-separated packages to include (added to the preset), "
                                                    "e.g. python3,git")
    deb.add_argument("--suite", default="bookworm")
    deb.add_argument("--mirror", help="Debian mirror URL (default: this host's apt sources)")
    exp = isub.add_parser("export", parents=[common],
                          help="write an image as a docker save tarball (`image import` or `docker load` takes it)")
    exp.add_argument("name")
    exp.add_argument("file", help="the tarball to write (.tar, or .tar.gz / .tgz compressed; - for stdout)")
    isub.add_parser("ls", parents=[common], help="list images with digest, size and shared bytes")
    irm = isub.add_parser("rm", parents=[common], help="remove images (sandboxes made from one keep their copy)")
    irm.add_argument("names", nargs="+")
    add_build_parser(isub, common)
    image.set_defaults(func=cmd_image)
