"""envd's ``process.Process`` service for the router's E2B layer, under ``/e2b/processes``, on the sandbox's one
process table (:mod:`executor.processes`, the same as ``/v1/processes``: the same cap, ``grove ps`` lists them).

Private to :mod:`router.api.compat.e2b`: its shapes follow envd's, not grove's public API. A process is started
attached, its output streamed back as newline-delimited JSON events (``{"start": pid}``, ``{"stdout"|"stderr":
base64}``, ``{"end": {"exit_code", "signal"}}``), and lives on when that stream is dropped (an E2B background
command): it can be listed, re-attached to (output from then on, as envd does), fed stdin, have its stdin
closed, and be signalled, all by pid. A process that ended is not found here, as envd answers.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from typing import Any

from flask import Blueprint, Response, request

from executor.process_output import Event
from executor.processes import Process, Processes
from executor.served import Served
from grove.core.errors import BadRequest

SIGNALS = {"SIGNAL_SIGKILL": "SIGKILL", "SIGNAL_SIGTERM": "SIGTERM"}
"""envd's signal names, as the table names them."""


def _lines(pid: int, events: Iterator[Event]) -> Iterator[bytes]:
    try:
        yield json.dumps({"start": pid}).encode() + b"\n"
        for name, value in events:
            data = base64.b64encode(value).decode() if name != "end" else value
            yield json.dumps({name: data}).encode() + b"\n"
    finally:
        close = getattr(events, "close", None)
        if close is not None:
            close()  # the client went away: the process lives on, detached from this stream


def _info(process: Process) -> dict[str, Any]:
    """envd's ``ProcessInfo``."""
    cmd, *args = process.argv
    return {"pid": process.pid, "tag": process.tag,
            "config": {"cmd": cmd, "args": args, "envs": process.env, "cwd": process.cwd}}


def e2b_blueprint(served: Callable[[], Served]) -> Blueprint:
    """The routes, on the bound executor's process table."""
    bp = Blueprint("e2b", __name__)

    def table() -> Processes:
        return served().processes

    def body() -> dict[str, Any]:
        value = request.get_json(silent=True)
        if not isinstance(value, dict):
            raise BadRequest("the body must be a JSON object")
        return value

    def pid_of(sent: dict[str, Any]) -> int:
        pid = sent.get("pid")
        if not isinstance(pid, int) or isinstance(pid, bool):
            raise BadRequest("'pid' must be a process id (a number)")
        return pid

    def stream(pid: int, events: Iterator[Event]) -> Response:
        return Response(_lines(pid, events), mimetype="application/x-ndjson")

    @bp.post("/processes")
    def start() -> Response:
        spec = body()
        cmd, args, envs = spec.get("cmd"), spec.get("args") or [], spec.get("envs") or {}
        if not isinstance(cmd, str) or not cmd or not isinstance(args, list) or not isinstance(envs, dict):
            raise BadRequest("a process needs 'cmd' (a non-empty string), 'args' (a list) and 'envs' (a map)")
        cwd, tag = spec.get("cwd"), spec.get("tag")
        process, events = table().start_attached(
            [cmd, *map(str, args)], cwd if isinstance(cwd, str) and cwd else None,
            {str(k): str(v) for k, v in envs.items()}, tag=tag if isinstance(tag, str) else None,
            stdin=bool(spec.get("stdin")))
        return stream(process.pid, events)

    @bp.post("/processes/connect")
    def connect() -> Response:
        pid = pid_of(body())
        return stream(pid, table().attach(pid))

    @bp.get("/processes")
    def listing() -> Response:
        processes = [_info(p) for p in table().running_ones()]
        return Response(json.dumps({"processes": processes}), mimetype="application/json")

    @bp.post("/processes/signal")
    def send_signal() -> Response:
        sent = body()
        name = sent.get("signal")
        if not isinstance(name, str) or name not in SIGNALS:
            raise BadRequest(f"signal {name!r} is not one of {', '.join(SIGNALS)}")
        table().signal(table().running(pid_of(sent)).pid, SIGNALS[name])
        return Response("{}", mimetype="application/json")

    @bp.post("/processes/stdin")
    def send_input() -> Response:
        sent = body()
        try:
            data = base64.b64decode(str(sent.get("data", "")), validate=True)
        except ValueError as exc:
            raise BadRequest("'data' must be base64") from exc
        table().write(pid_of(sent), data)
        return Response("{}", mimetype="application/json")

    @bp.post("/processes/close-stdin")
    def close_stdin() -> Response:
        table().write(pid_of(body()), b"", close=True)
        return Response("{}", mimetype="application/json")

    return bp
