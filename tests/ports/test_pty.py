"""The terminal: a WebSocket to a shell on a pty in the sandbox (aiohttp's client), and ``grove shell`` on a
real local terminal."""

from __future__ import annotations

import asyncio
import os
import pty
import select
import subprocess
import time
from typing import Any

import aiohttp

from grove.client import Sandbox
from tests.support.router_fixtures import GROVE_BIN, RouterProcess, wait_for


async def _read_until(ws: aiohttp.ClientWebSocketResponse, needle: bytes, timeout: float = 30) -> bytes:
    seen = b""
    deadline = asyncio.get_running_loop().time() + timeout
    while needle not in seen:
        message = await ws.receive(timeout=max(0.1, deadline - asyncio.get_running_loop().time()))
        assert message.type == aiohttp.WSMsgType.BINARY, message
        seen += message.data
    return seen


def steps_of(router: RouterProcess, sandbox_id: str) -> list[dict[str, Any]]:
    reply = router.http("GET", f"/v1/sandboxes/{sandbox_id}/trajectory")
    assert reply.status == 200
    return [s for s in reply.json()["steps"] if str(s.get("type", "")).startswith("pty_")]


def test_pty_round_trip_and_resize(router: RouterProcess, sandbox: Sandbox) -> None:
    async def go() -> tuple[bytes, bytes, dict[str, Any]]:
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {router.key}"}) as http:
            url = f"{router.url}/v1/sandboxes/{sandbox.id}/pty"
            async with http.ws_connect(url, params={"cols": "80", "rows": "24"}) as ws:
                await ws.send_bytes(b"stty size; echo sum=$((40+2))\n")
                first = await _read_until(ws, b"sum=42")
                await ws.send_json({"type": "resize", "cols": 132, "rows": 43})
                await ws.send_json({"type": "input", "data": "stty size\n"})
                second = await _read_until(ws, b"43 132")
                await ws.send_bytes(b"exit 3\n")
                while True:
                    message = await ws.receive(timeout=30)
                    if message.type == aiohttp.WSMsgType.TEXT:
                        return first, second, message.json()
                    assert message.type == aiohttp.WSMsgType.BINARY, message

    first, second, end = asyncio.run(go())
    assert b"24 80" in first and b"sum=42" in first
    assert b"43 132" in second
    assert end == {"type": "exit", "exit_code": 3}
    steps = wait_for(lambda: (s := steps_of(router, sandbox.id)) and s[-1]["type"] == "pty_close" and s, 30,
                     what="the session's last step")
    kinds = [s["type"] for s in steps]
    assert kinds[0] == "pty_open" and steps[0]["cols"] == 80 and steps[0]["rows"] == 24
    assert {"type": "pty_resize", "cols": 132, "rows": 43}.items() <= next(
        s for s in steps if s["type"] == "pty_resize").items()
    inputs = "".join(s["data"] for s in steps if s["type"] == "pty_input")
    assert "echo sum=$((40+2))" in inputs and "exit 3" in inputs
    assert "sum=42" in "".join(s["data"] for s in steps if s["type"] == "pty_output")
    assert steps[-1]["exit_code"] == 3


def test_pty_refuses_a_plain_get_and_a_bad_size(router: RouterProcess, sandbox: Sandbox) -> None:
    plain = router.http("GET", f"/v1/sandboxes/{sandbox.id}/pty")
    assert plain.status == 400 and "WebSocket" in plain.json()["error"]["message"]
    assert router.http("GET", f"/v1/sandboxes/{sandbox.id}/pty?cols=0",
                       headers={"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
                                "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}).status == 400


def _read(master: int, timeout: float) -> bytes | None:
    """What the terminal shows within ``timeout``; None once nothing holds its other side (the CLI exited)."""
    if not select.select([master], [], [], timeout)[0]:
        return b""
    try:
        return os.read(master, 65536) or None
    except OSError:  # EIO: every descriptor of the terminal's other side is closed
        return None


def test_grove_shell_on_a_real_terminal(router: RouterProcess, sandbox: Sandbox) -> None:
    master, slave = pty.openpty()
    env = {**os.environ, "GROVE_API_KEY": router.key}
    proc = subprocess.Popen([GROVE_BIN, "--url", router.url, "shell", sandbox.id], stdin=slave, stdout=slave,
                            stderr=slave, env=env, start_new_session=True)
    os.close(slave)
    output = b""
    try:
        deadline = time.monotonic() + 60
        while b"# " not in output and b"$ " not in output and time.monotonic() < deadline:  # the shell's prompt
            chunk = _read(master, 0.5)
            assert chunk is not None, (proc.wait(timeout=10), output)
            output += chunk
        os.write(master, b"echo shell=$((6*7)); exit 5\n")
        while time.monotonic() < deadline and (chunk := _read(master, 0.5)) is not None:
            output += chunk
        assert proc.wait(timeout=30) == 5, output
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    assert b"shell=42" in output
