"""Commit: a running sandbox's writable layer, as it is at one instant, becomes a named image.

The sandbox's processes are frozen (the ``cgroup.freeze`` of its cgroup v2 group) so that no write lands
while the layer is read; :mod:`router.backends.local.upper_tar` then reads it through the same superblock the
sandbox has mounted (a private mount of the same loop device), so what the sandbox wrote is all there without
a sync, page cache included. The processes are thawed as soon as the tar is written (a few ms to seconds,
by the layer's size); unpacking it into the layer store happens after, with the sandbox running again.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from grove.core.errors import Conflict, GroveError, Unavailable
from router.backends.local import disk
from router.backends.local.cgroups import ACCOUNTING, CgroupSet
from router.backends.local.image_derive import derive
from router.backends.local.images import Image, ImageStore, check_name

_FREEZE_TIMEOUT_S = 10.0
_TAR_TIMEOUT_S = 600.0
_CODE_ROOT = str(Path(__file__).resolve().parents[3])


@contextlib.contextmanager
def frozen(cgroups: CgroupSet) -> Iterator[None]:
    """Every process of the sandbox stopped (not killed) until the block ends; thawed also on failure."""
    group = cgroups.path(ACCOUNTING)
    if not (group / "cgroup.freeze").exists():
        raise Unavailable(f"sandbox {cgroups.sandbox_id} cannot be frozen for a commit: this host mounts no "
                          "cgroup v2 hierarchy at /sys/fs/cgroup/unified (or the sandbox is not running)")
    (group / "cgroup.freeze").write_text("1")
    try:
        deadline = time.monotonic() + _FREEZE_TIMEOUT_S
        while "frozen 1" not in (group / "cgroup.events").read_text():
            if time.monotonic() > deadline:
                raise Unavailable(f"sandbox {cgroups.sandbox_id} did not freeze within {_FREEZE_TIMEOUT_S:g} s; "
                                  "try the commit again")
            time.sleep(0.002)
        yield
    finally:
        (group / "cgroup.freeze").write_text("0")


def commit(store: ImageStore, sandbox_dir: Path, cgroups: CgroupSet, id_base: int, parent: Image, name: str,
           meta: dict[str, Any]) -> Image:
    """Store the running sandbox's layer (in ``sandbox_dir``, its root at host id ``id_base``) as the image
    ``name`` on top of ``parent``, the image it was made from; blocks (call it from a thread)."""
    loops = disk.attached_loops(sandbox_dir / disk.IMAGE_NAME)
    if not loops:
        raise Conflict(f"sandbox {sandbox_dir.name} has no mounted disk (it is not running, or was made before "
                       "sandboxes had disks): it cannot be committed")
    check_name(name)  # before the layer is written: a bad name costs nothing
    # A scratch dir the layer store's collection knows: one left by a killed router goes with the next collection;
    # one in use is kept from it by the import lock, held until the image names its layers (a deleted sandbox's
    # teardown pass may collect at any moment).
    with store.layers.importing():
        scratch = Path(tempfile.mkdtemp(prefix=".pull-commit-", dir=store.root))
        try:
            layer = scratch / "layer.tar"
            with frozen(cgroups):
                _write_layer(f"/dev/{loops[0]}", id_base, layer)
            return derive(store, name, parent, layer, **meta)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)


def _write_layer(device: str, id_base: int, out: Path) -> None:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": _CODE_ROOT}
    try:
        done = subprocess.run([sys.executable, "-m", "router.backends.local.upper_tar", device, str(id_base), str(out)],
                              capture_output=True, env=env, timeout=_TAR_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise Unavailable(f"reading the sandbox's layer took longer than {_TAR_TIMEOUT_S:g} s") from None
    if done.returncode != 0:
        raise GroveError(done.stderr.decode(errors="replace").strip() or f"upper_tar exited {done.returncode}")
