"""``GET /v1/sandboxes/{id}/pty``: a terminal in the sandbox as a WebSocket, recorded as a stream of steps.

The client sends binary messages (keystrokes) or text ones: ``{"type": "input", "data": "ls\\n"}`` and
``{"type": "resize", "cols": 120, "rows": 40}``. It receives binary messages (the terminal's output) and, when
the shell ends, ``{"type": "exit", "exit_code": N}`` before the close. Closing the WebSocket hangs the shell
up. Between router and executor the session is a ``grove-pty`` upgrade carrying :mod:`grove.core.ptyframes`,
resumed when that connection is cut (:func:`pty_handler`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from typing import Any

import aiohttp
from aiohttp import web

from grove.core import ptyframes
from grove.core.errors import BadRequest, GroveError, NotFound
from router.api.appkeys import sandbox_of, service_of
from router.ports.tunnels import open_upgraded
from router.records.registry import SandboxRecord
from router.trajectory.recorder import Recorder

STEP_TEXT = 64 * 1024
"""Most text of one input or output step (the rest counted, not kept)."""
SESSION_TEXT = 4 * 1024 * 1024
"""Most output text one session records; past it, output steps keep sizes only."""


def _size(request: web.Request, name: str, default: int) -> int:
    value = request.query.get(name, str(default))
    if not value.isdigit() or not 1 <= int(value) <= 1000:
        raise BadRequest(f"{name}={value[:20]!r} must be a whole number from 1 to 1000")
    return int(value)


class _Steps:
    """What a terminal session records: its start, inputs, outputs (bounded), resizes and exit."""

    def __init__(self, recorder: Recorder, record: SandboxRecord) -> None:
        self.recorder, self.record = recorder, record
        self.bytes_in = self.bytes_out = self.kept = 0

    def add(self, kind: str, **fields: Any) -> None:
        self.recorder.step(self.record, {"type": f"pty_{kind}", "t": time.time(), **fields})

    def text(self, kind: str, data: bytes) -> None:
        if kind == "input":
            self.bytes_in += len(data)
        else:
            self.bytes_out += len(data)
        room = STEP_TEXT if kind == "input" else min(STEP_TEXT, max(0, SESSION_TEXT - self.kept))
        kept = data[:room]
        self.kept += len(kept) if kind == "output" else 0
        self.add(kind, data=kept.decode("utf-8", "replace"), size=len(data), truncated=len(kept) < len(data))


RESUME_TRIES = 3
"""Tries to resume a terminal whose connection to the executor was cut (each after ``RESUME_PAUSE_S``)."""
RESUME_PAUSE_S = 0.5


class _Link:
    """The current connection to the executor's terminal session, replaced when a cut one is resumed."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.hung_up = False

    async def send(self, data: bytes) -> None:
        """Frames to the terminal; lost if the connection is being cut (what a resume cannot bring back)."""
        with contextlib.suppress(ConnectionError, RuntimeError):
            self.writer.write(data)
            await self.writer.drain()

    def hang_up(self) -> None:
        """Tell the executor the client is done (the session ends now), and close."""
        if not self.hung_up:
            self.hung_up = True
            with contextlib.suppress(ConnectionError, RuntimeError):
                self.writer.write(ptyframes.frame(ptyframes.HANGUP, b""))
            self.writer.close()


async def _open(request: web.Request, record: SandboxRecord, query: dict[str, str]) -> _Link:
    service = service_of(request)
    with service.recorder.faults(record, "pty"):
        endpoint = await service.endpoint(record)
    sock = await open_upgraded(endpoint, "/v1/pty", "grove-pty", query)
    return _Link(*await asyncio.open_connection(sock=sock))


async def pty_handler(request: web.Request) -> web.StreamResponse:
    """GET /v1/sandboxes/{id}/pty?cols=&rows= — a WebSocket to a new shell on a terminal in the sandbox.

    The executor keeps the shell as a named session, so a connection to it that is cut (on Knative every
    upgraded connection ends at the revision's timeout) is resumed here, the output the client has not seen
    replayed, and the client's WebSocket stays open throughout."""
    record = sandbox_of(request, request.match_info["id"])
    if request.headers.get("Upgrade", "").lower() != "websocket":
        raise BadRequest(f"GET /v1/sandboxes/{record.id}/pty is a WebSocket: connect with 'Upgrade: websocket'")
    cols, rows = _size(request, "cols", 80), _size(request, "rows", 24)
    service = service_of(request)
    name = secrets.token_hex(8)
    with service.calling(record, request.transport):
        link = await _open(request, record, {"cols": str(cols), "rows": str(rows), "session": name})
        ws = web.WebSocketResponse(max_msg_size=ptyframes.MAX_FRAME)
        steps = _Steps(service.recorder, record)
        started = time.time()
        try:
            await ws.prepare(request)
            steps.add("open", cols=cols, rows=rows)
            inbound = asyncio.ensure_future(_inbound(ws, link, steps))
            code = await _outbound(request, record, name, link, ws, steps)
            inbound.cancel()
        finally:
            link.hang_up()
            await ws.close()
        steps.add("close", exit_code=code, bytes_in=steps.bytes_in, bytes_out=steps.bytes_out,
                  duration_s=time.time() - started)
    return ws


async def _inbound(ws: web.WebSocketResponse, link: _Link, steps: _Steps) -> None:
    """The client's messages to the executor, until the client goes (which ends the session)."""
    async for message in ws:
        if message.type == aiohttp.WSMsgType.BINARY:
            data: bytes = message.data
        elif message.type == aiohttp.WSMsgType.TEXT:
            try:
                control = json.loads(message.data)
                if control.get("type") == "resize":
                    cols, rows = int(control["cols"]), int(control["rows"])
                    if not (1 <= cols <= 1000 and 1 <= rows <= 1000):
                        raise ValueError("cols and rows must be from 1 to 1000")
                    await link.send(ptyframes.json_frame(ptyframes.RESIZE, {"cols": cols, "rows": rows}))
                    steps.add("resize", cols=cols, rows=rows)
                    continue
                if control.get("type") != "input" or not isinstance(control.get("data"), str):
                    raise ValueError('expected {"type": "input", "data": "..."} or {"type": "resize", ...}')
                data = control["data"].encode()
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                await ws.send_json({"type": "error", "message": f"not a terminal message: {exc}"})
                continue
        else:
            break
        await link.send(b"".join(ptyframes.frame(ptyframes.DATA, data[start:start + ptyframes.MAX_FRAME])
                                 for start in range(0, len(data), ptyframes.MAX_FRAME)))
        steps.text("input", data)
    link.hang_up()


async def _outbound(request: web.Request, record: SandboxRecord, name: str, link: _Link,
                    ws: web.WebSocketResponse, steps: _Steps) -> int | None:
    """The terminal's output to the client, resuming the session after each cut; the shell's exit code (None
    if the client left first, or the session could not be resumed)."""
    while True:
        try:
            return await _output(link.reader, ws, steps)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # cut without the exit frame
        except (RuntimeError, ValueError, KeyError):
            return None
        if link.hung_up or ws.closed:
            return None
        for attempt in range(RESUME_TRIES):
            try:
                fresh = await _open(request, record, {"session": name, "offset": str(steps.bytes_out)})
                break
            except NotFound:
                return None  # the shell is gone (it waited too long, or ended as the connection was cut)
            except (GroveError, OSError, TimeoutError) as exc:  # a wake, a revision change, a refused connection
                if attempt + 1 == RESUME_TRIES:
                    steps.add("resume_failed", error=str(exc))
                    await ws.close(code=aiohttp.WSCloseCode.INTERNAL_ERROR,
                                   message=b"the terminal's connection to the sandbox was lost and could not be "
                                           b"resumed; open a new terminal")
                    return None
                await asyncio.sleep(RESUME_PAUSE_S)
        link.writer.close()
        link.reader, link.writer = fresh.reader, fresh.writer
        steps.add("resume", offset=steps.bytes_out)


async def _output(reader: asyncio.StreamReader, ws: web.WebSocketResponse, steps: _Steps) -> int:
    """Relay output frames until the exit frame: the shell's exit code."""
    while True:
        kind, size = ptyframes.HEADER.unpack(await reader.readexactly(ptyframes.HEADER.size))
        payload = await reader.readexactly(size)
        if kind == ptyframes.EXIT:
            code = json.loads(payload)["exit_code"]
            await ws.send_json({"type": "exit", "exit_code": code})
            return int(code)
        if kind == ptyframes.DATA:
            await ws.send_bytes(payload)
            steps.text("output", payload)
