"""The router's side of sharding: calls for another shard's sandbox passed on to its owner, and lists across
shards.

Only calls under ``/v1/sandboxes/{id}`` are passed on: everything else a router answers from S3 (trajectories,
artifacts: one bucket serves every shard, and ids are unique across shards) or from its own state (pools, images,
projects). A WebSocket upgrade is not passed on: it answers 421 with the owner's URL (the SDK goes there itself).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from aiohttp import web
from yarl import URL

from grove.core import wire
from grove.core.errors import Misdirected, NotFound, Unavailable
from grove.core.sandbox_ids import shard_of
from router.answer import Answer
from router.connections import hung_up
from router.projects.model import Caller
from router.shards import signing
from router.shards.config import ShardConfig

log = logging.getLogger("grove.router")
RETRY_AFTER_S = 5.0
CONNECT_TIMEOUT_S = 5.0
_CHUNK = 256 * 1024
# Hop-by-hop headers (RFC 9110 7.6.1), the key (the peer gets the caller, signed, instead) and what aiohttp sets.
_DROP = frozenset(h.lower() for h in (
    "Connection", "Keep-Alive", "Proxy-Connection", "TE", "Trailer", "Transfer-Encoding", "Upgrade", "Host",
    "Authorization", "Cookie", *signing.HEADERS))


class Peers:
    """This router's peers: who owns an id, the one client session to them, and the signed calls."""

    def __init__(self, config: ShardConfig) -> None:
        self.config = config
        self._session: aiohttp.ClientSession | None = None

    def owner(self, sandbox_id: str) -> str | None:
        """The other shard that owns ``sandbox_id``, or None if it is this router's (or no id a router makes)."""
        shard = shard_of(sandbox_id)
        return shard if shard is not None and shard != self.config.name else None

    def url_of(self, shard: str, sandbox_id: str) -> str:
        """The base URL of ``shard``'s router; ``NotFound`` naming the peers this router knows."""
        url = self.config.others.get(shard)
        if url is None:
            known = ", ".join(sorted(self.config.others)) or "none"
            raise NotFound(f"sandbox {sandbox_id} belongs to shard {shard!r}, which this router does not know "
                           f"(its peers: {known}; --peers)")
        return url

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30), auto_decompress=False,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S))
        return self._session

    def _signed(self, method: str, path: str, caller: Caller) -> dict[str, str]:
        assert self.config.secret is not None  # ShardConfig refuses peers without one
        return signing.sign(self.config.secret, self.config.name, method, path, caller)

    async def forward(self, request: web.Request, shard: str, caller: Caller) -> web.StreamResponse:
        """Pass ``request`` on to ``shard``'s router as ``caller`` and stream its answer back unchanged.

        A caller who hangs up while the owner works (a trainer killed mid-command) ends the forward: the
        connection to the owner closes with it, so the owner sees its caller gone, as it would a direct one
        (and does not count the call as the client's heartbeat to the command's end)."""
        base = self.url_of(shard, request.match_info.get("id", ""))
        if request.headers.get("Upgrade", "").lower() == "websocket":
            raise Misdirected(f"sandbox {request.match_info['id']} is shard {shard}'s: open this WebSocket at "
                              f"{base}{request.raw_path} (routers pass on HTTP calls, not upgrades)")
        gone = hung_up(request.transport)
        if gone is None:
            return await self._relay(request, shard, base, caller)
        relay = asyncio.ensure_future(self._relay(request, shard, base, caller))
        try:
            await asyncio.wait((relay, gone), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the router stopping: the relay goes with its handler
            relay.cancel()
            raise
        if relay.done():
            return relay.result()
        relay.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await relay
        log.info("the caller of %s %s (shard %s's) hung up before the answer", request.method, request.path, shard)
        return web.Response()  # never sent: its connection is gone

    async def _relay(self, request: web.Request, shard: str, base: str, caller: Caller) -> web.StreamResponse:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROP}
        headers.update(self._signed(request.method, request.raw_path, caller))
        body: AsyncIterator[bytes] | None = request.content.iter_chunked(_CHUNK) if request.can_read_body else None
        response: web.StreamResponse | None = None
        try:
            async with self._http().request(request.method, URL(base + request.raw_path, encoded=True),
                                            headers=headers, data=body, allow_redirects=False) as upstream:
                response = web.StreamResponse(status=upstream.status, headers={
                    k: v for k, v in upstream.headers.items() if k.lower() not in _DROP})
                if "Content-Length" not in upstream.headers:
                    response.enable_chunked_encoding()
                answer = Answer(request, response)
                await answer.start()
                async for chunk in upstream.content.iter_chunked(_CHUNK):
                    if answer.gone:
                        break  # leaving closes the connection: the owning router sees its caller gone
                    await answer.write(chunk)
                await answer.end()
                return response
        except (aiohttp.ClientError, TimeoutError) as exc:
            if response is not None and response.prepared:
                raise  # the answer had started: cutting the connection is the only signal left
            raise self.down(shard, base, exc) from exc

    @staticmethod
    def down(shard: str, base: str, exc: BaseException) -> Unavailable:
        """The 503 for a shard whose router cannot be reached."""
        return Unavailable(f"shard {shard} (its router at {base}) cannot be reached: {type(exc).__name__}: {exc}; "
                           "its sandboxes keep running, retry later", retry_after=RETRY_AFTER_S)

    async def lists(self, request: web.Request, caller: Caller) -> tuple[list[dict[str, Any]], dict[str, str]]:
        """Every other shard's answer to this list call (as ``caller``), and why each shard that gave none did
        not (its status and message, or the connection's error): a wrong peer secret reads apart from an outage."""
        query = [(k, v) for k, v in request.query.items() if k != "shards"]
        path = str(URL(request.path).with_query(query))

        async def one(shard: str, base: str) -> list[dict[str, Any]] | str:
            headers = {**self._signed("GET", path, caller), "Accept": wire.JSON}
            if (project := request.headers.get("X-Grove-Project")) is not None:
                headers["X-Grove-Project"] = project
            try:
                async with self._http().get(URL(base + path, encoded=True), headers=headers,
                                            timeout=aiohttp.ClientTimeout(total=30)) as resp:
                    if resp.status != 200:
                        return f"{resp.status}: {(await resp.text())[:300]}"
                    rows: list[dict[str, Any]] = (await resp.json())["sandboxes"]
                    return rows
            except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError) as exc:
                return f"{type(exc).__name__}: {exc}"

        others = sorted(self.config.others.items())
        answers = await asyncio.gather(*(one(shard, base) for shard, base in others))
        rows = [row for answer in answers if not isinstance(answer, str) for row in answer]
        errors = {shard: answer for (shard, _), answer in zip(others, answers, strict=True) if isinstance(answer, str)}
        for shard, why in errors.items():
            log.warning("shard %s did not answer a list: %s", shard, why)
        return rows, errors

    async def close(self) -> None:
        """Close the connections to the peers."""
        if self._session is not None:
            await self._session.close()
