"""``grove image build -f Dockerfile -t NAME [--build-arg K=V] [--network allow|deny] CONTEXT``: a Dockerfile built
step by step in the router's sandboxes (:mod:`grove.build.builder`); a ``FROM`` naming a registry image this state
dir lacks is pulled into it first, as ``grove image pull`` does."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from grove.cli.common import key_values, router_and_key


def add_build_parser(isub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``image build``."""
    build = isub.add_parser("build", parents=[common],
                            help="build a Dockerfile, every step in a sandbox (no Docker), layers cached and shared")
    build.add_argument("context", help="the build context directory")
    build.add_argument("-f", "--file", dest="dockerfile", help="the Dockerfile (default: CONTEXT/Dockerfile)")
    build.add_argument("-t", "--tag", required=True, help="the image's name")
    build.add_argument("--build-arg", action="append", default=[], metavar="K=V", help="a build argument (repeat)")
    build.add_argument("--network", choices=("deny", "allow"), default="deny",
                       help="egress of the RUN steps' sandboxes (default deny: no address at all)")
    build.add_argument("--no-cache", action="store_true", help="run every step, even unchanged ones")
    build.add_argument("--insecure", action="store_true", help="pull a FROM image over plain HTTP (loopback)")
    build.add_argument("--remote", action="store_true",
                       help="send the context to the router and build there in one call (POST /v1/images/build): "
                            "for a client away from the router's state dir; FROM a registry image needs a router "
                            "started with --pull-missing")


def cmd_build(store: Any, args: argparse.Namespace) -> int:
    """Build the image; its steps' output streams to stdout, the last line names the image and its digest."""
    from grove.build.builder import BuildOptions, build
    from grove.build.dockerfile import parse
    from grove.build.remote import build_remote
    from grove.client.aio import AsyncGrove

    context = Path(args.context)
    dockerfile = Path(args.dockerfile) if args.dockerfile else context / "Dockerfile"
    build_args = key_values(args.build_arg, "--build-arg")
    try:
        plan = parse(dockerfile.read_bytes(), build_args)
    except OSError as exc:
        print(f"grove: cannot read the Dockerfile {dockerfile}: {exc.strerror}", file=sys.stderr)
        return 2
    if not args.remote:
        for image in plan.image_bases():  # a FROM naming an earlier stage pulls nothing
            if image is not None:
                _pull_base(store, image, args.insecure)
    options = BuildOptions(dockerfile, context, args.tag, build_args, args.network, cache=not args.no_cache)

    async def run() -> None:
        async with AsyncGrove(*router_and_key(args)) as client:
            await (build_remote if args.remote else build)(client, options, lambda line: print(line, flush=True))

    asyncio.run(run())
    return 0


def _pull_base(store: Any, base: str, insecure: bool) -> None:
    from router.backends.local import references
    from router.backends.local.image_pull import pull_image
    from router.backends.local.registry_pull import PullOptions

    if not references.is_reference(base) or any(i.name == base for i in store.list()):
        return
    print(f"pulling {base}", flush=True)
    pull_image(store, base, options=PullOptions(insecure=insecure))
