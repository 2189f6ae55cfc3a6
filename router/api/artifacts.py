"""Handlers for stored artifacts: list them by sandbox, task or run; fetch one (byte ranges), or a fresh
presigned URL of it. The index is :mod:`artifacts.artifact_index`; S3's credentials never leave the router.

Every fetch answers with the recorded ``X-Grove-Sha256`` and ``X-Grove-Size``, so a client verifies the
bytes end to end (the SDK and ``grove artifacts get|pull`` do), and with the object's current ``ETag``
for ``If-Range``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from artifacts import catalog
from artifacts import trajectory as tj
from artifacts.artifact_index import ArtifactIndex, Page
from artifacts.catalog import Query
from artifacts.store import ObjectStore
from artifacts.streams import CHUNK
from grove.core.artifact import Artifact
from grove.core.errors import Conflict, GroveError, NotFound, RangeNotSatisfiable
from grove.core.schema import parse_query
from router.api import ranges
from router.api.appkeys import knows, service_of, storage_of, storage_of_sandbox, unknown_sandbox
from router.api.replies import reply
from router.models import ArtifactQuery, FetchQuery, SandboxArtifactQuery
from router.upstream.proxy import StreamAborted


async def list_artifacts(request: web.Request) -> web.Response:
    """GET /v1/artifacts?sandbox_id=&task_id=&run_id=&limit=&page_token= — one page of stored artifacts."""
    q = parse_query(ArtifactQuery, request.query)
    page = await asyncio.to_thread(_index(request).page, Query(q.sandbox_id, q.task_id, q.run_id), q.limit,
                                   q.page_token)
    return reply(request, _page_body(page))


async def list_sandbox_artifacts(request: web.Request) -> web.Response:
    """GET /v1/sandboxes/{id}/artifacts — one page of a sandbox's stored artifacts, live or deleted."""
    sandbox_id = request.match_info["id"]
    q = parse_query(SandboxArtifactQuery, request.query)
    page = await asyncio.to_thread(_index(request, sandbox_id).page, Query(sandbox_id=sandbox_id), q.limit,
                                   q.page_token)
    if not page.entries and q.page_token is None:
        await _require_known(request, sandbox_id)
    return reply(request, _page_body(page))


async def get_artifact(request: web.Request) -> web.StreamResponse:
    """GET /v1/artifacts/{sandbox_id}/{path} — the bytes (honouring ``Range``), or with ``?redirect=1`` a 307
    to a fresh presigned GET URL."""
    sandbox_id = request.match_info["sandbox_id"]
    path = catalog.normalize_path(request.match_info["path"])
    q = parse_query(FetchQuery, request.query)
    service = service_of(request)
    try:
        entry = await asyncio.to_thread(_index(request, sandbox_id).entry, sandbox_id, path)
    except NotFound:
        if not await _known(request, sandbox_id):  # nothing of it anywhere the caller may look: as any unknown id
            raise unknown_sandbox(sandbox_id) from None
        raise
    headers = {"X-Grove-Sha256": entry.sha256, "X-Grove-Size": str(entry.size), "Cache-Control": "no-store"}
    if q.redirect:
        expires = q.expires_s or service.settings.artifact_url_expires_s
        url = await asyncio.to_thread(_store(request, sandbox_id).presign_get, entry.key, expires)
        return web.Response(status=307, headers={**headers, "Location": url})
    return await _stream(request, _store(request, sandbox_id), entry, headers)


async def _stream(
    request: web.Request, store: ObjectStore, entry: Artifact, headers: dict[str, str]
) -> web.StreamResponse:
    try:
        info = await asyncio.to_thread(store.stat, entry.key)
    except NotFound:
        raise NotFound(f"artifact {entry.path} of sandbox {entry.sandbox_id} is in the index but its object "
                       f"{entry.key} is gone from S3 (expired or deleted)") from None
    headers = {**headers, "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
    if info.etag:
        headers["ETag"] = f'"{info.etag.strip(chr(34))}"'
    try:
        wanted = ranges.requested(request.headers.get("Range"), info.size, request.headers.get("If-Range"),
                                  info.etag.strip('"') if info.etag else None)
    except RangeNotSatisfiable as exc:
        answer = reply(request, exc.to_body(), status=exc.status)
        answer.headers.update({**headers, "Content-Range": f"bytes */{info.size}"})
        answer.headers["Content-Type"] = answer.content_type
        return answer
    response = web.StreamResponse(status=206 if wanted else 200, headers=headers)
    offset, length = (wanted.start, wanted.length) if wanted else (0, info.size)
    if wanted:
        response.headers["Content-Range"] = wanted.content_range()
    response.content_length = length
    reader = await asyncio.to_thread(store.get_stream, entry.key, offset, length) if length else None
    try:
        await response.prepare(request)
        left = length
        while reader is not None and left > 0:
            chunk = await asyncio.to_thread(reader.read, min(CHUNK, left))
            if not chunk:  # the object shrank under us (overwritten behind grove's back)
                raise StreamAborted(f"{entry.key} ended {left} bytes early")
            left -= len(chunk)
            await response.write(chunk)
    except GroveError as exc:  # S3 failed mid-body: the status is sent, cutting the connection is the signal
        raise StreamAborted(f"reading {entry.key} failed: {exc.message}") from exc
    except ConnectionResetError as exc:  # the client went away (e.g. a pull interrupted): nothing to answer
        raise StreamAborted(f"the client left while reading {entry.key}") from exc
    finally:
        if reader is not None:
            await asyncio.to_thread(reader.close)
    await response.write_eof()
    return response


def _page_body(page: Page) -> dict[str, Any]:
    return {"artifacts": [e.public() for e in page.entries], "next_page_token": page.next_token}


async def _require_known(request: web.Request, sandbox_id: str) -> None:
    """NotFound unless the router knows the sandbox (live or recently deleted) or S3 holds its trajectory."""
    try:
        service_of(request).registry.get(sandbox_id)
        return
    except Conflict:
        return  # deleted: known, just without artifacts
    except NotFound as exc:
        missing = exc
    if not await asyncio.to_thread(_store(request, sandbox_id).exists, tj.by_id_key(sandbox_id)):
        raise missing


async def _known(request: web.Request, sandbox_id: str) -> bool:
    """Whether the sandbox is the caller's to know of: the router knows it so, or its record is stored in the
    caller's part of the bucket (the router forgot it)."""
    if knows(request, sandbox_id):
        return True
    return await asyncio.to_thread(_store(request, sandbox_id).exists, tj.by_id_key(sandbox_id))


def _index(request: web.Request, sandbox_id: str | None = None) -> ArtifactIndex:
    """The artifact index of the call's project (of the sandbox's, for one the router knows)."""
    return (storage_of(request) if sandbox_id is None else storage_of_sandbox(request, sandbox_id)).artifacts


def _store(request: web.Request, sandbox_id: str) -> ObjectStore:
    return storage_of_sandbox(request, sandbox_id).objects

