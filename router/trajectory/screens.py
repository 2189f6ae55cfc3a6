"""Screenshots of computer steps, stored content-addressed beside the trajectories.

Each image goes to its project's part of the bucket as ``screenshots/<sha256>.png``, its thumbnail as
``screenshots/<sha256>.thumb.png``: an unchanged screen is stored once however many steps show it (and
however many sandboxes of the project). The step records the hash, the size and both keys.

Storing never delays the answer: the upload runs in the background. When S3 cannot take it, the images wait
in ``<state>/screenshots/<project>/`` and go up with the next flush (the reaper's, every few seconds), so a
step never names an image that is lost. A trajectory stores at most ``--screenshot-mb`` of distinct
images (full and thumbnail counted, counted per router run); past it a step keeps the hash and size,
``stored: false`` and why, and the agent still gets its screen.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import re
from collections import OrderedDict
from pathlib import Path
from typing import Any

from grove.core.errors import NotFound
from router.storage import Storage

log = logging.getLogger("grove.router")
PREFIX = "screenshots/"
SHA = re.compile(r"[0-9a-f]{64}")
_KNOWN = 100_000
"""Images known to be stored, remembered so a repeated screen costs no upload (by project and hash)."""


def key_of(sha: str, *, thumb: bool = False) -> str:
    """The object key of an image (or its thumbnail), within its project's part of the bucket."""
    return f"{PREFIX}{sha}{'.thumb' if thumb else ''}.png"


class Screens:
    """Stores the images of computer steps (see the module's docstring)."""

    def __init__(self, storage: Storage, spool: Path, limit_bytes: int) -> None:
        self._storage = storage
        self._spool = spool
        self._limit = limit_bytes
        self._known: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._spent: dict[str, int] = {}
        """Bytes of distinct images stored per sandbox (this router run)."""
        self._seen: dict[str, set[str]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._uploading: dict[tuple[str, str], tuple[bytes, bytes]] = {}
        """Images on their way to S3, served from here meanwhile: a step's image is readable the moment the
        step is (a client fetching it right after the action must not meet a 404)."""

    def keep(self, sandbox_id: str, project: str, image: bytes, thumb: bytes) -> dict[str, Any]:
        """Store an image and its thumbnail (in the background); the step's ``screenshot`` fields."""
        sha = hashlib.sha256(image).hexdigest()
        meta: dict[str, Any] = {"sha256": sha, "bytes": len(image), "key": key_of(sha),
                                "thumb_key": key_of(sha, thumb=True), "stored": True}
        seen = self._seen.setdefault(sandbox_id, set())
        if sha not in seen:
            size = len(image) + len(thumb)
            spent = self._spent.get(sandbox_id, 0)
            if spent + size > self._limit:
                meta.update(stored=False, key=None, thumb_key=None,
                            reason=f"the trajectory's screenshots reached {self._limit / (1 << 20):g} MiB "
                                   "(grove up --screenshot-mb); this image was shown to the agent, not stored")
                return meta
            self._spent[sandbox_id] = spent + size
            seen.add(sha)
        if (project, sha) not in self._known and (project, sha) not in self._uploading:
            self._uploading[(project, sha)] = (image, thumb)
            task = asyncio.create_task(self._store(project, sha, image, thumb))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return meta

    def forget(self, sandbox_id: str) -> None:
        """A sandbox is gone: its count goes too."""
        self._spent.pop(sandbox_id, None)
        self._seen.pop(sandbox_id, None)

    def spent(self, sandbox_id: str) -> int:
        """Bytes of images the sandbox's trajectory has stored (this router run)."""
        return self._spent.get(sandbox_id, 0)

    async def get(self, project: str, sha: str, *, thumb: bool = False) -> bytes:
        """An image of ``project`` (from S3, or its spool while it waits there); 404 if it has none."""
        if not SHA.fullmatch(sha):
            raise NotFound(f"no screenshot {sha[:80]!r}: a screenshot is named by the sha256 of its PNG "
                           "(64 hex digits)")
        if (uploading := self._uploading.get((project, sha))) is not None:
            return uploading[1 if thumb else 0]
        spooled = self._spool / project / os.path.basename(key_of(sha, thumb=thumb))
        with contextlib.suppress(FileNotFoundError):
            return await asyncio.to_thread(spooled.read_bytes)
        objects = self._storage.of(project).objects
        try:
            return await asyncio.to_thread(objects.get_bytes, key_of(sha, thumb=thumb))
        except NotFound:
            raise NotFound(f"no screenshot {sha} in this project") from None

    async def drain(self) -> None:
        """Wait for the uploads in flight (a stopping router; what fails is spooled)."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def flush(self) -> None:
        """Upload what waits in the spool."""
        if not self._spool.is_dir():
            return
        await asyncio.to_thread(self._flush)

    # -- storing ---------------------------------------------------------------------------------------

    async def _store(self, project: str, sha: str, image: bytes, thumb: bytes) -> None:
        try:
            await self._store_or_spool(project, sha, image, thumb)
        finally:
            self._uploading.pop((project, sha), None)

    async def _store_or_spool(self, project: str, sha: str, image: bytes, thumb: bytes) -> None:
        try:
            await asyncio.to_thread(self._put, project, sha, image, thumb)
        except Exception as exc:
            log.warning("screenshot %s of project %s waits in the spool: %s", sha[:12], project, exc)
            try:
                await asyncio.to_thread(self._write_spool, project, sha, image, thumb)
            except OSError:
                log.exception("screenshot %s of project %s could not be spooled either", sha[:12], project)
            return
        self._known[(project, sha)] = None
        while len(self._known) > _KNOWN:
            self._known.popitem(last=False)

    def _put(self, project: str, sha: str, image: bytes, thumb: bytes) -> None:
        objects = self._storage.of(project).objects
        objects.put_bytes(key_of(sha, thumb=True), thumb, "image/png")
        objects.put_bytes(key_of(sha), image, "image/png")

    def _write_spool(self, project: str, sha: str, image: bytes, thumb: bytes) -> None:
        folder = self._spool / project
        folder.mkdir(parents=True, exist_ok=True)
        for data, name in ((thumb, key_of(sha, thumb=True)), (image, key_of(sha))):
            final = folder / os.path.basename(name)
            tmp = folder / f".{final.name}.tmp"
            with open(tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, final)

    def _flush(self) -> None:
        for folder in sorted(p for p in self._spool.iterdir() if p.is_dir()):
            objects = self._storage.of(folder.name).objects
            for path in sorted(folder.glob("*.png")):
                try:
                    objects.put_bytes(PREFIX + path.name, path.read_bytes(), "image/png")
                except Exception as exc:
                    log.info("screenshots still wait in the spool: %s", exc)
                    return
                path.unlink()
