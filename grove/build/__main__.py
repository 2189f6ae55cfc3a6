"""``python -m grove.build``: one build, its output as JSON lines: what ``POST /v1/images/build`` runs.

The router serves builds with the same builder ``grove image build`` runs (:mod:`grove.build.builder`), in a
process of its own: the builder is an API client of the router (every step a sandbox made through the API, with
the caller's key, so the build counts against the caller's project), and the server imports no SDK code. Each
line on stdout is one JSON object: ``{"line": TEXT}`` as the build goes, then ``{"image": NAME, "digest": ...,
"steps": N, "cached": N, "seconds": S}`` or ``{"error": {"code", "message"}}``. The API key comes in
``GROVE_API_KEY``, never on the command line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from grove.build.builder import BuildOptions, build
from grove.cli.common import key_values
from grove.client.aio import AsyncGrove
from grove.core.errors import GroveError, InternalError, error_body


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def parser() -> argparse.ArgumentParser:
    """The worker's arguments (the endpoint's query, checked by the router)."""
    p = argparse.ArgumentParser(prog="python -m grove.build")
    p.add_argument("--url", required=True)
    p.add_argument("--dockerfile", required=True)
    p.add_argument("--tag", required=True)
    p.add_argument("--build-arg", action="append", default=[])
    p.add_argument("--network", choices=("deny", "allow"), default="deny")
    p.add_argument("--no-cache", action="store_true")
    p.add_argument("context")
    return p


async def run(args: argparse.Namespace) -> int:
    """Build; 0 once the image is made, 1 with the error as the last line. SIGTERM cancels the build, so the
    sandbox of the step it was running is deleted on the way out."""
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    context = Path(args.context)
    try:
        options = BuildOptions(context / args.dockerfile, context, args.tag,
                               key_values(args.build_arg, "--build-arg"), args.network, cache=not args.no_cache)
        async with AsyncGrove(args.url, os.environ.get("GROVE_API_KEY")) as client:
            result = await build(client, options, lambda line: _emit({"line": line}))
    except GroveError as exc:
        _emit(error_body(exc.code, exc.message))
        return 1
    except Exception as exc:  # a bug, said as the wire says one: the stream still ends with an error
        _emit(error_body(InternalError.code, f"the build failed unexpectedly: {exc!r}"))
        return 1
    _emit({"image": result.image, "digest": result.digest, "steps": result.steps, "cached": result.cached,
           "seconds": round(result.seconds, 3)})
    return 0


if __name__ == "__main__":
    try:
        sys.exit(asyncio.run(run(parser().parse_args())))
    except asyncio.CancelledError:
        sys.exit(143)  # ended by SIGTERM, its step's sandbox deleted
