"""Background processes through a real router into a real local sandbox: started by one call and outliving it,
their output followed as it comes, signalled and waited for, capped in number, recorded as steps, and gone with
the sandbox."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from executor.processes import MAX_RUNNING
from grove.client import Grove, Sandbox
from grove.errors import Conflict, Invalid, NotFound
from tests.support.router_fixtures import RouterProcess, cgroup_procs, error_of, process_alive, wait_for


def process_steps(router: RouterProcess, sandbox: Sandbox) -> list[dict[str, Any]]:
    """The process steps of the sandbox's live trajectory."""
    trajectory = router.http("GET", f"/v1/sandboxes/{sandbox.id}/trajectory").json()
    return [s for s in trajectory["steps"] if s.get("type") == "process"]


def host_pids_running(state_dir: Path, sandbox_id: str, marker: str) -> list[int]:
    """Host PIDs of the sandbox's processes whose command line holds ``marker``."""
    found = []
    for pid in cgroup_procs(state_dir, sandbox_id):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.append(pid)
    return found


def test_a_background_process_outlives_its_call_and_ends_with_the_sandbox(router: RouterProcess,
                                                                          grove: Grove) -> None:
    sandbox = grove.create(heartbeat=False)
    started = sandbox.processes.start("echo up; exec sleep 612", env={"MARK": "1"})
    assert started.running and started.pid > 1 and started.command == ["/bin/sh", "-c", "echo up; exec sleep 612"]
    # The call has returned; the process runs on while other calls come and go.
    assert sandbox.exec("echo other").stdout == b"other\n"
    assert sandbox.processes.get(started.pid).running
    assert wait_for(lambda: sandbox.processes.logs(started.pid), 10, what="its first line") == b"up\n"
    host = wait_for(lambda: host_pids_running(router.state_dir, sandbox.id, "612"), 10, what="sleep in the cgroup")
    assert [p.pid for p in sandbox.processes.list()] == [started.pid]
    [start] = process_steps(router, sandbox)
    assert start["event"] == "start" and start["pid"] == started.pid and start["env_keys"] == ["MARK"]
    sandbox.close()
    wait_for(lambda: not any(process_alive(pid) for pid in host), 20, what="the process gone with its sandbox")


def test_logs_follow_streams_output_until_the_process_ends(router: RouterProcess, sandbox: Sandbox) -> None:
    proc = sandbox.processes.start("for i in 1 2 3 4; do echo line $i; echo err $i >&2; sleep 0.3; done; exit 3")
    chunks = list(sandbox.processes.follow(proc.pid))
    whole = b"".join(chunks)
    assert whole == b"".join(f"line {i}\nerr {i}\n".encode() for i in range(1, 5))
    assert len(chunks) > 1  # it came as it was written, not in one piece at the end
    ended = sandbox.processes.get(proc.pid)
    assert (ended.status, ended.exit_code) == ("exited", 3)
    assert sandbox.processes.logs(proc.pid, offset=len(whole) - 6) == b"err 4\n"
    assert list(sandbox.processes.follow(proc.pid, offset=len(whole))) == []  # ended: the follow ends at once
    exits = [s for s in process_steps(router, sandbox) if s["event"] == "exit" and s["pid"] == proc.pid]
    assert len(exits) == 1 and exits[0]["exit_code"] == 3 and exits[0]["duration_s"] > 0


def test_signal_and_wait(router: RouterProcess, sandbox: Sandbox) -> None:
    proc = sandbox.processes.start(["/bin/sh", "-c", "trap 'echo got term; exit 7' TERM; while :; do sleep 0.1; done"])
    waited = sandbox.processes.wait(proc.pid, timeout_s=0.3)
    assert waited.running and waited.exit_code is None
    assert sandbox.processes.signal(proc.pid, "TERM").signalled == "SIGTERM"
    ended = sandbox.processes.wait(proc.pid, timeout_s=30)
    assert (ended.status, ended.exit_code, ended.signalled) == ("exited", 7, "SIGTERM")
    assert b"got term" in sandbox.processes.logs(proc.pid)
    with pytest.raises(Conflict, match="already exited"):
        sandbox.processes.signal(proc.pid, "SIGTERM")

    killed = sandbox.processes.start("sleep 600 & sleep 601; wait")
    assert sandbox.processes.signal(killed.pid, "SIGKILL").signalled == "SIGKILL"
    gone = sandbox.processes.wait(killed.pid, timeout_s=30)
    assert gone.exit_code == 137
    assert "sleep 60" not in sandbox.exec("ps -eo args 2>/dev/null || cat /proc/[0-9]*/cmdline").text  # its child too


def test_bad_requests_are_named(router: RouterProcess, sandbox: Sandbox) -> None:
    with pytest.raises(Invalid, match="unknown signal"):
        sandbox.processes.signal(sandbox.processes.start("sleep 5").pid, "SIGNOPE")
    with pytest.raises(NotFound, match="no background process 999999"):
        sandbox.processes.get(999999)
    with pytest.raises(NotFound, match="not a directory"):
        sandbox.processes.start("true", cwd="/no/such/dir")
    with pytest.raises(NotFound, match="program not found"):
        sandbox.processes.start(["/no/such/program"])
    reply = router.http("GET", f"/v1/sandboxes/{sandbox.id}/processes/web-server")
    assert reply.status == 404 and "named by its pid" in error_of(reply)["message"]
    reply = router.http("POST", f"/v1/sandboxes/{sandbox.id}/processes", json_body={"command": "true", "stdin": "x"})
    assert reply.status == 400 and "unknown field(s) 'stdin'" in error_of(reply)["message"]
    reply = router.http("POST", f"/v1/sandboxes/{sandbox.id}/processes", json_body={"cwd": "/"})
    assert reply.status == 400 and "'command'" in error_of(reply)["message"]
    reply = router.http("POST", f"/v1/sandboxes/{sandbox.id}/processes/1/wait", json_body={"timeout_s": 9999})
    assert reply.status == 422 and "wait again" in error_of(reply)["message"]
    reply = router.http("POST", f"/v1/sandboxes/{sandbox.id}/processes/1/wait", json_body={"timeout_s": "soon"})
    assert reply.status == 400 and "number of seconds" in error_of(reply)["message"]
    reply = router.http("POST", f"/v1/sandboxes/{sandbox.id}/processes/1/signal", json_body=["TERM"])
    assert reply.status == 400 and "JSON object" in error_of(reply)["message"]


def test_the_count_of_running_processes_is_capped(router: RouterProcess, grove: Grove) -> None:
    sandbox = grove.create(heartbeat=False)
    pids = [sandbox.processes.start("exec sleep 600").pid for _ in range(MAX_RUNNING)]
    with pytest.raises(Conflict, match=f"already runs {MAX_RUNNING} background processes") as refused:
        sandbox.processes.start("echo one too many")
    assert "signal" in str(refused.value)
    assert sandbox.exec("echo exec still works").ok  # the cap is on background processes, not on execs
    sandbox.processes.signal(pids[0], "SIGKILL")
    sandbox.processes.wait(pids[0], timeout_s=30)
    again = sandbox.processes.start("echo room again; exec sleep 600")
    assert again.running and again.pid not in pids
    assert len([p for p in sandbox.processes.list() if p.running]) == MAX_RUNNING


def test_a_process_runs_where_and_as_whom_it_is_told(router: RouterProcess, sandbox: Sandbox) -> None:
    sandbox.exec("mkdir -p /workspace/here")
    proc = sandbox.processes.start("echo $(id -u) $GREETING $(pwd)", user="nobody", env={"GREETING": "hi"},
                                   cwd="/workspace/here")
    assert sandbox.processes.wait(proc.pid, timeout_s=30).exit_code == 0
    assert sandbox.processes.logs(proc.pid) == b"65534 hi /workspace/here\n"
    [start] = [s for s in process_steps(router, sandbox) if s["event"] == "start" and s["pid"] == proc.pid]
    assert (start["user"], start["cwd"], start["env_keys"]) == ("nobody", "/workspace/here", ["GREETING"])


def test_a_log_the_sandbox_replaced_is_refused_not_waited_on(router: RouterProcess, sandbox: Sandbox) -> None:
    proc = sandbox.processes.start("echo once")
    log = sandbox.processes.get(proc.pid).raw["log"]
    sandbox.processes.wait(proc.pid, timeout_s=30)
    assert sandbox.exec(f"rm {log} && mkfifo {log}").ok
    with pytest.raises(Conflict, match="no longer a regular file"):
        sandbox.processes.logs(proc.pid)
    assert sandbox.exec(f"rm {log}").ok
    with pytest.raises(NotFound, match="is gone"):
        sandbox.processes.logs(proc.pid)
