"""``grove shell ID``: an interactive terminal in a sandbox, over ``GET /v1/sandboxes/{id}/pty``.

The local terminal goes raw (every key straight to the sandbox's shell, Ctrl-C included), its size follows
the window (SIGWINCH), and the command exits with the remote shell's exit code.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import os
import shutil
import signal
import sys
import termios
import tty
from collections.abc import Iterator
from typing import Any

import aiohttp

from grove.cli.common import api_key, router_url
from grove.client.shards import ShardRoutes, split_urls
from grove.core.errors import BadRequest, Unavailable, error_from_body


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``grove shell``."""
    shell = sub.add_parser("shell", parents=[common], help="an interactive terminal in a sandbox")
    shell.add_argument("id", help="the sandbox")
    shell.set_defaults(func=cmd_shell)


def cmd_shell(args: argparse.Namespace) -> int:
    """Run the terminal until the remote shell exits; its exit code is ours."""
    urls = split_urls(router_url(args) or os.environ.get("GROVE_URL") or "http://127.0.0.1:8470")
    if not urls:
        raise BadRequest("no router URL: pass --url or set GROVE_URL (several, one per shard, comma-separated)")
    key = api_key(args)
    if not key:
        raise BadRequest("no API key: set GROVE_API_KEY (or give --state-dir of a router whose key file you can read)")
    with _raw(sys.stdin.fileno()):
        return asyncio.run(_session(ShardRoutes(urls), f"/v1/sandboxes/{args.id}/pty", key))


@contextlib.contextmanager
def _raw(fd: int) -> Iterator[None]:
    if not os.isatty(fd):
        yield
        return
    saved = termios.tcgetattr(fd)
    tty.setraw(fd, termios.TCSANOW)  # not TCSAFLUSH: keys typed ahead of the connection are kept
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


async def _session(routes: ShardRoutes, path: str, key: str) -> int:
    """The terminal at ``path``, on the router that owns the sandbox (given several, one per shard)."""
    cols, rows = shutil.get_terminal_size((80, 24))
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as http:
        url = await routes.base(http, "GET", path) + path
        params = {"cols": str(cols or 80), "rows": str(rows or 24)}
        try:
            ws = await http.ws_connect(url, params=params, max_msg_size=0)
        except aiohttp.ClientConnectorError as exc:
            raise Unavailable(f"cannot reach the router at {url.split('/v1/')[0]}: {exc.os_error}") from exc
        except aiohttp.WSServerHandshakeError as exc:
            # aiohttp keeps a refused handshake's body to itself: ask once more, reading the answer this time.
            upgrade = {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
                       "Sec-WebSocket-Key": base64.b64encode(os.urandom(16)).decode()}
            async with http.get(url, params=params, headers=upgrade) as resp:
                body = await resp.json(content_type=None) if resp.content_type == "application/json" else None
            raise error_from_body(exc.status, body) from exc
        stdin = sys.stdin.fileno()
        sending: set[asyncio.Task[None]] = set()

        def send(work: Any) -> None:
            task = loop.create_task(work)
            sending.add(task)
            task.add_done_callback(sending.discard)

        def typed() -> None:
            data = os.read(stdin, 65536)
            if data:
                send(ws.send_bytes(data))
            else:
                loop.remove_reader(stdin)

        def resized() -> None:
            size = shutil.get_terminal_size((80, 24))
            send(ws.send_json({"type": "resize", "cols": size.columns, "rows": size.lines}))

        loop.add_reader(stdin, typed)
        loop.add_signal_handler(signal.SIGWINCH, resized)
        code = 1
        try:
            async for message in ws:
                if message.type == aiohttp.WSMsgType.BINARY:
                    os.write(sys.stdout.fileno(), message.data)
                elif message.type == aiohttp.WSMsgType.TEXT:
                    control = message.json()
                    if control.get("type") == "exit":
                        code = int(control["exit_code"])
                        break
        finally:
            loop.remove_reader(stdin)
            loop.remove_signal_handler(signal.SIGWINCH)
            await ws.close()
        return code
