"""Issue 18, finding 6 (router side): a fault the sandbox caused itself is recorded as its own doing.

A command that uses all of its sandbox's memory can make the kernel's OOM killer end PID 1 (and with it
the executor). That used to read as ``infra_error``, which training drops, and the exec that caused it was
not in the trajectory. Now the exec is a step with its error, the fault is a ``sandbox_errors`` entry
naming the memory, and the outcome is ``fail``.

Which process the kernel picks is its choice; the test makes PID 1 its first choice (``oom_score_adj``
1000 on PID 1, 0 on the hog, set from the host) so the run is deterministic — the memory used is the
sandbox's own either way.
"""

from __future__ import annotations

import contextlib
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from grove.client import Grove
from tests.support.router_fixtures import RouterProcess, cgroup_procs, procs_running, wait_for


def test_pid1_oom_killed_by_the_sandboxs_own_memory_use_is_its_fault(router: RouterProcess, grove: Grove) -> None:
    sandbox = grove.create(heartbeat=False, memory_mb=128)
    assert sandbox.exec("true").exit_code == 0
    pid1 = json.loads((router.state_dir / "records" / f"{sandbox.id}.json").read_text())["handle"]["pid"]
    Path(f"/proc/{pid1}/oom_score_adj").write_text("1000")
    hog = "python3 -c 'import time; time.sleep(1); b = bytearray(400 * 2**20)'"
    with ThreadPoolExecutor(1) as pool:
        call = pool.submit(router.http, "POST", f"/v1/sandboxes/{sandbox.id}/exec", json_body={"command": hog},
                           timeout=60)
        hogs = wait_for(lambda: procs_running(router.state_dir, sandbox.id, "bytearray", "memory"), 10, 0.02,
                        "the hog")
        time.sleep(0.2)  # the shell has started python (or exec'd it)
        for pid in hogs + [p for p in cgroup_procs(router.state_dir, sandbox.id, "memory") if p != pid1]:
            with contextlib.suppress(OSError):
                Path(f"/proc/{pid}/oom_score_adj").write_text("0")  # they inherited PID 1's 1000
        reply = call.result()
    assert reply.status == 502, (reply.status, reply.body[:300])
    record = grove.request("GET", f"/v1/sandboxes/{sandbox.id}/trajectory")
    outcome = record["outcome"]
    assert outcome["result"] == "fail" and "infra_errors" not in outcome, outcome
    assert "memory" in outcome["reason"] and "memory" in outcome["sandbox_errors"][0]["reason"], outcome
    step = [s for s in record["steps"] if s.get("type") == "exec"][-1]
    assert step["command"] == hog and step["error"]["status"] == 502, step
    # The sandbox comes back on the next call; a plain command works again.
    assert sandbox.exec("echo back").stdout == b"back\n"
    sandbox.close()
