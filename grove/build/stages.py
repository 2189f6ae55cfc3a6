"""``COPY --from=STAGE``: files of an earlier stage's image, fetched through the API and packed like context files.

A sandbox of the stage's image (no egress) is made for the copy; each source (a path in that image, relative ones
from its root, no wildcards) comes out through the archive API (a directory) or the files API (a file, with its
mode) into a temporary directory laid out like the image, which is then packed by the same code as a context's
``COPY`` (:meth:`grove.build.context.BuildContext.pack`), so Docker's rules for where things land are the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import posixpath
import tempfile
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from grove.build.context import BuildContext, Packed
from grove.client.aio import AsyncGrove, AsyncSandbox
from grove.core.errors import Invalid, NotFound


async def created(create: Coroutine[Any, Any, AsyncSandbox]) -> AsyncSandbox:
    """A build's sandbox (a step's, or a ``COPY --from``'s); a build cancelled while the router makes it still
    deletes it once made."""
    making = asyncio.ensure_future(create)
    try:
        return await asyncio.shield(making)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await (await making).close()
        raise


async def stage_files(client: AsyncGrove, image: str, sources: list[str], dest: str, where: str) -> Packed:
    """``sources`` of ``image`` packed for ``dest``; Invalid naming the step for a wildcard or a missing path."""
    if any(c in s for s in sources for c in "*?["):
        raise Invalid(f"{where}: COPY --from takes plain paths of the stage, not wildcards")
    sandbox = await created(client.create(image, network={"egress": "deny"},
                                          metadata={"labels": {"grove.build": "copy-from-stage"}}))
    try:
        with tempfile.TemporaryDirectory(prefix="grove-stage-") as tmp:
            rels = []
            for source in sources:
                path = posixpath.normpath("/" + source)
                rel = path.lstrip("/") or "."
                target = Path(tmp) / rel
                try:
                    await sandbox.download(path, target)  # a directory
                except NotFound:
                    try:
                        data = await sandbox.read_file(path)
                    except NotFound:
                        raise Invalid(f"{where}: {source!r} is not in the stage's image") from None
                    listed = await sandbox.list_files(posixpath.dirname(path))
                    mode = next((int(str(e["mode"]), 8) for e in listed if e["name"] == posixpath.basename(path)),
                                0o644)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(data)
                    os.chmod(target, mode)
                rels.append(rel)
            return BuildContext(Path(tmp)).pack(rels, dest)
    finally:
        await sandbox.close()
