"""Per-sandbox trajectory journals: every step appended to a file as it happens, so nothing is lost.

A journal is a stream of msgpack objects in ``<state>/journals/<id>.msgpack``: first the sandbox's
metadata (``{"sandbox": {...}}``), then one object per step, then possibly ``{"outcome": {...}}``,
``{"infra_error": {...}}`` (an environment fault, see :func:`_with_infra`) and ``{"ended": {...}, "cost": {...}}``.
Appending costs one small write — no fsync — on the exec path; a router crash loses at most what the
kernel had not written yet, and a restarted router continues the same file. When the sandbox ends,
:meth:`Journal.record` assembles the trajectory record that goes to S3.

A full state disk never tears a journal or loses a step: a write that fails part-way is cut back to the
last whole entry, and the entries that did not fit are held in memory (and in :meth:`Journal.record`)
until a later append finds space again. The exec whose step it is has already answered by then, so
failing the call would not un-run it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import msgpack

from artifacts.trajectory import readable_steps
from grove.core.errors import NotFound
from grove.statedir import StateDir
from router.records.registry import SAFE_ID_RE
from router.records.statedisk import is_no_space

RECORD_VERSION = 1
log = logging.getLogger("grove.router")


class Journal:
    """The journals of one router."""

    def __init__(self, state_dir: Path) -> None:
        self.dir = StateDir(state_dir).journals
        self.dir.mkdir(parents=True, exist_ok=True)
        self._dir = str(self.dir)
        self._held: dict[str, list[bytes]] = {}
        """Packed entries of a journal that did not fit on the disk yet, in order."""
        self._deferred: dict[str, Callable[[], dict[str, Any]]] = {}
        """Journals begun whose header is not on file yet (:meth:`defer_start`): what makes it, by id. Changed
        under ``_begin_lock``, and an entry leaves only once its header is written: while it is empty, no
        header is being written and an append takes no lock."""
        self._begin_lock = threading.Lock()

    def _path(self, sandbox_id: str) -> Path:
        return Path(self._file(sandbox_id))

    def _file(self, sandbox_id: str) -> str:
        """The journal's path as a string: every exec's step and every claim opens one, and building a Path
        costs more than the write."""
        if not SAFE_ID_RE.fullmatch(sandbox_id):  # never a file name made of what a caller chose
            raise NotFound(f"{sandbox_id[:80]!r} is not a sandbox id")
        return f"{self._dir}/{sandbox_id}.msgpack"

    def start(self, sandbox_id: str, sandbox: dict[str, Any]) -> None:
        """Begin a sandbox's journal with its metadata (replacing any left by an id collision); raises on a
        full disk, so the sandbox is refused rather than started without a journal."""
        self._held.pop(sandbox_id, None)
        self._write(sandbox_id, _pack({"sandbox": sandbox}), mode=os.O_TRUNC)

    def defer_start(self, starts: Iterable[tuple[str, Callable[[], dict[str, Any]]]]) -> None:
        """Begin journals whose header (``sandbox()``, the metadata :meth:`start` writes) is written later,
        by :meth:`write_deferred` or by whatever reads or appends to the journal first, whichever comes
        first: a batch of claims answers without a thousand file writes in front of its answer. Nothing can
        be lost by the wait: the claim's record is durable before its answer, and a router restarted before
        the header was written writes it from that record (:meth:`unused` is true of such a journal)."""
        with self._begin_lock:
            self._deferred.update(starts)

    def write_deferred(self, sandbox_ids: Iterable[str]) -> None:
        """Write the deferred headers of these journals (those not written yet), on the calling (worker)
        thread. A full disk holds a header in memory, like any entry, until a later write finds room."""
        for sandbox_id in sandbox_ids:
            self._begin(sandbox_id)

    def _begin(self, sandbox_id: str) -> None:
        """Write the journal's deferred header, if it has one still to write. The lock makes whoever comes
        first write it, and whoever comes second wait until it is on the file: no entry lands before it."""
        with self._begin_lock:
            make = self._deferred.get(sandbox_id)
            if make is None:
                return
            try:
                header = _pack({"sandbox": make()})
                try:
                    self._write(sandbox_id, header, mode=os.O_TRUNC)
                except OSError as exc:
                    # The claim was answered already: refusing it is no longer possible, losing the header
                    # is not allowed. Held first, before anything appended meanwhile.
                    self._held[sandbox_id] = [header, *self._held.get(sandbox_id, [])]
                    log.warning("journal of %s: its header could not be written (%s); held in memory",
                                sandbox_id, exc)
            finally:
                del self._deferred[sandbox_id]

    def append(self, sandbox_id: str, entry: dict[str, Any]) -> None:
        """Add one entry: a step, ``{"sandbox_update": {...}}``, ``{"outcome": ...}`` or ``{"ended": ...}``;
        held in memory while the disk is full."""
        if self._deferred:
            self._begin(sandbox_id)
        held = self._held.get(sandbox_id, [])
        data = _pack(entry)
        try:
            self._write(sandbox_id, b"".join([*held, data]), mode=os.O_APPEND)
        except FileNotFoundError:
            # No journal: the record was already stored (a late background step), nothing to add to.
            self._held.pop(sandbox_id, None)
            return
        except OSError as exc:
            if not is_no_space(exc):
                raise
            if not held:
                log.warning("journal of %s: the state disk is full (%s); holding steps in memory", sandbox_id, exc)
            self._held[sandbox_id] = [*held, data]
            return
        self._held.pop(sandbox_id, None)

    def flush_held(self, *, last: bool = False) -> None:
        """Write held entries where the disk has room again (each reaper pass, and a ``last`` time at
        shutdown, for journals that get no more appends)."""
        for sandbox_id, held in list(self._held.items()):
            try:
                self._write(sandbox_id, b"".join(held), mode=os.O_APPEND)
            except FileNotFoundError:
                pass  # stored meanwhile
            except OSError as exc:
                if last:
                    log.error("journal of %s: %d entries lost, the state disk is still full: %s",
                              sandbox_id, len(held), exc)
                continue
            self._held.pop(sandbox_id, None)

    def _write(self, sandbox_id: str, data: bytes, *, mode: int) -> None:
        create = os.O_CREAT if mode == os.O_TRUNC else 0  # only start() makes a journal
        fd = os.open(self._file(sandbox_id), os.O_WRONLY | create | mode | os.O_CLOEXEC, 0o600)
        try:
            view = memoryview(data)
            try:
                while view:  # a nearly full disk takes part of a write and refuses the rest
                    view = view[os.write(fd, view) :]
            except OSError:
                # Never leave half an entry: everything after it would be unreadable. The end before this write
                # is found only here (what is on file now, less what this write put there): an fstat ahead of
                # every write cost one more system call per exec's step.
                os.ftruncate(fd, os.fstat(fd).st_size - (len(data) - len(view)))
                raise
        finally:
            os.close(fd)

    def prepare(self, sandbox_id: str) -> None:
        """Make a pool member's journal ahead, empty, for its claim's :meth:`start` to fill: making a file
        costs this disk ~0.3 ms (more while other writes fsync), writing into one a tenth of that, and a
        claim pays it on the event loop, before the answer a whole burst's claims wait for."""
        os.close(os.open(self._file(sandbox_id), os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))

    def unused(self, sandbox_id: str) -> bool:
        """Whether the journal was made ahead and never started (nothing in it, nothing held): there is no
        trajectory in it to store."""
        if sandbox_id in self._deferred:
            return False
        try:
            return self._path(sandbox_id).stat().st_size == 0 and not self._held.get(sandbox_id)
        except FileNotFoundError:
            return False

    def exists(self, sandbox_id: str) -> bool:
        """Whether a journal is there."""
        return self._path(sandbox_id).exists()

    def record(self, sandbox_id: str) -> dict[str, Any]:
        """The trajectory record so far: ``{"version", "sandbox", "steps", "outcome", "cost"}`` (``cost``: what the
        sandbox cost, :class:`grove.core.cost.Cost`, once it ended; None before)."""
        if self._deferred:
            self._begin(sandbox_id)
        try:
            raw = self._path(sandbox_id).read_bytes() + b"".join(self._held.get(sandbox_id, []))
        except FileNotFoundError as exc:
            raise NotFound(f"no trajectory journal for sandbox {sandbox_id}") from exc
        sandbox: dict[str, Any] = {}
        steps: list[dict[str, Any]] = []
        outcome: dict[str, Any] | None = None
        cost: dict[str, Any] | None = None
        infra: list[dict[str, Any]] = []
        own: list[dict[str, Any]] = []
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
                elif "sandbox_error" in entry:
                    own.append(entry["sandbox_error"])
                elif "ended" in entry:
                    sandbox.update(entry["ended"])
                    cost = entry.get("cost", cost)
                else:
                    steps.append(entry)
        except (ValueError, msgpack.exceptions.ExtraData):
            pass  # a torn last write after a crash: keep everything before it
        return {"version": RECORD_VERSION, "sandbox": sandbox, "steps": readable_steps(steps),
                "outcome": _with_faults(outcome, infra, own), "cost": cost}

    def stamp(self, sandbox_id: str) -> tuple[int, int, int, int] | None:
        """What changes whenever :meth:`record` would (file identity, size and time, held entries); None if
        there is no journal. Readers that poll a journal (the viewer) skip re-reading an unchanged one."""
        try:
            st = self._path(sandbox_id).stat()
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_size, st.st_mtime_ns, len(self._held.get(sandbox_id, ()))

    def remove(self, sandbox_id: str) -> None:
        """Drop a journal once its record is safely stored (in S3 or the spool)."""
        if self._deferred:
            with self._begin_lock:
                self._deferred.pop(sandbox_id, None)
        self._held.pop(sandbox_id, None)
        with contextlib.suppress(FileNotFoundError):
            self._path(sandbox_id).unlink()

    def ids(self) -> set[str]:
        """Sandboxes that have a journal."""
        return {p.stem for p in self.dir.glob("sb-*.msgpack")}


def _with_faults(
    outcome: dict[str, Any] | None, infra: list[dict[str, Any]], own: list[dict[str, Any]]
) -> dict[str, Any] | None:
    """The outcome a trainer can trust. With no task result, an environment fault makes it ``infra_error``
    and a fault the sandbox caused itself (its memory exhausted, its executor lost with it) makes it
    ``fail``: the policy's doing, never hidden as the environment's. With a result, the faults ride along
    in ``infra_errors`` and ``sandbox_errors`` so the result can be weighed."""
    if not infra and not own:
        return outcome
    if outcome is None:
        first = (infra or own)[0]
        outcome = {"result": "infra_error" if infra else "fail", "reward": None, "reason": first.get("reason")}
    return {**outcome, **({"infra_errors": infra} if infra else {}), **({"sandbox_errors": own} if own else {})}


def _pack(entry: dict[str, Any]) -> bytes:
    return msgpack.packb(entry, use_bin_type=True, default=_fallback)  # type: ignore[no-any-return]


def _fallback(value: Any) -> Any:
    if isinstance(value, tuple | set | frozenset):
        return list(value)
    return str(value)
