"""Issue 29, medium 2 and low 5: the state dir is root's alone.

Before the fix the state dir was 0755 under its creator's umask: any user of the host could read the
records (each sandbox's token and env), the API key's neighbours, the sandboxes' disk images and the
S3 volume, and run an image's setuid-root program (``images/<name>/rootfs/bin/rootme``, 04755, uid 0) as
root. Now ``grove up``, ``grove image ...`` and ``grove key ...`` make it 0700 — a state dir made open
by an older grove or by hand included — and images keep their set-id bits for the sandboxes.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from tests.support.imagetools import make_busybox_rootfs
from tests.support.router_fixtures import GROVE_BIN, router_state

pytestmark = pytest.mark.local_only

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]


def as_nobody(*argv: str) -> subprocess.CompletedProcess[bytes]:
    """Run ``argv`` as the host's ``nobody``, through a shell: setpriv keeps root's capabilities until its own
    exec, so the program named must be exec'd by a process that has none."""
    return subprocess.run([*NOBODY, "/bin/sh", "-c", 'exec "$@"', "sh", *argv],
                          capture_output=True, timeout=30, check=False)


def test_an_open_state_dir_is_closed_and_nothing_in_it_is_reachable(tmp_path: Path) -> None:
    rootfs = make_busybox_rootfs(tmp_path / "rootfs")
    shutil.copy2(rootfs / "bin" / "busybox", rootfs / "bin" / "rootme")
    os.chmod(rootfs / "bin" / "rootme", 0o4755)
    with router_state(start=False) as router:
        os.chmod(router.state_dir, 0o755)  # as an older grove (or a umask of 022) left it
        router.start()
        assert stat.S_IMODE(router.state_dir.stat().st_mode) == 0o700
        done = router.cli("image", "import", "suid", str(rootfs))
        assert done.returncode == 0, done.stderr.decode()
        with router.client() as grove, grove.create("suid", heartbeat=False) as sb:
            # The image keeps its set-id bit: inside the sandbox's user namespace it grants nothing beyond it.
            assert sb.exec("stat -c %a /bin/rootme").stdout == b"4755\n"
            sb.exec("echo secret > /workspace/s && sync")
            stored = router.layout.images / "suid" / "rootfs" / "bin" / "rootme"
            assert stored.stat().st_mode & stat.S_ISUID
            record = router.layout.record(sb.id)
            disk = router.layout.sandbox(sb.id) / "disk.img"
            assert record.exists() and disk.exists()
            for path in (stored, record, disk, router.layout.api_keys, router.layout.images):
                done = as_nobody("cat", str(path))
                assert done.returncode != 0 and b"Permission denied" in done.stderr, (path, done)
            done = as_nobody(str(stored), "id", "-u")
            assert done.returncode != 0 and b"Permission denied" in done.stderr, done
            done = as_nobody("ls", str(router.layout.s3))
            assert done.returncode != 0, done
        os.chmod(router.state_dir, 0o755)
        done = router.cli("image", "ls")
        assert done.returncode == 0 and stat.S_IMODE(router.state_dir.stat().st_mode) == 0o700


def test_key_add_makes_a_new_state_dir_private(tmp_path: Path) -> None:
    state = tmp_path / "fresh-state"
    done = subprocess.run([GROVE_BIN, "--state-dir", str(state), "key", "add", "ci"],
                          capture_output=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr.decode()
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    assert stat.S_IMODE((state / "api_keys").stat().st_mode) == 0o600
