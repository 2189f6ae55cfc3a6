"""Per-sandbox trajectory journals: every step appended to a file as it happens, so nothing is lost.

A journal is a stream of msgpack objects in ``<state>/journals/<id>.msgpack``: first the sandbox's
metadata (``{"sandbox": {...}}``), then one object per step, then possibly ``{"outcome": {...}}``,
``{"infra_error": {...}}`` (an environment fault, see :func:`_with_infra`) and ``{"ended": {...}}``.
Appending costs one small write — no fsync — on the exec path; a router crash loses at most what the
kernel had not written yet, and a restarted router continues the same file. When the sandbox ends,
:meth:`Journal.record` assembles the trajectory record that goes to S3.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import msgpack

from grove.errors import NotFound

RECORD_VERSION = 1


class Journal:
    """The journals of one router."""

    def __init__(self, state_dir: Path) -> None:
        self.dir = state_dir / "journals"
        self.dir.mkdir(parents=True, exist_ok=True)

    def _path(self, sandbox_id: str) -> Path:
        return self.dir / f"{sandbox_id}.msgpack"

    def start(self, sandbox_id: str, sandbox: dict[str, Any]) -> None:
        """Begin a sandbox's journal with its metadata (replacing any left by an id collision)."""
        self._write(sandbox_id, {"sandbox": sandbox}, mode=os.O_TRUNC)

    def append(self, sandbox_id: str, entry: dict[str, Any]) -> None:
        """Add one entry: a step, ``{"sandbox_update": {...}}``, ``{"outcome": ...}`` or ``{"ended": ...}``."""
        # A missing journal means the record was already stored (a late background step): nothing to add to.
        with contextlib.suppress(FileNotFoundError):
            self._write(sandbox_id, entry, mode=os.O_APPEND)

    def _write(self, sandbox_id: str, entry: dict[str, Any], *, mode: int) -> None:
        data = msgpack.packb(entry, use_bin_type=True, default=_fallback)
        create = os.O_CREAT if mode == os.O_TRUNC else 0  # only start() makes a journal
        fd = os.open(self._path(sandbox_id), os.O_WRONLY | create | mode | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)

    def exists(self, sandbox_id: str) -> bool:
        """Whether a journal is there."""
        return self._path(sandbox_id).exists()

    def record(self, sandbox_id: str) -> dict[str, Any]:
        """The trajectory record so far: ``{"version", "sandbox", "steps", "outcome"}``."""
        try:
            raw = self._path(sandbox_id).read_bytes()
        except FileNotFoundError as exc:
            raise NotFound(f"no trajectory journal for sandbox {sandbox_id}") from exc
        sandbox: dict[str, Any] = {}
        steps: list[dict[str, Any]] = []
        outcome: dict[str, Any] | None = None
        infra: list[dict[str, Any]] = []
        unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
        unpacker.feed(raw)
        try:
            for entry in unpacker:
                if "sandbox" in entry:
                    sandbox = dict(entry["sandbox"])
                elif "sandbox_update" in entry:
                    sandbox.update(entry["sandbox_update"])
                elif "outcome" in entry:
                    outcome = entry["outcome"]
                elif "infra_error" in entry:
                    infra.append(entry["infra_error"])
                elif "ended" in entry:
                    sandbox.update(entry["ended"])
                else:
                    steps.append(entry)
        except (ValueError, msgpack.exceptions.ExtraData):
            pass  # a torn last write after a crash: keep everything before it
        return {"version": RECORD_VERSION, "sandbox": sandbox, "steps": steps, "outcome": _with_infra(outcome, infra)}

    def remove(self, sandbox_id: str) -> None:
        """Drop a journal once its record is safely stored (in S3 or the spool)."""
        with contextlib.suppress(FileNotFoundError):
            self._path(sandbox_id).unlink()

    def ids(self) -> set[str]:
        """Sandboxes that have a journal."""
        return {p.stem for p in self.dir.glob("sb-*.msgpack")}


def _with_infra(outcome: dict[str, Any] | None, infra: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The outcome a trainer can trust: with no task result, an environment fault makes it ``infra_error``;
    with one, the faults ride along in ``infra_errors`` so the result can be weighed (or dropped)."""
    if not infra:
        return outcome
    if outcome is None:
        outcome = {"result": "infra_error", "reward": None, "reason": infra[0].get("reason")}
    return {**outcome, "infra_errors": infra}


def _fallback(value: Any) -> Any:
    if isinstance(value, tuple | set | frozenset):
        return list(value)
    return str(value)
