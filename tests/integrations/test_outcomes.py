"""Reward bookkeeping a trainer can trust: an environment fault is recorded as ``infra_error``, never as the
policy's failure. The fault here is real: the sandbox's processes are SIGKILLed from the host, through its
cgroup, while a command runs."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct
import threading
from http.client import HTTPConnection, IncompleteRead
from typing import Any

import pytest

from artifacts.export import to_chat
from grove.client import Grove, Sandbox
from grove.core.errors import BadGateway, GroveError, Invalid
from tests.support.router_fixtures import RouterProcess, cgroup_procs, procs_running, wait_for


def kill_mid_command(router: RouterProcess, sandbox: Sandbox) -> GroveError:
    """Start a long command, SIGKILL everything in the sandbox's cgroup meanwhile; the error the call got."""
    caught: list[BaseException] = []

    def call() -> None:
        try:
            sandbox.exec("sleep 30", timeout_s=60)
        except BaseException as exc:
            caught.append(exc)

    thread = threading.Thread(target=call)
    thread.start()
    wait_for(lambda: procs_running(router.state_dir, sandbox.id, "sleep 30"), 10, what="the command to start")
    for pid in sorted(cgroup_procs(router.state_dir, sandbox.id)):  # oldest (the sandbox's PID 1) first
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    thread.join(30)
    assert not thread.is_alive() and len(caught) == 1, caught
    assert isinstance(caught[0], GroveError)
    return caught[0]


def after(sandbox: Sandbox) -> str | None:
    """``echo after`` in the sandbox; None while its executor is still being found gone."""
    try:
        return sandbox.exec("echo after").text
    except BadGateway:
        return None


def stored(grove: Grove, sandbox: Sandbox) -> dict[str, Any]:
    """Delete the sandbox and read its trajectory back from S3."""
    sandbox.close()
    record: dict[str, Any] = grove.request("GET", f"/v1/trajectories/{sandbox.id}")
    return record


def test_executor_lost_mid_command_is_an_infra_error_not_a_failure(router: RouterProcess) -> None:
    metadata = {"task_id": "infra-1", "model": "m", "harness": "grove-tests", "harness_version": "1"}
    with router.client() as grove:
        lost = grove.create("default", memory_mb=128, metadata=metadata)
        assert lost.exec("echo before").ok
        assert isinstance(kill_mid_command(router, lost), BadGateway)
        # A later call starts the sandbox again, files kept (one may still find the remains: another 502);
        # the fault stays on the record.
        assert wait_for(lambda: after(lost), 10, what="the sandbox to come back") == "after\n"
        record = stored(grove, lost)
        summaries = grove.request("GET", "/v1/trajectories", params={"task_id": "infra-1"})["trajectories"]

    outcome = record["outcome"]
    assert outcome["result"] == "infra_error" and outcome["reward"] is None
    assert "executor went away" in outcome["reason"] and outcome["infra_errors"]
    assert [s["stdout"] for s in record["steps"] if s["type"] == "exec" and "error" not in s] == [b"before\n",
                                                                                               b"after\n"]
    # The exec that lost the executor is a step too, with its error.
    assert any(s["type"] == "exec" and s["error"]["status"] == 502 for s in record["steps"] if "error" in s)
    metadata_out = to_chat(record)["metadata"]
    assert metadata_out["result"] == "infra_error" and metadata_out["resolved"] is None
    assert metadata_out["reward"] is None and metadata_out["infra_errors"]
    assert summaries[0]["result"] == "infra_error" and summaries[0]["infra_errors"] >= 1


def test_a_posted_result_keeps_the_faults_beside_it(router: RouterProcess) -> None:
    with router.client() as grove:
        sandbox = grove.create("default", memory_mb=128)
        kill_mid_command(router, sandbox)
        grove.request("POST", f"/v1/sandboxes/{sandbox.id}/events",
                      json_body={"kind": "result", "data": {"result": "fail", "reward": 0.0}})
        record = stored(grove, sandbox)
        clean = grove.create("default", memory_mb=128)
        clean.exec("true")
        events = f"/v1/sandboxes/{clean.id}/events"
        with pytest.raises(Invalid):  # only pass, fail and infra_error are results
            grove.request("POST", events, json_body={"kind": "result", "data": {"result": "maybe"}})
        grove.request("POST", events, json_body={"kind": "result", "data": {"result": "pass", "reward": 1.0}})
        clean_record = stored(grove, clean)
    assert record["outcome"]["result"] == "fail" and len(record["outcome"]["infra_errors"]) >= 1
    assert to_chat(record)["metadata"]["infra_errors"]
    assert clean_record["outcome"] == {"result": "pass", "reward": 1.0, "reason": None}


def _hang_up(conn: HTTPConnection) -> None:
    """Close with a reset, as a killed client's kernel does with unread data: no polite end of the stream."""
    assert conn.sock is not None
    conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()


def test_a_caller_who_hangs_up_mid_download_is_no_fault_of_the_sandbox(router: RouterProcess) -> None:
    """A trainer killed mid-download (or an SDK call cut by its own timeout) left the trajectory an infra error:
    the failed write to the caller was read as the executor lost, and training drops such attempts."""
    with router.client() as grove:
        sandbox = grove.create("default", memory_mb=128)
        assert sandbox.exec("head -c 64M /dev/urandom > /tmp/big && echo ok").text == "ok\n"
        before = router.log()
        for _ in range(3):  # a hang-up may come at the headers, mid-body or at its end: one is enough to fail
            resp, conn = router.send("GET", f"/v1/sandboxes/{sandbox.id}/files?path=/tmp/big")
            assert resp.status == 200 and len(resp.read(256 * 1024)) == 256 * 1024
            _hang_up(conn)
        # A command's answer is read to its end though its caller left: the step it made is recorded.
        conn = HTTPConnection("127.0.0.1", router.port, timeout=30)
        conn.request("POST", f"/v1/sandboxes/{sandbox.id}/exec",
                     body=json.dumps({"command": "sleep 2; echo left-behind"}),
                     headers={"Authorization": f"Bearer {router.key}", "Content-Type": "application/json"})
        wait_for(lambda: procs_running(router.state_dir, sandbox.id, "sleep 2"), 10, what="the command to start")
        _hang_up(conn)
        wait_for(lambda: left_behind(grove, sandbox), 10, what="the step of the command whose caller left")
        assert sandbox.exec("echo after").text == "after\n"
        record = stored(grove, sandbox)
    said = router.log()[len(before):]
    assert "infra error" not in said and "Error handling request" not in said, said
    assert record["outcome"] is None  # no result posted, and no fault: not infra_error
    assert not [s for s in record["steps"] if s["type"] == "lifecycle" and s.get("event") == "scaled_to_zero"]


def left_behind(grove: Grove, sandbox: Sandbox) -> list[dict[str, Any]]:
    """The exec steps of ``sleep 2; echo left-behind`` in the sandbox's trajectory so far."""
    steps = grove.request("GET", f"/v1/sandboxes/{sandbox.id}/trajectory")["steps"]
    return [s for s in steps if s["type"] == "exec" and s["command"] == "sleep 2; echo left-behind"
            and s["stdout"] == "left-behind\n"]


def test_an_executor_lost_mid_download_cuts_the_answer_and_is_an_infra_error(router: RouterProcess) -> None:
    """The answer had started: the caller sees it cut short (not a clean end), the trajectory the fault, and the
    router's log one line, not a traceback per cut answer."""
    with router.client() as grove:
        sandbox = grove.create("default", memory_mb=128)
        assert sandbox.exec("head -c 64M /dev/urandom > /tmp/big && echo ok").text == "ok\n"
        before = router.log()
        resp, conn = router.send("GET", f"/v1/sandboxes/{sandbox.id}/files?path=/tmp/big")
        try:
            assert resp.status == 200 and len(resp.read(64 * 1024)) == 64 * 1024
            for pid in sorted(cgroup_procs(router.state_dir, sandbox.id)):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            with pytest.raises((IncompleteRead, ConnectionError)):
                resp.read()  # short of its Content-Length
        finally:
            conn.close()
        assert wait_for(lambda: after(sandbox), 10, what="the sandbox to come back") == "after\n"
        record = stored(grove, sandbox)
    said = router.log()[len(before):]
    assert "Error handling request" not in said and "Traceback" not in said, said
    assert record["outcome"]["result"] == "infra_error", record["outcome"]
    assert any("GET /v1/files" in fault["reason"] for fault in record["outcome"]["infra_errors"]), record["outcome"]
