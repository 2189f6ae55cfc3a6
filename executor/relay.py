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
import os
import socket
import threading
from collections.abc import Coroutine
from typing import Any

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
    """Copy bytes both ways until both sides are done; a side's end of input is passed on as a half-close.

    Each side is a bare protocol that writes what it receives straight into the other side's transport: one
    loop callback per chunk and no stream objects or tasks between (a round trip through StreamReaders cost
    two more loop turns per hop). Back-pressure is the transports' own: a side whose buffer fills pauses its
    peer's reading until it drains."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    ends = [_Side(done), _Side(done)]
    ends[0].peer, ends[1].peer = ends[1], ends[0]
    try:
        for sock, end in zip((client, upstream), ends, strict=True):
            await loop.connect_accepted_socket(end.itself, sock=sock)
    except OSError:
        for end in ends:
            end.abort()
        client.close()
        upstream.close()
        return
    for end in ends:  # both transports exist: now either may read (and write to the other)
        if end.transport is not None and not end.transport.is_closing():
            end.transport.resume_reading()
    await done


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


class _Side(asyncio.Protocol):
    """One socket of a splice: what it reads goes to its peer; both closed once both ended (or one broke)."""

    def __init__(self, done: asyncio.Future[None]) -> None:
        self.done = done
        self.peer: _Side | None = None
        self.transport: asyncio.Transport | None = None
        self.ended = self.lost = False

    def itself(self) -> _Side:
        """The protocol factory of this side's transport."""
        return self

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.set_write_buffer_limits(high=_CHUNK)
        transport.pause_reading()  # until the peer's transport exists too

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is not None and peer.transport is not None and not peer.transport.is_closing():
            peer.transport.write(data)

    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None and not self.peer.transport.is_closing():
            self.peer.transport.resume_reading()

    def eof_received(self) -> bool:
        self.ended = True
        peer = self.peer
        if peer is None or peer.transport is None or peer.ended:
            self._close_both()
            return False
        if peer.transport.can_write_eof():
            peer.transport.write_eof()  # after what is buffered: the half-close is passed on in order
        return True  # keep writing to this side until the peer ends too

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if exc is not None:
            self.abort_both()  # one side broke: the whole connection ends
        else:
            self._close_both()
        if all(end.lost for end in (self, self.peer) if end is not None) and not self.done.done():
            self.done.set_result(None)

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def abort_both(self) -> None:
        for end in (self, self.peer):
            if end is not None:
                end.abort()

    def _close_both(self) -> None:
        for end in (self, self.peer):
            if end is not None and end.transport is not None:
                end.transport.close()  # what is buffered is still written first
