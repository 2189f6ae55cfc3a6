"""The one protocol every backend implements; the router never asks which backend it has."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from router.models import CreateRequest, DesktopModel
from router.models import NetworkModel as Network

__all__ = ["Backend", "CheckpointSource", "CheckpointTaken", "Endpoint", "Network", "RunUsage", "SandboxSpec",
           "Started"]


@dataclass(frozen=True)
class CheckpointSource:
    """A checkpoint a new sandbox starts from."""

    sandbox_id: str
    """The sandbox it was taken of."""
    checkpoint_id: str
    """Its id."""


@dataclass(frozen=True)
class CheckpointTaken:
    """What a backend reports of a checkpoint it took."""

    bytes: int
    """Bytes the checkpoint holds (blocks it shares with the sandbox or other checkpoints counted in full)."""
    frozen_s: float
    """How long the sandbox's processes were frozen for it (0 for a sandbox scaled to zero)."""
    reflinked: bool
    """Whether it is a copy-on-write clone (else a full copy)."""


@dataclass(frozen=True)
class SandboxSpec:
    """Everything a backend needs to make a sandbox; fixed for the sandbox's life."""

    id: str
    """The sandbox id (also its hostname)."""
    image: str
    """Image name as the user gave it."""
    cpu: float
    """CPU limit in cores."""
    memory_mb: int
    """Memory limit in MiB."""
    pids_max: int
    """Most processes (and threads) the sandbox's commands may have."""
    env: dict[str, str]
    """The sandbox's environment for every command."""
    workdir: str
    """Default working directory of commands and relative paths."""
    network: Network
    """Egress policy."""
    token: str
    """The per-sandbox executor token (the router's API key never enters a sandbox)."""
    labels: dict[str, str] = field(default_factory=dict)
    """Metadata labels, for backends that can attach them (Kubernetes)."""
    # The defaults are the API's own (CreateRequest), never declared a second time.
    idle_timeout_s: float = CreateRequest.idle_timeout_s
    """Idle time before scale-to-zero, for backends whose platform scales on its own (Knative)."""
    ttl_s: float = CreateRequest.ttl_s
    """The sandbox's lifetime, for credentials that must outlive it (presigned snapshot URLs)."""
    disk_mb: int = CreateRequest.disk_mb
    """Disk quota in MiB: the most its writable layer (what it changed of the image) may hold."""
    desktop: DesktopModel | None = None
    """Its screen's settings (the executor's ``DesktopSettings``); None: the defaults, started on demand."""
    checkpoint: CheckpointSource | None = None
    """The checkpoint whose files it starts with (None: its image's files)."""
    group: str | None = None
    """Its private network (``network.group``) qualified by its project (``project/group``), or None."""


@dataclass(frozen=True)
class Endpoint:
    """Where the executor of a running sandbox answers."""

    url: str
    """``unix:/path/to/socket`` or ``http://host:port``."""
    token: str
    """Bearer token the executor expects."""


@dataclass(frozen=True)
class Started:
    """A sandbox that runs: its endpoint and whatever the backend needs to find it again after a restart."""

    endpoint: Endpoint
    image_digest: str
    handle: dict[str, Any]
    """Opaque, JSON-serialisable; stored in the router's record and handed back to the backend."""


@dataclass(frozen=True)
class RunUsage:
    """What a sandbox used in its current run (since the start its handle describes), as far as its backend can
    read it; None where it cannot."""

    cpu_s: float | None = None
    """CPU-seconds its processes used (user and system), its executor's own included."""
    memory_peak_mb: float | None = None
    """The most memory (MiB) it held at once: its processes and the page cache of its files."""
    disk_bytes: int | None = None
    """What its writable layer holds now (None once its processes are gone, where only they could tell)."""


class SnapshotUploads(Protocol):
    """The broker of executors' snapshot uploads (``POST /v1/sandboxes/{id}/snapshot-upload``)."""

    def check(self, sandbox_id: str, authorization: str | None) -> int:
        """The most bytes the bearer may upload for ``sandbox_id``; ``Unauthorized`` if the token is not its."""

    async def handle(self, sandbox_id: str, max_bytes: int, body: Any) -> dict[str, Any]:
        """One operation of the executor's upload (``start``, ``parts``, ``complete``, ``abort``)."""


class Backend(Protocol):
    """Makes, stops, wakes and deletes sandboxes. Every method may raise a :class:`grove.core.errors.GroveError`."""

    name: str
    exit_grace_s: float
    """How long a sandbox whose executor just vanished may still look running (its process exiting):
    a call that lost its executor looks this long before concluding the executor is alive."""
    endpoints_move: bool
    """Whether an endpoint that refuses connections can mean the sandbox merely moved (a Knative pod that
    scaled to zero before the router's watch said so), not that it failed: then a call that reached nothing
    is sent once more once the sandbox went idle, and wakes it."""
    executor_reaches_storage: bool
    """Whether the object store's address means the same server inside a sandbox as in the router. Not on
    the local backend: there a presigned URL names 127.0.0.1, which inside is the sandbox's own loopback,
    where its processes can listen and answer the executor's upload (so the router relays instead)."""

    @property
    def snapshot_uploads(self) -> SnapshotUploads | None:
        """The broker of the executors' snapshot uploads, or None on a backend that keeps no snapshots
        (then no upload token is valid)."""

    def attach_storage(self, storage: Any) -> None:
        """Object storage (``artifacts.store.ObjectStore``) for a backend that keeps state there (Knative's
        workspace snapshots); called once, before :meth:`open`. A backend that keeps none ignores it."""
    start_slots: int
    """How many sandboxes it starts at once: the router shares these out fairly between projects
    (:mod:`router.lifecycle.fairness`), so a burst of one project's creates waits in its own line."""
    host_admission: bool
    """Whether sandboxes run on this host, so a create is admitted only while the host has the memory and disk
    for it (the local backend); a cluster's scheduler does that for its own nodes (Knative)."""
    warm_by_traffic: bool
    """Whether only traffic keeps a sandbox running (Knative's autoscaler sees requests, not the router's
    records): then a heartbeat is also sent to the executor, so "no API call and no heartbeat this long:
    scale to zero" holds on every backend."""

    async def open(self) -> None:
        """Prepare (images, runtime bundle, clients); called once before any other call."""

    async def close(self) -> None:
        """Release clients; sandboxes keep running (a restarted router re-adopts them)."""

    def check(self, spec: SandboxSpec) -> None:
        """Refuse (``Invalid``) a sandbox this backend cannot make as asked, before anything is made."""

    async def image_digest(self, image: str) -> str:
        """The content digest of an image (``NotFound`` naming the images there are)."""

    async def create(self, spec: SandboxSpec) -> Started:
        """Make a new sandbox and wait until its executor answers."""

    async def resume(self, spec: SandboxSpec, handle: dict[str, Any]) -> Started:
        """Start a sandbox scaled to zero again, with the files it had."""

    async def stop(self, sandbox_id: str, handle: dict[str, Any]) -> dict[str, Any]:
        """Scale to zero: its processes end, its files stay. Returns the new handle."""

    async def delete(self, sandbox_id: str, handle: dict[str, Any]) -> None:
        """Remove everything of the sandbox. Deleting what is already gone is not an error."""

    async def is_running(self, sandbox_id: str, handle: dict[str, Any]) -> bool:
        """Whether the sandbox's executor process still exists (for re-adoption and crash detection)."""

    async def usage(self, sandbox_id: str, handle: dict[str, Any]) -> RunUsage | None:
        """What the sandbox's current run used so far, read just before it is scaled to zero or deleted (the
        router keeps the sums across runs); None from a backend that can read nothing of it."""

    async def own_fault(self, sandbox_id: str, handle: dict[str, Any], *, rebase: bool = False) -> str | None:
        """Why the sandbox's executor was lost through the sandbox's own doing (its processes used all of
        its memory and the OOM killer took the executor or PID 1), or None if nothing says so. With
        ``rebase``: forget the faults so far (a command was OOM-killed and the executor lived on)."""

    claim_fixed: tuple[str, ...]
    """Create fields a warm-pool claim cannot change on this backend (a claim asking otherwise gets a
    fresh sandbox instead of a pool member)."""

    async def claim(self, spec: SandboxSpec, handle: dict[str, Any]) -> dict[str, str]:
        """Make a running pool member the sandbox ``spec`` describes, as far as the backend keeps it (labels,
        the token and env a restart starts it with); returns the environment its executor must get."""

    checkpoint_snapshots: bool
    """Whether a checkpoint of a running sandbox is its executor's snapshot of its workspace (``POST /v1/snapshot``,
    asked by the router first), which the backend then keeps (Knative); else the backend takes it alone."""

    async def checkpoint(self, sandbox_id: str, handle: dict[str, Any], checkpoint_id: str) -> CheckpointTaken:
        """Keep the sandbox's files as they are now as ``checkpoint_id``; a later create with
        ``SandboxSpec.checkpoint`` starts from them."""

    async def delete_checkpoint(self, sandbox_id: str, checkpoint_id: str) -> None:
        """Remove a checkpoint's files (already gone: not an error)."""

    async def collect_orphans(self, known_ids: set[str]) -> list[str]:
        """Delete whatever this backend finds that belongs to no known sandbox; return what was removed."""
