"""Warm pools: sandboxes started ahead of time and handed out by creates that name the pool.

A pool's definition and its claim counters are files under ``<state>/pools`` (:mod:`router.pools.files`), so
they survive restarts; its members are ordinary sandbox records with ``pool`` set, hidden from the API until
claimed. One filler task starts members one at a time while users' sandboxes work (deferring to them), so
refilling does not compete with a burst, and a few at a time (``filler.IDLE_STARTS``) while the router is idle.
What a claim applies and guarantees is :meth:`router.lifecycle.claims.Claims.claim`'s business; this module keeps the
pools: definitions, their members, the filling.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import re
from pathlib import Path
from typing import Any

from grove.core.errors import Conflict, Invalid, NotFound
from router.models import CreateRequest, PoolRequest
from router.pools.files import Counts, PoolFiles
from router.pools.filler import Filler, Pool, PoolHost, made_with, pool_key
from router.projects.model import DEFAULT
from router.records.registry import SandboxRecord, new_id

log = logging.getLogger("grove.router")
NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
# Fields of a create that a pool fixes; a create naming the pool may leave them out or repeat them.
POOL_FIELDS = ("image", "cpu", "memory_mb", "pids_max", "disk_mb", "network", "desktop")
# How often changed claim and miss counters are written: a burst's thousand claims cost one write, and a
# killed router loses at most this much of its counting.
_COUNTS_EVERY_S = 1.0


class Pools:
    """The router's warm pools (definitions persisted, members kept filled in the background)."""

    def __init__(self, service: PoolHost, state_dir: Path) -> None:
        self._service = service
        self._files = PoolFiles(state_dir)
        self._pools: dict[str, Pool] = {}
        self._saved: dict[str, Counts] = {}
        """Each pool's counters as last written."""
        self._filler = Filler(self.all, service)
        self._counting: asyncio.Task[None] | None = None

    # -- definitions ---------------------------------------------------------------------------------

    def load(self) -> None:
        """Read the definitions and counters an earlier router left (unreadable definitions are set aside,
        never deleted)."""
        for project, definition in self._files.definitions():
            pool = Pool(definition, project)
            counts = self._files.counts(pool.key)
            pool.claims, pool.misses = counts.claims, counts.misses
            self._pools[pool.key] = pool
            self._saved[pool.key] = counts

    def start(self) -> None:
        """Start keeping the pools filled (:mod:`router.pools.filler`) and their counters saved."""
        self._filler.start()
        self._counting = asyncio.create_task(self._save_counts_forever())

    async def close(self) -> None:
        """Stop filling; write the counters one last time."""
        await self._filler.close()
        if self._counting is not None:
            self._counting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._counting
        try:
            self._save_counts()
        except OSError as exc:  # a full state disk must not stop the router from stopping
            log.warning("could not save warm pool counters: %s", exc)

    async def create(self, definition: PoolRequest, project: str = DEFAULT) -> dict[str, Any]:
        """Define a pool of ``project`` and start filling it."""
        if not NAME_RE.match(definition.name):
            raise Invalid(f"pool name {definition.name!r}: use lower-case letters, digits and '-' (at most 63)")
        key = pool_key(project, definition.name)
        if key in self._pools:
            raise Conflict(f"pool {definition.name} exists; resize it or delete it first")
        if not definition.workdir.startswith("/"):
            raise Invalid("'workdir' must be an absolute path")
        self._check_size(definition.size, project)
        await self._service.backend.image_digest(definition.image)  # NotFound names the images there are
        member = SandboxRecord(id=new_id(), request=made_with(definition), token="", created_at=0.0)
        self._service.backend.check(member.spec())  # a malformed allow-list: 422 naming the entry
        self._files.remove(key)  # counters an earlier pool of this name left are not this one's
        self._files.save(key, definition)
        self._pools[key] = Pool(definition, project)
        self._saved[key] = Counts()
        self._filler.wake()
        return self.show(definition.name, project)

    async def resize(self, name: str, size: int, project: str = DEFAULT) -> dict[str, Any]:
        """Change how many members a pool keeps; members beyond it are deleted (starting ones first)."""
        pool = self.get(name, project)
        self._check_size(size, project)
        pool.definition = dataclasses.replace(pool.definition, size=size)
        self._files.save(pool.key, pool.definition)
        members = sorted(self._service.registry.pooled(pool.key), key=lambda r: (r.status == "ready", r.created_at))
        for record in members[: max(0, len(members) - size)]:
            await self._service.delete(record.id, reason=f"pool {name} resized to {size}")
        self._filler.wake()
        return self.show(name, project)

    async def delete(self, name: str, project: str = DEFAULT) -> dict[str, Any]:
        """Forget a pool and delete its unclaimed members (claimed sandboxes are their users')."""
        shown = self.show(name, project)
        key = pool_key(project, name)
        del self._pools[key]
        self._saved.pop(key, None)
        self._files.remove(key)
        for record in self._service.registry.pooled(key):
            await self._service.delete(record.id, reason=f"pool {name} deleted")
        return {**shown, "size": 0, "ready": 0, "starting": 0}

    def _check_size(self, size: int, project: str) -> None:
        limit = self._service.settings.max_sandboxes
        if size > limit:
            raise Invalid(f"a pool of {size} exceeds this router's limit of {limit} sandboxes "
                          "(pool members count toward it)")
        quota = self._service.projects.get(project).quotas.sandboxes
        if quota is not None and size > quota:
            raise Invalid(f"a pool of {size} exceeds project {project}'s quota of {quota} sandboxes (pool members "
                          "count toward it, as its other sandboxes do)")

    def get(self, name: str, project: str = DEFAULT) -> Pool:
        """A pool of ``project`` by name (``NotFound`` naming the project's pools: another's are not there)."""
        pool = self._pools.get(pool_key(project, name))
        if pool is None:
            names = sorted(p.definition.name for p in self._pools.values() if p.project == project)
            raise NotFound(f"no pool {name!r}; pools: {', '.join(names) or 'none'}")
        return pool

    def show(self, name: str, project: str = DEFAULT) -> dict[str, Any]:
        """A pool as the API shows it."""
        return self.shown(self.get(name, project))

    def shown(self, pool: Pool) -> dict[str, Any]:
        """A pool as the API shows it."""
        members = self._service.registry.pooled(pool.key)
        ready = sum(1 for r in members if r.status == "ready")
        return {**dataclasses.asdict(pool.definition), "project": pool.project, "ready": ready,
                "starting": len(members) - ready, "claims": pool.claims, "misses": pool.misses, "error": pool.error}

    def all(self) -> list[Pool]:
        """Every pool, of every project."""
        return list(self._pools.values())

    def pool_keys(self) -> list[str]:
        """Every pool's key (:func:`~router.pools.filler.pool_key`), sorted."""
        return sorted(self._pools)

    # -- counters ------------------------------------------------------------------------------------

    async def _save_counts_forever(self) -> None:
        while True:
            await asyncio.sleep(_COUNTS_EVERY_S)
            try:
                # On the loop, not in a thread: pools come and go there. A few small files, once a second.
                self._save_counts()
            except OSError as exc:  # a full state disk: counting goes on in memory, and is saved once it can be
                log.warning("could not save warm pool counters: %s", exc)

    def _save_counts(self) -> None:
        """Write the counters of every pool whose claims or misses changed since they were last written."""
        for name, pool in self._pools.items():
            counts = Counts(claims=pool.claims, misses=pool.misses)
            if self._saved.get(name) != counts:
                self._files.save_counts(name, counts)
                self._saved[name] = counts

    # -- claims --------------------------------------------------------------------------------------

    def pool_for(self, req: CreateRequest, given: frozenset[str], project: str = DEFAULT) -> Pool | None:
        """The pool of ``project`` a create draws on: the one it names (its fields must agree with the pool's),
        else one whose spec it matches exactly."""
        if req.pool is not None:
            pool = self.get(req.pool, project)
            wanted = self.made_with(pool)
            for name in POOL_FIELDS:
                if name in given and getattr(req, name) != getattr(wanted, name):
                    raise Conflict(f"pool {req.pool} makes sandboxes with {name}={_show(getattr(wanted, name))}, "
                                   f"not {_show(getattr(req, name))}; leave '{name}' out or create without the pool")
            return pool
        for pool in self._pools.values():
            if pool.project != project:
                continue
            wanted = self.made_with(pool)
            if all(getattr(req, name) == getattr(wanted, name) for name in POOL_FIELDS):
                return pool
        return None

    def made_with(self, pool: Pool) -> CreateRequest:
        """The create a pool's members were made with."""
        return made_with(pool.definition)

    def as_create(self, pool: Pool, req: CreateRequest) -> CreateRequest:
        """The create with the pool's image, resources and network (what a member was made with)."""
        wanted = self.made_with(pool)
        return dataclasses.replace(req, **{name: getattr(wanted, name) for name in POOL_FIELDS})

    def as_made(self, req: CreateRequest, project: str = DEFAULT) -> CreateRequest:
        """What a create naming a pool becomes (to compare a retry with the first call's request)."""
        if req.pool is None or (pool := self._pools.get(pool_key(project, req.pool))) is None:
            return req
        return self.as_create(pool, req)

    def take(self, pool: Pool, *, count_miss: bool = True) -> SandboxRecord | None:
        """Take a ready member out of the pool (no await: two claims never get the same one); none there
        counts as the pool's miss unless the caller counts it later."""
        taken = self.take_many(pool, 1)
        if not taken and count_miss:
            pool.misses += 1
        return taken[0] if taken else None

    def take_many(self, pool: Pool, count: int) -> list[SandboxRecord]:
        """Take up to ``count`` ready members out of the pool, oldest first (no await), in one pass over it."""
        taken = []
        for record in self._service.registry.members(pool.key):
            if record.status == "ready":
                record.status = "pending"  # taken: no other claim, no reaper, no resize touches it now
                taken.append(record)
                if len(taken) == count:
                    break
        if taken:
            pool.claims += len(taken)
            self._filler.wake()
        return taken


def _show(value: Any) -> str:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return json.dumps(dataclasses.asdict(value))
    return repr(value)
