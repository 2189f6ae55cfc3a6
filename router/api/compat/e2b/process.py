"""envd's ``process.Process`` service over the executor's ``/e2b/processes`` (:mod:`executor.e2b_processes`).

``Start`` and ``Connect`` stream the process's events as Connect envelopes (start, data, end, and a keepalive
when nothing else was sent for the client's ``Keepalive-Ping-Interval``); a process outlives a dropped stream
(an E2B background command) and ends at the client's ``Connect-Timeout-Ms``, killed as envd kills it. A
``Start`` is recorded as an exec step once its stream ends: argv, cwd, env keys, exit code, output (capped).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
from typing import Any

from aiohttp import web

from grove.core import wire as grove_wire
from grove.core.errors import BadGateway, BadRequest, GroveError, error_from_body
from router.api.compat.calls import SandboxCalls
from router.api.compat.e2b.wire import STREAM_TYPE, ConnectError, end_stream, envelope

_RECORD_LIMIT = 1024 * 1024
_KEEPALIVE_S = 50.0
_LINE_LIMIT = 256 * 1024


async def _json_call(calls: SandboxCalls, method: str, path: str, body: dict[str, Any] | None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    async with calls.open(method, path, data=data, content_type=grove_wire.JSON) as resp:
        answer = await resp.read()
        if resp.status != 200:
            raise error_from_body(resp.status, grove_wire.decode(answer, resp.content_type))
        return grove_wire.decode(answer, resp.content_type)


async def _pid(calls: SandboxCalls, selector: Any) -> int:
    """The pid a ``ProcessSelector`` names (by pid, or by tag among the running ones)."""
    if isinstance(selector, dict) and isinstance(selector.get("pid"), int):
        return int(selector["pid"])
    if isinstance(selector, dict) and isinstance(selector.get("tag"), str):
        for proc in (await list_processes(calls, {}))["processes"]:
            if proc.get("tag") == selector["tag"]:
                return int(proc["pid"])
        raise ConnectError("not_found", f"process with tag {selector['tag']} not found")
    raise BadRequest("'process' must select a process by 'pid' or 'tag'")


async def list_processes(calls: SandboxCalls, _: dict[str, Any]) -> dict[str, Any]:
    """``List``: the running processes."""
    answer = await _json_call(calls, "GET", "/e2b/processes", None)
    processes = []
    for proc in answer.get("processes", []):
        config = {k: v for k, v in proc["config"].items() if v is not None}
        processes.append({"pid": proc["pid"], "config": config, **({"tag": proc["tag"]} if proc.get("tag") else {})})
    return {"processes": processes}


async def send_signal(calls: SandboxCalls, body: dict[str, Any]) -> dict[str, Any]:
    """``SendSignal``: SIGKILL or SIGTERM to the process's group."""
    pid = await _pid(calls, body.get("process"))
    await _json_call(calls, "POST", "/e2b/processes/signal", {"pid": pid, "signal": body.get("signal")})
    calls.note({"type": "process_signal", "t": time.time(), "pid": pid, "signal": body.get("signal")})
    return {}


async def send_input(calls: SandboxCalls, body: dict[str, Any]) -> dict[str, Any]:
    """``SendInput``: bytes to the process's stdin."""
    pid = await _pid(calls, body.get("process"))
    given = body.get("input")
    data = given.get("stdin") if isinstance(given, dict) else None
    if not isinstance(data, str):
        raise ConnectError("unimplemented", "only 'stdin' input is supported (grove has no PTY here)")
    await _json_call(calls, "POST", "/e2b/processes/stdin", {"pid": pid, "data": data})
    calls.note({"type": "process_input", "t": time.time(), "pid": pid, "bytes": len(base64.b64decode(data))})
    return {}


async def close_stdin(calls: SandboxCalls, body: dict[str, Any]) -> dict[str, Any]:
    """``CloseStdin``."""
    pid = await _pid(calls, body.get("process"))
    await _json_call(calls, "POST", "/e2b/processes/close-stdin", {"pid": pid})
    calls.note({"type": "process_input", "t": time.time(), "pid": pid, "closed": True})
    return {}


class _Output:
    """What a stream carried, kept for the record up to a limit."""

    def __init__(self) -> None:
        self.data = {"stdout": bytearray(), "stderr": bytearray()}
        self.truncated = {"stdout": False, "stderr": False}

    def add(self, name: str, chunk: bytes) -> None:
        kept = self.data[name]
        room = _RECORD_LIMIT - len(kept)
        kept += chunk[:max(room, 0)]
        self.truncated[name] |= len(chunk) > room


def _event(line: dict[str, Any]) -> dict[str, Any]:
    """envd's ``ProcessEvent`` of one executor event."""
    if "start" in line:
        return {"start": {"pid": line["start"]}}
    if "end" in line:
        end = line["end"]
        if end.get("signal"):
            return {"end": {"exitCode": -1, "exited": False, "status": "signal: killed", "error": "signal: killed"}}
        code = int(end.get("exit_code", 0))
        return {"end": {"exitCode": code, "exited": True, "status": f"exit status {code}"}}
    name = "stdout" if "stdout" in line else "stderr"
    return {"data": {name: line[name]}}


async def stream(request: web.Request, calls: SandboxCalls, method: str, body: dict[str, Any]) -> web.StreamResponse:
    """``Start`` or ``Connect``: the process's events, enveloped, until it ends, the client leaves, or the
    client's deadline passes (then the process is killed)."""
    deadline_ms = request.headers.get("Connect-Timeout-Ms")
    deadline = time.monotonic() + int(deadline_ms) / 1000 if deadline_ms and deadline_ms.isdigit() else None
    keepalive = _keepalive(request)
    response = web.StreamResponse(status=200, headers={"Content-Type": STREAM_TYPE})
    started, output, pid, end = time.time(), _Output(), None, None
    config = body.get("process") if method == "Start" else None
    try:
        if method == "Start":
            if body.get("pty"):
                raise ConnectError("unimplemented", "PTY sessions are not supported by grove's E2B endpoint")
            if not isinstance(config, dict):
                raise BadRequest("'process' (a ProcessConfig) is required")
            upstream, payload = "/e2b/processes", {**config, "stdin": bool(body.get("stdin")), "tag": body.get("tag")}
        else:
            upstream, payload = "/e2b/processes/connect", {"pid": await _pid(calls, body.get("process"))}
        async with calls.open("POST", upstream, data=json.dumps(payload).encode(),
                              content_type=grove_wire.JSON) as resp:
            if resp.status != 200:
                raise error_from_body(resp.status, grove_wire.decode(await resp.read(), resp.content_type))
            await response.prepare(request)
            while True:
                wait = keepalive if deadline is None else min(keepalive, deadline - time.monotonic())
                if wait <= 0:
                    await _kill(calls, pid)
                    raise ConnectError("deadline_exceeded", "the command's timeout passed: it was killed")
                try:
                    raw = await asyncio.wait_for(resp.content.readline(), wait)
                except TimeoutError:
                    if deadline is None or time.monotonic() < deadline:
                        await response.write(envelope({"event": {"keepalive": {}}}))
                    continue
                if not raw:
                    raise BadGateway("the sandbox's executor ended the process stream early")
                line = json.loads(raw)
                pid = line.get("start", pid)
                for name in ("stdout", "stderr"):
                    if name in line:
                        output.add(name, base64.b64decode(line[name]))
                await response.write(envelope({"event": _event(line)}))
                if "end" in line:
                    end = line["end"]
                    break
        await response.write(end_stream())
    except GroveError as err:
        if not response.prepared:
            await response.prepare(request)
        with contextlib.suppress(ConnectionResetError):  # the client left first (its sandbox killed): no one to tell
            await response.write(end_stream(err))
    except (ConnectionResetError, asyncio.CancelledError):
        _record(calls, config, body, started, output, pid, None, detached=True)
        raise
    if method == "Start":
        _record(calls, config, body, started, output, pid, end, detached=False)
    return response


async def _kill(calls: SandboxCalls, pid: int | None) -> None:
    if pid is not None:
        with contextlib.suppress(GroveError):  # it ended meanwhile
            await _json_call(calls, "POST", "/e2b/processes/signal", {"pid": pid, "signal": "SIGNAL_SIGKILL"})


def _keepalive(request: web.Request) -> float:
    given = request.headers.get("Keepalive-Ping-Interval", "")
    return min(float(given), _KEEPALIVE_S) if given.isdigit() and int(given) > 0 else _KEEPALIVE_S


def _record(calls: SandboxCalls, config: Any, body: dict[str, Any], started: float, output: _Output, pid: int | None,
            end: dict[str, Any] | None, *, detached: bool) -> None:
    """The exec step of a ``Start``."""
    if not isinstance(config, dict):
        return
    envs = config.get("envs")
    step: dict[str, Any] = {
        "type": "exec", "t": started, "latency_s": round(time.time() - started, 6),
        "command": [config.get("cmd"), *(config.get("args") or [])], "cwd": config.get("cwd"),
        "env_keys": sorted(envs) if isinstance(envs, dict) else [], "pid": pid, "request_id": None,
        "stdin": bool(body.get("stdin")), "tag": body.get("tag"),
        "stdout": bytes(output.data["stdout"]), "stderr": bytes(output.data["stderr"]),
        "stdout_truncated": output.truncated["stdout"], "stderr_truncated": output.truncated["stderr"],
        "duration_s": round(time.time() - started, 6), "timed_out": False,
    }
    if end is not None:
        step["exit_code"] = end.get("exit_code") if not end.get("signal") else -1
        step["signal"] = end.get("signal")
    else:
        step["exit_code"] = None
        step["detached"] = detached
    calls.note(step)
