"""Checkpoints of local sandboxes: their disk image, consistent at one instant, cloned copy-on-write.

Taking one (:func:`take`): ``syncfs`` once while the sandbox runs (most dirty data goes out then), freeze the
sandbox's processes (the cgroup v2 freezer of its accounting group, ``cgroup.freeze``), ``syncfs`` its root
again (an overlay's sync writes out its upper file system: the sandbox's ext4, whose loop device writes into
``disk.img``), clone ``disk.img`` (:func:`router.backends.local.cow.clone`), thaw.
Nothing can change the file system between the sync and the clone, so the clone is what a clean crash at
that instant would leave: an ext4 with every completed write (a database in WAL mode recovers from it as
from a power cut). The processes stay frozen only across the sync and the clone; the sync's time grows with
what was written since the first sync, the clone's does not.

Checkpoints live beside the sandbox's image, ``<state>/sandboxes/<id>/checkpoints/<checkpoint id>.img``: on
the same file system (a reflink cannot cross one), and deleted with the sandbox.
"""

from __future__ import annotations

import ctypes
import os
import time
from pathlib import Path

from grove.core.errors import Conflict, NotFound, Unavailable
from router.backends.base import CheckpointTaken as Taken
from router.backends.local import cow, disk, procs
from router.backends.local.cgroups import ACCOUNTING, CgroupSet

CHECKPOINTS = "checkpoints"
_FREEZE_TIMEOUT_S = 5.0
_libc = ctypes.CDLL(None, use_errno=True)


def image_of(sandbox_dir: Path, checkpoint_id: str) -> Path:
    """Where a checkpoint's disk image is."""
    return sandbox_dir / CHECKPOINTS / f"{checkpoint_id}.img"


def take(sandbox_dir: Path, cgroups: CgroupSet, pid: int | None, start_time: int | None, checkpoint_id: str) -> Taken:
    """Checkpoint the sandbox whose directory is ``sandbox_dir`` (``pid``: its PID 1, None while scaled to zero)."""
    source = sandbox_dir / disk.IMAGE_NAME
    if not source.exists():
        raise Conflict(f"sandbox {sandbox_dir.name} keeps its files in plain directories (made before disk quotas): "
                       "it cannot be checkpointed; make a new sandbox")
    target = image_of(sandbox_dir, checkpoint_id)
    target.parent.mkdir(exist_ok=True)
    running = pid is not None and start_time is not None and procs.alive(pid, start_time)
    if not running:
        reflinked = cow.clone(source, target)
        return Taken(os.stat(target).st_blocks * 512, 0.0, reflinked)
    assert pid is not None
    root = os.open(f"/proc/{pid}/root", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    freeze = cgroups.path(ACCOUNTING) / "cgroup.freeze"
    try:
        # Most dirty data is written out while the processes still run; frozen, the sync writes only what
        # they dirtied since (the freeze grows with the write rate over this moment, not with all unsynced data).
        _syncfs(root, sandbox_dir.name)
        frozen_at = time.monotonic()
        _freeze(freeze, cgroups.path(ACCOUNTING) / "cgroup.events")
        try:
            _syncfs(root, sandbox_dir.name)
            reflinked = cow.clone(source, target)
        finally:
            _thaw(freeze)
            frozen_s = time.monotonic() - frozen_at
    finally:
        os.close(root)
    return Taken(os.stat(target).st_blocks * 512, frozen_s, reflinked)


def _syncfs(root: int, sandbox_id: str) -> None:
    if _libc.syncfs(root) != 0:
        err = ctypes.get_errno()
        raise Unavailable(f"syncing sandbox {sandbox_id}'s file system failed: {os.strerror(err)}")


def _freeze(freeze: Path, events: Path) -> None:
    """Freeze the group and wait until every process in it is frozen."""
    try:
        freeze.write_text("1")
    except OSError as exc:
        raise Unavailable(f"cannot freeze the sandbox's processes ({freeze}: {exc}); checkpoints need the cgroup "
                          "v2 hierarchy a hybrid host mounts at /sys/fs/cgroup/unified") from exc
    deadline = time.monotonic() + _FREEZE_TIMEOUT_S
    while "frozen 1" not in events.read_text():
        if time.monotonic() > deadline:
            _thaw(freeze)
            raise Unavailable(f"the sandbox's processes did not freeze within {_FREEZE_TIMEOUT_S:g} s; try again")
        time.sleep(0.0005)


def _thaw(freeze: Path) -> None:
    freeze.write_text("0")


def restore(source_dir: Path, checkpoint_id: str, target: Path) -> None:
    """Give a new sandbox the checkpoint's disk image at ``target``."""
    image = image_of(source_dir, checkpoint_id)
    if not image.exists():
        raise NotFound(f"checkpoint {checkpoint_id} has no files on this host (its sandbox was deleted)")
    cow.clone(image, target)


def remove(sandbox_dir: Path, checkpoint_id: str) -> None:
    """Delete a checkpoint's image (gone already: nothing to do)."""
    image_of(sandbox_dir, checkpoint_id).unlink(missing_ok=True)
