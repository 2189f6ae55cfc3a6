"""The four timeouts through a real router: idle scale-to-zero and wake-up, TTL, heartbeat expiry.

The router's reaper runs every second, so each timeout below is set to a few seconds.
"""

from __future__ import annotations

import time

import pytest

from grove.client import Grove
from tests.support.killed_client import kill_a_client_mid_command
from tests.support.router_fixtures import RouterProcess, cgroup_procs, error_of, layer_file, wait_for, wait_removed


@pytest.fixture(scope="module")
def router(any_router: RouterProcess) -> RouterProcess:
    """This module runs against both backends (local and the Knative stand-in)."""
    return any_router


def _status(router: RouterProcess, sandbox_id: str) -> dict[str, object]:
    reply = router.http("GET", f"/v1/sandboxes/{sandbox_id}")
    assert reply.status == 200, reply.body
    info: dict[str, object] = reply.json()
    return info


@pytest.mark.local_only  # reads the sandbox cgroup on the host; test_knative_router covers idle/resume
def test_idle_scale_to_zero_and_transparent_wake(router: RouterProcess, grove: Grove) -> None:
    sb = grove.create(heartbeat=False, idle_timeout_s=2, heartbeat_timeout_s=60)
    sb.write_file("/workspace/kept.txt", "written before\n")
    sb.exec("echo made by a command > /root/also-kept; echo lost > /dev/shm/marker; sleep 300 &")
    assert len(cgroup_procs(router.state_dir, sb.id)) >= 2
    last_call = time.monotonic()

    wait_for(lambda: _status(router, sb.id)["status"] == "idle", 6, 0.1, "the sandbox to go idle")
    assert time.monotonic() - last_call > 1.9
    # Scaled to zero: not a single process left in its cgroup (the last zombies are reaped within
    # moments of PID 1's death), its files still on disk.
    wait_for(lambda: cgroup_procs(router.state_dir, sb.id) == [], 1, 0.01, "an empty cgroup")
    assert layer_file(router.state_dir, sb.id, "workspace/kept.txt") == b"written before\n"
    time.sleep(1.2)
    assert _status(router, sb.id)["status"] == "idle"  # a GET is not activity: it stays asleep
    assert [s["status"] for s in grove.list()] == ["idle"]

    # The next call starts it again, waiting like an activator instead of failing.
    r = sb.exec("cat /workspace/kept.txt /root/also-kept; ls /dev/shm; pgrep -c sleep || true")
    assert r.exit_code == 0, r.stderr
    assert r.stdout == b"written before\nmade by a command\n0\n"  # files kept; tmpfs and processes are new
    assert _status(router, sb.id)["status"] == "ready"
    assert cgroup_procs(router.state_dir, sb.id) != []
    assert sb.read_file("/workspace/kept.txt") == b"written before\n"


def test_a_file_call_wakes_an_idle_sandbox_too(router: RouterProcess, grove: Grove) -> None:
    sb = grove.create(heartbeat=False, idle_timeout_s=1, heartbeat_timeout_s=60)
    sb.write_file("/workspace/f", "x")
    wait_for(lambda: _status(router, sb.id)["status"] == "idle", 5, 0.1, "the sandbox to go idle")
    assert [e["name"] for e in sb.list_files("/workspace")] == ["f"]
    assert _status(router, sb.id)["status"] == "ready"


def test_activity_and_running_commands_keep_it_awake(router: RouterProcess, grove: Grove) -> None:
    busy = grove.create(heartbeat=False, idle_timeout_s=2, heartbeat_timeout_s=60)
    # One command longer than the idle timeout: a call in flight is not idleness.
    r = busy.exec("sleep 3.5; echo finished", timeout_s=10)
    assert r.stdout == b"finished\n"
    assert _status(router, busy.id)["status"] == "ready"
    # Calls more often than the idle timeout: it never sleeps.
    for _ in range(3):
        time.sleep(0.8)
        busy.exec("true")
        assert _status(router, busy.id)["status"] == "ready"


def test_ttl_expiry_deletes(router: RouterProcess, grove: Grove) -> None:
    asked = time.monotonic()  # the TTL counts from the create's arrival (a Knative create takes a second or so)
    sb = grove.create(ttl_s=2)  # the SDK heart-beats: the TTL wins anyway
    info = wait_for(lambda: (s := _status(router, sb.id))["status"] == "deleted" and s, 6, 0.1, "the TTL")
    assert time.monotonic() - asked > 1.9
    assert "ttl" in str(info["end_reason"])
    reply = router.http("POST", f"/v1/sandboxes/{sb.id}/exec", json_body={"command": "true"})
    assert reply.status == 409 and "ttl" in error_of(reply)["message"]
    wait_removed(router.state_dir, sb.id)  # its teardown's passes follow the delete
    assert not (router.layout.sandbox(sb.id)).exists()
    assert cgroup_procs(router.state_dir, sb.id) == []
    assert grove.list() == []


def test_heartbeat_expiry_vs_kept_alive(router: RouterProcess, grove: Grove) -> None:
    silent = grove.create(heartbeat=False, heartbeat_timeout_s=5)
    beating = grove.create(heartbeat_timeout_s=5)  # the SDK heart-beats every ~1.7 s in the background
    manual = grove.create(heartbeat=False, heartbeat_timeout_s=5)
    started = time.monotonic()
    # A command in flight longer than the heartbeat timeout: the client is waiting, not gone.
    long = manual.exec("sleep 6.5; echo survived", timeout_s=20)
    assert long.stdout == b"survived\n"

    info = wait_for(lambda: (s := _status(router, silent.id))["status"] == "deleted" and s, 8, 0.2,
                    "heartbeat expiry")
    assert time.monotonic() - started > 4.5
    assert "heartbeat" in str(info["end_reason"])
    while time.monotonic() - started < 8:
        manual.heartbeat()
        time.sleep(1)
    # Both outlived their heartbeat timeout by heart-beating.
    assert _status(router, beating.id)["status"] == "ready"
    assert _status(router, manual.id)["status"] == "ready"
    assert beating.exec("echo alive").stdout == b"alive\n"
    assert sorted(s["id"] for s in grove.list()) == sorted([beating.id, manual.id])


def test_a_client_killed_mid_command_is_gone_and_its_sandbox_reaped(router: RouterProcess, grove: Grove) -> None:
    """A trainer killed while it waits on a long command (SIGKILL, the OOM killer) stops heart-beating, and its
    connection closes: the call it left, running on in the sandbox, does not keep the sandbox past its heartbeat
    timeout (it kept it until the command ended: here 600 s)."""
    sandbox = grove.create(heartbeat=False, heartbeat_timeout_s=5)
    killed = kill_a_client_mid_command(router.url, router.key, sandbox)
    info = wait_for(lambda: (s := _status(router, sandbox.id))["status"] == "deleted" and s, 20, 0.2,
                    "the sandbox reaped by its heartbeat timeout")
    assert "heartbeat" in str(info["end_reason"]), info
    assert time.monotonic() - killed < 15
