"""A stream of unknown length into one S3 object as a multipart upload, holding one part in memory.

For writers that hold no S3 credentials (the executor inside a Knative pod). Presigned part URLs carry
the upload's id in their signature, so they can only be made once the upload exists, and an upload is
used up when it completes: a writer that snapshots again and again cannot be handed its URLs once and
for all. It asks a *broker* instead — the router, which holds the credentials — to start an upload, for
part URLs as it goes, and to complete or abort it. The object is replaced only by the completion, so a
snapshot cut off anywhere before it leaves the previous one whole; the writer aborts what it started,
and the broker aborts whatever a writer killed mid-way left (at the next start, and at deletion).

Like :mod:`artifacts.presigned`, only the standard library and ``grove.core.errors``: it runs in the bundle.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from artifacts.presigned import connect, error_for, upload_via_presigned, where
from grove.core.errors import GroveError, InternalError, Unavailable, error_from_body

T = TypeVar("T")
log = logging.getLogger("grove.snapshot")
# A router restarting or S3 hiccuping for a few seconds must not cost a snapshot (a pod going away has
# Knative's termination grace, the request timeout): each call and part is tried again, the part from
# the buffer it is still in.
RETRY_DELAYS_S = (0.5, 1.0, 2.0, 4.0)


def _retried(what: str, attempt: Callable[[], T]) -> T:
    for delay in (*RETRY_DELAYS_S, None):
        try:
            return attempt()
        except Unavailable as exc:
            if delay is None:
                raise
            log.warning("%s failed (%s); trying again in %gs", what, exc.message, delay)
            time.sleep(delay)
    raise AssertionError("unreachable")


class Broker(Protocol):
    """The holder of the credentials: ``start``, ``parts``, ``complete`` and ``abort`` one upload."""

    def call(self, op: str, **fields: Any) -> dict[str, Any]:
        """One operation; its answer (``upload_id``, ``part_size``, ``urls``, ``etag`` ...)."""


class HttpBroker:
    """The router's snapshot-upload endpoint, over plain HTTP with the sandbox's upload token."""

    def __init__(self, url: str, token: str, *, timeout: float = 60.0) -> None:
        self.url, self._token, self._timeout = url, token, timeout

    def call(self, op: str, **fields: Any) -> dict[str, Any]:
        """POST ``{"op": op, ...}``; the JSON answer, or the router's error as a GroveError."""
        conn, target = connect(self.url, self._timeout)
        body = json.dumps({"op": op, **fields}).encode()
        try:
            conn.request("POST", target, body=body, headers={
                "Authorization": f"Bearer {self._token}", "Content-Type": "application/json"})
            response = conn.getresponse()
            data = response.read()
        except OSError as exc:
            raise Unavailable(f"the snapshot broker at {where(self.url)} is unreachable: {exc}", retry_after=5) from exc
        finally:
            conn.close()
        if response.status != 200:
            try:
                error = json.loads(data)["error"]
                message = f"snapshot broker: {error['message']}"
            except (ValueError, KeyError, TypeError):
                raise error_for(self.url, response.status, data) from None
            raise error_from_body(response.status, {"error": {"code": error.get("code"), "message": message}})
        answer = json.loads(data)
        if not isinstance(answer, dict):
            raise InternalError(f"the snapshot broker at {where(self.url)} answered {type(answer).__name__}")
        return answer


@dataclass
class UploadStats:
    """What one upload did (for the log and the tests)."""

    etag: str | None = None
    parts: int = 0
    size: int = 0
    largest_buffer: int = 0
    """The most bytes held at once: the bound on the upload's memory."""
    part_size: int = 0
    urls_asked: list[int] = field(default_factory=list)


def upload_multipart(broker: Broker, chunks: Iterable[bytes]) -> UploadStats:
    """Upload ``chunks`` (e.g. a tar + zstd stream) through ``broker``; abort on any failure."""
    started = _retried("starting the snapshot upload", lambda: broker.call("start"))
    upload_id, part_size = str(started["upload_id"]), int(started["part_size"])
    stats = UploadStats(part_size=part_size)
    urls: list[str] = list(started["urls"])
    etags: list[str] = []
    try:
        # One part's buffer, filled to exactly part_size and sent as it is (no copy): the memory bound is
        # one part plus one chunk of the stream.
        buffer = bytearray()
        for chunk in chunks:
            view = memoryview(chunk)
            while view:
                take = part_size - len(buffer)
                buffer += view[:take]
                view = view[take:]
                stats.largest_buffer = max(stats.largest_buffer, len(buffer) + len(view))
                if len(buffer) == part_size:
                    etags.append(_put_part(broker, upload_id, urls, len(etags) + 1, buffer, stats))
                    buffer = bytearray()
        if buffer or not etags:  # the last part may be short; an upload needs at least one
            etags.append(_put_part(broker, upload_id, urls, len(etags) + 1, buffer, stats))
        done = _retried("completing the snapshot upload",
                        lambda: broker.call("complete", upload_id=upload_id, etags=etags))
        stats.etag = done.get("etag")
    except BaseException:
        try:
            broker.call("abort", upload_id=upload_id)
        except GroveError as exc:  # the broker aborts leftovers at the next start and at deletion
            log.warning("aborting the snapshot upload failed: %s", exc.message)
        raise
    stats.parts = len(etags)
    return stats


def _put_part(broker: Broker, upload_id: str, urls: list[str], number: int, data: bytearray,
              stats: UploadStats) -> str:
    if number > len(urls):  # URLs come in batches, as the stream needs them
        stats.urls_asked.append(number)
        more = _retried("asking for part URLs", lambda: broker.call("parts", upload_id=upload_id, first=number))
        urls.extend(more["urls"])
        if number > len(urls):
            raise InternalError(f"the snapshot broker gave no URL for part {number}")
    etag = _retried(f"uploading part {number}", lambda: upload_via_presigned(urls[number - 1], data))
    if not etag:
        raise InternalError(f"S3 answered part {number} of the snapshot without an ETag")
    stats.size += len(data)
    return etag
