"""Ports and the terminal: upgraded connections through the executor's one port.

``GET /v1/ports/{port}/tunnel`` with ``Upgrade: grove-tunnel`` connects to ``127.0.0.1:{port}`` inside the
sandbox and, once it answers ``101``, the connection is a plain byte stream to that port (HTTP, WebSocket, or
anything else the client speaks over it). ``GET /v1/pty`` with ``Upgrade: grove-pty`` starts a shell on a
terminal and relays it as frames (:mod:`executor.terminals`). ``GET /v1/processes/{pid}/stdio`` with ``Upgrade:
grove-stdio`` is a byte stream to a background process's stdin and from its stdout (a stdio MCP server). All go
through the executor's own port because a Knative Service exposes exactly one; the handshake is ordinary
HTTP/1.1, which queue-proxy and the activator pass through as they do a WebSocket's. The request thread only
does the handshake; the relay thread carries the connection from then on.
"""

from __future__ import annotations

import fcntl
import os
import pty
import shutil
import socket
import struct
import termios
from collections.abc import Callable, Iterable
from typing import Any

from flask import Blueprint, Response, request

from executor import reaper
from executor.relay import Relay, pipes, splice
from executor.served import Served
from executor.terminals import Terminals
from grove.core.errors import BadGateway, BadRequest, InternalError

TUNNEL, PTY, STDIO = "grove-tunnel", "grove-pty", "grove-stdio"
"""The ``Upgrade`` protocols the executor speaks."""
CONNECT_TIMEOUT_S = 5.0


class _Upgraded(Response):
    """The answer for a connection given away: gunicorn must neither write a response nor keep the connection;
    raising StopIteration from the app is how its workers are told to close it as it is (flask-sock's way)."""

    def __call__(self, environ: Any, start_response: Any) -> Iterable[bytes]:
        raise StopIteration


def ports_blueprint(served: Callable[[], Served]) -> Blueprint:
    """The routes, and the relay their connections go to (started by the first one)."""
    blueprint = Blueprint("ports", __name__)
    relay = Relay()
    terminals = Terminals()

    @blueprint.get("/v1/ports/<int:port>/tunnel")
    def tunnel(port: int) -> Any:
        _expect_upgrade(TUNNEL)
        if not 1 <= port <= 65535:
            raise BadRequest(f"port {port} is out of range (1-65535)")
        upstream = _connect(port)
        relay.submit(splice(_take_over(TUNNEL), upstream))
        return _Upgraded()

    @blueprint.get("/v1/pty")
    def terminal_() -> Any:
        """A new shell (``session=NAME`` keeps it across a dropped connection), or, with ``offset=``, the named
        session's shell again, its output from that byte on (:mod:`executor.terminals`)."""
        _expect_upgrade(PTY)
        name, offset = request.args.get("session"), request.args.get("offset")
        session = terminals.claim(name, offset)
        if session is None:
            cols, rows = _size(request.args.get("cols"), 80), _size(request.args.get("rows"), 24)
            session = terminals.add(name, *_start_shell(served(), cols, rows))
        relay.submit(terminals.serve(session, _take_over(PTY), int(offset or 0)))
        return _Upgraded()

    @blueprint.get("/v1/processes/<int:pid>/stdio")
    def stdio(pid: int) -> Any:
        _expect_upgrade(STDIO)
        stdin, stdout = served().processes.take_stdio(pid)
        try:
            client = _take_over(STDIO)
        except BaseException:
            os.close(stdin)
            os.close(stdout)
            raise
        relay.submit(pipes(client, stdin, stdout))
        return _Upgraded()

    return blueprint


def _expect_upgrade(protocol: str) -> None:
    if request.headers.get("Upgrade", "").lower() != protocol:
        raise BadRequest(f"this endpoint needs 'Connection: Upgrade' and 'Upgrade: {protocol}'")


def _connect(port: int) -> socket.socket:
    try:
        return socket.create_connection(("127.0.0.1", port), timeout=CONNECT_TIMEOUT_S)
    except ConnectionRefusedError as exc:
        raise BadGateway(f"nothing listens on port {port} in the sandbox (connection refused)") from exc
    except OSError as exc:
        raise BadGateway(f"port {port} in the sandbox could not be reached: {exc}") from exc


def _take_over(protocol: str) -> socket.socket:
    """Answer 101 on the raw connection and take it from gunicorn.

    gunicorn closes a connection it is done with gracefully: a half-close, then up to 2 s of reading what is
    left. On the connection itself either would cut or steal the relay's bytes, so gunicorn's descriptor
    number is pointed at a spent socket pair instead (``dup2`` is atomic), and its close finds nothing there.
    """
    raw = request.environ.get("gunicorn.socket")
    if not isinstance(raw, socket.socket):
        raise InternalError("upgraded connections need the executor served by gunicorn")
    own = raw.dup()
    spent, peer = socket.socketpair()
    os.dup2(spent.fileno(), raw.fileno())
    spent.close()
    peer.close()
    own.setblocking(True)
    own.sendall(f"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: {protocol}\r\n\r\n".encode())
    return own


def _size(value: str | None, default: int) -> int:
    if value is None:
        return default
    if not value.isdigit() or not 1 <= int(value) <= 1000:
        raise BadRequest(f"terminal size {value!r} must be a whole number from 1 to 1000")
    return int(value)


def _start_shell(served: Served, cols: int, rows: int) -> tuple[int, Any]:
    """A login-less interactive shell on a new terminal, in a session of its own (its process group is what a
    hang-up ends), with the sandbox's environment and working directory."""
    settings = served.settings
    master, slave = pty.openpty()
    fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    shell = next((s for s in ("/bin/bash", "/bin/sh") if shutil.which(s, path=os.path.dirname(s))), "/bin/sh")
    env = {"TERM": "xterm-256color", **settings.env, **served.runner.extra_env}
    try:
        proc = reaper.spawn([shell], stdin=slave, stdout=slave, stderr=slave, env=env,
                            cwd=served.paths.resolve(settings.workdir), start_new_session=True,
                            preexec_fn=_controlling_terminal)
    except BaseException:
        os.close(master)
        raise
    finally:
        os.close(slave)
    return master, proc


def _controlling_terminal() -> None:
    """In the child, after ``setsid``: its stdin (the new terminal) becomes its controlling terminal."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
