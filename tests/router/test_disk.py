"""Disk quotas on the local backend: each sandbox's writable layer is an ext4 image of ``disk_mb``.

A sandbox that writes past its quota gets ENOSPC inside and keeps working; the host's disk and other
sandboxes never notice; the quota and the files survive scale-to-zero; delete leaves no loop device, no
mount, no file; a sandbox made before quotas (plain ``upper`` dirs) still resumes.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from grove.client import Grove, Sandbox
from grove.core.errors import TooLarge
from router.backends.local.disk import KEPT_TEMPLATES, DiskTemplates, attached_loops
from sandbox_image.disk import attach
from tests.support.router_fixtures import (
    RouterProcess,
    cgroup_procs,
    error_of,
    layer_file,
    layer_owner,
    loops_with,
    mounts_with,
    to_plain_layer,
    wait_for,
    wait_removed,
)

pytestmark = pytest.mark.local_only

MIB = 1024 * 1024
QUOTA_MB = 64
FILL = "dd if=/dev/zero of=/workspace/fill bs=1M count=200 2>&1; sync"


def _base(router: RouterProcess, sb: Sandbox) -> Path:
    return router.layout.sandbox(sb.id)


def _df_root_kib(sb: Sandbox) -> int:
    """The size of the sandbox's root filesystem as ``df`` inside it shows it."""
    r = sb.exec("df -k / | tail -1")
    assert r.exit_code == 0, r.stderr
    return int(r.stdout.split()[1])


def _status(router: RouterProcess, sandbox_id: str) -> str:
    reply = router.http("GET", f"/v1/sandboxes/{sandbox_id}")
    assert reply.status == 200, reply.body
    return str(reply.json()["status"])


def test_writing_past_the_quota_is_enospc_inside(router: RouterProcess, grove: Grove) -> None:
    a = grove.create(heartbeat=False, disk_mb=QUOTA_MB)
    b = grove.create(heartbeat=False)
    assert a.info["resources"]["disk_mb"] == QUOTA_MB and b.info["resources"]["disk_mb"] == 10240
    trajectory = grove.request("GET", f"/v1/sandboxes/{a.id}/trajectory")
    assert trajectory["sandbox"]["resources"]["disk_mb"] == QUOTA_MB  # recorded with the other limits
    assert 48 * 1024 < _df_root_kib(a) <= QUOTA_MB * 1024  # df / shows the quota, less ext4's own metadata
    assert 9 * 1024 * 1024 < _df_root_kib(b) <= 10240 * 1024

    r = a.exec(FILL)
    assert r.exit_code == 0, r.stderr  # sync succeeds; dd's failure is in its output
    assert b"No space left on device" in r.stdout, r.stdout
    assert int(a.exec("stat -c %s /workspace/fill").stdout) < QUOTA_MB * MIB
    # The host holds no more than the quota for it: a sparse image of exactly the quota's size (st_blocks
    # also counts the host filesystem's own extent blocks for the file: a little slack for those).
    image = _base(router, a) / "disk.img"
    assert image.stat().st_size == QUOTA_MB * MIB
    assert image.stat().st_blocks * 512 <= QUOTA_MB * MIB + MIB
    # Through the file API too: a clear 413, nothing half-written, and the next call works (the refused
    # upload's connection is not reused: it once made the following exec a 502 now and then).
    for _ in range(20):
        with pytest.raises(TooLarge, match="no space left"):
            a.write_file("/workspace/more", b"x" * MIB)
        assert a.exec(["test", "-e", "/workspace/more"]).exit_code == 1

    # The neighbour writes on as if nothing happened.
    r = b.exec("dd if=/dev/zero of=/workspace/big bs=1M count=100 status=none && sync && stat -c %s /workspace/big")
    assert r.exit_code == 0 and r.stdout == f"{100 * MIB}\n".encode(), r.stderr

    # The full sandbox keeps working, and deleting frees its space.
    assert a.exec("echo still here").stdout == b"still here\n"
    r = a.exec("rm /workspace/fill && dd if=/dev/zero of=/workspace/after bs=1M count=16 status=none && sync")
    assert r.exit_code == 0, r.stderr
    a.write_file("/workspace/more", b"x" * MIB)
    assert a.read_file("/workspace/more") == b"x" * MIB


def test_the_disk_is_invisible_inside_and_absent_from_the_host_mount_table(
    router: RouterProcess, grove: Grove
) -> None:
    sb = grove.create(heartbeat=False, disk_mb=QUOTA_MB)
    base = _base(router, sb)
    # One loop device holds the image, mounted only in the sandbox's own namespace.
    assert list(loops_with(f"{base}/").values()) == [f"{base}/disk.img"]
    assert mounts_with(str(base)) == []
    assert not any((base / "disk").iterdir())  # the mount point, empty on the host's side
    # Inside: no loop device, no disk image, no way to reach the filesystem under the overlay.
    assert sb.exec("ls /dev | grep -c loop || true").stdout == b"0\n"
    assert sb.exec("grep -c /dev/loop /proc/self/mounts || true").stdout == b"0\n"
    r = sb.exec("mount -t ext4 /dev/loop0 /mnt 2>&1; echo rc=$?")
    assert not r.stdout.endswith(b"rc=0\n"), r.stdout


def test_delete_leaves_no_loop_device_mount_or_file(router: RouterProcess, grove: Grove) -> None:
    sb = grove.create(heartbeat=False, disk_mb=QUOTA_MB)
    base = _base(router, sb)
    sb.exec("echo x > /workspace/x")
    assert len(loops_with(f"{base}/")) == 1
    reply = router.http("DELETE", f"/v1/sandboxes/{sb.id}")
    assert reply.status == 200, reply.body
    wait_removed(router.state_dir, sb.id)  # the delete answered once the sandbox could no longer run
    assert loops_with(f"{base}/") == {}
    assert mounts_with(str(base)) == []
    assert not base.exists()


def test_quota_and_files_survive_scale_to_zero(router: RouterProcess, grove: Grove) -> None:
    sb = grove.create(heartbeat=False, disk_mb=QUOTA_MB, idle_timeout_s=2, heartbeat_timeout_s=120)
    base = _base(router, sb)
    sb.write_file("/workspace/kept.txt", "written before\n")
    r = sb.exec(FILL)
    assert b"No space left on device" in r.stdout, r.stdout
    size_before = _df_root_kib(sb)

    wait_for(lambda: _status(router, sb.id) == "idle", 10, 0.1, "the sandbox to go idle")
    wait_for(lambda: cgroup_procs(router.state_dir, sb.id) == [], 2, 0.01, "an empty cgroup")
    assert loops_with(f"{base}/") == {}  # scaled to zero: its disk is detached, its files kept
    assert layer_file(router.state_dir, sb.id, "workspace/kept.txt") == b"written before\n"
    assert layer_owner(router.state_dir, sb.id, "workspace/kept.txt") is not None
    assert layer_owner(router.state_dir, sb.id, "workspace/never-written") is None

    # Resumed by the next call: the same files, the same quota, still full.
    r = sb.exec("cat /workspace/kept.txt")
    assert r.exit_code == 0 and r.stdout == b"written before\n", r.stderr
    assert _df_root_kib(sb) == size_before
    assert len(loops_with(f"{base}/")) == 1
    r = sb.exec("dd if=/dev/zero of=/workspace/more bs=1M count=8 2>&1")
    assert r.exit_code != 0 and b"No space left on device" in r.stdout, r.stdout
    r = sb.exec("rm /workspace/fill /workspace/more && dd if=/dev/zero of=/workspace/more bs=1M count=8 status=none")
    assert r.exit_code == 0, r.stderr


@pytest.mark.parametrize("value", [0, 63, 1048577, 10**12, -1])
def test_absurd_disk_quota_is_a_422(router: RouterProcess, value: int) -> None:
    before = router.live_ids()
    reply = router.http("POST", "/v1/sandboxes", json_body={"disk_mb": value})
    assert reply.status == 422, reply.body
    assert "disk_mb" in error_of(reply)["message"]
    assert router.live_ids() == before


@pytest.mark.parametrize("value", ["64", True, 1.5, None])
def test_disk_quota_of_the_wrong_type_is_a_4xx(router: RouterProcess, value: object) -> None:
    reply = router.http("POST", "/v1/sandboxes", json_body={"disk_mb": value})
    assert reply.status in (400, 422), reply.body
    assert "disk_mb" in error_of(reply)["message"]


def test_a_sandbox_from_before_disk_quotas_still_resumes(fresh_router: RouterProcess) -> None:
    """A layer kept as plain ``upper``/``work`` dirs (as routers before disk quotas made them) resumes as is."""
    router = fresh_router
    with router.client() as grove:
        sb = grove.create(heartbeat=False, disk_mb=QUOTA_MB, idle_timeout_s=1, heartbeat_timeout_s=300)
        sb.exec("echo from the old days > /workspace/old.txt; echo etc > /etc/old-marker")
        wait_for(lambda: _status(router, sb.id) == "idle", 10, 0.1, "the sandbox to go idle")
        base = _base(router, sb)
        wait_for(lambda: loops_with(f"{base}/") == {}, 5, 0.05, "its disk to detach")
    assert router.stop() in (None, 0)

    # Rewrite its directory into the old layout: the layer's files as plain dirs, no disk image.
    to_plain_layer(base)
    assert (base / "upper" / "workspace" / "old.txt").read_bytes() == b"from the old days\n"
    uid_base = int((base / "userns").read_text())  # root inside: the sandbox's own host id range
    assert layer_owner(router.state_dir, sb.id, "workspace/old.txt") == (uid_base, uid_base)

    router.start()
    with router.client() as grove:
        old = grove.attach(sb.id)
        r = old.exec("cat /workspace/old.txt /etc/old-marker && echo new > /workspace/new.txt")
        assert r.exit_code == 0 and r.stdout == b"from the old days\netc\n", r.stderr
        assert (base / "upper" / "workspace" / "new.txt").read_bytes() == b"new\n"  # still the plain dirs
        assert not (base / "disk.img").exists() and loops_with(f"{base}/") == {}


def test_templates_are_copied_sparsely_and_only_the_recent_ones_kept(tmp_path: Path) -> None:
    templates = DiskTemplates(tmp_path / "disk-templates")
    first = templates.template(64)
    templates.make_image(64, tmp_path / "a.img")
    copy = tmp_path / "a.img"
    assert copy.stat().st_size == 64 * MIB and copy.stat().st_blocks * 512 < MIB  # holes kept
    assert subprocess.run(["cmp", str(first), str(copy)]).returncode == 0
    assert subprocess.run(["e2fsck", "-fn", str(copy)], capture_output=True).returncode == 0
    # Clients asking for ever new sizes do not fill the state dir with templates.
    for size in range(65, 65 + KEPT_TEMPLATES + 2):
        templates.template(size)
    kept = sorted(p.name for p in (tmp_path / "disk-templates").iterdir())
    assert len(kept) == KEPT_TEMPLATES and not first.exists()
    assert templates.template(64).exists()  # made again when asked for again
    # Copies after the first use the template's data map found then: the map of the template made again,
    # not the removed one's.
    for name in ("b.img", "c.img"):
        templates.make_image(64, tmp_path / name)
        assert subprocess.run(["cmp", str(templates.template(64)), str(tmp_path / name)]).returncode == 0
        assert (tmp_path / name).stat().st_blocks * 512 < MIB


def test_attached_loops_finds_the_device_holding_an_image_until_it_detaches(tmp_path: Path) -> None:
    # The router waits on this before it mounts an image again or removes a sandbox's directory: a
    # holder it missed would let two mounts of one ext4 image happen.
    image = tmp_path / "disk.img"
    DiskTemplates(tmp_path / "disk-templates").make_image(QUOTA_MB, image)
    assert attached_loops(image) == []
    device, path = attach(str(image))
    try:
        assert attached_loops(image) == [Path(path).name]
        assert attached_loops(image, [Path(path).name]) == [Path(path).name]
        assert attached_loops(tmp_path / "other.img") == []
        image.unlink()  # a deleted image still held shows as "<path> (deleted)"
        assert attached_loops(image) == [Path(path).name]
    finally:
        os.close(device)  # the last reference: the device detaches itself (autoclear)
    wait_for(lambda: attached_loops(image) == [], 10.0, 0.01, what=f"{path} to detach")
