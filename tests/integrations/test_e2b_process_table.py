"""One process table per sandbox: E2B's ``process.Process`` calls (the real ``e2b`` SDK's ``commands``) and grove's
``/v1/processes`` (the SDK's ``processes``, the CLI's ``grove ps``) see, signal and count the same processes."""

from __future__ import annotations

import json

import pytest
from e2b import CommandExitException, Sandbox
from e2b.exceptions import SandboxException

from executor.processes import MAX_RUNNING
from tests.integrations.test_e2b import steps_of
from tests.support.router_fixtures import RouterProcess, wait_for


def test_a_process_started_either_way_is_seen_and_ended_the_other(router: RouterProcess, e2b_env: None) -> None:
    sbx = Sandbox.create("base", timeout=120)
    try:
        with router.client() as client:
            grove_side = client.attach(sbx.sandbox_id)
            # Started through E2B (with its tag-less background command and stdin): grove lists it, with its log.
            handle = sbx.commands.run("while read line; do echo got:$line; done", background=True, stdin=True)
            sbx.commands.send_stdin(handle.pid, "one\n")
            listed = {p.pid: p for p in grove_side.processes.list()}
            assert listed[handle.pid].running
            assert listed[handle.pid].command == ["/bin/bash", "-l", "-c", "while read line; do echo got:$line; done"]
            logged = wait_for(lambda: grove_side.processes.logs(handle.pid), 20, what="its line in the log")
            assert logged == b"got:one\n"
            assert str(handle.pid) in router.cli("ps", sbx.sandbox_id).stdout.decode()
            # Ended through grove: E2B's waiting handle sees the kill.
            grove_side.processes.signal(handle.pid, "SIGKILL")
            with pytest.raises(CommandExitException) as killed:
                handle.wait()
            assert killed.value.stdout == "got:one\n"
            assert handle.pid not in [p.pid for p in sbx.commands.list()]  # E2B lists running ones only
            assert grove_side.processes.get(handle.pid).exit_code == 137  # grove remembers it ended

            # Started through grove: E2B lists it, attaches to its output from now on, and kills it.
            loop = "while true; do echo tick; sleep 0.2; done"
            started = grove_side.processes.start(loop, env={"MODE": "x"})
            [info] = [p for p in sbx.commands.list() if p.pid == started.pid]
            assert (info.cmd, info.args, info.envs) == ("/bin/sh", ["-c", loop], {"MODE": "x"})
            attached = sbx.commands.connect(started.pid)
            ticks = grove_side.processes.logs(started.pid).count(b"tick")
            wait_for(lambda: grove_side.processes.logs(started.pid).count(b"tick") > ticks + 1, 20, what="more ticks")
            assert sbx.commands.kill(started.pid)
            with pytest.raises(CommandExitException) as ended:
                attached.wait()
            assert "tick\n" in ended.value.stdout  # what it wrote while attached
            assert grove_side.processes.wait(started.pid, timeout_s=30).exit_code == 137
            assert not sbx.commands.kill(started.pid)  # ended: E2B's not-found, not grove's conflict

        # An E2B command's end is its exec step (via e2b), not a second "process exit" step of grove's.
        steps = steps_of(router, sbx.sandbox_id)
        exits = [s for s in steps if s["type"] == "process" and s["event"] == "exit"]
        assert [s["pid"] for s in exits] == [started.pid]
    finally:
        sbx.kill()


def test_one_cap_counts_both_kinds(router: RouterProcess, e2b_env: None) -> None:
    sbx = Sandbox.create("base", timeout=120)
    try:
        with router.client() as client:
            grove_side = client.attach(sbx.sandbox_id)
            half = MAX_RUNNING // 2
            by_grove = [grove_side.processes.start("exec sleep 600").pid for _ in range(half)]
            by_e2b = [sbx.commands.run("sleep 600", background=True).pid for _ in range(MAX_RUNNING - half)]
            assert len({p.pid for p in grove_side.processes.list() if p.running}) == MAX_RUNNING
            with pytest.raises(SandboxException, match=f"already runs {MAX_RUNNING} background processes"):
                sbx.commands.run("echo one too many")
            rows = json.loads(router.cli("proc", "ls", sbx.sandbox_id, "--json").stdout)
            assert {r["pid"] for r in rows} == set(by_grove + by_e2b)
            assert sbx.commands.kill(by_grove[0])  # room again, for either side
            grove_side.processes.wait(by_grove[0], timeout_s=30)
            assert sbx.commands.run("echo room").stdout == "room\n"
    finally:
        sbx.kill()
