"""Real servers inside a sandbox, for the port proxy's tests: aiohttp (HTTP and WebSocket) and the ``mcp``
package's own server (streamable HTTP, or stdio), run by the sandbox's Python with their libraries copied in from
this venv.

The default image binds the host's ``/usr``, so ``python3`` runs inside; the libraries are the exact files of
this venv's distributions (and their dependency closure), uploaded through grove's own file API. A published MCP
server is called with the ``mcp`` package's own client (:func:`mcp_session`).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import shutil
import tempfile
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path, PurePosixPath
from typing import Any

from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from packaging.requirements import Requirement

from grove.client import Sandbox
from grove.integrations import e2b_interpreter

LIBS = "/opt/pylib"


def closure(names: tuple[str, ...]) -> list[importlib.metadata.Distribution]:
    """The distributions ``names`` need to import, found in this venv (extras left out)."""
    seen: dict[str, importlib.metadata.Distribution] = {}
    todo = list(names)
    while todo:
        name = todo.pop()
        key = name.lower().replace("_", "-")
        if key in seen:
            continue
        dist = importlib.metadata.distribution(name)
        seen[key] = dist
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return list(seen.values())


_made: list[Path] = []


@functools.cache
def libs_dir(names: tuple[str, ...]) -> Path:
    """A directory holding the files of ``names`` and everything they need (made once per session)."""
    out = Path(tempfile.mkdtemp(prefix="grove-sandbox-libs-"))
    _made.append(out)
    for dist in closure(names):
        for entry in dist.files or []:
            rel = PurePosixPath(str(entry))
            if ".." in rel.parts or rel.is_absolute() or "__pycache__" in rel.parts:
                continue
            src = Path(str(dist.locate_file(entry)))
            if src.is_file():
                dst = out / rel
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, dst)
    return out


def drop_libs_dirs() -> None:
    """Remove the directories :func:`libs_dir` made in this process (never another test run's, which may be
    uploading from its own at this moment)."""
    for made in list(_made):
        shutil.rmtree(made, ignore_errors=True)
        _made.remove(made)
    libs_dir.cache_clear()


AIOHTTP_SERVER = textwrap.dedent('''
    import hashlib, json, sys
    from aiohttp import web

    async def hello(request):
        return web.json_response({"path": request.path_qs, "host": request.host, "method": request.method,
                                  "headers": dict(request.headers)})

    async def sha(request):
        digest, size = hashlib.sha256(), 0
        async for chunk in request.content.iter_chunked(1 << 16):
            digest.update(chunk)
            size += len(chunk)
        return web.json_response({"sha256": digest.hexdigest(), "size": size})

    async def stream(request):
        total = int(request.query["bytes"])
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        await response.prepare(request)
        block = bytes(range(256)) * 256
        sent = 0
        while sent < total:
            part = block[: min(len(block), total - sent)]
            await response.write(part)
            sent += len(part)
        await response.write_eof()
        return response

    async def echo(request):
        ws = web.WebSocketResponse(protocols=("echo",))
        await ws.prepare(request)
        async for msg in ws:
            if msg.type == web.WSMsgType.TEXT:
                await ws.send_str(msg.data)
            elif msg.type == web.WSMsgType.BINARY:
                await ws.send_bytes(msg.data)
        return ws

    app = web.Application(client_max_size=0)
    app.add_routes([web.route("*", "/hello{tail:.*}", hello), web.post("/sha", sha), web.get("/stream", stream),
                    web.get("/ws", echo)])
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
''')

MCP_SERVER = textwrap.dedent('''
    import sys
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("notes")

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[1]))
''')


MCP_STDIO_SERVER = textwrap.dedent('''
    import os, sys
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("files")

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    @server.tool()
    def where() -> str:
        """The server's working directory and its NOTE variable."""
        return f"{os.getcwd()} {os.environ.get('NOTE')}"

    @server.tool()
    def crash(code: int) -> str:
        """Exit the whole server at once."""
        print("boom: asked to crash", file=sys.stderr, flush=True)
        os._exit(code)

    server.run("stdio")
''')
"""The ``mcp`` package's own server speaking stdio only: ``add``, ``where`` (its cwd and ``$NOTE``) and ``crash``
(exits at once with the code given, after a line on stderr)."""

STDIO_SERVER_PATH = "/opt/stdio-server.py"
STDIO_COMMAND = f"PYTHONPATH={LIBS} exec python3 {STDIO_SERVER_PATH}"
"""The command that publishes :data:`MCP_STDIO_SERVER` once :func:`install_stdio_server` put it in a sandbox."""


def install_stdio_server(sandbox: Sandbox) -> None:
    """Upload the ``mcp`` libraries to :data:`LIBS` and :data:`MCP_STDIO_SERVER` to :data:`STDIO_SERVER_PATH`, for
    ``sandbox.mcp_server(name, command=STDIO_COMMAND)``."""
    sandbox.upload(libs_dir(("mcp",)), LIBS)
    sandbox.write_file(STDIO_SERVER_PATH, MCP_STDIO_SERVER)


@contextlib.asynccontextmanager
async def mcp_session(config: dict[str, Any]) -> AsyncIterator[ClientSession]:
    """An initialized session of the ``mcp`` package's own client with a published server (``config`` as
    ``Sandbox.mcp_server`` returns it: its URL and the headers that authorize the call)."""
    async with create_mcp_http_client(headers=config["headers"]) as http, \
            streamable_http_client(config["url"], http_client=http) as (read, write), \
            ClientSession(read, write) as session:
        await session.initialize()
        yield session


def start_server(sandbox: Sandbox, script: str, port: int, libs: tuple[str, ...], timeout: float = 60.0,
                 home: str = "/opt") -> int:
    """Upload ``libs`` and ``script`` under ``home`` (a path exec and the file API both see as the same: on the
    Knative stand-in, whose pods share the host's root, a path relative to the workdir), start it in the
    background on ``port``, and wait until it listens; its pid."""
    sandbox.upload(libs_dir(libs), f"{home}/pylib")
    sandbox.write_file(f"{home}/server-{port}.py", script)
    started = sandbox.exec(f"cd {home} && {{ PYTHONPATH=$PWD/pylib setsid python3 server-{port}.py {port} "
                           f"> server-{port}.log 2>&1 < /dev/null & echo $!; }}")
    assert started.exit_code == 0, started
    probe = ("import socket,sys; s=socket.socket(); s.settimeout(1); "
             f"sys.exit(s.connect_ex(('127.0.0.1', {port})))")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sandbox.exec(["python3", "-c", probe]).exit_code == 0:
            return int(started.stdout)
        time.sleep(0.2)
    log = sandbox.read_file(f"{home}/server-{port}.log").decode(errors="replace")
    raise AssertionError(f"the server on port {port} did not listen within {timeout}s:\n{log}")


INTERPRETER_PORT = 49999
"""Where E2B's code interpreter SDK looks for its server."""


def start_interpreter(sandbox: Sandbox) -> None:
    """grove's server of E2B's code interpreter protocol (:mod:`grove.integrations.e2b_interpreter`) on
    :data:`INTERPRETER_PORT`, its libraries (``jupyter_client``, ``ipykernel``) uploaded from this venv."""
    script = Path(e2b_interpreter.__file__).read_text()
    start_server(sandbox, script, INTERPRETER_PORT, ("aiohttp", "jupyter_client", "ipykernel"), timeout=120.0)
