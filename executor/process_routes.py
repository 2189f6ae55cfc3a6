"""The ``/v1/processes`` routes of the executor: start, list, get, logs (``follow``), signal and wait.

Every answer but the log's carries ``exits``: the processes that ended since the last answer, each handed out
once, which the router records as trajectory steps (:mod:`router.api.processes`) and leaves out of its own reply.
Two routes are the router's own: ``POST /v1/processes/exits`` (a long poll answering as soon as a process exits,
so its exit is recorded when it happens) and ``POST /v1/processes/end`` (every process ended, their exits
answered, before the sandbox stops) — see :mod:`router.lifecycle.process_exits`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from flask import Blueprint, Response, request

from executor.models import ExecRequest
from executor.processes import END_GRACE_S, Processes
from executor.served import Served
from grove.core import wire
from grove.core.errors import BadRequest, Invalid

START_FIELDS = frozenset({"command", "env", "cwd", "user", "stdio"})
MAX_WAIT_S = 280.0
"""The longest one wait call blocks (under the router's call timeout); the caller waits again after it."""


def processes_blueprint(served: Callable[[], Served]) -> Blueprint:
    """The routes of one executor (registered by ``app_shell``); ``served()`` is its sandbox."""
    bp = Blueprint("processes", __name__)

    def table() -> Processes:
        return served().processes

    def reply(value: dict[str, Any]) -> Response:
        value["exits"] = [*value.get("exits", []), *table().exits()]
        as_msgpack = wire.is_msgpack(request.headers.get("Accept"))
        return Response(wire.encode(value, as_msgpack), mimetype=wire.MSGPACK if as_msgpack else wire.JSON)

    def body() -> Mapping[str, Any]:
        limit = served().settings.max_request_bytes
        data = request.get_data(cache=False)
        if len(data) > limit:
            raise BadRequest(f"body exceeds {limit} bytes")
        decoded = wire.decode(data, request.content_type or wire.JSON) if data else {}
        if not isinstance(decoded, Mapping):
            raise BadRequest("the body must be a JSON object")
        return decoded

    @bp.post("")
    def start() -> Response:
        given = body()
        unknown = sorted(set(given) - START_FIELDS)
        if unknown:
            allowed = ", ".join(sorted(START_FIELDS))
            raise BadRequest(f"unknown field(s) {', '.join(map(repr, unknown))}; allowed: {allowed}")
        stdio = given.get("stdio", False)
        if not isinstance(stdio, bool):
            raise BadRequest("'stdio' must be true or false")
        fields = {k: v for k, v in given.items() if k != "stdio"}
        req = ExecRequest.parse(fields, served().settings)  # the same checks as an exec's command, env, cwd, user
        return reply(table().start(req.argv, req.cwd, req.user, req.env, stdio=stdio))

    @bp.get("")
    def list_() -> Response:
        return reply({"processes": table().list()})

    @bp.get("/<int:pid>")
    def get(pid: int) -> Response:
        return reply(table().get(pid))

    @bp.post("/<int:pid>/signal")
    def signal(pid: int) -> Response:
        name = body().get("signal", "SIGTERM")
        if not isinstance(name, str):
            raise BadRequest("'signal' must be a signal's name, such as \"SIGTERM\" or \"KILL\"")
        return reply(table().signal(pid, name))

    @bp.post("/<int:pid>/wait")
    def wait(pid: int) -> Response:
        return reply(table().wait(pid, _seconds(body(), "timeout_s", 30.0)))

    @bp.post("/exits")
    def exits() -> Response:
        return reply(table().next_exits(_seconds(body(), "timeout_s", 30.0)))

    @bp.post("/end")
    def end() -> Response:
        return reply({"exits": table().end_all(_seconds(body(), "grace_s", END_GRACE_S))})

    @bp.get("/<int:pid>/logs")
    def logs(pid: int) -> Response:
        try:
            offset = int(request.args.get("offset", "0"))
        except ValueError:
            raise BadRequest("'offset' must be a whole number of bytes") from None
        if offset < 0:
            raise Invalid(f"'offset' must be 0 or more, got {offset}")
        follow = request.args.get("follow") in ("1", "true")
        chunks = table().logs(pid, offset, follow)
        return Response(chunks, mimetype="application/octet-stream", headers={"X-Accel-Buffering": "no"})

    return bp


def _seconds(given: Mapping[str, Any], name: str, default: float) -> float:
    """A wait's length in seconds from the body: a number from 0 to :data:`MAX_WAIT_S`."""
    value = given.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise BadRequest(f"'{name}' must be a number of seconds")
    if not 0 <= value <= MAX_WAIT_S:
        raise Invalid(f"'{name}' must be between 0 and {MAX_WAIT_S:g}, got {value}; wait again for longer")
    return float(value)
