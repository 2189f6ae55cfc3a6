"""``grove image import|ls|rm``: the local backend's images (works on the state dir directly)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from grove.cli.common import state_dir
from grove.statedir import StateDir


def cmd_image(args: argparse.Namespace) -> int:
    """Import, list and remove local images."""
    from router.local.images import ImageStore

    store = ImageStore(StateDir(state_dir(args)).images)
    if args.image_cmd == "import":
        image = store.import_image(args.name, Path(args.source), force=args.force)
        print(f"imported {image.name} {image.digest}")
        return 0
    if args.image_cmd == "rm":
        for name in args.names:
            store.remove(name)
            print(f"removed {name} (sandboxes made from it keep their copy until they are deleted)")
        return 0
    store.ensure_default()
    for image in store.list():
        print(f"{image.name:<24} {image.digest}  {image.source}")
    return 0


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``image``."""
    image = sub.add_parser("image", parents=[common], help="local images")
    isub = image.add_subparsers(dest="image_cmd", required=True)
    imp = isub.add_parser("import", parents=[common],
                          help="import a directory, rootfs tarball, docker save or OCI tarball")
    imp.add_argument("name")
    imp.add_argument("source")
    imp.add_argument("--force", action="store_true")
    isub.add_parser("ls", parents=[common], help="list images")
    irm = isub.add_parser("rm", parents=[common], help="remove images (sandboxes made from one keep their copy)")
    irm.add_argument("names", nargs="+")
    image.set_defaults(func=cmd_image)
