"""A stdio MCP server in a sandbox, served to clients outside as streamable HTTP.

The server is a background process of the sandbox whose stdin and stdout are pipes (:mod:`executor.processes`);
the router holds one byte stream to them (``Upgrade: grove-stdio`` through the executor's port) and speaks
the MCP stdio transport over it: one JSON-RPC message per line, each way. The HTTP side is the ``mcp``
package's own :class:`~mcp.server.streamable_http.StreamableHTTPServerTransport`: it answers each POST (a JSON
body or an event stream), routes a response to the request waiting for it, and serves the GET stream of
server-initiated messages. Between the two this module only moves messages, parsed and written as the
package's stdio client does (``mcp_types.jsonrpc_message_adapter``, ``model_dump_json(by_alias=True,
exclude_unset=True)``), and sees each ``tools/call`` go in and its answer come out, which it reports for the
trajectory.

One stdio server holds one MCP session, so every client of a publication shares it (the transport runs
without session ids; the first client's ``initialize`` is the one the server answers first). When the process
exits, its stdout ends: each request still waiting is answered with a JSON-RPC error, and every later request
is refused with :class:`ServerExited` (a 502 naming the exit and the tail of its stderr).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import mcp_types
from mcp.server.streamable_http import StreamableHTTPServerTransport
from mcp.shared._stream_protocols import ReadStream, WriteStream
from mcp.shared.message import SessionMessage
from starlette.types import Receive, Scope, Send

from grove.core.errors import BadGateway

log = logging.getLogger("grove.router")
MAX_LINE = 16 * 1024 * 1024
"""Longest JSON-RPC line read from the server (a longer one ends the bridge: the stream cannot be resynced)."""
_DRAIN_S = 10.0
EXITED_CODE = -32000
"""The JSON-RPC error code of a request the server exited without answering (implementation-defined range)."""


class ServerExited(BadGateway):
    """The stdio MCP server's process has exited: nothing answers the publication any more."""


@dataclass(frozen=True)
class ToolCall:
    """A ``tools/call`` that went through, and what came back (``answer``: the JSON-RPC response, as a dict)."""

    tool: str
    arguments: Any
    started: float
    answer: dict[str, Any] | None
    """None when the server exited without answering."""


class StdioMcp:
    """One published stdio MCP server: its process's stdio on one side, streamable HTTP on the other."""

    def __init__(self, name: str, pid: int, sock: socket.socket, on_call: Callable[[ToolCall], None],
                 why_exited: Callable[[], Awaitable[str]]) -> None:
        self.name, self.pid = name, pid
        self._sock, self._on_call, self._why_exited = sock, on_call, why_exited
        self._transport = StreamableHTTPServerTransport(mcp_session_id=None)
        self._calls: dict[Any, tuple[str, Any, float]] = {}
        self._waiting: set[Any] = set()
        self._connected = asyncio.Event()
        self._posts = 0
        self._no_posts = asyncio.Event()
        self._no_posts.set()
        self._task: asyncio.Task[None] | None = None
        self.exited = False
        self._exit_reason: str | None = None

    async def start(self) -> None:
        """Begin relaying (returns once the HTTP side takes requests)."""
        self._task = asyncio.create_task(self._run(), name=f"grove-mcp-stdio-{self.name}")
        connected = asyncio.ensure_future(self._connected.wait())
        done, _ = await asyncio.wait([self._task, connected], return_when=asyncio.FIRST_COMPLETED)
        connected.cancel()
        if self._task in done:
            self._task.result()

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        """One HTTP request of an MCP client (an ASGI call); :class:`ServerExited` once the process is gone."""
        if self.exited:
            if self._exit_reason is None:
                self._exit_reason = await self._why_exited()
            raise ServerExited(f"the stdio MCP server {self.name!r} (pid {self.pid}) exited: "
                               f"{self._exit_reason}; publish it again to start it anew")
        posting = scope["method"] == "POST"
        if posting:
            self._posts += 1
            self._no_posts.clear()
        try:
            await self._transport.handle_request(scope, receive, send)
        finally:
            if posting:
                self._posts -= 1
                if not self._posts:
                    self._no_posts.set()

    async def close(self) -> None:
        """Stop relaying: the process's stdin closes (a stdio server then exits), waiting requests are answered."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)  # its stdout "ends" here: the bridge winds down as on an exit
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), _DRAIN_S + 5)
            except TimeoutError:
                self._task.cancel()
        self._sock.close()

    async def _run(self) -> None:
        reader, writer = await asyncio.open_connection(sock=self._sock, limit=MAX_LINE)
        try:
            async with self._transport.connect() as (from_client, to_client):
                self._connected.set()
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(self._to_server, from_client, writer)
                    await self._from_server(reader, to_client)
                    tasks.cancel_scope.cancel()
                # The server is gone: no more messages (the transport's router ends cleanly), the answers already
                # sent are written to their POSTs before the transport is ended (its GET stream with it).
                await to_client.aclose()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._no_posts.wait(), _DRAIN_S)
                await self._transport.terminate()
        finally:
            self.exited = True
            writer.close()

    async def _to_server(self, from_client: ReadStream[SessionMessage | Exception],
                         writer: asyncio.StreamWriter) -> None:
        async for item in from_client:
            if isinstance(item, Exception):
                continue  # the transport already answered the client about a message it could not parse
            message = item.message
            if isinstance(message, mcp_types.JSONRPCRequest):
                self._waiting.add(message.id)
                if message.method == "tools/call" and isinstance(message.params, dict):
                    params = message.params
                    self._calls[message.id] = (str(params.get("name")), params.get("arguments"), time.time())
            writer.write(message.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n")
            await writer.drain()

    async def _from_server(self, reader: asyncio.StreamReader, to_client: WriteStream[SessionMessage]) -> None:
        while True:
            try:
                line = await reader.readline()
            except (ValueError, OSError) as exc:  # a line past MAX_LINE, or the stream broke
                log.warning("stdio MCP server %s: %s", self.name, exc)
                break
            if not line:
                break
            try:
                message = mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False)
            except ValueError:
                log.info("stdio MCP server %s wrote a line that is not JSON-RPC: %r", self.name, line[:200])
                continue
            if isinstance(message, mcp_types.JSONRPCResponse | mcp_types.JSONRPCError):
                self._answered(message.id, message.model_dump(by_alias=True, exclude_unset=True))
            await to_client.send(SessionMessage(message))
        self.exited = True
        for request_id in list(self._waiting):  # nobody will answer them: say so rather than leave them hanging
            error = mcp_types.JSONRPCError(jsonrpc="2.0", id=request_id, error=mcp_types.ErrorData(
                code=EXITED_CODE, message=f"the stdio MCP server {self.name!r} exited before it answered"))
            self._answered(request_id, None)
            await to_client.send(SessionMessage(error))

    def _answered(self, request_id: Any, answer: dict[str, Any] | None) -> None:
        self._waiting.discard(request_id)
        if (call := self._calls.pop(request_id, None)) is not None:
            self._on_call(ToolCall(call[0], call[1], call[2], answer))
