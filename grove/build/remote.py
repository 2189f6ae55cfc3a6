"""A build as one API call (``POST /v1/images/build``): the context goes up as a tar, the router runs the builder
(:mod:`router.api.builds`), and its output comes back line by line, ending with the image or the failing step's
error (raised as its :class:`~grove.core.errors.GroveError`, the same class a client-side build raises)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import PurePosixPath

from grove.build.builder import BuildOptions, BuildResult
from grove.build.context import BuildContext
from grove.client.aio import AsyncGrove
from grove.client.upload import spool_tar
from grove.core.errors import GroveError, Invalid, error_from_body


async def build_remote(client: AsyncGrove, options: BuildOptions, emit: Callable[[str], None] = print) -> BuildResult:
    """Build ``options`` on the router; ``emit`` gets the build's output line by line as it comes."""
    context = options.context.resolve()
    dockerfile = options.dockerfile.resolve()
    if not dockerfile.is_relative_to(context):
        raise Invalid(f"the Dockerfile {options.dockerfile} is outside the build context {options.context}: a "
                      "remote build sends the context only (move the Dockerfile into it)")
    rel = dockerfile.relative_to(context).as_posix()
    params = [("tag", options.tag), ("dockerfile", rel),
              ("network", options.network), ("no_cache", "0" if options.cache else "1"),
              *(("build_arg", f"{k}={v}") for k, v in options.build_args.items())]
    with spool_tar(context, keep=_sent(BuildContext(context), rel)) as tar:
        async with client.stream("/v1/images/build", method="POST", params=params, data=tar,
                                 headers={"Content-Type": "application/x-tar"}) as resp:
            async for raw in resp.content:
                message = json.loads(raw)
                if "line" in message:
                    emit(str(message["line"]))
                elif "error" in message:
                    raise error_from_body(422, message)
                elif "image" in message:
                    return BuildResult(str(message["image"]), str(message["digest"]), int(message["steps"]),
                                       int(message["cached"]), float(message["seconds"]))
    raise GroveError("the router's build answer ended without the image or an error")


def _sent(context: BuildContext, dockerfile: str) -> Callable[[str, bool], bool]:
    """Which paths of the context go up: what ``.dockerignore`` leaves in, and always the Dockerfile (with the
    directories on its way) and the ``.dockerignore`` itself, which the router's build reads too."""
    always = {".", ".dockerignore", dockerfile, *(str(p) for p in PurePosixPath(dockerfile).parents)}
    return lambda rel, is_dir: rel in always or context.sent(rel, is_dir)
