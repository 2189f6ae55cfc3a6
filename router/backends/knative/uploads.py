"""The router's side of a snapshot's multipart upload: it holds the S3 credentials the executor does not.

An executor snapshots many times over a sandbox's life (after each idle period, and when its pod goes),
and each snapshot needs an upload of its own: presigned part URLs name the upload's id, which exists
only once the upload is started, and a completed upload is used up. So no set of URLs in the sandbox's
Secret could serve them all; the executor asks the router (:mod:`artifacts.multipart`) to start one,
for part URLs in batches as its stream needs them, and to complete or abort it.

The executor proves which sandbox it is with its *upload token*: an HMAC, under a key derived from the
router's S3 secret, of the sandbox id and the most bytes it may upload (its disk quota). It is in the
sandbox's Secret, so it reaches exactly what the presigned PUT URL before it did: that sandbox's own
snapshot key, and no more than its disk's worth. The router needs no state to check it, and a restarted
router checks it alike.

The same token buys a fresh GET URL of the snapshot (``download``): the one in the Secret was presigned when
the sandbox (or pool member) was made, and a sandbox that lives and sleeps long outlives it. Each wake asks
for one first, and falls back to the Secret's only when the router cannot be reached.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import math
from typing import Any, Protocol

from grove.core.errors import Invalid, TooLarge, Unauthorized
from router.backends.knative.manifest import snapshot_key

MIN_PART = 5 * 1024 * 1024
"""S3's smallest part but the last: the production part size may not go below it."""
DEFAULT_PART = 16 * 1024 * 1024
"""One part, the executor's memory bound while it snapshots."""
MAX_PARTS = 10_000  # S3's limit per upload: a larger quota gets larger parts
_URL_BATCH = 16
_URL_EXPIRY_S = 3600.0  # made when needed: an hour covers one part, however long the sandbox lives


class MultipartStorage(Protocol):
    """What the broker needs of object storage (``artifacts.store.ObjectStore`` has it)."""

    def presign_get(self, key: str, expires: float) -> str:
        """A URL that GETs ``key`` without credentials."""

    def start_multipart(self, key: str) -> str:
        """Start an upload; its id."""

    def presign_part(self, key: str, upload_id: str, number: int, expires: float = 3600.0) -> str:
        """A URL that PUTs one part."""

    def complete_multipart(self, key: str, upload_id: str, etags: list[str]) -> str | None:
        """Replace ``key`` with the parts."""

    def abort_multipart(self, key: str, upload_id: str) -> None:
        """Drop an upload."""

    def uploaded_bytes(self, key: str, upload_id: str) -> int:
        """The bytes of an upload's parts so far."""

    def incomplete_uploads(self, prefix: str) -> list[tuple[str, str]]:
        """(key, upload id) of the uploads in progress under ``prefix``."""


def signing_key(s3_secret: str) -> bytes:
    """The HMAC key of upload tokens, from the router's S3 secret (never the secret itself)."""
    return hashlib.sha256(b"grove snapshot upload token\0" + s3_secret.encode()).digest()


def upload_token(key: bytes, sandbox_id: str, max_bytes: int) -> str:
    """``<max_bytes>.<hmac>``: lets its holder upload at most ``max_bytes`` to the sandbox's snapshot."""
    mac = hmac.new(key, f"{sandbox_id}\0{max_bytes}".encode(), hashlib.sha256).hexdigest()
    return f"{max_bytes}.{mac}"


def part_size_for(max_bytes: int, part_size: int) -> int:
    """``part_size``, or larger when the quota would need more than S3's 10000 parts (whole MiB)."""
    needed = math.ceil(max_bytes / MAX_PARTS / 2**20) * 2**20
    return max(part_size, needed)


class SnapshotUploads:
    """Start, extend, complete and abort the multipart uploads of sandboxes' snapshots."""

    def __init__(self, storage: MultipartStorage, key: bytes, instance: str, part_size: int = DEFAULT_PART) -> None:
        self.storage = storage
        self.part_size = part_size
        self.instance = instance
        """The router instance whose snapshots these are (:func:`~router.backends.knative.manifest.snapshot_prefix`)."""
        self._key = key

    def token(self, sandbox_id: str, disk_mb: int) -> str:
        """The upload token of a sandbox: its disk's worth, and a part's slack (tar headers, zstd frames)."""
        return upload_token(self._key, sandbox_id, disk_mb * 2**20 + part_size_for(disk_mb * 2**20, self.part_size))

    def check(self, sandbox_id: str, authorization: str | None) -> int:
        """The most bytes the bearer may upload for ``sandbox_id``; 401 when the token is not its."""
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise Unauthorized("a snapshot upload needs the sandbox's upload token (Authorization: Bearer)")
        limit, _, _ = token.partition(".")
        if not limit.isdigit() or not hmac.compare_digest(token, upload_token(self._key, sandbox_id, int(limit))):
            raise Unauthorized(f"that is not the upload token of sandbox {sandbox_id}")
        return int(limit)

    async def handle(self, sandbox_id: str, max_bytes: int, body: Any) -> dict[str, Any]:
        """One operation of the executor's (``start``, ``parts``, ``complete``, ``abort``; ``download``: a fresh
        GET URL of the snapshot, valid for an hour — a restore starts within seconds of asking)."""
        if not isinstance(body, dict) or body.get("op") not in ("start", "parts", "complete", "abort", "download"):
            raise Invalid("'op' must be one of start, parts, complete, abort, download")
        key, part_size = snapshot_key(self.instance, sandbox_id), part_size_for(max_bytes, self.part_size)
        if body["op"] == "download":
            return {"url": await asyncio.to_thread(self.storage.presign_get, key, _URL_EXPIRY_S)}
        max_parts = min(MAX_PARTS, math.ceil(max_bytes / part_size))
        if body["op"] == "start":
            # One snapshot at a time per sandbox: what a killed executor left is dropped now.
            await self.abort_all(sandbox_id)
            started = await asyncio.to_thread(self.storage.start_multipart, key)
            urls = await self._urls(key, started, 1, max_parts)
            return {"upload_id": started, "part_size": part_size, "max_parts": max_parts, "urls": urls}
        upload_id = body.get("upload_id")
        if not isinstance(upload_id, str) or not upload_id:
            raise Invalid("'upload_id' must be the id 'start' answered")
        if body["op"] == "parts":
            first = body.get("first")
            if not isinstance(first, int) or first < 1:
                raise Invalid("'first' must be a part number (1 or more)")
            if first > max_parts:
                raise TooLarge(f"the snapshot of {sandbox_id} is larger than its disk quota allows "
                               f"({max_parts} parts of {part_size} bytes)")
            return {"urls": await self._urls(key, upload_id, first, max_parts)}
        if body["op"] == "abort":
            await asyncio.to_thread(self.storage.abort_multipart, key, upload_id)
            return {"aborted": upload_id}
        etags = body.get("etags")
        if not isinstance(etags, list) or not etags or len(etags) > max_parts or \
                not all(isinstance(e, str) and e for e in etags):
            raise Invalid(f"'etags' must list the parts' ETags in order (1 to {max_parts})")
        # A presigned part URL does not bound its part's size: the quota is checked on what was uploaded.
        uploaded = await asyncio.to_thread(self.storage.uploaded_bytes, key, upload_id)
        if uploaded > max_bytes:
            await asyncio.to_thread(self.storage.abort_multipart, key, upload_id)
            raise TooLarge(f"the snapshot of {sandbox_id} holds {uploaded} bytes, more than its disk quota allows "
                           f"({max_bytes}): it was not stored, and the previous snapshot stays")
        etag = await asyncio.to_thread(self.storage.complete_multipart, key, upload_id, etags)
        return {"etag": etag, "parts": len(etags)}

    async def abort_all(self, sandbox_id: str) -> int:
        """Abort every upload of the sandbox's snapshot in progress; how many there were."""
        found = await asyncio.to_thread(self.storage.incomplete_uploads, snapshot_key(self.instance, sandbox_id))
        for key, upload_id in found:
            await asyncio.to_thread(self.storage.abort_multipart, key, upload_id)
        return len(found)

    async def _urls(self, key: str, upload_id: str, first: int, max_parts: int) -> list[str]:
        last = min(max_parts, first + _URL_BATCH - 1)

        def sign() -> list[str]:
            return [self.storage.presign_part(key, upload_id, n, _URL_EXPIRY_S) for n in range(first, last + 1)]

        return await asyncio.to_thread(sign)
