"""Host id ranges for the local sandboxes' user namespaces: one range of 65,536 ids per sandbox.

Root inside sandbox N is host uid ``FLOOR + N * RANGE``, an id no host account uses, and no two
sandboxes share an id, so even a process that got out of its namespaces would own nothing of another
sandbox's. A sandbox keeps its range for its life (the files of its layer are owned by it, also while
it is scaled to zero): the range is written to ``<sandbox dir>/userns`` and read back on resume and
after a router restart.

Ranges are allocated host-wide, not per router: every router on the host claims a range in one
registry directory (:data:`REGISTRY`), one file per range naming the ``userns`` file of the sandbox
that holds it, created with ``O_EXCL`` under an ``flock``. Two routers with two state dirs therefore
never hand out the same range. A claim whose ``userns`` file is gone or names another range (its state
dir was removed without deleting the sandboxes) is stale: taken back when a router starts and when
ranges run out. Both the claim and the ``userns`` file are written under the lock, so a claim being
made is never mistaken for a stale one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from grove.core.errors import Unavailable
from sandbox_image.userns import RANGE

FLOOR = 1 << 28
"""First host id given to sandboxes (268,435,456): far above the ids of accounts and of the usual
``/etc/subuid`` ranges (100000+), and the last range ends below 2**31."""
SLOTS = ((1 << 31) - FLOOR) // RANGE
"""How many ranges fit (28,672): more than the sandboxes one host can run."""
REGISTRY = Path("/var/lib/grove/uid-ranges")
"""The host-wide claims: a file per range (its slot number) holding the claiming ``userns`` file's path.
Persistent (not under /run): a sandbox's layer keeps its owners across a reboot, so must its range."""
_FILE = "userns"


class UidRanges:
    """Which range each sandbox directory holds. Allocation takes the next range free on the whole host
    round-robin (a range just released is not handed out again at once); it runs in one thread of this
    router, the event loop's, and the registry's lock orders it against other routers."""

    def __init__(self, sandboxes: Path, registry: Path = REGISTRY) -> None:
        self._sandboxes = sandboxes
        self._registry = registry
        registry.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._used: dict[int, str] = {}
        self._slots: dict[str, set[int]] = {}
        """The inverse of ``_used``: each sandbox's slots (a release looks up its own, not every sandbox's)."""
        with self._locked():  # claims left by routers whose state dir was removed (a crash, a wiped /tmp)
            self._collect_stale()
        for entry in sandboxes.glob(f"*/{_FILE}") if sandboxes.is_dir() else ():
            slot = _read_slot(entry)
            if slot is not None:
                self._hold(slot, entry.parent.name)
                with self._locked():
                    self._claim(slot, entry)  # recorded before ranges were host-wide, or after a wipe
        self._next = 0

    def base(self, sandbox_id: str) -> int:
        """The sandbox's range (first host id), allocating and recording one if it has none yet."""
        path = self._sandboxes / sandbox_id / _FILE
        slot = _read_slot(path)
        if slot is None or self._used.get(slot, sandbox_id) != sandbox_id:
            with self._locked():
                slot = self._allocate(path)
                tmp = path.with_suffix(".tmp")
                tmp.write_text(f"{FLOOR + slot * RANGE}\n", encoding="ascii")
                os.replace(tmp, path)
        self._hold(slot, sandbox_id)
        return FLOOR + slot * RANGE

    def _hold(self, slot: int, sandbox_id: str) -> None:
        self._used[slot] = sandbox_id
        self._slots.setdefault(sandbox_id, set()).add(slot)

    def release(self, sandbox_id: str) -> None:
        """The sandbox is gone: its range may be given out again (here and by every other router)."""
        path = str(self._sandboxes / sandbox_id / _FILE)
        for slot in sorted(self._slots.pop(sandbox_id, ())):
            if self._used.get(slot) == sandbox_id:
                del self._used[slot]
                with self._locked():
                    if _claimant(self._registry / str(slot)) == path:
                        (self._registry / str(slot)).unlink(missing_ok=True)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(self._registry / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _claim(self, slot: int, path: Path) -> bool:
        """Claim ``slot`` for the sandbox whose ``userns`` file is ``path``; whether it is now its own."""
        claim = self._registry / str(slot)
        try:
            fd = os.open(claim, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            return _claimant(claim) == str(path)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(str(path))
        return True

    def _allocate(self, path: Path) -> int:
        for sweep in (False, True):
            if sweep:
                self._collect_stale()
            for _ in range(SLOTS):
                slot, self._next = self._next, (self._next + 1) % SLOTS
                if slot not in self._used and self._claim(slot, path):
                    return slot
        raise Unavailable(f"all {SLOTS} user-id ranges for sandboxes on this host are in use; delete sandboxes first")

    def _collect_stale(self) -> None:
        """Drop claims whose sandbox no longer records that range (its state dir was removed)."""
        for claim in self._registry.iterdir():
            if not claim.name.isdigit():
                continue
            owner = _claimant(claim)
            if owner is None or _read_slot(Path(owner)) != int(claim.name):
                claim.unlink(missing_ok=True)


def _claimant(claim: Path) -> str | None:
    try:
        return claim.read_text(encoding="utf-8")
    except OSError:
        return None


def _read_slot(path: Path) -> int | None:
    try:
        base = int(path.read_text(encoding="ascii"))
    except (OSError, ValueError):
        return None
    offset = base - FLOOR
    if offset < 0 or offset % RANGE or offset // RANGE >= SLOTS:
        return None
    return offset // RANGE


def shift_owners(top: Path, base: int) -> None:
    """Give a layer written before sandboxes had user namespaces to the sandbox's range: owner ``u``
    becomes ``base + u`` (ids at or past the range's end, which the namespace could not map, become its
    ``nobody``). Ownership only; modes, including setuid bits, are kept (``lchown`` clears them: restored).
    """
    for entry in [top, *top.rglob("*")]:
        st = entry.lstat()
        if st.st_uid >= base and st.st_gid >= base:
            continue
        uid = base + st.st_uid if st.st_uid < RANGE else base + 65534
        gid = base + st.st_gid if st.st_gid < RANGE else base + 65534
        os.lchown(entry, uid, gid)
        if not entry.is_symlink():
            os.chmod(entry, st.st_mode & 0o7777)
