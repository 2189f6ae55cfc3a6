"""Host id ranges for the local sandboxes' user namespaces: one range of 65,536 ids per sandbox.

Root inside sandbox N is host uid ``FLOOR + N * RANGE``, an id no host account uses, and no two
sandboxes share an id, so even a process that got out of its namespaces would own nothing of another
sandbox's. A sandbox keeps its range for its life (the files of its layer are owned by it, also while
it is scaled to zero): the range is written to ``<sandbox dir>/userns`` and read back on resume and
after a router restart.
"""

from __future__ import annotations

import os
from pathlib import Path

from grove.errors import Unavailable
from sandbox_image.userns import RANGE

FLOOR = 1 << 28
"""First host id given to sandboxes (268,435,456): far above the ids of accounts and of the usual
``/etc/subuid`` ranges (100000+), and the last range ends below 2**31."""
SLOTS = ((1 << 31) - FLOOR) // RANGE
"""How many ranges fit (28,672): more than the sandboxes one host can run."""
_FILE = "userns"


class UidRanges:
    """Which range each sandbox directory holds. Allocation takes the next free range round-robin (a
    range just released is not handed out again at once) and runs in one thread, the event loop's."""

    def __init__(self, sandboxes: Path) -> None:
        self._sandboxes = sandboxes
        self._used: dict[int, str] = {}
        for entry in sandboxes.glob(f"*/{_FILE}") if sandboxes.is_dir() else ():
            slot = _read_slot(entry)
            if slot is not None:
                self._used[slot] = entry.parent.name
        self._next = 0

    def base(self, sandbox_id: str) -> int:
        """The sandbox's range (first host id), allocating and recording one if it has none yet."""
        path = self._sandboxes / sandbox_id / _FILE
        slot = _read_slot(path)
        if slot is None or self._used.get(slot, sandbox_id) != sandbox_id:
            slot = self._allocate()
            tmp = path.with_suffix(".tmp")
            tmp.write_text(f"{FLOOR + slot * RANGE}\n", encoding="ascii")
            os.replace(tmp, path)
        self._used[slot] = sandbox_id
        return FLOOR + slot * RANGE

    def release(self, sandbox_id: str) -> None:
        """The sandbox is gone: its range may be given out again."""
        for slot, owner in list(self._used.items()):
            if owner == sandbox_id:
                del self._used[slot]

    def _allocate(self) -> int:
        for _ in range(SLOTS):
            slot, self._next = self._next, (self._next + 1) % SLOTS
            if slot not in self._used:
                return slot
        raise Unavailable(f"all {SLOTS} user-id ranges for sandboxes are in use; delete sandboxes first")


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
