"""Restart safety: a router stopped (SIGTERM) or killed (SIGKILL) re-adopts its running sandboxes without
restarting them, and a new router collects what has no record."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from grove.client import Grove
from grove.core.errors import Unavailable
from sandbox_image.bundle import MANIFEST
from tests.support.router_fixtures import (
    RouterProcess,
    cgroup_procs,
    process_alive,
    procs_running,
    sandbox_cgroups,
    wait_for,
)


def _pid1_start(grove: Grove, sandbox_id: str) -> bytes:
    """The start time of the sandbox's PID 1 as seen inside: it changes whenever the sandbox restarts."""
    return grove.attach(sandbox_id).exec("cut -d' ' -f22 /proc/1/stat").stdout


def test_restart_readopts_running_sandboxes(fresh_router: RouterProcess) -> None:
    """SIGTERM, then SIGKILL: each time the new router finds both sandboxes running and uses them as they are."""
    router = fresh_router
    with router.client() as grove:
        a = grove.create(heartbeat=False, metadata={"task_id": "keep-a"})
        b = grove.create(heartbeat=False, metadata={"labels": {"k": "b"}})
        for sb in (a, b):
            sb.exec(f"echo {sb.id} > /dev/shm/alive; echo disk > /workspace/f")
        before = {sb.id: _pid1_start(grove, sb.id) for sb in (a, b)}
        procs_before = {sb.id: sorted(cgroup_procs(router.state_dir, sb.id)) for sb in (a, b)}

        for sig in (signal.SIGTERM, signal.SIGKILL):
            code = router.stop(sig)
            assert code == (0 if sig == signal.SIGTERM else -signal.SIGKILL)
            # With no router, the sandboxes run on.
            for sb in (a, b):
                assert sorted(cgroup_procs(router.state_dir, sb.id)) == procs_before[sb.id]
            with pytest.raises(Unavailable, match="cannot reach"):
                grove.list()
            router.start()

            listed = {s["id"]: s for s in grove.list()}
            assert set(listed) == {a.id, b.id}
            assert all(s["status"] == "ready" for s in listed.values())
            assert listed[a.id]["metadata"]["task_id"] == "keep-a"
            assert listed[b.id]["metadata"]["labels"] == {"k": "b"}
            for sb in (a, b):
                # Same processes: the tmpfs file (lost on any restart of the sandbox) is still there.
                r = sb.exec("cat /dev/shm/alive /workspace/f")
                assert r.stdout == f"{sb.id}\ndisk\n".encode(), r.stderr
                assert _pid1_start(grove, sb.id) == before[sb.id]
            assert sorted(s["id"] for s in grove.list({"k": "b"})) == [b.id]
        a.close()
        assert [s["id"] for s in grove.list()] == [b.id]


def _exec_in_a_thread(router: RouterProcess, sandbox_id: str, command: str) -> tuple[threading.Thread,
                                                                                     list[BaseException]]:
    """``command`` through the router on a thread of its own; the thread and what the call raised (the router
    stops or dies under it)."""
    failure: list[BaseException] = []

    def call() -> None:
        try:
            router.http("POST", f"/v1/sandboxes/{sandbox_id}/exec", json_body={"command": command}, timeout=700)
        except BaseException as exc:
            failure.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    return caller, failure


def test_sigkill_during_a_command_then_restart(fresh_router: RouterProcess) -> None:
    router = fresh_router
    with router.client() as grove:
        sb = grove.create(heartbeat=False)
        sb.exec("echo here > /dev/shm/alive")
        beating = grove.create(heartbeat_timeout_s=5)  # the SDK heart-beats every ~1.7 s
        caller, failure = _exec_in_a_thread(router, sb.id, "sleep 20")
        time.sleep(0.5)
        router.stop(signal.SIGKILL)
        caller.join(10)
        assert failure and not caller.is_alive()
        time.sleep(2)  # long enough for a heartbeat to fail
        router.start()
        restarted = time.monotonic()
        assert sb.exec("cat /dev/shm/alive").stdout == b"here\n"
        assert sb.status()["status"] == "ready"
        # The background heartbeat outlived the outage: past its timeout after the restart, still alive.
        time.sleep(max(0.0, 6.5 - (time.monotonic() - restarted)))
        assert beating.status()["status"] == "ready"


def test_sigterm_during_a_long_command_stops_after_the_grace_and_the_command_runs_on(
        fresh_router: RouterProcess) -> None:
    """A stop waited up to aiohttp's 60 s for calls in flight: as long as a supervisor's SIGKILL takes to come,
    and a router killed there leaves its mounts. It gives them 10 s, names them, and the command runs on."""
    router = fresh_router
    with router.client() as grove:
        sb = grove.create(heartbeat=False)
        caller, failure = _exec_in_a_thread(router, sb.id, "sleep 600")
        wait_for(lambda: procs_running(router.state_dir, sb.id, "sleep 600"), 10, what="the command to start")
        asked = time.monotonic()
        assert router.stop(timeout=45) == 0, router.log()
        took = time.monotonic() - asked
        caller.join(10)
        assert failure and not caller.is_alive()
        assert took < 40, f"the stop took {took:.1f} s"  # the grace (10 s) twice at most: wait, then cut
        assert f"calls in flight on {sb.id} (1) get 10 s to end" in router.log(), router.log()
        router.start()
        assert procs_running(router.state_dir, sb.id, "sleep 600")
        assert sb.exec("echo still").text == "still\n"


def test_sigkill_while_creating_then_restart(fresh_router: RouterProcess) -> None:
    """A create the router never finished is started over after a restart, not resumed half-made."""
    router = fresh_router
    made = []
    for attempt in range(3):
        reply = router.http("POST", "/v1/sandboxes", json_body={"wait": False, "request_id": f"crash-{attempt}"})
        assert reply.status == 201
        time.sleep(0.02 * attempt)  # die at different points of the start-up
        router.stop(signal.SIGKILL)
        made.append(reply.json()["id"])
        router.start()
        # A retried create (as the SDK does after a dropped connection) finds the same sandbox, and it works.
        again = router.http("POST", "/v1/sandboxes", json_body={"request_id": f"crash-{attempt}"})
        assert again.status == 201 and again.json()["id"] == made[-1], again.body
        assert again.json()["status"] == "ready"
        ran = router.http("POST", f"/v1/sandboxes/{made[-1]}/exec", json_body={"command": "echo up"})
        assert ran.status == 200 and ran.json()["stdout"] == "up\n", ran.body
    with router.client() as grove:
        assert sorted(s["id"] for s in grove.list()) == sorted(made)
        # As many processes as a sandbox made normally: nothing of an abandoned start-up survived.
        normal = len(cgroup_procs(router.state_dir, grove.create(heartbeat=False).id))
        for sandbox_id in made:
            assert len(cgroup_procs(router.state_dir, sandbox_id)) == normal


def test_dead_idle_and_orphaned_sandboxes_across_a_restart(fresh_router: RouterProcess) -> None:
    """While no router runs: one sandbox dies, one sleeps, one loses its record. The next router restarts
    the dead one on its next call, keeps the idle one idle, and removes the orphan entirely."""
    router = fresh_router
    with router.client() as grove:
        died = grove.create(heartbeat=False)
        died.write_file("/workspace/kept", "yes")
        asleep = grove.create(heartbeat=False, idle_timeout_s=1, heartbeat_timeout_s=60)
        asleep.write_file("/workspace/kept", "asleep")
        orphan = grove.create(heartbeat=False)
        orphan_pids = cgroup_procs(router.state_dir, orphan.id)
        assert orphan_pids
        wait_for(lambda: asleep.status()["status"] == "idle", 5, 0.1, "idle")
        router.stop()
        # Kill a sandbox's processes behind the router's back (they are ours: found in its cgroup).
        for pid in cgroup_procs(router.state_dir, died.id):
            os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not cgroup_procs(router.state_dir, died.id), 5, 0.05, "the sandbox to die")
        (router.layout.record(orphan.id)).unlink()
        router.start()

        assert "orphan" in router.log()
        assert not (router.layout.sandbox(orphan.id)).exists()
        assert all(p.name != orphan.id for p in sandbox_cgroups(router.state_dir))
        wait_for(lambda: not any(process_alive(pid) for pid in orphan_pids), 2, 0.02, "the orphan's processes to go")
        assert router.http("GET", f"/v1/sandboxes/{orphan.id}").status == 404
        assert sorted(s["id"] for s in grove.list()) == sorted([died.id, asleep.id])

        assert died.status()["status"] == "idle"
        assert asleep.status()["status"] == "idle"
        assert died.read_file("/workspace/kept") == b"yes"
        assert died.status()["status"] == "ready"
        assert asleep.exec("cat /workspace/kept").stdout == b"asleep"
        assert asleep.status()["status"] == "ready"


def test_a_new_runtime_bundle_leaves_running_sandboxes_theirs(fresh_router: RouterProcess) -> None:
    """An upgrade rebuilds the runtime bundle at the next start; sandboxes still running keep the one they
    have mounted (retired beside it, not deleted) until they stop."""
    router = fresh_router
    runtime = router.layout.runtime
    with router.client() as grove:
        sb = grove.create(heartbeat=False)
        listing = sb.exec("ls /.grove/lib | wc -l").stdout
        assert int(listing) > 5
        router.stop()
        old_stamp = json.loads((runtime / MANIFEST).read_text())["stamp"]
        rebuilt = subprocess.run([sys.executable, "-m", "sandbox_image.bundle", "build", str(runtime), "--force"],
                                 capture_output=True, text=True, timeout=600)
        assert rebuilt.returncode == 0, rebuilt.stderr
        retired = router.state_dir / f".runtime.retired-{old_stamp}"
        assert retired.is_dir()
        router.start()  # its collection at start keeps what the running sandbox uses
        assert retired.is_dir()
        # Every file of the old bundle is still there for the running sandbox, also ones it never opened.
        assert sb.exec("ls /.grove/lib | wc -l").stdout == listing
        assert sb.exec("cat /.grove/lib/python3.11/site-packages/grove/__init__.py >/dev/null").exit_code == 0
        sb.close()
    # Collected by the deleted sandbox's teardown pass, which runs after the delete has answered.
    wait_for(lambda: not retired.exists(), 30, what="the retired bundle collected once no sandbox uses it")
