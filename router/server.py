"""Running the router: bind, print where it listens, serve until SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import errno
import logging
import resource
import signal
import socket
import sys

from aiohttp import web

from grove.core.errors import Conflict, GroveError, Invalid
from grove.runfile import remove_run_file, write_run_file
from router import logs
from router.api.appkeys import SERVICE
from router.app import create_app
from router.connections import ConnectionGuard
from router.settings import RouterSettings

log = logging.getLogger("grove.router")
_LINGER_S = 1.0
_SPARE_FDS = 512
"""Descriptors kept out of the connection cap: executors, S3, journals, the backend's own work."""
_WATCH_SHARE = 4
"""And a quarter of the limit: the local backend's pidfds and open ``cpu.stat`` files (1/8 each at most,
:data:`router.backends.local.exits.OPEN_SHARE`, :data:`router.backends.local.hogs.OPEN_SHARE`)."""


_SWITCH_INTERVAL_S = 0.0005
_STOP_GRACE_S = 10.0
"""How long a stopping router waits for calls in flight (aiohttp's default, 60 s, outlasts what a supervisor
gives a process between SIGTERM and SIGKILL; a killed router leaves its backend's mounts behind)."""


def connection_cap(wanted: int) -> int:
    """``wanted`` connections, or fewer if the descriptor limit (raised to its hard limit) cannot hold them
    beside the router's own files: past the cap the router sheds load; past the limit it would fail."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    room = max(64, soft - soft // _WATCH_SHARE - _SPARE_FDS)
    if wanted > room:
        log.warning("max_connections %d lowered to %d to fit the descriptor limit (%d)", wanted, room, soft)
    return min(wanted, room)


def listen_socket(host: str, port: int) -> socket.socket:
    """The router's listening socket, bound before anything else starts: a busy port fails at once, with one
    message saying which port and how to pick another, and nothing started to undo."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as exc:
        raise Invalid(f"cannot listen on {host!r}: {exc.strerror}; give --host an address of this host "
                      "(127.0.0.1, the default, or 0.0.0.0 for every interface)") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port in TIME_WAIT is free; a listened one not
        sock.bind(address)  # listening starts once the app is ready: until then a connection is refused, as ever
    except OSError as exc:
        sock.close()
        raise _bind_error(host, port, exc) from None
    sock.setblocking(False)
    return sock


def _bind_error(host: str, port: int, exc: OSError) -> GroveError:
    if exc.errno == errno.EADDRINUSE:
        return Conflict(f"port {port} on {host} is in use by another program (`ss -ltnp 'sport = :{port}'` shows "
                        "which); start the router on another with `--port N`, or `--port 0` for any free one "
                        "(the router prints its URL, and other grove commands find it through the state dir)")
    if exc.errno == errno.EACCES:
        return Invalid(f"cannot listen on {host}:{port}: permission denied (ports below 1024 need root); "
                       "pick another with --port N")
    if exc.errno == errno.EADDRNOTAVAIL:
        return Invalid(f"cannot listen on {host}:{port}: {host} is not an address of this host; "
                       "pick another with --host")
    return Invalid(f"cannot listen on {host}:{port}: {exc.strerror or exc}")


async def serve(
    settings: RouterSettings, *, new_key: str | None = None, ready_file: str | None = None,
    sock: socket.socket | None = None,
) -> None:
    """Serve until a signal, on ``sock`` if given (:func:`listen_socket`), else on the settings' host and port;
    sandboxes keep running after exit and are re-adopted on the next start."""
    if sock is None:
        sock = listen_socket(settings.host, settings.port)
    logs.configure()
    settings.layout.make_private()
    # The disk threads (the record log's fsyncs, journals) wait for the GIL each time a system call
    # returns: up to the switch interval while the event loop is busy, 5 ms by default. A streamed batch
    # of claims waited ~15 ms per log append on it; this process is the router's alone.
    sys.setswitchinterval(_SWITCH_INTERVAL_S)
    app = create_app(settings)
    # After an error answer (408, 413) aiohttp reads what is left of the body before closing, by default for
    # 10 s: a stalled sender would keep its place under the connection cap that long.
    runner = web.AppRunner(app, access_log=None, handle_signals=False, keepalive_timeout=settings.idle_timeout_s,
                           lingering_time=_LINGER_S, shutdown_timeout=_STOP_GRACE_S)
    await runner.setup()
    assert runner.server is not None
    guard = ConnectionGuard(runner.server, max_connections=connection_cap(settings.max_connections),
                            header_timeout_s=settings.header_timeout_s)
    loop = asyncio.get_running_loop()
    try:
        server = await loop.create_server(guard.protocol, sock=sock, backlog=2048)
    except BaseException as exc:
        await runner.cleanup()  # the app's storage and backend started: stop them, not leave them to the GC
        if isinstance(exc, OSError):  # another router bound the port too and listened first
            raise _bind_error(settings.host, sock.getsockname()[1], exc) from None
        raise
    port = sock.getsockname()[1]
    url = f"http://{settings.host}:{port}"
    print(f"grove router listening on {url} (backend {settings.backend}, state dir {settings.state_dir})", flush=True)
    print(f"  viewer: {url}/ui/ (log in with an API key)", flush=True)
    if new_key:
        print(f"created API key (shown once; kept in {settings.state_dir}/api_keys): {new_key}", flush=True)
    print(f"  stop it with Ctrl-C (sandboxes keep running) or `grove --state-dir {settings.state_dir} down` "
          "(stops every sandbox and stores its trajectory)", flush=True)
    write_run_file(settings.state_dir, url)
    if ready_file:
        with open(ready_file, "w", encoding="utf-8") as fh:
            fh.write(url)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    remove_run_file(settings.state_dir)
    left = len(app[SERVICE].registry.live())
    if left:
        print(f"grove router stopping: {left} sandbox(es) keep running, and nothing enforces their TTLs until the "
              f"next `grove --state-dir {settings.state_dir} up` re-adopts them; "
              f"`grove --state-dir {settings.state_dir} down` stops them and stores their trajectories",
              file=sys.stderr, flush=True)
    else:
        print("grove router stopping (no sandbox running)", file=sys.stderr, flush=True)
    server.close()
    calls = [f"{record.id} ({record.inflight})" for record in app[SERVICE].registry.live() if record.inflight]
    if calls:
        shown = ", ".join(calls[:5]) + (f" and {len(calls) - 5} more" if len(calls) > 5 else "")
        print(f"grove router stopping: calls in flight on {shown} get {_STOP_GRACE_S:g} s to end, then their callers "
              "get a broken connection (the commands run on in their sandboxes)", file=sys.stderr, flush=True)
    await runner.cleanup()
