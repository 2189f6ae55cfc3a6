"""The router SIGKILLed while 20 creates and execs are in flight: after a restart every sandbox on the
host is one the router knows and can use, and nothing else is left (no cgroup, directory or process)."""

from __future__ import annotations

import signal
import threading
import time
from http.client import HTTPException

from tests.support.router_fixtures import RouterProcess, cgroup_procs, sandbox_cgroups, wait_for


def test_sigkill_mid_burst_then_restart(fresh_router: RouterProcess) -> None:
    router = fresh_router

    def one(i: int) -> None:
        try:
            reply = router.http("POST", "/v1/sandboxes", json_body={"metadata": {"task_id": f"burst-{i}"}}, timeout=30)
            if reply.status == 201:
                sandbox_id = reply.json()["id"]
                router.http("POST", f"/v1/sandboxes/{sandbox_id}/exec", json_body={"command": "sleep 0.2; echo x"},
                            timeout=30)
        except (OSError, HTTPException):  # a refused or reset connection, or an answer cut short
            pass  # the router died under this call: expected

    threads = [threading.Thread(target=one, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
        time.sleep(0.01)
    time.sleep(0.4)
    assert router.stop(signal.SIGKILL) == -signal.SIGKILL
    for t in threads:
        t.join(40)
    router.start()
    # Creations the kill interrupted start over in the background once the router is up: let them finish.
    wait_for(lambda: all(s["status"] != "pending" for s in router.http("GET", "/v1/sandboxes").json()["sandboxes"]),
             60, 0.1, "interrupted creations to finish")

    live = router.live_ids()
    on_host = {p.name for p in (router.layout.sandboxes).iterdir()}
    cgroups = {p.name for p in sandbox_cgroups(router.state_dir)}
    assert on_host == live, (on_host - live, live - on_host)
    assert cgroups == live, (cgroups, live)
    for sandbox_id in live:  # re-adopted (or restarted): each one works
        reply = router.http("POST", f"/v1/sandboxes/{sandbox_id}/exec", json_body={"command": "echo ok"})
        assert reply.status == 200 and reply.json()["stdout"] == "ok\n", (sandbox_id, reply.body)
        assert cgroup_procs(router.state_dir, sandbox_id)
    # Deleting them all through the API leaves the host clean (the fixture checks for leaks too).
    router.delete_all()
    wait_for(lambda: not list((router.layout.sandboxes).iterdir()), 30, 0.1, "the deleted sandboxes' remains removed")
