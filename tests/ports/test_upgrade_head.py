"""The router reads the executor's answer to an upgrade exactly to its blank line: bytes the other side sends at
once (a terminal's shell prompting, a process writing before it is read, a server that greets first) stay in the
socket for whoever reads it next.

A real executor sends its 101 and a new shell's prompt on their own; only on a loaded host does the router read
them in one piece (`tests/ports/test_pty.py` met it so, in CI), and that cannot be made to happen on demand. So
the peer here is a Unix socket server that writes the 101 and the first bytes together, as the executor's socket
delivers them when that race is lost, and one that sends its head in pieces.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from grove.core.errors import GroveError
from router.backends.base import Endpoint
from router.ports.tunnels import open_upgraded

HEAD = b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: grove-pty\r\n\r\n"
Writes = Callable[[asyncio.StreamWriter], Awaitable[None]]


async def _upgrade_against(tmp_path: Path, answer: Writes) -> tuple[bytes, bytes]:
    """Upgrade a connection to a server answering with ``answer``: the request it got, and the first bytes the
    upgraded socket then reads."""
    path = str(tmp_path / "executor.sock")
    requests: list[bytes] = []
    done = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        requests.append(await reader.readuntil(b"\r\n\r\n"))
        await answer(writer)
        await done.wait()
        writer.close()

    server = await asyncio.start_unix_server(handle, path=path)
    try:
        sock = await open_upgraded(Endpoint(f"unix:{path}", "token"), "/v1/pty", "grove-pty")
        try:
            assert not sock.getblocking()  # the caller's asyncio streams need it so
            first = await asyncio.wait_for(asyncio.get_running_loop().sock_recv(sock, 4096), 10)
        finally:
            sock.close()
    finally:
        done.set()
        server.close()
        await server.wait_closed()
    return requests[0], first


def test_bytes_sent_with_the_101_are_left_for_the_reader(tmp_path: Path) -> None:
    async def together(writer: asyncio.StreamWriter) -> None:
        writer.write(HEAD + b"root@sandbox:/# ")  # one write: one segment
        await writer.drain()

    request, first = asyncio.run(_upgrade_against(tmp_path, together))
    assert request.startswith(b"GET /v1/pty HTTP/1.1\r\n") and b"Upgrade: grove-pty\r\n" in request
    assert first == b"root@sandbox:/# "


def test_a_head_in_pieces_is_read_whole_and_no_further(tmp_path: Path) -> None:
    async def in_pieces(writer: asyncio.StreamWriter) -> None:
        # The blank line split across writes, the first bytes after it in the same write as its end.
        for piece in (HEAD[:9], HEAD[9:-3], HEAD[-3:-1], HEAD[-1:] + b"hello"):
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0.05)

    _, first = asyncio.run(_upgrade_against(tmp_path, in_pieces))
    assert first == b"hello"


def test_a_status_line_without_a_reason_phrase_is_a_101_too(tmp_path: Path) -> None:
    async def bare(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 101\r\nUpgrade: grove-pty\r\n\r\n$ ")
        await writer.drain()

    _, first = asyncio.run(_upgrade_against(tmp_path, bare))
    assert first == b"$ "


def test_a_refusal_is_the_executors_own_error(tmp_path: Path) -> None:
    body = b'{"error": {"code": "not_found", "message": "no session named s1"}}'

    async def refuse(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 404 NOT FOUND\r\nContent-Type: application/json\r\nContent-Length: "
                     + str(len(body)).encode() + b"\r\n\r\n" + body)
        await writer.drain()

    with pytest.raises(GroveError) as raised:
        asyncio.run(_upgrade_against(tmp_path, refuse))
    assert raised.value.status == 404 and "no session named s1" in raised.value.message


def test_a_peer_that_hangs_up_mid_head_is_a_bad_gateway(tmp_path: Path) -> None:
    async def hang_up(writer: asyncio.StreamWriter) -> None:
        writer.write(HEAD[:20])
        await writer.drain()
        writer.close()

    with pytest.raises(GroveError) as raised:
        asyncio.run(_upgrade_against(tmp_path, hang_up))
    assert raised.value.status == 502 and "closed the connection while upgrading" in raised.value.message

