"""A delete answers once its sandbox can no longer run; its cgroups, loop device and directory go in the
teardown's passes after it (router/backends/local/teardown.py). Remains something still holds wait for it and
hold up nothing else; a router killed before they are gone removes them at its next start, the trajectory
kept; and once the passes are done nothing of the sandboxes is left."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from grove.client import Grove
from router.backends.local import procs
from router.backends.local.disk import DiskTemplates, held_images
from sandbox_image.disk import attach
from tests.support.router_fixtures import (
    RouterProcess,
    cgroup_procs,
    leaks,
    remains_of,
    wait_for,
    wait_removed,
)

pytestmark = pytest.mark.local_only


def _hold_disk(router: RouterProcess, sandbox_id: str) -> int:
    """A loop device of the test's own on the sandbox's disk image, held by the returned fd (closing it lets go):
    a holder the teardown must wait for, as it waits for the kernel to detach the sandbox's own."""
    device, _ = attach(str(router.layout.sandbox(sandbox_id) / "disk.img"))
    return device


def _pids(router: RouterProcess, sandbox_id: str) -> list[tuple[int, int]]:
    """(pid, start time) of every process in the sandbox's cgroup."""
    found = [(pid, procs.start_time(pid)) for pid in cgroup_procs(router.state_dir, sandbox_id)]
    return [(pid, started) for pid, started in found if started is not None]


def test_a_delete_answers_before_its_teardown_and_leaves_nothing_once_it_is_done(router: RouterProcess,
                                                                                 grove: Grove) -> None:
    kept = grove.create(heartbeat=False)
    sandboxes = [grove.create(heartbeat=False) for _ in range(3)]
    for sb in sandboxes:
        assert sb.exec("echo x > /workspace/x && (sleep 600 > /dev/null 2>&1 &)").exit_code == 0
    processes = {sb.id: _pids(router, sb.id) for sb in sandboxes}
    assert all(len(found) >= 2 for found in processes.values()), processes  # the executor and the sleep
    held = _hold_disk(router, sandboxes[0].id)
    try:
        for sb in sandboxes:
            reply = router.http("DELETE", f"/v1/sandboxes/{sb.id}")
            assert reply.status == 200 and reply.json()["status"] == "deleted", reply.body
            # Answered once the sandbox can no longer run: every process of it is dead by then.
            assert not [pid for pid, started in processes[sb.id] if procs.alive(pid, started)], sb.id
        # Passes come every 0.1 s: after several, the held sandbox's remains still wait for its disk...
        time.sleep(1.0)
        assert f"sandbox dir {router.layout.sandbox(sandboxes[0].id)}" in remains_of(router.state_dir,
                                                                                    sandboxes[0].id)
        # ...and hold up none of the others.
        for sb in sandboxes[1:]:
            wait_removed(router.state_dir, sb.id)
    finally:
        os.close(held)  # the last reference: the test's loop device detaches itself
    wait_removed(router.state_dir, sandboxes[0].id)
    assert kept.exec("cat /etc/hostname").exit_code == 0  # nothing else was disturbed
    kept.close()
    wait_removed(router.state_dir, kept.id)
    assert not list(router.layout.sandboxes.iterdir())


def test_a_router_killed_before_the_teardown_ends_removes_the_remains_at_its_next_start(
        fresh_router: RouterProcess) -> None:
    router = fresh_router
    with router.client() as grove:
        sb = grove.create(heartbeat=False)
        assert sb.exec("echo kept").stdout == b"kept\n"
        held = _hold_disk(router, sb.id)
        try:
            reply = router.http("DELETE", f"/v1/sandboxes/{sb.id}")
            assert reply.status == 200, reply.body
            router.stop(signal.SIGKILL)  # the delete answered; its teardown waits for the test's loop device
            assert remains_of(router.state_dir, sb.id), "nothing was pending when the router died"
        finally:
            os.close(held)
    router.start()  # collects the orphan's remains before it listens
    assert remains_of(router.state_dir, sb.id) == []
    with router.client() as grove:
        steps = grove.request("GET", f"/v1/trajectories/{sb.id}")["steps"]  # the record was safe at the answer
        assert [s["command"] for s in steps if s["type"] == "exec"] == ["echo kept"]
    assert router.stop() in (None, 0)
    assert leaks(router.state_dir) == []


def test_held_images_finds_the_held_ones_in_one_scan(tmp_path: Path) -> None:
    templates = DiskTemplates(tmp_path / "disk-templates")
    images = [tmp_path / f"{name}.img" for name in ("a", "b", "c")]
    for image in images:
        templates.make_image(64, image)
    assert held_images(images) == set()
    device, path = attach(str(images[1]))
    try:
        assert held_images(images) == {images[1]}
        images[1].unlink()  # a deleted image still held shows as "<path> (deleted)"
        assert held_images(images) == {images[1]}
    finally:
        os.close(device)
    wait_for(lambda: held_images(images) == set(), 10.0, 0.01, what=f"{path} to detach")
