"""Terminal sessions that outlive their connection, so a cut connection can be resumed.

On Knative every hop in front of the executor ends an upgraded connection at the revision's timeout
(:mod:`tests.support.knative_upgrades` says why), so a terminal open longer than that loses its connection
while the shell is fine. A session named by the router (``session=``) therefore keeps its shell when the
connection drops without a hang-up frame: its output goes on into a replay buffer for up to ``LINGER_S``,
and a connection that resumes it (``session=…&offset=N``, N the output bytes the router already has) gets the
output from N on, then the live terminal. Only a hang-up frame, the shell's end, or the linger running out
ends the session. All of a session's state is touched on the relay loop only.
"""

from __future__ import annotations

import asyncio
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
from dataclasses import dataclass, field
from typing import Any

from executor import reaper
from grove.core.errors import BadRequest, NotFound
from grove.core.ptyframes import DATA, EXIT, HANGUP, HEADER, MAX_FRAME, RESIZE, frame, json_frame

_CHUNK = 256 * 1024
REPLAY_BYTES = 1024 * 1024
"""The most recent output a session keeps for a connection that resumes it."""
LINGER_S = 120.0
"""How long a session whose connection was cut waits for a resume before its shell is hung up."""


@dataclass(eq=False)
class Session:
    """One shell on one terminal, and the connection (if any) that carries it now."""

    master: int
    proc: subprocess.Popen[bytes]
    resumable: bool
    """Whether a dropped connection leaves the shell waiting (a named session) or hangs it up."""
    replay: bytearray = field(default_factory=bytearray)
    produced: int = 0
    """Output bytes the shell wrote so far; ``replay`` holds the last ones of them."""
    exit_code: int | None = None
    ended: bool = False
    reading: bool = False
    writer: asyncio.StreamWriter | None = None
    linger: asyncio.TimerHandle | None = None


class Terminals:
    """The sessions, by the names the router gave them (unnamed ones are not listed)."""

    def __init__(self) -> None:
        self._named: dict[str, Session] = {}
        self._lock = threading.Lock()  # the request threads look sessions up; the relay loop retires them
        self._tasks: set[asyncio.Future[None]] = set()  # asyncio holds tasks weakly: held here until done

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def claim(self, name: str | None, offset: str | None) -> Session | None:
        """The session a connection resumes (``offset`` given), or None for a new one; a clear error for a
        session that is gone or a new one whose name is taken."""
        if name is not None and (not name or len(name) > 64 or not name.replace("-", "").isalnum()):
            raise BadRequest("session must be 1-64 letters, digits or dashes")
        if offset is None:
            with self._lock:
                if name is not None and name in self._named:
                    raise BadRequest(f"terminal session {name!r} already exists: resume it with offset=")
            return None
        if name is None or not offset.isdigit():
            raise BadRequest("resuming a terminal needs session=NAME and offset=BYTES (a whole number)")
        with self._lock:
            found = self._named.get(name)
        if found is None:
            raise NotFound(f"terminal session {name!r} has ended (its shell exited, was hung up, or waited "
                           f"{LINGER_S:.0f} s for a resume)")
        return found

    def add(self, name: str | None, master: int, proc: subprocess.Popen[bytes]) -> Session:
        """A new session for a shell just started (named: it survives a dropped connection)."""
        session = Session(master, proc, resumable=name is not None)
        if name is not None:
            with self._lock:
                self._named[name] = session
        return session

    async def serve(self, session: Session, client: socket.socket, offset: int) -> None:
        """Carry ``session`` on ``client`` (the output from ``offset`` on first) until one of them ends."""
        reader, writer = await asyncio.open_connection(sock=client, limit=_CHUNK)
        if session.writer is not None:  # a resume racing a connection not yet seen to be dead: the newer wins
            session.writer.close()
        if session.linger is not None:
            session.linger.cancel()
            session.linger = None
        if not session.reading:
            self._start_reading(session)
        session.writer = writer
        start = session.produced - len(session.replay)
        if offset < session.produced:  # what the last connection did not deliver (all that is kept of it)
            writer.write(frame(DATA, bytes(session.replay[max(0, offset - start):])))
        if session.ended:
            self._finish(session, writer)
            return
        hung_up = await _input(reader, session)
        if session.writer is writer:
            session.writer = None
            if hung_up or not session.resumable:
                await self._retire(session)
            elif not session.ended:
                session.linger = asyncio.get_running_loop().call_later(
                    LINGER_S, lambda: self._spawn(self._retire(session)))
        writer.close()

    def _start_reading(self, session: Session) -> None:
        loop = asyncio.get_running_loop()

        def readable() -> None:
            data = read_terminal(session.master, _CHUNK)
            if data is None:
                return
            if data:
                session.produced += len(data)
                session.replay += data
                del session.replay[:max(0, len(session.replay) - REPLAY_BYTES)]
                if session.writer is not None:
                    session.writer.write(frame(DATA, data))
                return
            loop.remove_reader(session.master)
            self._spawn(self._shell_ended(session))

        session.reading = True
        os.set_blocking(session.master, False)
        loop.add_reader(session.master, readable)

    async def _shell_ended(self, session: Session) -> None:
        session.exit_code = await asyncio.to_thread(session.proc.wait)
        session.ended = True
        if session.writer is not None:
            self._finish(session, session.writer)

    def _finish(self, session: Session, writer: asyncio.StreamWriter) -> None:
        """The exit frame, and the session is over (one cut before it arrives is reported as having no code)."""
        writer.write(json_frame(EXIT, {"exit_code": session.exit_code}))
        writer.close()
        session.writer = None
        self._spawn(self._retire(session))

    async def _retire(self, session: Session) -> None:
        if session.linger is not None:
            session.linger.cancel()
        with self._lock:
            for name, known in list(self._named.items()):
                if known is session:
                    del self._named[name]
        with contextlib.suppress(ValueError, OSError):
            asyncio.get_running_loop().remove_reader(session.master)
        await asyncio.to_thread(_hang_up, session.proc)
        with contextlib.suppress(OSError):
            os.close(session.master)



async def _input(reader: asyncio.StreamReader, session: Session) -> bool:
    """The client's frames to the terminal until its connection ends; whether it ended with a hang-up."""
    try:
        while True:
            kind, size = HEADER.unpack(await reader.readexactly(HEADER.size))
            if size > MAX_FRAME:
                return False
            payload = await reader.readexactly(size)
            if kind == HANGUP:
                return True
            if kind == DATA:
                await asyncio.to_thread(_write_all, session.master, payload)
            elif kind == RESIZE:
                size_of = json.loads(payload)
                fcntl.ioctl(session.master, termios.TIOCSWINSZ,
                            struct.pack("HHHH", size_of["rows"], size_of["cols"], 0, 0))
    except (asyncio.IncompleteReadError, OSError, ValueError, KeyError, TypeError, struct.error):
        return False


def read_terminal(fd: int, size: int) -> bytes | None:
    """What a (non-blocking) pty's master has: None if nothing yet, ``b""`` once the shell and everything that
    held the terminal are gone (EIO)."""
    try:
        return os.read(fd, size)
    except BlockingIOError:
        return None
    except OSError:
        return b""


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
