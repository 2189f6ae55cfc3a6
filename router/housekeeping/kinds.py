"""What a project keeps in object storage, by kind, and the items each kind's objects make.

An :class:`Item` is what is kept or collected whole: one sandbox's trajectory (its record and its index entries
by-id/by-task/by-model/by-harness), one sandbox's pushed files or its truncated commands' full outputs (the
bytes and their artifact index entries by-sandbox/by-task/by-run), one rollout run's files. Every item has an
*owner* — the sandbox or the run it belongs to — that a live sandbox may still hold, and a time its retention
counts from (a trajectory's ``ended_at``, else when its newest object was written).

A kind names the key prefixes it reads in a project's part of the bucket and groups what is listed there into
items. The kinds are :data:`KINDS`. Checkpoints and screenshots do not exist yet; each will be one more kind
here: its prefix (say ``checkpoints/<sandbox_id>/``) and a grouping by sandbox, owned by that sandbox, so the
report, the collection and the stored-bytes figure take it up with no other change.

Keys are read as grove writes them (:mod:`artifacts.trajectory`, :mod:`artifacts.catalog`,
``router/api/runs.py``); an object under a kind's prefix in any other shape is no item and is left alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import unquote

from artifacts import catalog
from artifacts import trajectory as tj
from artifacts.store import ObjectInfo
from artifacts.trajectory import RUNS_PREFIX

SANDBOX = "sandbox"
RUN = "run"
"""Where a rollout run's files live (``runs/<run_id>/<name>``): the layout ``router/api/runs.py`` writes."""
_RECORD_SUFFIX = ".msgpack"


@dataclass(frozen=True)
class Owner:
    """What an item belongs to: a sandbox (by id) or a rollout run (by id, the sandboxes' ``labels.run_id``)."""

    kind: str
    """:data:`SANDBOX` or :data:`RUN`."""
    id: str


@dataclass
class Item:
    """What is kept or collected whole."""

    kind: str
    """The name of its kind (``trajectories``, ``artifacts``, ``outputs``, ``runs``)."""
    owner: Owner
    objects: list[ObjectInfo] = field(default_factory=list)
    """Every key of it, in the order they are removed: the entries a lookup starts from first (``by-id``,
    ``by-sandbox``), the other index entries next, the bytes last, so no reader finds an entry whose object
    is already gone."""
    count: int = 0
    """How many of what users count it holds: records, files."""
    time: float | None = None
    """When retention starts counting for it (seconds since the epoch); None: never collected."""

    @property
    def bytes(self) -> int:
        """What its objects take in the bucket."""
        return sum(info.size for info in self.objects)

    def newest(self) -> float | None:
        """When its newest object was written."""
        stamps = [info.last_modified for info in self.objects if info.last_modified is not None]
        return max(stamps) if stamps else None


class Listed(Protocol):
    """What a kind reads of one project's part of the bucket (:class:`router.housekeeping.scan.Listing`)."""

    def under(self, prefix: str) -> list[ObjectInfo]:
        """The objects under ``prefix``, in key order (listed once per scan)."""

    def entry(self, info: ObjectInfo) -> dict[str, Any]:
        """The fields of an index entry's JSON body a kind uses (read once per version of the entry)."""


class Kind(Protocol):
    """One kind of stored thing."""

    name: str
    """What the report and the collection call it."""
    doc: str
    """One line saying what it is, for the report's readers."""
    prefixes: tuple[str, ...]
    """The key prefixes (in a project's part of the bucket) its objects live under."""
    entries: tuple[str, ...]
    """The prefixes of the index entries whose bodies it reads (fetched in parallel before it groups)."""

    def items(self, listed: Listed) -> list[Item]:
        """Its items, grouped from what is listed under its prefixes."""


class Trajectories:
    """Trajectory records and their index entries, one item per sandbox; its time is the record's ``ended_at``."""

    name: str = "trajectories"
    doc: str = "trajectory records and their index entries (by-id, by-task, by-model, by-harness)"
    prefixes: tuple[str, ...] = (tj.TRAJECTORY_PREFIX, f"{tj.INDEX_PREFIX}by-")
    entries: tuple[str, ...] = (f"{tj.INDEX_PREFIX}by-id/",)

    def items(self, listed: Listed) -> list[Item]:
        found: dict[str, Item] = {}
        firsts: dict[str, list[ObjectInfo]] = {}
        records: dict[str, list[ObjectInfo]] = {}
        ended: dict[str, Any] = {}
        for info in listed.under(tj.TRAJECTORY_PREFIX):
            parts = info.key.split("/")  # trajectories/<day>/<task>/<sandbox_id>.msgpack
            if len(parts) == 4 and parts[3].endswith(_RECORD_SUFFIX):
                records.setdefault(unquote(parts[3].removesuffix(_RECORD_SUFFIX)), []).append(info)
        for info in listed.under(f"{tj.INDEX_PREFIX}by-"):
            parts = info.key.split("/")  # index/by-id/<sandbox_id>, index/by-<field>/<value>/<sandbox_id>
            if len(parts) == 3 and parts[1] == "by-id":
                sid = unquote(parts[2])
                firsts.setdefault(sid, []).append(info)
                ended[sid] = listed.entry(info).get("ended_at")
            elif len(parts) == 4 and parts[1] in tj.INDEXES:
                _item(found, self.name, unquote(parts[3])).objects.append(info)
        for sid, infos in firsts.items():
            item = _item(found, self.name, sid)
            item.objects[:0] = infos
        for sid, infos in records.items():
            item = _item(found, self.name, sid)
            item.objects.extend(infos)
            item.count = len(infos)
        for sid, item in found.items():
            when = ended.get(sid)
            item.time = float(when) if isinstance(when, int | float) and not isinstance(when, bool) else item.newest()
        return list(found.values())


class Artifacts:
    """Stored artifacts of some index kinds and their index entries, one item per sandbox."""

    prefixes: tuple[str, ...] = (catalog.ARTIFACT_PREFIX, catalog.INDEX_PREFIX)
    entries: tuple[str, ...] = (f"{catalog.INDEX_PREFIX}by-sandbox/",)

    def __init__(self, name: str, doc: str, entry_kinds: Iterable[str], *, unindexed: bool = False) -> None:
        self.name = name
        self.doc = doc
        self._kinds = frozenset(entry_kinds)
        self._unindexed = unindexed
        """Whether bytes with no index entry (an indexing that failed half-way) count as this kind's."""

    def items(self, listed: Listed) -> list[Item]:
        by_tail: dict[str, str] = {}  # "<sandbox>/<path>" of an index key (two segments) → the artifact's kind
        indexed = listed.under(catalog.INDEX_PREFIX)
        for info in indexed:
            parts = info.key.split("/")  # index/artifacts/by-sandbox/<sandbox_id>/<path>
            if len(parts) == 5 and parts[2] == "by-sandbox":
                by_tail["/".join(parts[3:])] = str(listed.entry(info).get("kind") or "file")
        found: dict[str, Item] = {}
        rest: list[tuple[str, ObjectInfo]] = []
        for info in indexed:
            parts = info.key.split("/")  # ... by-task/<task>/<sandbox_id>/<path>, by-run/<run>/<sandbox_id>/<path>
            sandbox_entry = len(parts) == 5 and parts[2] == "by-sandbox"
            if not sandbox_entry and not (len(parts) == 6 and parts[2] in ("by-task", "by-run")):
                continue
            kind = by_tail.get("/".join(parts[-2:]))
            if kind in self._kinds or (kind is None and self._unindexed):
                if sandbox_entry:
                    _item(found, self.name, unquote(parts[-2])).objects.append(info)
                else:
                    rest.append((unquote(parts[-2]), info))
        for sid, info in rest:
            _item(found, self.name, sid).objects.append(info)
        for info in listed.under(catalog.ARTIFACT_PREFIX):
            parts = info.key.split("/", 2)  # artifacts/<sandbox_id>/<path, '/' kept>
            if len(parts) != 3 or not parts[1]:
                continue
            kind = by_tail.get(_tail(parts[1], parts[2]))
            if kind in self._kinds or (kind is None and self._unindexed):
                item = _item(found, self.name, parts[1])
                item.objects.append(info)
                item.count += 1
        for item in found.values():
            item.time = item.newest()
        return list(found.values())


class Runs:
    """A rollout run's files (results, summaries, reports, plots), one item per run."""

    name: str = "runs"
    doc: str = "rollout runs' files (runs/<run_id>/<name>)"
    prefixes: tuple[str, ...] = (RUNS_PREFIX,)
    entries: tuple[str, ...] = ()

    def items(self, listed: Listed) -> list[Item]:
        found: dict[str, Item] = {}
        for info in listed.under(RUNS_PREFIX):
            parts = info.key.split("/")
            if len(parts) == 3 and parts[1] and parts[2]:
                item = found.setdefault(parts[1], Item(self.name, Owner(RUN, parts[1])))
                item.objects.append(info)
                item.count += 1
        for item in found.values():
            item.time = item.newest()
        return list(found.values())


KINDS: tuple[Kind, ...] = (
    Trajectories(),
    Artifacts("artifacts", "files pushed with POST /v1/sandboxes/{id}/artifacts, and their index entries",
              ("file",), unindexed=True),
    Artifacts("outputs", "truncated commands' full outputs (stdout, stderr), and their index entries",
              ("stdout", "stderr")),
    Runs(),
)
"""Every kind, in the order reports list them."""


def _tail(sandbox_id: str, quoted_path: str) -> str:
    """The last two segments of an artifact's index keys, from its object key's parts (:mod:`artifacts.catalog`:
    the path is absolute and normalized, quoted with '/' kept in the object key, as one segment in the index)."""
    return f"{tj.segment(sandbox_id)}/{tj.segment('/' + unquote(quoted_path))}"


def _item(found: dict[str, Item], kind: str, sandbox_id: str) -> Item:
    item = found.get(sandbox_id)
    if item is None:
        item = found[sandbox_id] = Item(kind, Owner(SANDBOX, sandbox_id))
    return item
