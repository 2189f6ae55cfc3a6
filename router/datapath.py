"""Data-path handlers: proxy each call to the sandbox's executor and record it in the trajectory.

The id→endpoint lookup is an in-memory dict access; the recording is one append to the sandbox's
journal after the answer is sent. Neither calls the backend, except to wake a sandbox scaled to zero.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgpack
from aiohttp import web

from artifacts.catalog import artifact_key
from grove import wire
from grove.errors import (
    BadGateway,
    GroveError,
    InternalError,
    RequestTimeout,
    TooLarge,
    Unavailable,
    UpstreamTimeout,
)
from router.fulloutputs import full_outputs_of, store_full_outputs
from router.proxy import StreamAborted, forward
from router.registry import SandboxRecord
from router.service import SandboxService

log = logging.getLogger("grove.router")
MAX_EXEC_BODY = 256 * 1024 * 1024
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def service_of(request: web.Request) -> SandboxService:
    """The app's sandbox service."""
    from router.app import SERVICE

    return request.app[SERVICE]


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
    service.touch(record)
    record.inflight += 1
    started = time.time()
    try:
        with service.infra_faults(record, f"{request.method} {upstream_path}"):
            endpoint = await service.endpoint(record)
            response = await forward(
                request, service.upstreams, endpoint, upstream_path, lambda: service.lost(record), **kwargs
            )
    finally:
        record.inflight -= 1
        service.touch(record)
    if response.status == 500:
        service.record_infra_error(record, f"{request.method} {upstream_path}: the executor failed internally")
    return record, response, started


async def read_capped(request: web.Request, limit: int, what: str = "request body") -> bytes:
    """The whole request body, refusing more than ``limit`` bytes (413) and a sender that stalls for
    longer than the router's ``body_timeout_s`` between chunks (408: a slow body holds a connection)."""
    if request.content_length is not None and request.content_length > limit:
        raise TooLarge(f"{what} of {request.content_length} bytes exceeds {limit}")
    idle = service_of(request).settings.body_timeout_s
    data = bytearray()
    while True:
        try:
            chunk = await asyncio.wait_for(request.content.readany(), idle)
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
            service.record_step(lost, failed)
        raise
    step = _exec_step(body, request, bytes(answer), response.status, started)
    if step is not None and step.get("oom_killed") is True:
        await service.note_own_fault(record, rebase=True)  # a command died of it, the executor lived on
    # A failed call is always a step; a result is one step however often a retry fetched it.
    if step is not None and ("error" in step or _first_time(record, step.get("request_id"))):
        full = full_outputs_of(step)
        for stream in ("stdout", "stderr"):
            if isinstance(path := step.get(f"{stream}_file"), str):
                step[f"{stream}_artifact"] = artifact_key(record.id, path)
        service.record_step(record, step)
        if full:
            # The full text of a truncated output goes to S3 beside the step that links it, at the pace
            # of the router's budget for it (the host, not the sandbox, pays for storing it).
            service.background(store_full_outputs(service, record, full), f"full output of {record.id}")
    return response


_REMEMBERED_REQUESTS = 4096


def _first_time(record: SandboxRecord, request_id: object) -> bool:
    """Whether this exec's request id is new to the trajectory (the SDK retries with the same id)."""
    if not isinstance(request_id, str):
        return True
    if request_id in record.recorded_requests:
        return False
    record.recorded_requests[request_id] = None
    if len(record.recorded_requests) > _REMEMBERED_REQUESTS:
        del record.recorded_requests[next(iter(record.recorded_requests))]
    return True


def _exec_step(body: bytes, request: web.Request, answer: bytes, status: int, started: float) -> dict[str, Any] | None:
    try:
        sent = wire.decode(body, request.content_type)
    except Exception:
        return None  # the executor answered 400 about it; nothing ran
    if not isinstance(sent, dict):
        return None
    env = sent.get("env")
    stdin = sent.get("stdin")
    step: dict[str, Any] = {
        "type": "exec",
        "t": started,
        "latency_s": round(time.time() - started, 6),
        "command": sent.get("command"),
        "cwd": sent.get("cwd"),
        "user": sent.get("user"),
        "env_keys": sorted(env) if isinstance(env, dict) else [],
        "stdin_bytes": len(stdin) if isinstance(stdin, bytes | str) else 0,
        "timeout_s": sent.get("timeout_s"),
        "request_id": sent.get("request_id"),
    }
    result = _final_result(answer, response_type(request), request.query.get("stream") in ("1", "true"))
    if status >= 400 or result is None:
        step["error"] = {"status": status, "body": answer[:2000].decode("utf-8", "replace")}
        return step
    step.update(result)
    return step


def response_type(request: web.Request) -> str:
    """What the executor answered in: msgpack if the client asked for it."""
    return wire.MSGPACK if wire.is_msgpack(request.headers.get("Accept")) else wire.JSON


def _final_result(answer: bytes, content_type: str, streamed: bool) -> dict[str, Any] | None:
    try:
        if not streamed:
            value = wire.decode(answer, content_type)
            return value if isinstance(value, dict) and "exit_code" in value else None
        if content_type == wire.MSGPACK:
            unpacker = msgpack.Unpacker(raw=False)
            unpacker.feed(answer)
            frames = list(unpacker)
        else:
            frames = [wire.decode(line, wire.JSON) for line in answer.splitlines() if line.strip()]
    except Exception:
        return None
    for frame in reversed(frames):
        if isinstance(frame, dict) and frame.get("type") == "result":
            result = frame.get("result")
            return result if isinstance(result, dict) else None
    return None


CONTENT_RECORDED = 65536
"""File contents up to this size are kept in the trajectory (so exports can show an edit as a tool call)."""


class _Digest:
    """Size and sha256 of bytes passing through, and the head of them (up to :data:`CONTENT_RECORDED`)."""

    def __init__(self) -> None:
        self.size = 0
        self.hash = hashlib.sha256()
        self.head = bytearray()

    def __call__(self, chunk: bytes) -> None:
        self.size += len(chunk)
        self.hash.update(chunk)
        if len(self.head) <= CONTENT_RECORDED:
            self.head.extend(chunk[: CONTENT_RECORDED + 1 - len(self.head)])

    def content(self) -> str | None:
        """The whole content as text, if it was small and valid UTF-8."""
        if len(self.head) > CONTENT_RECORDED:
            return None
        try:
            return bytes(self.head).decode("utf-8")
        except UnicodeDecodeError:
            return None


def transfer(upstream_path: str, kind: str) -> Handler:
    """A streamed file or archive call, recorded with the size and sha256 of what moved."""

    async def handler(request: web.Request) -> web.StreamResponse:
        digest = _Digest()
        taps: dict[str, Any] = {}
        if request.method == "PUT":
            taps["request_tap"] = digest
        elif request.method == "GET" and not upstream_path.endswith("/list"):
            taps["response_tap"] = digest
        record, response, started = await call_executor(request, upstream_path, **taps)
        op = {"GET": "read", "PUT": "write", "DELETE": "delete"}[request.method]
        if upstream_path.endswith("/list"):
            op = "list"
        step: dict[str, Any] = {
            "type": f"{kind}_{op}",
            "t": started,
            "path": request.query.get("path"),
            "status": response.status,
        }
        if op in ("read", "write"):
            step["size"], step["sha256"] = digest.size, digest.hash.hexdigest()
            if kind == "file" and response.status < 300 and (text := digest.content()) is not None:
                step["content"] = text
        service_of(request).record_step(record, step)
        return response

    handler.__name__ = f"{kind}_handler"
    return handler
