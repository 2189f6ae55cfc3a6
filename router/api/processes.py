"""Background processes: ``/v1/sandboxes/{id}/processes`` — start, list, get, logs (``?follow=1``), signal, wait.

The executor does the work (:mod:`executor.processes`); the router relays and records. A start is a step
(``{"type": "process", "event": "start"}``: the command, its place, its user, the names of its variables) and
so is each exit (``"event": "exit"``: the exit code, the last signal sent, how long it ran), recorded when it
happens or before the sandbox stops (:mod:`router.lifecycle.process_exits`), or with any answer here. A log
read is not recorded (its bytes are the process's, read as often as anyone likes).
"""

from __future__ import annotations

import time
from typing import Any

import aiohttp
from aiohttp import web

from grove.core import wire
from grove.core.errors import BadRequest, GroveError, NotFound
from router.api.appkeys import sandbox_of, service_of
from router.api.computer import call
from router.api.datapath import call_executor, read_capped
from router.lifecycle.service import SandboxService
from router.records.registry import SandboxRecord

MAX_BODY = 1024 * 1024
LOG_TAIL = 2000
"""Bytes of a process's log an error's message quotes (a stdio MCP server's exit, a template command's)."""
LOG_TAIL_READ = 16 * 1024 * 1024
"""At most this much of a log is read for its tail (a process that wrote more is quoted from there)."""


async def start_process(request: web.Request) -> web.Response:
    """POST /v1/sandboxes/{id}/processes — ``{command, env?, cwd?, user?}``; 201 with the process (``pid``)."""
    body = await _body(request)
    if "stdio" in body:
        raise BadRequest("'stdio' is for MCP servers: PUT /v1/sandboxes/{id}/mcp/{name} with their command")
    service, record = service_of(request), sandbox_of(request, request.match_info["id"])
    return _reply(service, record, await start_recorded(service, record, body), status=201)


async def start_recorded(service: SandboxService, record: SandboxRecord, body: dict[str, Any]) -> dict[str, Any]:
    """Start one (``body`` as the API takes it) and record its start; the executor's answer, ``exits`` and all."""
    answer = await call(service, record, "POST", "/v1/processes", body)
    _started(service, record, answer, body.get("env"))
    return answer


def _started(service: SandboxService, record: SandboxRecord, answer: dict[str, Any], env: Any) -> None:
    """A process the executor started: its ``start`` step, and its exit watched for."""
    service.recorder.step(record, {
        "type": "process", "event": "start", "t": answer.get("started_at", time.time()), "pid": answer.get("pid"),
        "command": answer.get("command"), "cwd": answer.get("cwd"), "user": answer.get("user"),
        "env_keys": sorted(env) if isinstance(env, dict) else []})
    service.process_exits.started(record)


async def list_processes(request: web.Request) -> web.Response:
    """GET /v1/sandboxes/{id}/processes — every process the sandbox remembers, running or ended."""
    return await _relay(request, "GET", "/v1/processes", None)


async def get_process(request: web.Request) -> web.Response:
    """GET /v1/sandboxes/{id}/processes/{pid} — its status and exit code."""
    return await _relay(request, "GET", f"/v1/processes/{_pid(request)}", None)


async def signal_process(request: web.Request) -> web.Response:
    """POST /v1/sandboxes/{id}/processes/{pid}/signal — ``{"signal": "SIGTERM"}`` to its process group."""
    return await _relay(request, "POST", f"/v1/processes/{_pid(request)}/signal", await _body(request))


async def wait_process(request: web.Request) -> web.Response:
    """POST /v1/sandboxes/{id}/processes/{pid}/wait — ``{"timeout_s": 30}``; its state once ended or timed out."""
    return await _relay(request, "POST", f"/v1/processes/{_pid(request)}/wait", await _body(request))


async def process_logs(request: web.Request) -> web.StreamResponse:
    """GET /v1/sandboxes/{id}/processes/{pid}/logs — its output from ``?offset=``; ``?follow=1`` streams it until
    the process ends."""
    _, response, _ = await call_executor(request, f"/v1/processes/{_pid(request)}/logs")
    return response


def _pid(request: web.Request) -> int:
    """The process id of the path; a 404 for anything but a number (no process has another name)."""
    pid = request.match_info["pid"]
    if not pid.isascii() or not pid.isdigit() or len(pid) > 10:
        raise NotFound(f"no background process {pid[:40]!r}: a process is named by its pid, a number")
    return int(pid)


async def _relay(request: web.Request, method: str, path: str, body: dict[str, Any] | None) -> web.Response:
    service, record = service_of(request), sandbox_of(request, request.match_info["id"])
    return _reply(service, record, await call(service, record, method, path, body))


def _reply(service: SandboxService, record: SandboxRecord, answer: dict[str, Any], status: int = 200) -> web.Response:
    """The answer without the executor's ``exits``, each of which becomes a step."""
    return web.json_response(without_exits(service, record, answer), status=status)


async def _body(request: web.Request) -> dict[str, Any]:
    raw = await read_capped(request, MAX_BODY, "process request")
    try:
        body = wire.decode(raw, request.content_type) if raw else {}
    except GroveError:
        raise
    except Exception as exc:
        raise BadRequest(f"the body is not valid JSON or msgpack: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


def without_exits(service: SandboxService, record: SandboxRecord, answer: dict[str, Any]) -> dict[str, Any]:
    """``answer`` less the executor's ``exits``, each recorded as a step (every answer of the process API, and
    the router's own calls: an E2B template's start command, a stdio MCP server)."""
    service.process_exits.record(record, answer.pop("exits", None))
    return answer


async def log_tail(service: SandboxService, record: SandboxRecord, pid: int, limit: int = LOG_TAIL) -> bytes | None:
    """The last ``limit`` bytes of a process's log (of its first :data:`LOG_TAIL_READ` bytes), for an error's
    message; None if it cannot be read."""
    endpoint = record.endpoint()
    if record.status != "ready" or endpoint is None:
        return None
    tail, read = b"", 0
    try:
        async with service.upstreams.call(endpoint, "GET", f"/v1/processes/{pid}/logs", timeout_s=30) as resp:
            if resp.status != 200:
                return None
            async for chunk in resp.content.iter_any():
                tail = (tail + chunk)[-limit:]
                read += len(chunk)
                if read > LOG_TAIL_READ:
                    break
    except (GroveError, aiohttp.ClientError, TimeoutError):
        return None
    return tail
