"""Limits enforced through a real router: memory (OOM kill with a clear result), pids (fork bomb), CPU quota.

After each, the sandbox still answers and the host is fine.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from grove.client import Grove
from router.backends.local.hogs import HOG_SHARES, NORMAL_SHARES, RELEASE_S
from tests.support.router_fixtures import CGROUP_ROOT, RouterProcess, error_of, instance_of, wait_for

CPU_PROBE = (
    "import os, time\n"
    "t = time.monotonic()\n"
    "while time.monotonic() - t < 1.0: pass\n"
    "c = os.times()\n"
    "print(round(c.user + c.system, 3))\n"
)


def _host_can_fork() -> bool:
    return subprocess.run(["true"], check=False, timeout=10).returncode == 0


def test_memory_hog_is_oom_killed_and_the_sandbox_lives_on(router: RouterProcess, grove: Grove) -> None:
    sb = grove.create(heartbeat=False, memory_mb=128)
    limit = CGROUP_ROOT / "memory" / f"grove-{instance_of(router.state_dir)}" / sb.id / "memory.limit_in_bytes"
    assert int(limit.read_text()) == 128 * 1024 * 1024
    r = sb.exec(["python3", "-c", "b = bytearray(400 * 1024 * 1024); print('survived')"], timeout_s=60)
    assert r.exit_code == 137 and r.oom_killed and not r.timed_out
    assert b"survived" not in r.stdout
    assert b"out-of-memory" in r.stderr
    # The executor was not the victim: the same sandbox answers, without a restart.
    assert sb.exec("echo still here").stdout == b"still here\n"
    assert sb.status()["status"] == "ready"
    small = sb.exec(["python3", "-c", "b = bytearray(32 * 1024 * 1024); print(len(b))"])
    assert small.stdout == b"33554432\n" and not small.oom_killed
    assert _host_can_fork()


def _pids_events_max(router: RouterProcess, sandbox_id: str) -> int:
    """How often the sandbox's pids cgroup refused a fork (``pids.events``)."""
    path = CGROUP_ROOT / "pids" / f"grove-{instance_of(router.state_dir)}" / sandbox_id / "pids.events"
    return int(path.read_text().split()[1])


def _exec_when_it_answers(router: RouterProcess, sandbox_id: str, command: str, within_s: float) -> dict[str, object]:
    """Run a command, retrying while the sandbox is out of processes (a clear 503 with Retry-After)."""
    deadline = time.monotonic() + within_s
    while True:
        reply = router.http("POST", f"/v1/sandboxes/{sandbox_id}/exec", json_body={"command": command})
        if reply.status == 200:
            result: dict[str, object] = reply.json()
            return result
        assert reply.status == 503 and "pids_max" in error_of(reply)["message"], reply.body
        assert reply.headers["Retry-After"]
        assert time.monotonic() < deadline, "the sandbox did not recover"
        time.sleep(0.3)


def test_fork_loop_hits_pids_max(router: RouterProcess, grove: Grove) -> None:
    sb = grove.create(heartbeat=False, pids_max=32)
    started = time.monotonic()
    # bash retries a failed fork with back-off; the command timeout ends it and kills its whole group.
    r = sb.exec(["bash", "-c", "for i in $(seq 100); do sleep 30 & done; echo done"], timeout_s=4)
    assert time.monotonic() - started < 10
    assert r.timed_out
    assert b"Resource temporarily unavailable" in r.stderr, r.stderr[-500:]
    assert _pids_events_max(router, sb.id) > 0
    assert _host_can_fork()
    # The sleeps that did start went with the command's group. Until PID 1 has reaped the last of them they
    # still count against pids_max (ps may not fork yet), so look for a few seconds, not once.
    wait_for(lambda: sb.exec("ps -e | grep -c 'sleep' || true").stdout.strip() == b"0", 5,
             what="the command's sleeps to be gone")
    assert sb.exec("for i in $(seq 10); do sleep 0.1 & done; wait; echo ok").stdout == b"ok\n"


def test_fork_bomb(router: RouterProcess, grove: Grove) -> None:
    """A real self-replicating fork bomb: it runs into pids_max and collapses; the host never notices."""
    sb = grove.create(heartbeat=False, pids_max=16)
    r = sb.exec("b() { b | b & }; b; sleep 1", timeout_s=5)
    assert b"Cannot fork" in r.stderr or b"Resource temporarily unavailable" in r.stderr, r.stderr[-300:]
    assert _pids_events_max(router, sb.id) > 0
    assert _host_can_fork()
    result = _exec_when_it_answers(router, sb.id, "echo alive", within_s=15)
    assert result["stdout"] == "alive\n"
    assert sb.status()["status"] == "ready"


def test_cpu_quota(router: RouterProcess, grove: Grove) -> None:
    slow = grove.create(heartbeat=False, cpu=0.2)
    fast = grove.create(heartbeat=False, cpu=1.0)
    slow_cpu = float(slow.exec(["python3", "-c", CPU_PROBE], timeout_s=30).stdout)
    fast_cpu = float(fast.exec(["python3", "-c", CPU_PROBE], timeout_s=30).stdout)
    # 0.2 CPU for ~1 s of wall time: about 0.2 s of CPU (plus the interpreter's start-up, same quota).
    assert 0.05 < slow_cpu < 0.45, slow_cpu
    assert fast_cpu > slow_cpu * 1.8, (slow_cpu, fast_cpu)
    quota = CGROUP_ROOT / "cpu" / f"grove-{instance_of(router.state_dir)}" / slow.id / "cpu.cfs_quota_us"
    assert int(quota.read_text()) == 20_000


def _unkilled(pids: set[str]) -> list[str]:
    """Of ``pids``, those neither exiting (a zombie) nor with SIGKILL pending: still free to run on."""
    left = []
    for pid in pids:
        try:
            status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                          if ":" in line)
        except (FileNotFoundError, ProcessLookupError):
            continue  # gone meanwhile
        pending = int(status["SigPnd"], 16) | int(status["ShdPnd"], 16)
        if not status["State"].strip().startswith(("Z", "X")) and not pending & (1 << (signal.SIGKILL - 1)):
            left.append(f"{pid} {status['Name'].strip()} {status['State'].strip()}")
    return left


def _wait_for(check: Callable[[], bool], within_s: float, what: str) -> None:
    deadline = time.monotonic() + within_s
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_a_neighbour_spinning_and_fork_bombing_yields_and_the_victim_still_answers(
    router: RouterProcess, grove: Grove
) -> None:
    """Noisy neighbours, functionally (the latency is perf.bench_noisy's): a sandbox that spins on every CPU
    and fork-bombs is demoted to the lowest cpu.shares while it does; the other sandbox's execs all succeed;
    once the neighbour is quiet again, it gets its weight back."""
    victim = grove.create(heartbeat=False)
    neighbour = grove.create(heartbeat=False, pids_max=64)
    groups = CGROUP_ROOT / "{}" / f"grove-{instance_of(router.state_dir)}" / neighbour.id
    shares, procs = Path(str(groups).format("cpu")) / "cpu.shares", Path(str(groups).format("pids")) / "cgroup.procs"
    assert int(shares.read_text()) == NORMAL_SHARES
    idle = set(procs.read_text().split())  # the sandbox's own processes (PID 1, the executor)
    noise = threading.Thread(
        target=neighbour.exec,
        args=("for i in $(seq $(nproc)); do (while :; do :; done) & done; b() { b | b & }; b; wait",),
        kwargs={"timeout_s": 8},
        daemon=True,
    )
    noise.start()
    try:
        _wait_for(lambda: int(shares.read_text()) == HOG_SHARES, 7, "the spinning neighbour was not demoted")
        assert _pids_events_max(router, neighbour.id) > 0  # the bomb really ran into its pids_max
        results = [victim.exec(["sh", "-c", "echo $((6 * 7))"], timeout_s=30) for _ in range(20)]
        assert all(r.exit_code == 0 and r.stdout == b"42\n" for r in results)
    finally:
        noise.join(30)
    assert not noise.is_alive()
    # Every process of the neighbour's command was killed with its timeout. A killed process exits when it is
    # next scheduled: at the lowest weight on a loaded host that can wait for its weight to come back (a CI
    # run saw some still exiting 15 s on), so first each is killed, then all are gone.
    deadline = time.monotonic() + 15
    while running := _unkilled(set(procs.read_text().split()) - idle):
        assert time.monotonic() < deadline, f"the neighbour's command left processes running: {running}"
        time.sleep(0.1)
    _wait_for(lambda: not set(procs.read_text().split()) - idle, RELEASE_S + 20,
              "the neighbour's killed processes did not exit")
    _wait_for(lambda: int(shares.read_text()) == NORMAL_SHARES, RELEASE_S + 15, "the neighbour stayed demoted")
    assert _host_can_fork()
