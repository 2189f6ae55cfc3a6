"""Connections the executor hands off after an upgrade: one asyncio loop, in one thread, relays them all.

gunicorn's gthread worker gives every request a thread of its pool (32) until it answers. A proxied port
or a terminal can stay open for hours, and holding a pool thread each would let 32 open WebSockets starve
every exec. So the request thread only does the handshake (:mod:`executor.ports`) and gives the socket to
this relay, where an open connection costs a few kilobytes and no thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import fcntl
import json
import os
import select
import signal
import socket
import struct
import subprocess
import termios
import threading
from collections.abc import Coroutine
from typing import Any

from executor import reaper
from grove.core.ptyframes import DATA, EXIT, HEADER, MAX_FRAME, RESIZE, frame, json_frame

_CHUNK = 256 * 1024


class Relay:
    """The relay loop, started by the first connection it is given (not in a zygote that then forks)."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        # asyncio holds tasks weakly, and a stream's protocol holds its reader weakly: a relay's task, its
        # readers and their waiters form a cycle nothing else reaches, which the garbage collector would end
        # (closing the connection mid-session). Each is held here until it is done.
        self._running_work: set[concurrent.futures.Future[None]] = set()

    def _running(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="grove-relay", daemon=True).start()
                self._loop = loop
            return self._loop

    def submit(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` on the relay loop (it owns the sockets it was given from now on)."""
        future = asyncio.run_coroutine_threadsafe(work, self._running())
        with self._lock:
            self._running_work.add(future)
        future.add_done_callback(self._done)

    def _done(self, future: concurrent.futures.Future[None]) -> None:
        with self._lock:
            self._running_work.discard(future)


async def splice(client: socket.socket, upstream: socket.socket) -> None:
    """Copy bytes both ways until both sides are done; a side's end of input is passed on as a half-close."""
    try:
        c_reader, c_writer = await asyncio.open_connection(sock=client, limit=_CHUNK)
        u_reader, u_writer = await asyncio.open_connection(sock=upstream, limit=_CHUNK)
    except OSError:
        client.close()
        upstream.close()
        return
    await asyncio.gather(_pump(c_reader, u_writer), _pump(u_reader, c_writer), return_exceptions=True)
    for writer in (c_writer, u_writer):
        writer.close()


async def pipes(client: socket.socket, stdin: int, stdout: int) -> None:
    """Relay a process's stdio: the client's bytes to its stdin, its stdout to the client. Its stdout's end is
    passed on as a half-close; the client's end closes its stdin (a stdio server then exits, as it would when
    the client that started it went away)."""
    loop = asyncio.get_running_loop()
    try:
        c_reader, c_writer = await asyncio.open_connection(sock=client, limit=_CHUNK)
        out_reader = asyncio.StreamReader(limit=_CHUNK, loop=loop)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(out_reader, loop=loop),
                                     os.fdopen(stdout, "rb", buffering=0))
        transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin,
                                                            os.fdopen(stdin, "wb", buffering=0))
    except OSError:
        client.close()
        for fd in (stdin, stdout):
            with contextlib.suppress(OSError):
                os.close(fd)
        return
    in_writer = asyncio.StreamWriter(transport, protocol, None, loop)
    await asyncio.gather(_pump(c_reader, in_writer), _pump(out_reader, c_writer), return_exceptions=True)
    for writer in (c_writer, in_writer):
        writer.close()


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(_CHUNK):
            writer.write(chunk)
            await writer.drain()  # back-pressure: a slow reader slows the sender, nothing piles up here
        if writer.can_write_eof():
            writer.write_eof()
    except (OSError, RuntimeError):
        writer.close()  # one side broke: the whole connection ends
        writer.transport.abort()


async def terminal(client: socket.socket, master: int, proc: subprocess.Popen[bytes]) -> None:
    """Relay a terminal: frames from the client to the pty (input, resize), the pty's output back as frames,
    and a last ``exit`` frame with the shell's exit code. A client gone hangs the shell up."""
    reader, writer = await asyncio.open_connection(sock=client, limit=_CHUNK)
    loop = asyncio.get_running_loop()
    output: asyncio.Queue[bytes] = asyncio.Queue()

    def readable() -> None:
        try:
            data = os.read(master, _CHUNK)
        except BlockingIOError:
            return
        except OSError:  # EIO: the shell and all it started closed the terminal
            data = b""
        if not data:
            loop.remove_reader(master)
        output.put_nowait(data)

    os.set_blocking(master, False)
    loop.add_reader(master, readable)
    inbound = asyncio.ensure_future(_terminal_input(reader, master, proc))
    try:
        while data := await output.get():
            writer.write(frame(DATA, data))
            await writer.drain()
        code = await asyncio.to_thread(proc.wait)
        writer.write(json_frame(EXIT, {"exit_code": code}))
        await writer.drain()
    except (OSError, RuntimeError):
        pass
    finally:
        inbound.cancel()
        loop.remove_reader(master)
        await asyncio.to_thread(_hang_up, proc)
        os.close(master)
        writer.close()


async def _terminal_input(reader: asyncio.StreamReader, master: int, proc: subprocess.Popen[bytes]) -> None:
    try:
        while True:
            kind, size = HEADER.unpack(await reader.readexactly(HEADER.size))
            if size > MAX_FRAME:
                break
            payload = await reader.readexactly(size)
            if kind == DATA:
                await asyncio.to_thread(_write_all, master, payload)
            elif kind == RESIZE:
                size_of = json.loads(payload)
                fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", size_of["rows"], size_of["cols"], 0, 0))
    except (asyncio.IncompleteReadError, OSError, ValueError, KeyError, TypeError, struct.error):
        pass
    # The client is gone (or spoke nonsense): the terminal is hung up, as a closed one would be.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGHUP)


def _write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to the (non-blocking) pty, waiting while the shell does not read (in a thread)."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            select.select([], [fd], [], 1.0)


def _hang_up(proc: subprocess.Popen[bytes]) -> None:
    """End the shell's whole session: SIGHUP as a closed terminal would, SIGKILL for what ignores it."""
    if proc.poll() is not None:
        reaper.release(proc)
        return
    for sig in (signal.SIGHUP, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
    reaper.release(proc)
