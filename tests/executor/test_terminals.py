"""Terminal sessions on their own: a real shell on a real pty, carried over real socket pairs, cut and resumed
(:mod:`executor.terminals`); the refusals a bad resume gets."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import socket
import time

import pytest

from executor import reaper
from executor.terminals import Session, Terminals
from grove.core import ptyframes
from grove.core.errors import BadRequest, NotFound


def _shell(terminals: Terminals, name: str | None) -> Session:
    master, slave = pty.openpty()
    proc = reaper.spawn(["/bin/sh", "-i"], stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
                        env={"PS1": "$ ", "PATH": os.environ["PATH"]})
    os.close(slave)
    return terminals.add(name, master, proc)


async def _until(reader: asyncio.StreamReader, needle: bytes) -> tuple[bytes, int | None]:
    """Output up to ``needle`` (or the exit frame): the bytes, and the exit code if it came."""
    seen = b""
    while needle not in seen:
        kind, size = ptyframes.HEADER.unpack(await asyncio.wait_for(reader.readexactly(ptyframes.HEADER.size), 20))
        payload = await reader.readexactly(size)
        if kind == ptyframes.EXIT:
            return seen, json.loads(payload)["exit_code"]
        seen += payload
    return seen, None


def test_a_named_session_is_resumed_with_what_it_wrote_meanwhile() -> None:
    terminals = Terminals()

    async def go() -> tuple[bytes, bytes, int | None]:
        session = _shell(terminals, "s1")
        ours, theirs = socket.socketpair()
        served = asyncio.ensure_future(terminals.serve(session, theirs, 0))
        reader, writer = await asyncio.open_connection(sock=ours)
        writer.write(ptyframes.frame(ptyframes.DATA, b"echo one=$((1+1)); sleep 1; echo two=$((2+2))\n"))
        first, _ = await _until(reader, b"one=2")
        writer.close()  # cut: no hang-up frame
        await served
        deadline = time.monotonic() + 20
        while b"two=4" not in session.replay:  # written while no connection carries it: only the replay has it
            assert time.monotonic() < deadline, bytes(session.replay)
            await asyncio.sleep(0.05)
        assert terminals.claim("s1", str(len(first))) is session  # the shell waits for a resume
        ours, theirs = socket.socketpair()
        served = asyncio.ensure_future(terminals.serve(session, theirs, len(first)))
        reader, writer = await asyncio.open_connection(sock=ours)
        second, _ = await _until(reader, b"two=4")  # written while no connection carried the session
        writer.write(ptyframes.frame(ptyframes.DATA, b"exit 7\n"))
        _, code = await _until(reader, b"\x00never")
        await served
        writer.close()
        return first, second, code

    first, second, code = asyncio.run(go())
    assert b"one=2" in first and b"one=2" not in second and b"two=4" in second
    assert code == 7
    with pytest.raises(NotFound, match="has ended"):
        terminals.claim("s1", "0")


def test_a_hang_up_ends_a_named_session_at_once() -> None:
    terminals = Terminals()

    async def go() -> Session:
        session = _shell(terminals, "s2")
        ours, theirs = socket.socketpair()
        served = asyncio.ensure_future(terminals.serve(session, theirs, 0))
        _, writer = await asyncio.open_connection(sock=ours)
        writer.write(ptyframes.frame(ptyframes.HANGUP, b""))
        await writer.drain()
        await served
        for _ in range(100):  # retiring hangs the shell up in a thread
            if session.proc.poll() is not None:
                break
            await asyncio.sleep(0.05)
        writer.close()
        return session

    session = asyncio.run(go())
    assert session.proc.poll() is not None
    with pytest.raises(NotFound):
        terminals.claim("s2", "0")


def test_bad_session_requests_are_refused_clearly() -> None:
    terminals = Terminals()
    assert terminals.claim(None, None) is None and terminals.claim("new-one", None) is None
    with pytest.raises(BadRequest, match="letters, digits or dashes"):
        terminals.claim("../x", None)
    with pytest.raises(BadRequest, match="offset=BYTES"):
        terminals.claim("abc", "-1")
    with pytest.raises(BadRequest, match="offset=BYTES"):
        terminals.claim(None, "5")
    with pytest.raises(NotFound, match="'abc' has ended"):
        terminals.claim("abc", "5")
