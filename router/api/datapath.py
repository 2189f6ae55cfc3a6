"""Data-path handlers: proxy each call to the sandbox's executor and record it in the trajectory.

The id→endpoint lookup is an in-memory dict access; the recording is one append to the sandbox's
journal after the answer is sent. Neither calls the backend, except to wake a sandbox scaled to zero.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from grove.core import wire
from grove.core.errors import (
    BadGateway,
    GroveError,
    InternalError,
    RequestTimeout,
    TooLarge,
    Unavailable,
    UpstreamTimeout,
)
from router.api.appkeys import service_of
from router.records.registry import SandboxRecord
from router.trajectory.fulloutputs import full_outputs_of
from router.trajectory.recorder import Digest, exec_step
from router.upstream.proxy import StreamAborted, Unreached, forward

log = logging.getLogger("grove.router")
MAX_EXEC_BODY = 256 * 1024 * 1024
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def call_executor(
    request: web.Request,
    upstream_path: str,
    **kwargs: Any,
) -> tuple[SandboxRecord, web.StreamResponse, float]:
    """Look up (waking if needed), forward, and return the record, response and start time.

    A fault of the environment on the way (executor lost, sandbox not resumable) is noted in the
    trajectory as an infra error before it propagates, so it never reads as the policy's failure.
    """
    service = service_of(request)
    record = service.registry.get(request.match_info["id"])
    started = time.time()
    what = f"{request.method} {upstream_path}"
    with service.calling(record, request.transport), service.recorder.faults(record, what):
        response = await _forward_once_more_if_unreached(request, record, upstream_path, **kwargs)
    if response.status == 500:
        service.recorder.infra_error(record, f"{request.method} {upstream_path}: the executor failed internally")
    return record, response, started


async def _forward_once_more_if_unreached(
    request: web.Request, record: SandboxRecord, upstream_path: str, **kwargs: Any
) -> web.StreamResponse:
    """Forward to the sandbox's endpoint. An endpoint that refused the connection got nothing of the call: if
    the backend's endpoints can move and the sandbox turns out gone (it goes idle), the call wakes it and is
    sent once more; otherwise it is the executor lost, as any broken connection."""
    service = service_of(request)
    for attempt in (1, 2):
        endpoint = await service.endpoint(record)
        try:
            return await forward(
                request, service.upstreams, endpoint, upstream_path, lambda: service.lost(record), **kwargs
            )
        except Unreached as exc:
            await service.lost(record)
            if attempt == 2 or not service.backend.endpoints_move or record.status != "idle":
                raise BadGateway(
                    f"the sandbox's executor went away: its endpoint refused the connection ({exc}); "
                    "the sandbox is restarted on the next call, its files kept"
                ) from exc
            log.info("%s: its endpoint %s is gone; waking it and sending the call again", record.id, endpoint.url)
    raise AssertionError("unreachable")


async def read_capped(request: web.Request, limit: int, what: str = "request body") -> bytes:
    """The whole request body, refusing more than ``limit`` bytes (413) and a sender that stalls for
    longer than the router's ``body_timeout_s`` between chunks (408: a slow body holds a connection)."""
    if request.content_length is not None and request.content_length > limit:
        raise TooLarge(f"{what} of {request.content_length} bytes exceeds {limit}")
    idle = service_of(request).settings.body_timeout_s
    data = bytearray()
    while True:
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for wraps every read in a task of its own,
            # two more turns of the event loop per exec even when the body has arrived whole.
            async with asyncio.timeout(idle):
                chunk = await request.content.readany()
        except TimeoutError as exc:
            raise RequestTimeout(f"no part of the {what} arrived for {idle:g}s after {len(data)} bytes") from exc
        if not chunk:
            return bytes(data)
        data += chunk
        if len(data) > limit:
            raise TooLarge(f"{what} exceeds {limit} bytes")


async def exec_handler(request: web.Request) -> web.StreamResponse:
    """POST /v1/sandboxes/{id}/exec — forwarded whole; the result recorded as an exec step."""
    body = await read_capped(request, MAX_EXEC_BODY, "exec body")
    answer = bytearray()
    service = service_of(request)
    started = time.time()
    try:
        record, response, started = await call_executor(request, "/v1/exec", body=body, response_tap=answer.extend)
    except (BadGateway, UpstreamTimeout, Unavailable, InternalError, StreamAborted) as exc:
        # The exec that lost the executor is a step of the trajectory too, with what went wrong: the
        # sandbox may have caused it (its memory exhausted), and then the record must say which command.
        lost = service.registry.lookup(request.match_info["id"])
        status, message = (exc.status, exc.message) if isinstance(exc, GroveError) else (502, str(exc))
        failed = _exec_step(body, request, message.encode(), status, started)
        if lost is not None and lost.status != "deleted" and failed is not None and "error" in failed:
            service.recorder.exec(lost, failed)
        raise
    step = _exec_step(body, request, bytes(answer), response.status, started)
    if step is not None and step.get("oom_killed") is True:
        await service.note_own_fault(record, rebase=True)  # a command died of it, the executor lived on
    if step is not None and service.recorder.exec(record, step):
        full = full_outputs_of(step)
        if full:
            # The full text of a truncated output goes to S3 beside the step that links it, at the pace
            # of the router's budget for it (the host, not the sandbox, pays for storing it).
            service.background(service.full_outputs.store(record, full), f"full output of {record.id}")
    return response


def _exec_step(body: bytes, request: web.Request, answer: bytes, status: int, started: float) -> dict[str, Any] | None:
    streamed = request.query.get("stream") in ("1", "true")
    return exec_step(body, request.content_type, answer, response_type(request), streamed, status, started)


def response_type(request: web.Request) -> str:
    """What the executor answered in: msgpack if the client asked for it."""
    return wire.MSGPACK if wire.is_msgpack(request.headers.get("Accept")) else wire.JSON


def transfer(upstream_path: str, kind: str) -> Handler:
    """A streamed file or archive call, recorded with the size and sha256 of what moved."""
    listing = upstream_path.rpartition("/")[2] if upstream_path.endswith(("/list", "/manifest")) else None

    async def handler(request: web.Request) -> web.StreamResponse:
        op = listing or {"GET": "read", "PUT": "write", "DELETE": "delete"}[request.method]
        digest = Digest() if op in ("read", "write") else None
        taps: dict[str, Any] = {}
        if digest is not None:
            taps["request_tap" if op == "write" else "response_tap"] = digest
        record, response, started = await call_executor(request, upstream_path, **taps)
        service_of(request).recorder.transfer(record, kind, op, path=request.query.get("path"),
                                              status=response.status, started=started, moved=digest)
        return response

    handler.__name__ = f"{kind}_handler"
    return handler
