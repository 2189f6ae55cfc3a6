"""A project, its quotas, and the caller an API key stands for.

A key belongs to one project. A ``member`` key sees and touches only its project's sandboxes, pools,
trajectories, artifacts and runs: anything else answers 404, as if it did not exist, so ids of other
projects never leak. An ``admin`` key (an operator's) acts in its own project too, and may act in
any other by naming it (``X-Grove-Project``) or list across all (``X-Grove-Project: *``).

The project ``default`` is what a state dir had before projects existed: its objects keep their keys
in the bucket (no prefix), its pools their names, and the keys of that time are its admins.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from grove.core.errors import Invalid

DEFAULT = "default"
"""The project of everything made before projects, and of keys that name none."""
NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$")
ROLES = ("member", "admin")
ALL = "*"
"""An admin's ``X-Grove-Project`` for listings across every project."""
PROJECT_HEADER = "X-Grove-Project"


def check_name(name: str) -> str:
    """``name`` if it is a project name, else ``Invalid`` saying what one looks like."""
    if not NAME_RE.match(name):
        raise Invalid(f"project name {name!r}: use 1-40 lower-case letters, digits and '-' (not at either end)")
    return name


def object_prefix(project: str) -> str:
    """Where a project's objects live in the bucket: ``projects/<name>/``; the default project's at the top,
    where they were before projects existed (a state dir upgrades in place)."""
    return "" if project == DEFAULT else f"projects/{check_name(project)}/"


@dataclass(frozen=True)
class Caller:
    """Who is calling: the project its key belongs to, and whether it is an operator's."""

    project: str
    admin: bool = False
    key_id: str = ""
    """The key's fingerprint (never the key): what logs and audit entries name."""

    def may_see(self, project: str) -> bool:
        """Whether this caller may see (and touch) what belongs to ``project``."""
        return self.admin or project == self.project


SYSTEM = Caller(DEFAULT, admin=True, key_id="router")
"""The router itself (its reaper, its filler): every project's."""


@dataclass(frozen=True)
class Quotas:
    """What one project may hold at once; None: no limit (the default: a lone researcher's setup is
    limited by the router's own limits only)."""

    sandboxes: int | None = None
    """Live sandboxes, its warm pools' members included."""
    starting: int | None = None
    """Sandboxes starting at once (created and not yet ready)."""
    cpu: float | None = None
    """CPU cores reserved: the sum of its live sandboxes' ``cpu``."""
    memory_mb: int | None = None
    """Memory reserved: the sum of its live sandboxes' ``memory_mb``."""
    disk_mb: int | None = None
    """Disk reserved: the sum of its live sandboxes' ``disk_mb``."""
    stored_bytes: int | None = None
    """Bytes it keeps in object storage: trajectories, artifacts, full outputs, run files."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


QUOTA_FIELDS = tuple(f.name for f in dataclasses.fields(Quotas))


@dataclass(frozen=True)
class Project:
    """A project's definition (``<state>/projects/<name>.json``)."""

    name: str
    quotas: Quotas = dataclasses.field(default_factory=Quotas)
    retention_days: float | None = None
    """Stored trajectories, artifacts and run files older than this are collected (None: kept for ever)."""
    created_at: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "quotas": self.quotas.to_dict(), "retention_days": self.retention_days,
                "created_at": self.created_at}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Project:
        """Parse a definition, refusing anything malformed with the field named."""
        if not isinstance(data, dict):
            raise Invalid("a project definition is a JSON object")
        name = check_name(str(data.get("name", "")))
        raw = data.get("quotas") or {}
        if not isinstance(raw, dict):
            raise Invalid(f"project {name}: 'quotas' must be an object")
        unknown = set(raw) - set(QUOTA_FIELDS)
        if unknown:
            raise Invalid(f"project {name}: unknown quota(s) {', '.join(sorted(unknown))}; "
                          f"quotas are {', '.join(QUOTA_FIELDS)}")
        quotas: dict[str, Any] = {}
        for field_name in QUOTA_FIELDS:
            value = raw.get(field_name)
            if value is None:
                continue
            kind = float if field_name == "cpu" else int
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or \
                    (kind is int and value != int(value)):
                raise Invalid(f"project {name}: quota '{field_name}' must be a non-negative "
                              f"{'number' if kind is float else 'integer'} or null, got {value!r}")
            quotas[field_name] = kind(value)
        retention = data.get("retention_days")
        if retention is not None and (isinstance(retention, bool) or not isinstance(retention, (int, float))
                                      or retention <= 0):
            raise Invalid(f"project {name}: 'retention_days' must be a positive number or null, got {retention!r}")
        created = data.get("created_at") or 0.0
        return cls(name, Quotas(**quotas), None if retention is None else float(retention), float(created))


def request_key(project: str, request_id: str) -> str:
    """Where a create's ``request_id`` is looked up: in its project's own space, so two projects' retries never
    find each other's sandboxes (the default project's ids are as they always were). A NUL, the separator, is
    refused in any id: no project can spell another's key."""
    if "\x00" in request_id:
        raise Invalid("'request_id' may not contain a NUL character")
    return request_id if project == DEFAULT else f"{project}\x00{request_id}"


@dataclass
class Usage:
    """What a project holds now: its live sandboxes (warm-pool members included) and what they reserve."""

    sandboxes: int = 0
    cpu: float = 0.0
    memory_mb: int = 0
    disk_mb: int = 0

    def add(self, cpu: float, memory_mb: int, disk_mb: int, sign: int = 1) -> None:
        """Count one sandbox in (``sign`` 1) or out (-1)."""
        self.sandboxes += sign
        self.cpu += sign * cpu
        self.memory_mb += sign * memory_mb
        self.disk_mb += sign * disk_mb

    def to_dict(self) -> dict[str, Any]:
        return {"sandboxes": self.sandboxes, "cpu": round(self.cpu, 3), "memory_mb": self.memory_mb,
                "disk_mb": self.disk_mb}
