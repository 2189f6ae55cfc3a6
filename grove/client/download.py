"""One artifact fetched through the router, verified against its recorded sha256, resumable on disk.

A fetch to a file writes ``<target>.part`` and renames it into place only once the whole file hashes
to the recorded sha256. If a fetch stopped (the process was killed, the network dropped), the next one
asks for the rest with ``Range: bytes=<size of the part>-`` and hashes the part it already has; a
router that answers with the whole object instead (200) restarts the part. A file whose hash does not
match is moved to ``reject_to`` — never left where a good file would be — and ChecksumMismatch names
the file and both hashes.
"""

from __future__ import annotations

import hashlib
import io
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from grove.core.errors import ChecksumMismatch, GroveError

if TYPE_CHECKING:
    from grove.client.aio import AsyncGrove

CHUNK = 1024 * 1024
_BLOCK = 4 * 1024 * 1024


@dataclass(frozen=True)
class Progress:
    """Where one fetch is: reported when it starts, every second or so while it runs, and when it ends."""

    route: str
    """The artifact's router path (``/v1/artifacts/<sandbox_id>/<path>``)."""
    done: int
    """Bytes of the file on disk (resumed bytes included)."""
    total: int | None
    """The file's size, once the router said it."""
    resumed_from: int = 0
    """Bytes that were already on disk from an earlier fetch."""
    event: str = "bytes"
    """``start``, ``bytes``, ``done`` or ``skipped`` (already complete and verified)."""


async def fetch_bytes(client: AsyncGrove, route: str) -> bytes:
    """The whole artifact in memory, verified."""
    buf = io.BytesIO()
    digest = hashlib.sha256()
    async with client.stream(route) as resp:
        expected = resp.headers.get("X-Grove-Sha256")
        async for chunk in resp.content.iter_chunked(CHUNK):
            digest.update(chunk)
            buf.write(chunk)
    if expected and digest.hexdigest() != expected:
        raise ChecksumMismatch(f"{route}: the fetched bytes have sha256 {digest.hexdigest()}, but the record says "
                               f"{expected} (the object changed in S3 after it was stored); nothing was returned")
    return buf.getvalue()


async def fetch_file(
    client: AsyncGrove,
    route: str,
    target: Path,
    reject_to: Path,
    expected: tuple[int, str] | None = None,
    progress: Callable[[Progress], None] | None = None,
) -> int:
    """Fetch to ``target`` (resuming ``<target>.part``), verify, rename into place; the bytes received.

    ``expected``: the (size, sha256) the listing gave, if known (else the router's headers say them)."""
    part = target.with_name(target.name + ".part")
    target.parent.mkdir(parents=True, exist_ok=True)
    have = part.stat().st_size if part.exists() else 0
    if expected is not None and have > expected[0]:
        have = 0  # longer than the artifact: not a prefix of it
    sha = expected[1] if expected else None
    digest = _hash_file(part) if have else hashlib.sha256()
    received = 0
    report = _Reporter(route, progress)
    try:
        async with client.stream(route, headers={"Range": f"bytes={have}-"} if have else {}) as resp:
            sha = sha or resp.headers.get("X-Grove-Sha256")
            total = int(resp.headers["X-Grove-Size"]) if "X-Grove-Size" in resp.headers else None
            if resp.status != 206:  # the whole object: what was on disk is not a prefix of it
                have, digest = 0, hashlib.sha256()
            report(have, total, have, "start")
            # Plain file writes in the event loop: a local disk takes a 1 MiB chunk in well under a millisecond.
            with open(part, "ab" if have else "wb") as out:
                async for chunk in resp.content.iter_chunked(CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
                    received += len(chunk)
                    report(have + received, total, have)
    except GroveError as exc:
        if exc.status != 416 or not have:
            raise
        if sha is None:  # nothing to check the part against: start over
            part.unlink()
            return await fetch_file(client, route, target, reject_to, None, progress)
        # The part already holds every byte (the last fetch stopped before its rename): check it below.
    actual = digest.hexdigest()
    if sha and actual != sha:
        reject_to.parent.mkdir(parents=True, exist_ok=True)
        os.replace(part, reject_to)
        raise ChecksumMismatch(
            f"{target}: sha256 of the fetched bytes is {actual}, but the record says {sha} (the object "
            f"changed in S3 after it was stored); the file was moved to {reject_to}, not kept at {target}"
        )
    os.replace(part, target)
    report(have + received, have + received, have, "done")
    return received


def verified(target: Path, size: int, sha256: str) -> bool:
    """Whether ``target`` already holds exactly these bytes (a pull that is run again skips it)."""
    try:
        if target.stat().st_size != size:
            return False
    except FileNotFoundError:
        return False
    return _hash_file(target).hexdigest() == sha256


def _hash_file(path: Path) -> hashlib._Hash:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        _feed(fh, digest)
    return digest


def _feed(fh: BinaryIO, digest: hashlib._Hash) -> None:
    while block := fh.read(_BLOCK):
        digest.update(block)


class _Reporter:
    """Calls ``progress`` at the start, at most about once a second while bytes flow, and at the end."""

    def __init__(self, route: str, progress: Callable[[Progress], None] | None) -> None:
        self._route, self._progress, self._last = route, progress, 0.0

    def __call__(self, done: int, total: int | None, resumed: int, event: str = "bytes") -> None:
        if self._progress is None:
            return
        now = time.monotonic()
        if event == "bytes" and now - self._last < 1.0:
            return
        self._last = now
        self._progress(Progress(self._route, done, total, resumed, event))
