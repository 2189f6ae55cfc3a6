"""Hundreds of create/exec/delete cycles through a real router leave nothing behind: no cgroup, mount,
process, directory, record or file descriptor."""

from __future__ import annotations

import asyncio
import os
import time

from grove.client import AsyncGrove
from tests.support.executor_fixtures import processes_with
from tests.support.router_fixtures import (
    RouterProcess,
    fd_count,
    mounts_with,
    proc_status,
    sandbox_cgroups,
    wait_for,
)

CYCLES = 200
BATCH = 10
# A background sleep left by some of the sandboxes; the odd duration makes it findable in /proc.
SLEEP = f"sleep 60.{os.getpid()}"


async def _cycles(router: RouterProcess) -> int:
    done = 0
    async with AsyncGrove(router.url, router.key) as client:

        async def one(i: int) -> None:
            nonlocal done
            sb = await client.create(heartbeat=False, metadata={"labels": {"leak": str(i)}})
            try:
                if i % 4 == 0:  # some do real work before they go
                    await sb.write_file("/workspace/f", b"x" * 1000)
                    result = await sb.exec(f"cat /workspace/f | wc -c; {SLEEP} &")
                    assert result.stdout == b"1000\n"
            finally:
                await sb.close()
            done += 1

        for start in range(0, CYCLES, BATCH):
            await asyncio.gather(*(one(i) for i in range(start, start + BATCH)))
    return done


def test_create_delete_cycles_leak_nothing(router: RouterProcess) -> None:
    # Warm up (first-use pools, the zygote), then take the baseline.
    asyncio.run(_cycles_small(router))
    pid = router.pid
    fds_before = fd_count(pid)
    rss_before = proc_status(pid, "VmRSS")
    helpers = set(processes_with(str(router.state_dir)))  # the router's own: zygote, S3 server

    started = time.monotonic()
    assert asyncio.run(_cycles(router)) == CYCLES
    elapsed = time.monotonic() - started

    assert router.http("GET", "/v1/sandboxes").json()["sandboxes"] == []
    # A delete answers once its sandbox can no longer run; the teardown's passes remove the rest soon after.
    wait_for(lambda: not list(router.layout.sandboxes.iterdir()), 30, what="the deleted sandboxes' remains removed")
    assert sandbox_cgroups(router.state_dir) == []
    # Only the checkpoint volume under sandboxes/ (router/backends/local/cow.py), mounted while the router runs.
    volume = str(router.layout.sandboxes)
    assert [line for line in mounts_with(str(router.state_dir)) if line.split()[1] != volume] == []
    assert list((router.layout.sandboxes).iterdir()) == []
    # A deleted sandbox's record file goes after its removal is in the log, which nothing waits for: soon, not
    # at once (a full run once found one still there).
    records = router.layout.records
    wait_for(lambda: not list(records.glob("sb-*")), 10, what="the deleted sandboxes' record files removed")
    # Every sandbox's processes are gone, the background sleeps included; the router's helpers stay.
    assert set(processes_with(str(router.state_dir))) == helpers
    assert processes_with(SLEEP) == []
    fds_after = fd_count(pid)
    assert fds_after - fds_before <= 8, (fds_before, fds_after)
    rss_after = proc_status(pid, "VmRSS")
    assert rss_after - rss_before < 40 * 1024, (rss_before, rss_after)
    print(f"{CYCLES} cycles in {elapsed:.1f}s; fds {fds_before}->{fds_after}; rss {rss_before}->{rss_after} KiB")


async def _cycles_small(router: RouterProcess) -> None:
    async with AsyncGrove(router.url, router.key) as client:
        sandboxes = await asyncio.gather(*(client.create(heartbeat=False) for _ in range(BATCH)))
        await asyncio.gather(*(sb.exec("true") for sb in sandboxes))
        await asyncio.gather(*(sb.close() for sb in sandboxes))

