"""Background processes' exits recorded when they happen, through a real router into real sandboxes: with
nobody asking the process API and at scale-to-zero (local backend: on Knative the router keeps no long poll),
at the delete with the signal that ended the process, and never twice when the API was asked as well (both
backends)."""

from __future__ import annotations

from typing import Any

import pytest

from grove.client import Grove, Sandbox
from tests.support.router_fixtures import RouterProcess, wait_for


@pytest.fixture(scope="module")
def router(any_router: RouterProcess) -> RouterProcess:
    """The delete and the no-duplicate tests run against both backends (local and the Knative stand-in)."""
    return any_router


def exits_in(steps: list[dict[str, Any]], pid: int) -> list[dict[str, Any]]:
    """The exit steps of one process."""
    return [s for s in steps if s.get("type") == "process" and s.get("event") == "exit" and s.get("pid") == pid]


def live_steps(router: RouterProcess, sandbox: Sandbox) -> list[dict[str, Any]]:
    """The steps of the sandbox's live trajectory (reading it calls no process API)."""
    steps: list[dict[str, Any]] = router.http("GET", f"/v1/sandboxes/{sandbox.id}/trajectory").json()["steps"]
    return steps


def stored_steps(grove: Grove, sandbox_id: str) -> list[dict[str, Any]]:
    """The steps of the sandbox's stored (closed) trajectory."""
    steps: list[dict[str, Any]] = grove.request("GET", f"/v1/trajectories/{sandbox_id}")["steps"]
    return steps


@pytest.mark.local_only  # on Knative a held poll would keep the pod up: the exit waits for a call or the delete
def test_an_exit_is_recorded_when_it_happens(router: RouterProcess, grove: Grove) -> None:
    sandbox = grove.create(heartbeat=False)
    proc = sandbox.processes.start("sleep 0.5; exit 3")
    # Nobody calls the process API again: the router hears of the exit on its own.
    [step] = wait_for(lambda: exits_in(live_steps(router, sandbox), proc.pid), 30, what="the exit step")
    assert step["exit_code"] == 3 and step["signalled"] is None and step["command"] == ["/bin/sh", "-c",
                                                                                         "sleep 0.5; exit 3"]
    assert step["t"] >= proc.started_at + 0.5 and step["duration_s"] >= 0.5
    sandbox.close()
    assert len(exits_in(stored_steps(grove, sandbox.id), proc.pid)) == 1


def test_a_process_running_at_the_delete_has_its_exit_and_signal_recorded(router: RouterProcess,
                                                                          grove: Grove) -> None:
    sandbox = grove.create(heartbeat=False)
    proc = sandbox.processes.start("exec sleep 600")
    stubborn = sandbox.processes.start(["/bin/sh", "-c", "trap '' TERM; while :; do sleep 0.1; done"])
    sandbox.close()
    steps = stored_steps(grove, sandbox.id)
    [ended] = exits_in(steps, proc.pid)
    assert (ended["exit_code"], ended["signalled"]) == (128 + 15, "SIGTERM")
    [killed] = exits_in(steps, stubborn.pid)  # it ignored SIGTERM: SIGKILL after the grace
    assert (killed["exit_code"], killed["signalled"]) == (128 + 9, "SIGKILL")


def test_no_duplicate_when_wait_also_answered_the_exit(router: RouterProcess, grove: Grove) -> None:
    sandbox = grove.create(heartbeat=False)
    proc = sandbox.processes.start("sleep 0.3; exit 5")
    waited = sandbox.processes.wait(proc.pid, timeout_s=30)
    assert (waited.status, waited.exit_code) == ("exited", 5)
    assert sandbox.processes.get(proc.pid).exit_code == 5  # asked once more: still one step
    wait_for(lambda: exits_in(live_steps(router, sandbox), proc.pid), 30, what="the exit step")
    sandbox.close()
    [step] = exits_in(stored_steps(grove, sandbox.id), proc.pid)
    assert step["exit_code"] == 5


@pytest.mark.local_only  # Knative's own scale-to-zero ends the pod before the router hears of it
def test_scaling_to_zero_records_the_exits_of_what_it_ends(router: RouterProcess, grove: Grove) -> None:
    sandbox = grove.create(heartbeat=False, idle_timeout_s=2, heartbeat_timeout_s=60)
    proc = sandbox.processes.start("exec sleep 600")
    # The router's own watch on the process moves no clock: the sandbox still goes idle.
    wait_for(lambda: grove.request("GET", f"/v1/sandboxes/{sandbox.id}")["status"] == "idle", 15,
             what="the sandbox to go idle")
    [step] = exits_in(live_steps(router, sandbox), proc.pid)
    assert (step["exit_code"], step["signalled"]) == (128 + 15, "SIGTERM")
    events = [s.get("event") for s in live_steps(router, sandbox)]
    assert events.index("exit") < events.index("scaled_to_zero")
    sandbox.close()
    assert len(exits_in(stored_steps(grove, sandbox.id), proc.pid)) == 1
