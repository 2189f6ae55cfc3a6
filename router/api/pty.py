"""``GET /v1/sandboxes/{id}/pty``: a terminal in the sandbox as a WebSocket, recorded as a stream of steps.

The client sends binary messages (keystrokes) or text ones: ``{"type": "input", "data": "ls\\n"}`` and
``{"type": "resize", "cols": 120, "rows": 40}``. It receives binary messages (the terminal's output) and, when
the shell ends, ``{"type": "exit", "exit_code": N}`` before the close. Closing the WebSocket hangs the shell
up. Between router and executor the session is a ``grove-pty`` upgrade carrying :mod:`grove.core.ptyframes`.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
from aiohttp import web

from grove.core import ptyframes
from grove.core.errors import BadRequest
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


async def pty_handler(request: web.Request) -> web.StreamResponse:
    """GET /v1/sandboxes/{id}/pty?cols=&rows= — a WebSocket to a new shell on a terminal in the sandbox."""
    record = sandbox_of(request, request.match_info["id"])
    if request.headers.get("Upgrade", "").lower() != "websocket":
        raise BadRequest(f"GET /v1/sandboxes/{record.id}/pty is a WebSocket: connect with 'Upgrade: websocket'")
    cols, rows = _size(request, "cols", 80), _size(request, "rows", 24)
    service = service_of(request)
    with service.calling(record):
        with service.recorder.faults(record, "pty"):
            endpoint = await service.endpoint(record)
        sock = await open_upgraded(endpoint, "/v1/pty", "grove-pty", {"cols": str(cols), "rows": str(rows)})
        reader, writer = await asyncio.open_connection(sock=sock)
        ws = web.WebSocketResponse(max_msg_size=ptyframes.MAX_FRAME)
        steps = _Steps(service.recorder, record)
        started = time.time()
        try:
            await ws.prepare(request)
            steps.add("open", cols=cols, rows=rows)
            inbound = asyncio.ensure_future(_inbound(ws, writer, steps))
            code = await _outbound(reader, ws, steps)
            inbound.cancel()
        finally:
            writer.close()
            await ws.close()
        steps.add("close", exit_code=code, bytes_in=steps.bytes_in, bytes_out=steps.bytes_out,
                  duration_s=time.time() - started)
    return ws


async def _inbound(ws: web.WebSocketResponse, writer: asyncio.StreamWriter, steps: _Steps) -> None:
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
                    writer.write(ptyframes.json_frame(ptyframes.RESIZE, {"cols": cols, "rows": rows}))
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
        for start in range(0, len(data), ptyframes.MAX_FRAME):
            writer.write(ptyframes.frame(ptyframes.DATA, data[start:start + ptyframes.MAX_FRAME]))
        await writer.drain()
        steps.text("input", data)
    writer.close()


async def _outbound(reader: asyncio.StreamReader, ws: web.WebSocketResponse, steps: _Steps) -> int | None:
    """The terminal's output to the client; the shell's exit code (None if the connection ended first)."""
    try:
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
    except (asyncio.IncompleteReadError, ConnectionError, RuntimeError, ValueError, KeyError):
        return None
