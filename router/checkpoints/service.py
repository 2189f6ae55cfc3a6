"""Checkpoints, restores and forks: the rules; the backend keeps the files, the API handlers only translate.

- A checkpoint belongs to its sandbox: deleting the sandbox deletes its checkpoints (a sandbox made from
  one keeps its own copy). Each counts its ``bytes`` against the project's ``disk_mb`` quota, shared blocks
  in full: a conservative count of what copy-on-write stores far more cheaply.
- A sandbox made from a checkpoint (``"checkpoint"`` on create, or a fork) gets the checkpoint's image and disk
  size, its own id, token, limits, network policy and trajectory, and a ``lineage`` naming where it came from.
  Files only: processes are not carried (a task's services start again from its definition in each child).
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
import time
from typing import Any, Protocol

from grove.core.errors import Conflict, Invalid, QuotaExceeded
from router.backends.base import Backend
from router.checkpoints.index import CheckpointIndex, CheckpointRecord, unknown
from router.models import CreateRequest, LineageModel, Metadata
from router.projects.files import ProjectFiles
from router.records.registry import Registry, SandboxRecord
from router.trajectory.journal import Journal
from router.upstream.proxy import Upstreams

_QUOTA_RETRY_S = 30
_SNAPSHOT_TIMEOUT_S = 600.0
MAX_FORK = 64
"""The most children one fork makes."""


class CheckpointHost(Protocol):
    """What checkpoints need of the sandbox service (which owns the records, the backend and creates)."""

    backend: Backend
    registry: Registry
    projects: ProjectFiles
    journal: Journal
    upstreams: Upstreams

    def lock(self, sandbox_id: str) -> asyncio.Lock:
        """The sandbox's lifecycle lock."""

    async def create(self, req: CreateRequest, given: frozenset[str] = ..., project: str = ...,
                     kind: str = ...) -> SandboxRecord:
        """Create a sandbox (from a checkpoint: ``kind`` is its lineage's)."""

    async def delete(self, sandbox_id: str, *, reason: str = ...) -> SandboxRecord:
        """Delete a sandbox."""


class Checkpoints:
    """Takes, lists and deletes checkpoints; makes sandboxes from them."""

    def __init__(self, service: CheckpointHost, index: CheckpointIndex) -> None:
        self._service = service
        self.index = index
        """Every checkpoint's record."""

    async def take(self, record: SandboxRecord) -> CheckpointRecord:
        """Checkpoint a sandbox now (its lifecycle lock held: it is neither scaled to zero nor deleted meanwhile)."""
        service = self._service
        async with service.lock(record.id):
            if record.status not in ("ready", "idle"):
                raise Conflict(f"sandbox {record.id} is {record.status}: only a ready or idle sandbox can be "
                               "checkpointed")
            checkpoint_id = "ck-" + secrets.token_hex(8)
            step = len(service.journal.record(record.id)["steps"])
            if service.backend.checkpoint_snapshots and (endpoint := record.endpoint()) is not None:
                await service.upstreams.post_json(endpoint, "/v1/snapshot", {}, timeout_s=_SNAPSHOT_TIMEOUT_S)
            taken = await service.backend.checkpoint(record.id, record.handle, checkpoint_id)
            made = CheckpointRecord(
                id=checkpoint_id, sandbox_id=record.id, project=record.project, step=step, created_at=time.time(),
                bytes=taken.bytes, frozen_ms=round(taken.frozen_s * 1000, 3), copy_on_write=taken.reflinked,
                image=record.request.image, disk_mb=record.request.disk_mb)
            try:
                self._check_quota(made)
                self.index.add(made)
            except BaseException:
                await service.backend.delete_checkpoint(record.id, checkpoint_id)
                raise
        return made

    def _check_quota(self, made: CheckpointRecord) -> None:
        limit = self._service.projects.get(made.project).quotas.disk_mb
        if limit is None:
            return
        held = self._service.registry.usage(made.project).disk_mb + self.index.held_mb(made.project)
        want = made.bytes / (1 << 20)
        if held + want > limit:
            raise QuotaExceeded(
                f"project {made.project} is at its 'disk_mb' quota: its sandboxes and checkpoints hold {held:,.1f} MiB "
                f"of {limit:,} MiB, and this checkpoint holds {want:,.1f} MiB more; delete checkpoints (DELETE "
                "/v1/sandboxes/{id}/checkpoints/{checkpoint}) or sandboxes, or ask for a larger quota",
                retry_after=_QUOTA_RETRY_S)

    def of_sandbox(self, sandbox_id: str) -> list[CheckpointRecord]:
        """A sandbox's checkpoints, oldest first."""
        return self.index.of_sandbox(sandbox_id)

    def get(self, record: SandboxRecord, checkpoint_id: str) -> CheckpointRecord:
        """One checkpoint of this sandbox (``NotFound`` for any other, another project's above all)."""
        found = self.index.get(checkpoint_id, frozenset({record.project}))
        if found.sandbox_id != record.id:
            raise unknown(checkpoint_id)
        return found

    async def delete(self, record: SandboxRecord, checkpoint_id: str) -> CheckpointRecord:
        """Delete one checkpoint of this sandbox (sandboxes made from it keep their own files)."""
        found = self.get(record, checkpoint_id)
        await self._service.backend.delete_checkpoint(record.id, checkpoint_id)
        self.index.remove(checkpoint_id)
        return found

    def forget_sandbox(self, sandbox_id: str) -> None:
        """The sandbox was deleted, and its checkpoints' files with it: forget them."""
        for found in self.index.of_sandbox(sandbox_id):
            self.index.remove(found.id)

    def restoring(self, req: CreateRequest, project: str, kind: str) -> tuple[CreateRequest, dict[str, Any]]:
        """A create naming a checkpoint as it is made (the checkpoint's image and disk size), and its lineage."""
        assert req.checkpoint is not None
        found = self.index.get(req.checkpoint, frozenset({project}))
        if req.image not in (CreateRequest.image, found.image):
            raise Invalid(f"'image' {req.image!r} differs from checkpoint {found.id}'s ({found.image!r}): a sandbox "
                          "made from a checkpoint has its image; leave 'image' out")
        origin = LineageModel(parent=found.sandbox_id, step=found.step, checkpoint=found.id, kind=kind)
        # On the request too, where a lineage given on create lives (the viewer's tree reads one place).
        return dataclasses.replace(req, image=found.image, disk_mb=found.disk_mb, lineage=origin), dict(vars(origin))

    async def fork(self, record: SandboxRecord, count: int, metadata: Metadata | None) -> list[SandboxRecord]:
        """``count`` new sandboxes, each with the files ``record`` has now (one checkpoint, kept with it)."""
        made = await self.take(record)
        req = dataclasses.replace(record.request, checkpoint=made.id, request_id=None, pool=None, wait=True,
                                  metadata=metadata if metadata is not None else record.request.metadata)
        results = await asyncio.gather(*(self._service.create(req, project=record.project, kind="fork")
                                         for _ in range(count)), return_exceptions=True)
        children = [r for r in results if isinstance(r, SandboxRecord)]
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:  # all or nothing: a caller never has to find and delete half a fork
            await asyncio.gather(*(self._service.delete(c.id, reason="its fork failed") for c in children),
                                 return_exceptions=True)
            raise failed[0]
        return children
