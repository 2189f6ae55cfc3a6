"""Which router a client call goes to when it is given several (one per shard): a sandbox's calls to the router
its id names, creates spread over the routers in turn.

The client learns each router's shard from its ``GET /healthz`` (public) the first time it needs to, so it
is given URLs only (``GROVE_URL=http://a:8470,http://b:8470``). A call for a shard it did not learn (its router
was down then) goes to the first router, which passes it on to the owner or answers 503 naming the shard.
"""

from __future__ import annotations

import asyncio
import itertools
import re

import aiohttp

from grove.core.sandbox_ids import shard_of

_SANDBOX_PATH = re.compile(r"^/v1/(?:sandboxes|trajectories)/([^/?#]+)")
"""Calls sent to the router of the shard their sandbox id names (a trajectory too: its owner has it live)."""
_HEALTH_TIMEOUT_S = 10.0


def split_urls(text: str) -> list[str]:
    """``http://a,http://b`` as a list (one URL is a list of one)."""
    return [u.strip().rstrip("/") for u in text.split(",") if u.strip()]


class ShardRoutes:
    """The routers a client was given and the shard each serves."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self._shards: dict[str, str] | None = None
        self._turn = itertools.count()
        self._refused: set[str] = set()
        """Routers that refused a create's connection: left out of creates (their sandboxes' calls still go
        there)."""
        self._lock = asyncio.Lock()

    async def _learn(self, http: aiohttp.ClientSession) -> dict[str, str]:
        async with self._lock:
            if self._shards is None:
                async def shard(url: str) -> tuple[str, str] | None:
                    try:
                        async with http.get(url + "/healthz", headers={"Accept": "application/json"},
                                            timeout=aiohttp.ClientTimeout(total=_HEALTH_TIMEOUT_S)) as resp:
                            return str((await resp.json())["shard"]), url
                    except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError):
                        return None  # down, or a router from before sharding: reached through the first URL

                found = await asyncio.gather(*(shard(u) for u in self.urls))
                self._shards = dict(pair for pair in found if pair is not None)
            return self._shards

    async def base(self, http: aiohttp.ClientSession, method: str, path: str) -> str:
        """The router to send ``method path`` to."""
        if len(self.urls) == 1:
            return self.urls[0]
        if _is_create(method, path):
            await self._learn(http)
            return self._next_for_creates() or self.urls[0]
        if (match := _SANDBOX_PATH.match(path)) is not None and (shard := shard_of(match.group(1))) is not None:
            return (await self._learn(http)).get(shard, self.urls[0])
        return self.urls[0]

    def instead(self, method: str, path: str, refused: str) -> str | None:
        """Another router for a create whose router refused the connection (nothing of it was sent, so no
        shard made it), that router left out of creates from now on; None for any other call (a sandbox's
        calls belong to its owner) or when no router is left."""
        if len(self.urls) == 1 or not _is_create(method, path):
            return None
        self._refused.add(refused)
        return self._next_for_creates()

    def _next_for_creates(self) -> str | None:
        live = [url for url in (self._shards or {}).values() if url not in self._refused]
        return live[next(self._turn) % len(live)] if live else None


def _is_create(method: str, path: str) -> bool:
    return method == "POST" and path in ("/v1/sandboxes", "/v1/sandboxes/batch")
