"""Sandbox lifecycle: create, wake, delete, and the four timeouts; re-adoption after a restart."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time

from grove.errors import Conflict, GroveError, InternalError, Invalid, Unavailable
from router.backends.base import Backend, Endpoint
from router.models import CreateRequest
from router.proxy import Upstreams
from router.registry import Registry, SandboxRecord, new_id
from router.settings import RouterSettings

log = logging.getLogger("grove.router")


class SandboxService:
    """Owns the records and drives the backend; the HTTP layer only translates."""

    def __init__(self, settings: RouterSettings, backend: Backend, registry: Registry, upstreams: Upstreams) -> None:
        self.settings = settings
        self.backend = backend
        self.registry = registry
        self.upstreams = upstreams
        self._locks: dict[str, asyncio.Lock] = {}
        self._creating: dict[str, asyncio.Task[None]] = {}
        self._reaper: asyncio.Task[None] | None = None

    # -- start and stop ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the backend, re-adopt what still runs, collect what has no owner, start the reaper."""
        await self.backend.open()
        for record in self.registry.load():
            await self._adopt(record)
        removed = await self.backend.collect_orphans(self.registry.known_ids())
        if removed:
            log.warning("removed %d orphaned sandbox(es): %s", len(removed), ", ".join(removed))
        self._reaper = asyncio.create_task(self._reap_forever())

    async def _adopt(self, record: SandboxRecord) -> None:
        if record.status in ("ready", "pending"):
            if record.handle and await self.backend.is_running(record.id, record.handle):
                record.status = "ready"
            else:
                # It stopped while no router watched: its files are there, the next call starts it.
                record.status = "idle"
                record.endpoint_url = None
            self.registry.save(record)
        if record.status == "deleting":
            await self.delete(record.id, reason=record.end_reason or "delete interrupted by a router restart")

    async def close(self) -> None:
        """Stop the reaper and wait for creations in flight; sandboxes keep running."""
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        for task in list(self._creating.values()):
            with contextlib.suppress(BaseException):
                await task
        await self.upstreams.close()
        await self.backend.close()

    def _lock(self, sandbox_id: str) -> asyncio.Lock:
        return self._locks.setdefault(sandbox_id, asyncio.Lock())

    # -- lifecycle calls -----------------------------------------------------------------------------

    async def create(self, req: CreateRequest) -> SandboxRecord:
        """Create a sandbox (idempotent by ``request_id``); wait for it unless ``wait`` is false."""
        if req.request_id and (existing := self.registry.by_request_id.get(req.request_id)):
            record = self.registry.get(existing)
        else:
            if len(self.registry.live()) >= self.settings.max_sandboxes:
                raise Unavailable(f"this router already runs {self.settings.max_sandboxes} sandboxes", retry_after=5)
            if not req.workdir.startswith("/"):
                raise Invalid("'workdir' must be an absolute path")
            digest = await self.backend_image_digest(req.image)
            record = SandboxRecord(id=new_id(), request=req, token=secrets.token_urlsafe(32), created_at=time.time())
            record.image_digest = digest
            self.registry.add(record)
            self.registry.save(record)
            self._creating[record.id] = asyncio.create_task(self._bring_up(record))
        task = self._creating.get(record.id)
        if req.wait and task is not None:
            await asyncio.shield(task)
        if req.wait and record.status == "failed":
            raise Unavailable(f"sandbox {record.id} failed to start: {record.error}", retry_after=1)
        return record

    async def backend_image_digest(self, image: str) -> str:
        """The digest of an image, or the backend's NotFound."""
        return await self.backend.image_digest(image)

    async def _bring_up(self, record: SandboxRecord) -> None:
        try:
            started = await self.backend.create(record.spec())
        except GroveError as exc:
            record.status, record.error = "failed", exc.message
        except Exception as exc:  # a backend bug: keep the router up, say what happened
            log.exception("creating %s failed", record.id)
            record.status, record.error = "failed", f"{type(exc).__name__}: {exc}"
        else:
            if record.status == "deleting":  # deleted while it was starting
                await self.backend.delete(record.id, started.handle)
                return
            record.status = "ready"
            record.handle, record.endpoint_url = started.handle, started.endpoint.url
            record.image_digest = started.image_digest
            record.ready_at = time.time()
            record.last_activity = time.time()
        finally:
            self._creating.pop(record.id, None)
        self.registry.save(record)

    async def delete(self, sandbox_id: str, *, reason: str = "deleted by request") -> SandboxRecord:
        """Kill everything of the sandbox and forget it (its id then answers ``deleted``)."""
        record = self.registry.get(sandbox_id)
        async with self._lock(sandbox_id):
            if self.registry.lookup(sandbox_id) is not record or record.status == "deleted":
                return record
            record.status, record.end_reason = "deleting", reason
            self.registry.save(record)
            if task := self._creating.get(sandbox_id):
                with contextlib.suppress(BaseException):
                    await task
            await self.upstreams.drop(record.endpoint_url)
            await self.backend.delete(sandbox_id, record.handle)
            record.status, record.ended_at, record.endpoint_url = "deleted", time.time(), None
            self.registry.forget(record)
        self._locks.pop(sandbox_id, None)
        return record

    def touch(self, record: SandboxRecord) -> None:
        """Any API call or heartbeat: not idle, client alive."""
        record.last_activity = time.time()

    async def endpoint(self, record: SandboxRecord) -> Endpoint:
        """The executor to call, starting the sandbox first if it was scaled to zero (like an activator)."""
        if record.status == "ready" and (endpoint := record.endpoint()):
            return endpoint
        if task := self._creating.get(record.id):
            await asyncio.shield(task)
        async with self._lock(record.id):
            if record.status == "idle":
                started = await self.backend.resume(record.spec(), record.handle)
                record.handle, record.endpoint_url, record.status = started.handle, started.endpoint.url, "ready"
                record.error = None
                self.registry.save(record)
        if record.status == "failed":
            raise Conflict(f"sandbox {record.id} failed: {record.error}; delete it and create another")
        if record.status in ("deleting", "deleted"):
            raise Conflict(f"sandbox {record.id} was deleted ({record.end_reason})")
        endpoint = record.endpoint()
        if endpoint is None:
            raise InternalError(f"sandbox {record.id} is {record.status} without an endpoint")
        return endpoint

    async def lost(self, record: SandboxRecord) -> None:
        """A call found the executor gone: if its process is dead, the next call restarts it."""
        if record.status == "ready" and not await self.backend.is_running(record.id, record.handle):
            await self._to_idle(record, error="the executor exited unexpectedly; restarted on the next call")

    async def _to_idle(self, record: SandboxRecord, *, error: str | None = None) -> None:
        async with self._lock(record.id):
            if record.status != "ready":
                return
            await self.upstreams.drop(record.endpoint_url)
            record.handle = await self.backend.stop(record.id, record.handle)
            record.status, record.endpoint_url, record.error = "idle", None, error
            self.registry.save(record)

    # -- the reaper ----------------------------------------------------------------------------------

    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.reap_interval_s)
            try:
                await self.reap_once()
            except Exception:
                log.exception("reaper pass failed")

    async def reap_once(self) -> None:
        """Apply TTL, heartbeat expiry and idle scale-to-zero; notice executors that died."""
        now = time.time()
        for record in self.registry.live():
            req = record.request
            if record.status in ("deleting", "pending"):
                continue
            if now - record.created_at > req.ttl_s:
                await self.delete(record.id, reason=f"ttl of {req.ttl_s:g}s expired")
            elif now - record.last_activity > req.heartbeat_timeout_s:
                await self.delete(record.id, reason=f"no heartbeat for {req.heartbeat_timeout_s:g}s")
            elif record.status == "ready" and record.inflight == 0 and now - record.last_activity > req.idle_timeout_s:
                await self._to_idle(record)
            elif record.status == "ready" and not await self.backend.is_running(record.id, record.handle):
                await self._to_idle(record, error="the executor exited unexpectedly; restarted on the next call")

