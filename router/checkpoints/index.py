"""The router's index of checkpoints: one JSON file each under ``<state>/checkpoints``, all held in memory."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grove.core.errors import NotFound


@dataclass(frozen=True)
class CheckpointRecord:
    """One checkpoint, as the API shows it."""

    id: str
    """Its id (``ck-`` and 16 hex digits)."""
    sandbox_id: str
    """The sandbox it was taken of."""
    project: str
    """That sandbox's project (only its callers see the checkpoint)."""
    step: int
    """How many steps the sandbox's trajectory held when it was taken: ``steps[:step]`` made this state."""
    created_at: float
    """When it was taken (Unix time)."""
    bytes: int
    """What it holds, shared blocks counted in full; what the project's ``disk_mb`` quota counts."""
    frozen_ms: float
    """How long the sandbox's processes were frozen for it."""
    copy_on_write: bool
    """Whether it shares blocks with its sandbox (a reflink), or is a full copy."""
    image: str
    """The image the sandbox was made from (a sandbox made from the checkpoint has it too)."""
    disk_mb: int
    """The sandbox's disk quota (a sandbox made from the checkpoint has it too)."""

    def public(self) -> dict[str, Any]:
        """The API's view: every field."""
        return dataclasses.asdict(self)


def unknown(checkpoint_id: str) -> NotFound:
    """What every call answers for a checkpoint that is not the caller's: one never taken, one deleted (also with
    its sandbox) and another project's alike."""
    return NotFound(f"no checkpoint {checkpoint_id!r} (list a sandbox's with GET /v1/sandboxes/{{id}}/checkpoints); "
                    "deleting a sandbox deletes its checkpoints")


class CheckpointIndex:
    """Checkpoint records by id, persisted one file each (written before the API answers)."""

    def __init__(self, state_dir: Path) -> None:
        self._dir = state_dir / "checkpoints"
        self._dir.mkdir(parents=True, exist_ok=True)
        self._all: dict[str, CheckpointRecord] = {}
        for path in self._dir.glob("ck-*.json"):
            with contextlib.suppress(OSError, ValueError, TypeError):
                record = CheckpointRecord(**json.loads(path.read_text(encoding="utf-8")))
                self._all[record.id] = record

    def add(self, record: CheckpointRecord) -> None:
        """Keep a new checkpoint's record."""
        tmp = self._dir / f".{record.id}.tmp"
        tmp.write_text(json.dumps(record.public()), encoding="utf-8")
        os.replace(tmp, self._dir / f"{record.id}.json")
        self._all[record.id] = record

    def get(self, checkpoint_id: str, projects: frozenset[str] | None) -> CheckpointRecord:
        """A checkpoint of one of ``projects`` (None: any); another project's is unknown, as one never taken."""
        record = self._all.get(checkpoint_id)
        if record is None or (projects is not None and record.project not in projects):
            raise unknown(checkpoint_id)
        return record

    def of_sandbox(self, sandbox_id: str) -> list[CheckpointRecord]:
        """A sandbox's checkpoints, oldest first."""
        return sorted((r for r in self._all.values() if r.sandbox_id == sandbox_id), key=lambda r: r.created_at)

    def held_mb(self, project: str) -> float:
        """What a project's checkpoints hold, in MiB (counted against its ``disk_mb`` quota)."""
        return sum(r.bytes for r in self._all.values() if r.project == project) / (1 << 20)

    def remove(self, checkpoint_id: str) -> None:
        """Forget a checkpoint (its files are the backend's to delete)."""
        self._all.pop(checkpoint_id, None)
        (self._dir / f"{checkpoint_id}.json").unlink(missing_ok=True)
