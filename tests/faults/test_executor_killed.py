"""An executor killed mid-command: that call gets a clear 502, the sandbox comes back or says why not,
and the sandbox next to it never notices."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from typing import Any

from grove.client import Grove
from tests.support.router_fixtures import RouterProcess, cgroup_procs, error_of, wait_for


def test_executor_sigkilled_mid_command(router: RouterProcess, grove: Grove) -> None:
    victim = grove.create(heartbeat=False)
    bystander = grove.create(heartbeat=False)
    bystander.exec("echo kept > /workspace/f")
    victim.exec("echo layer > /workspace/f")
    got: dict[str, Any] = {}

    def run() -> None:
        got["reply"] = router.http("POST", f"/v1/sandboxes/{victim.id}/exec",
                                   json_body={"command": "echo started; sleep 30", "timeout_s": 60})

    caller = threading.Thread(target=run)
    started = time.monotonic()
    caller.start()
    wait_for(lambda: len(cgroup_procs(router.state_dir, victim.id)) >= 2, 10, interval=0.02, what="command running")
    time.sleep(0.2)
    for pid in cgroup_procs(router.state_dir, victim.id):  # the executor (PID 1) and the command, from the host
        with contextlib.suppress(ProcessLookupError):  # one that ended since the list was read
            os.kill(pid, signal.SIGKILL)
    caller.join(20)
    assert not caller.is_alive(), "the exec call hung after its executor died"
    reply = got["reply"]
    assert reply.status in (502, 503), (reply.status, reply.body)
    err = error_of(reply)
    assert err["code"] in ("bad_gateway", "unavailable"), err
    assert "executor" in err["message"] or victim.id in err["message"], err
    assert time.monotonic() - started < 15

    # The next call finds the sandbox restarted over its own layer, or failed with the reason.
    after = router.http("POST", f"/v1/sandboxes/{victim.id}/exec", json_body={"command": "cat /workspace/f"})
    status = router.http("GET", f"/v1/sandboxes/{victim.id}").json()
    if after.status == 200:
        assert after.json()["stdout"] == "layer\n"
    else:
        assert after.status in (502, 503, 409), after.body
        assert status["status"] in ("failed", "stopped", "deleted"), (after.status, after.body, status)
        assert any(status.get(k) for k in ("end_reason", "reason", "error")), status
    # Untouched: the other sandbox, its files and its processes.
    assert bystander.exec("cat /workspace/f").stdout == b"kept\n"
    assert router.http("GET", f"/v1/sandboxes/{bystander.id}").json()["status"] == "ready"
