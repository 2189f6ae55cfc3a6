"""The router's records of its sandboxes: in memory for the hot path, on disk for restarts."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import re
import time
from collections import OrderedDict
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grove.core import sandbox_ids
from grove.core.errors import Conflict, GroveError, NotFound
from grove.core.sandbox_ids import DEFAULT_SHARD, ID_PATTERN, ID_RE
from grove.statedir import StateDir
from router.backends.base import CheckpointSource, Endpoint, SandboxSpec
from router.models import CreateRequest, LineageModel, Metadata, NetworkModel
from router.projects.model import DEFAULT, Usage, request_key
from router.records import log as recordlog
from router.records.cost import Spent
from router.records.files import RecordFiles

SAFE_ID_RE = re.compile(ID_PATTERN)
"""What any id in a route or a file name must look like (``fullmatch``): the router makes ``sb-``, its shard's
name and ``-`` (none for the ``default`` shard) and 16 hex digits (:mod:`grove.core.sandbox_ids`), records from
elsewhere (imported, test samples) may carry other letters; none can hold a path."""
_TOMBSTONES = 10_000


def new_id(shard: str = DEFAULT_SHARD) -> str:
    """A fresh sandbox id of ``shard`` (:func:`grove.core.sandbox_ids.new_id`)."""
    return sandbox_ids.new_id(shard)


@dataclass
class SandboxRecord:
    """One sandbox as the router knows it."""

    id: str
    request: CreateRequest
    token: str
    created_at: float
    status: str = "pending"
    image_digest: str | None = None
    handle: dict[str, Any] = field(default_factory=dict)
    endpoint_url: str | None = None
    ready_at: float | None = None
    ended_at: float | None = None
    end_reason: str | None = None
    error: str | None = None
    pool: str | None = None
    """The warm pool this sandbox waits in, unclaimed (None: a user's sandbox). Hidden from the API."""
    project: str = DEFAULT
    """The project it belongs to (its creator's key's); records from before projects are the default's."""
    spent: Spent = field(default_factory=Spent)
    """What it used over its runs so far (router/records/cost.py); its cost once it is deleted."""
    # Not persisted: after a restart every sandbox counts as just used.
    last_activity: float = field(default_factory=time.time)
    inflight: int = 0
    callers: list[asyncio.BaseTransport] = field(default_factory=list)
    """The client connections of the calls in flight that came with one (``SandboxService.calling``)."""
    start_error: GroveError | None = None
    """Why its start failed, as raised (an ``Invalid`` is the create's own fault: a 422, not a 503)."""
    lineage: dict[str, Any] | None = None
    """Where its files came from, if from a checkpoint: ``{"parent", "step", "checkpoint", "kind"}`` (``kind``:
    ``fork`` or ``restore``); shown by the API and recorded in its trajectory."""
    image_config: dict[str, Any] | None = None
    """What of its image's recorded config it started with (``{"digest", "env", "workdir", "user"}``,
    router/lifecycle/image_config.py), or None: its image records none (or its backend keeps no configs)."""
    own_fault: str | None = None
    """Why the executor was just lost through the sandbox's own doing (set by ``SandboxService.lost``, taken by
    the call that lost it), so the fault is recorded as the sandbox's, not as an infra error."""

    def spec(self) -> SandboxSpec:
        """What the backend needs to (re)start this sandbox."""
        req = self.request
        return SandboxSpec(
            id=self.id,
            image=req.image,
            cpu=req.cpu,
            memory_mb=req.memory_mb,
            pids_max=req.pids_max,
            env=dict(req.env),
            workdir=req.workdir,
            network=req.network,
            token=self.token,
            labels={k: v for k, v in vars(req.metadata).items() if isinstance(v, str)},
            idle_timeout_s=req.idle_timeout_s,
            ttl_s=req.ttl_s,
            disk_mb=req.disk_mb,
            desktop=req.desktop,
            checkpoint=CheckpointSource(self.lineage["parent"], self.lineage["checkpoint"]) if self.lineage else None,
            group=f"{self.project}/{req.network.group}" if req.network.group else None,
        )

    def waited_on(self) -> bool:
        """Whether a call in flight still has someone waiting for its answer. A client that died mid-call (its
        process killed) closed its connection: its call, running on in the sandbox, keeps the sandbox from
        nothing, its heartbeat timeout included."""
        return self.inflight > sum(1 for caller in self.callers if caller.is_closing())

    def endpoint(self) -> Endpoint | None:
        """Where the executor answers, if it runs."""
        return Endpoint(self.endpoint_url, self.token) if self.endpoint_url else None

    def public(self, summary: dict[str, Any] | None = None) -> dict[str, Any]:
        """The sandbox as the API shows it (never its token); ``summary``: its request's, if already made
        (a batch's alike claims share one)."""
        return {
            "id": self.id,
            "project": self.project,
            "status": self.status,
            "image_digest": self.image_digest,
            "created_at": self.created_at,
            "ready_at": self.ready_at,
            "ended_at": self.ended_at,
            "end_reason": self.end_reason,
            "error": self.error,
            **(summary if summary is not None else self.request.summary()),
            **({"lineage": self.lineage} if self.lineage else {}),
            **self._private_address(summary),
            **({"image_config": self.image_config} if self.image_config else {}),
            "last_activity": self.last_activity,
            # Known once it ended: a live sandbox's current run is read only when it stops.
            **({"cost": self.cost()} if self.status == "deleted" else {}),
        }

    def _private_address(self, summary: dict[str, Any] | None) -> dict[str, Any]:
        """``network`` with the sandbox's address in its private group, once it has one (else nothing)."""
        address = self.handle.get("private_address")
        if not isinstance(address, str):
            return {}
        network = (summary if summary is not None else self.request.summary())["network"]
        return {"network": {**network, "address": address}}

    def cost(self) -> dict[str, Any]:
        """What it cost over the runs that ended (every run, once it is deleted): the trajectory's ``cost``."""
        return self.spent.cost(self.request.memory_mb).to_dict()

    def matches(self, labels: dict[str, str]) -> bool:
        """Whether every ``k=v`` filter matches a metadata field or label."""
        meta = dict(vars(self.request.metadata))
        flat = {**meta.pop("labels"), **{k: v for k, v in meta.items() if v is not None}}
        return all(flat.get(k) == v for k, v in labels.items())

    def to_disk(self) -> dict[str, Any]:
        """What survives a restart."""
        # Field by field rather than dataclasses.asdict(self), which deep-copies every value: this runs on
        # every state change, on the event loop. Only the request nests dataclasses.
        data = {f.name: getattr(self, f.name) for f in _DISK_FIELDS}
        data["request"] = self.request.to_dict()
        data["spent"] = self.spent.to_disk()
        return data

    @classmethod
    def from_disk(cls, data: dict[str, Any]) -> SandboxRecord:
        """Rebuild a record written by :meth:`to_disk`."""
        req = dict(data.pop("request"))
        net = req["network"]
        req["network"] = NetworkModel(net["egress"], tuple(net["allow"]), net.get("group"))
        req["metadata"] = Metadata(**req["metadata"])
        req["lineage"] = LineageModel(**lineage) if (lineage := req.get("lineage")) else None
        spent = Spent.from_disk(data.pop("spent", None))
        return cls(request=CreateRequest(**req), spent=spent, **data)


_ENCODER = json.JSONEncoder(check_circular=False)
"""A record is a tree of plain values: no cycle to look for (the check costs a third of the encoding)."""


def _encode(record: SandboxRecord) -> bytes:
    return _ENCODER.encode(record.to_disk()).encode()  # one C-encoder call, one write (json.dump writes per token)


_MEMORY_ONLY = ("last_activity", "inflight", "callers", "start_error")
_DISK_FIELDS = tuple(f for f in dataclasses.fields(SandboxRecord) if f.name not in _MEMORY_ONLY)
class Registry:
    """id → record, persisted one JSON file per sandbox under ``<state>/records``."""

    def __init__(self, state_dir: Path, shard: str = DEFAULT_SHARD) -> None:
        self.shard = shard
        """The router's shard: the one every id it makes names."""
        self._dir = StateDir(state_dir).records
        self._dir.mkdir(parents=True, exist_ok=True)
        self._files = RecordFiles(self._dir)  # replays the log a crash left: the files as last written
        self._records: dict[str, SandboxRecord] = {}
        self._ended: OrderedDict[str, SandboxRecord] = OrderedDict()
        self._pooled: dict[str, dict[str, SandboxRecord]] = {}
        """Per pool, its unclaimed members (every claim looks there: no scan of all records)."""
        self._usage: dict[str, Usage] = {}
        """Per project, what its live records hold (kept as records come and go: a create asks at once)."""
        self.by_request_id: dict[str, str] = {}
        """Sandbox ids by :func:`~router.projects.model.request_key` (a project's own request ids)."""

    def load(self) -> list[SandboxRecord]:
        """Read every record left by an earlier router (unreadable ones are set aside, never deleted)."""
        loaded = []
        for sandbox_id, raw in sorted(self._files.current().items()):
            try:
                record = SandboxRecord.from_disk(json.loads(raw))
            except (ValueError, KeyError, TypeError) as exc:
                path = self._dir / f"{sandbox_id}.json"
                with contextlib.suppress(FileNotFoundError):
                    path.rename(path.with_suffix(f".corrupt-{int(time.time())}"))
                print(f"grove: set aside unreadable record {path.name}: {exc}")
                continue
            self.add(record)
            loaded.append(record)
        return loaded

    def add(self, record: SandboxRecord) -> None:
        """Track a record (not yet written)."""
        if record.id not in self._records:
            self._count(record, 1)
        self._records[record.id] = record
        if record.pool is not None:
            self._pooled.setdefault(record.pool, {})[record.id] = record
        if record.request.request_id:
            self.by_request_id[request_key(record.project, record.request.request_id)] = record.id

    def save(self, record: SandboxRecord) -> None:
        """Write the record atomically (temp file, fsync, rename), on the calling thread."""
        self._files.write(record.id, _encode(record))

    async def store(self, record: SandboxRecord) -> None:
        """:meth:`save`, with the wait for the disk in a worker thread (the event loop serves other calls
        meanwhile); the record as it is now is what lands, after any earlier write of it."""
        await self._files.write_async(record.id, _encode(record))

    def queue_group(self, records: list[SandboxRecord], shared: CreateRequest) -> Future[None]:
        """:meth:`store` for claimed pool members whose requests are ``shared`` but for their request ids (a
        batch of claims, not empty), as one group without the wait: queued now, the future settled once all are
        durable (in the log), or none acknowledged. Logged as one patch of the members' records
        (:func:`router.records.log.patch_of`): the request once, then each claim's own fields, ~130 bytes a claim
        where its whole record is ~1 KB (a batch's 500 records took ~3.5 ms to encode and ~2.5 ms more to frame
        and write, ahead of its answer). The whole records follow with each claim's hand-over
        (:meth:`store`)."""
        request = shared.to_dict()
        del request["request_id"]
        first = records[0]
        # What a claim sets of its member (router.lifecycle.claims.Claims.begin_group): the request and pool, and a
        # group's creation time and state alike in all (the same instant); its own token and request id.
        alike = {"request": request, "pool": None, "created_at": first.created_at, "status": first.status}
        if any(r.created_at != first.created_at or r.status != first.status for r in records):
            raise ValueError("a group of claims is created at one time, in one state")
        ids = [r.id for r in records]
        payload = recordlog.patch_of(alike, ids, [("token", [r.token for r in records]),
                                                  (("request", "request_id"), [r.request.request_id for r in records])])
        return self._files.queue_patch(ids, payload)

    async def close(self) -> None:
        """Wait for the writes in flight."""
        await self._files.drain()

    def unlink(self, sandbox_id: str) -> None:
        """Remove a record's file (which needs no free space); the in-memory record stays as it is."""
        self._files.unlink(sandbox_id)

    def drop(self, record: SandboxRecord) -> None:
        """Stop tracking a record that never became a sandbox (no tombstone: no one ever saw its id)."""
        if self._records.pop(record.id, None) is not None:
            self._count(record, -1)
        self._unpool(record.pool, record)

    def claimed_from(self, pool: str, record: SandboxRecord) -> None:
        """A member of ``pool`` was claimed (its ``pool`` already cleared): it is a users' sandbox now."""
        self._unpool(pool, record)

    def _unpool(self, pool: str | None, record: SandboxRecord) -> None:
        if pool is not None and (members := self._pooled.get(pool)) is not None:
            members.pop(record.id, None)
            if not members:
                del self._pooled[pool]

    def forget(self, record: SandboxRecord) -> None:
        """Drop a deleted sandbox; keep a tombstone so its id answers ``deleted`` for a while."""
        if self._records.pop(record.id, None) is not None:
            self._count(record, -1)
        self._unpool(record.pool, record)
        if record.request.request_id:
            self.by_request_id.pop(request_key(record.project, record.request.request_id), None)
        self._files.discard(record.id)
        self._ended[record.id] = record
        while len(self._ended) > _TOMBSTONES:
            self._ended.popitem(last=False)

    def new_id(self) -> str:
        """A fresh id of this router's shard."""
        return new_id(self.shard)

    def get(self, sandbox_id: str, *, pooled: bool = False) -> SandboxRecord:
        """A live record; ``NotFound`` for unknown or malformed ids (and unclaimed pool members, unless
        ``pooled``: no one reaches a pooled sandbox before its claim), ``Conflict`` for deleted ones."""
        record = self._records.get(sandbox_id)
        if record is not None and (pooled or record.pool is None):
            return record
        if sandbox_id in self._ended:
            ended = self._ended[sandbox_id]
            raise Conflict(f"sandbox {sandbox_id} was deleted ({ended.end_reason or 'by request'})")
        if not ID_RE.match(sandbox_id):
            raise NotFound(f"{sandbox_id!r} is not a sandbox id (they look like sb-0123456789abcdef)")
        raise NotFound(f"no sandbox {sandbox_id}")

    def lookup(self, sandbox_id: str, *, pooled: bool = False) -> SandboxRecord | None:
        """A live or ended record (an unclaimed pool member only if ``pooled``), or None."""
        record = self._records.get(sandbox_id) or self._ended.get(sandbox_id)
        return record if record is None or pooled or record.pool is None else None

    def count(self) -> int:
        """How many sandboxes are not deleted, pool members included."""
        return len(self._records)

    def usage(self, project: str) -> Usage:
        """What ``project``'s live sandboxes (pool members included) hold now (a copy)."""
        found = self._usage.get(project)
        return dataclasses.replace(found) if found is not None else Usage()

    def _count(self, record: SandboxRecord, sign: int) -> None:
        req = record.request
        self._usage.setdefault(record.project, Usage()).add(req.cpu, req.memory_mb, req.disk_mb, sign)

    def live(self) -> list[SandboxRecord]:
        """Every sandbox not deleted, pool members included (they count toward the limits)."""
        return list(self._records.values())

    def claimed(self) -> list[SandboxRecord]:
        """Every users' sandbox not deleted (not the unclaimed pool members)."""
        return [r for r in self._records.values() if r.pool is None]

    def pooled(self, pool: str) -> list[SandboxRecord]:
        """The unclaimed members of a pool, oldest first."""
        return list(self._pooled.get(pool, {}).values())

    def pool_count(self, pool: str) -> int:
        """How many unclaimed members a pool has."""
        return len(self._pooled.get(pool, ()))

    def members(self, pool: str) -> Iterable[SandboxRecord]:
        """The unclaimed members of a pool, oldest first, without a copy (not to be changed while read)."""
        return self._pooled.get(pool, {}).values()

    def known_ids(self) -> set[str]:
        """Ids of live sandboxes."""
        return set(self._records)
