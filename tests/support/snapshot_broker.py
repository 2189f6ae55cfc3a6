"""The router's snapshot-upload broker without a router, for tests of the executor and the upload itself.

:class:`BrokerServer` serves :class:`router.backends.knative.uploads.SnapshotUploads` — the router's own code, on
the real S3 server — at ``/v1/sandboxes/{id}/snapshot-upload`` on a loopback port, as the router does;
:class:`LocalBroker` calls it in-process (an ``artifacts.multipart.Broker``).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from aiohttp import web

from artifacts.store import ObjectStore
from grove.core.errors import GroveError
from router.backends.knative.uploads import SnapshotUploads, signing_key
from tests.support.knative_fixtures import INSTANCE


def broker_for(store: ObjectStore, part_size: int) -> SnapshotUploads:
    """The router's broker on ``store``, with parts of ``part_size`` bytes."""
    return SnapshotUploads(store, signing_key(store.config.secret_key), INSTANCE, part_size)


class LocalBroker:
    """One sandbox's side of :class:`SnapshotUploads`, called in-process."""

    def __init__(self, uploads: SnapshotUploads, sandbox_id: str, disk_mb: int) -> None:
        self.uploads, self.sandbox_id = uploads, sandbox_id
        self.max_bytes = uploads.check(sandbox_id, f"Bearer {uploads.token(sandbox_id, disk_mb)}")
        self.calls: list[str] = []

    def call(self, op: str, **fields: Any) -> dict[str, Any]:
        """One operation, as the router would answer it."""
        self.calls.append(op)
        return asyncio.run(self.uploads.handle(self.sandbox_id, self.max_bytes, {"op": op, **fields}))


class BrokerServer:
    """The broker over HTTP on 127.0.0.1, in a thread of its own (``with`` it)."""

    def __init__(self, uploads: SnapshotUploads) -> None:
        self.uploads = uploads
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def upload_url(self, sandbox_id: str) -> str:
        """The executor's ``GROVE_EXECUTOR_SNAPSHOT_UPLOAD_URL`` for ``sandbox_id``."""
        return f"{self.url}/v1/sandboxes/{sandbox_id}/snapshot-upload"

    async def _serve(self, request: web.Request) -> web.Response:
        sandbox_id = request.match_info["id"]
        try:
            max_bytes = self.uploads.check(sandbox_id, request.headers.get("Authorization"))
            return web.json_response(await self.uploads.handle(sandbox_id, max_bytes, await request.json()))
        except GroveError as exc:
            return web.json_response(exc.to_body(), status=exc.status)

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/sandboxes/{id}/snapshot-upload", self._serve)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    def __enter__(self) -> BrokerServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
