"""A delete the host cannot finish at once: a process of the sandbox that cannot take its SIGKILL yet (here
held in a cgroup-v1 freezer, as a busy host holds a dying process). The delete answers 503 with what to
do, the router finishes it in the background once the process can die, and nothing is left."""

from __future__ import annotations

import contextlib
import secrets
import time
from pathlib import Path

from grove.client import Grove
from tests.support.router_fixtures import RouterProcess, cgroup_procs, error_of, sandbox_cgroups, wait_for

FREEZER = Path("/sys/fs/cgroup/freezer")


def test_a_delete_held_up_by_a_process_answers_503_and_finishes_in_the_background(router: RouterProcess,
                                                                                  grove: Grove) -> None:
    assert FREEZER.is_dir(), "this test needs the cgroup-v1 freezer controller at /sys/fs/cgroup/freezer"
    sb = grove.create(heartbeat=False)
    assert sb.exec("sleep 600 > /dev/null 2>&1 &").exit_code == 0
    sleeper = wait_for(lambda: [pid for pid in cgroup_procs(router.state_dir, sb.id)
                                if Path(f"/proc/{pid}/comm").read_text().strip() == "sleep"], 10,
                       what="the background sleep in the sandbox's cgroup")[0]
    frozen = FREEZER / f"grove-test-{secrets.token_hex(4)}"
    frozen.mkdir()
    try:
        (frozen / "cgroup.procs").write_text(str(sleeper))
        (frozen / "freezer.state").write_text("FROZEN")
        wait_for(lambda: (frozen / "freezer.state").read_text().strip() == "FROZEN", 10, what="the sleep frozen")
        reply = router.http("DELETE", f"/v1/sandboxes/{sb.id}", timeout=60)
        assert reply.status == 503, reply.body[:300]
        assert reply.headers.get("Retry-After") == "1"
        message = error_of(reply)["message"]
        assert str(sleeper) in message and "finishes the delete in the background" in message, message
        assert "retry" in message, message
    finally:
        _thaw_and_remove(frozen)
    # Thawed, the process takes its SIGKILL: the router's reaper completes the delete it began.
    wait_for(lambda: router.http("GET", f"/v1/sandboxes/{sb.id}").json()["status"] == "deleted", 60,
             what="the delete finished in the background")
    sb.close()  # already gone: closing again is no error
    assert not Path(f"/proc/{sleeper}").exists()
    assert not [p for p in sandbox_cgroups(router.state_dir) if p.name == sb.id]


def _thaw_and_remove(frozen: Path) -> None:
    """Let the frozen process go, and remove the freezer cgroup once it is empty (also when the test failed)."""
    with contextlib.suppress(OSError):
        (frozen / "freezer.state").write_text("THAWED")
    with contextlib.suppress(OSError):  # what is still alive goes back to the root group (the sandbox's own
        for pid in (frozen / "cgroup.procs").read_text().split():  # delete still ends it)
            with contextlib.suppress(OSError):
                (FREEZER / "cgroup.procs").write_text(pid)
    deadline = time.monotonic() + 30
    while frozen.exists():
        try:
            frozen.rmdir()  # empty once the process has died (or left with its sandbox's teardown)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
