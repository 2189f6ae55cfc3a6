"""Checkpoints and forks on the local backend: what they cost beside a plain create, measured in one run.

``python -m perf.bench_checkpoints`` starts a real router (``grove up`` on a fresh state dir, so its
sandboxes live on the reflink volume it makes) and, through the SDK:

- creates fresh sandboxes one at a time (the yardstick every ratio is against);
- fills one sandbox's workspace with 1 GiB, then checkpoints it after writing 1, 16 and 128 MiB of dirty data
  (not synced: the checkpoint's own sync writes it out), reading the round trip and how long the sandbox was
  frozen (the router's ``frozen_ms``);
- forks it into 8 (the round trip of the call that answers with 8 ready sandboxes);
- takes 100 checkpoints of a sandbox that changes 1 MiB between each, and reads how much the volume's used
  space grew.

Writes ``perf/results/checkpoints.json`` and the "Checkpoints and forks" section of ``perf/README.md``.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from grove.client import Grove, Sandbox
from perf.common import (
    MIB,
    Target,
    code_version,
    machine,
    machine_line,
    publish,
    running_router,
    summarize,
    target_table,
    utc_now,
)

NAME = "checkpoints"
SECTION = "## Checkpoints and forks"
DIRTY_MB = (1, 16, 128)
BODY: dict[str, Any] = {"cpu": 1.0, "memory_mb": 512, "disk_mb": 4096}


def _timed(call: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    result = call()
    return time.perf_counter() - t0, result


def _dirty(sandbox: Sandbox, mib: int, step: int) -> None:
    """Overwrite ``mib`` MiB of the big file in place (page cache only: nothing synced)."""
    sandbox.exec(f"dd if=/dev/urandom of=/workspace/big bs=1M count={mib} seek={step * mib % 900} conv=notrunc "
                 "status=none")


def _used(path: str) -> int:
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def _measure(grove: Grove, sandboxes_dir: str, n: int) -> dict[str, Any]:
    fresh = []
    for _ in range(n):
        took, sandbox = _timed(lambda: grove.create(heartbeat=False, **BODY))
        fresh.append(took)
        sandbox.close()
    parent = grove.create(heartbeat=False, **BODY)
    parent.exec("head -c 1073741824 /dev/urandom > /workspace/big && sync")
    dirty: dict[str, Any] = {}
    for mib in DIRTY_MB:
        rtt, frozen = [], []
        for step in range(n):
            _dirty(parent, mib, step)
            took, made = _timed(parent.checkpoint)
            rtt.append(took)
            frozen.append(made["frozen_ms"] / 1000)
            parent.delete_checkpoint(made["id"])
        dirty[f"{mib}"] = {"checkpoint": summarize(rtt), "frozen": summarize(frozen),
                           "copy_on_write": made["copy_on_write"]}
    _dirty(parent, 1, 0)
    took, children = _timed(lambda: parent.fork(8))
    fork_s = took
    for child in children:
        child.close()
    steps = grove.create(heartbeat=False, **BODY)
    steps.exec("head -c 268435456 /dev/urandom > /workspace/base && sync")
    before = _used(sandboxes_dir)
    for step in range(100):
        steps.exec(f"dd if=/dev/urandom of=/workspace/base bs=1M count=1 seek={step} conv=notrunc status=none")
        steps.checkpoint()
    grown = _used(sandboxes_dir) - before
    return {"fresh_create": summarize(fresh), "dirty": dirty, "fork8_ms": round(fork_s * 1000, 1),
            "hundred_checkpoints_bytes": grown}


def _targets(r: dict[str, Any]) -> list[Target]:
    one, fork, stored = r["dirty"]["1"], r["fork8_ms"], r["hundred_checkpoints_bytes"] / MIB
    frozen = max(d["frozen"]["p50_ms"] for d in r["dirty"].values())
    return [
        Target("checkpoint, 1 GiB workspace, 1 MiB dirty (round trip p50)", f"{one['checkpoint']['p50_ms']} ms",
               "<= 50 ms", one["checkpoint"]["p50_ms"] <= 50),
        Target("parent frozen, 1 MiB dirty (p50)", f"{one['frozen']['p50_ms']} ms", "<= 20 ms",
               one["frozen"]["p50_ms"] <= 20),
        Target("parent frozen, worst p50 up to 128 MiB dirty", f"{frozen} ms", "<= 20 ms", frozen <= 20),
        Target("fork into 8, ready (round trip)", f"{fork} ms", "<= 100 ms", fork <= 100),
        Target("storage of 100 checkpoints, 1 MiB changed per step", f"{stored:.0f} MiB", "about 100 MiB (<= 150)",
               stored <= 150),
    ]


def _section(r: dict[str, Any], targets: list[Target]) -> str:
    fresh = r["fresh_create"]["p50_ms"]
    rows = []
    for mib, d in r["dirty"].items():
        took, frozen = d["checkpoint"], d["frozen"]
        rows.append(f"| {mib} MiB | {took['p50_ms']} ms | {took['p99_ms']} ms | {frozen['p50_ms']} ms "
                    f"| {frozen['p99_ms']} ms | {took['p50_ms'] / fresh:.2f} |")
    return "\n".join([
        SECTION, "",
        f"{r['date']}, `python -m perf.bench_checkpoints --n {r['n']}`. {machine_line(r['machine'])}", "",
        "Local backend through a real router and the SDK (round trips), a sandbox with a 1 GiB workspace, its",
        "disk image on the router's XFS reflink volume. Dirty data is written just before each checkpoint and",
        "not synced: the checkpoint syncs once while the sandbox runs, then freezes it, syncs what was written",
        "meanwhile, reflinks the image and thaws. Ratios against a plain fresh create measured in the same run "
        f"(p50 {fresh} ms, p99 {r['fresh_create']['p99_ms']} ms).", "",
        "| dirty data | checkpoint p50 | p99 | frozen p50 | p99 | checkpoint / fresh create |",
        "|---|---|---|---|---|---|",
        *rows, "",
        f"Fork into 8 (the call answers with 8 ready sandboxes, each started like a fresh create): {r['fork8_ms']} ms, "
        f"{r['fork8_ms'] / fresh:.1f}x one fresh create.",
        f"100 checkpoints of a sandbox changing 1 MiB between each: the volume's used space grew "
        f"{r['hundred_checkpoints_bytes'] / MIB:.0f} MiB (not 100 x the 256 MiB the sandbox holds).", "",
        *target_table(targets), "",
        "The fork misses its goal: its clones take milliseconds, but each child is a sandbox that starts (a zygote",
        "fork, mounts, its executor) like any fresh create, and 8 of them share 2 CPUs.", "",
    ])


def main() -> None:
    """Measure, write the results file and the README section."""
    parser = argparse.ArgumentParser(prog="python -m perf.bench_checkpoints", description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10, help="samples of each figure")
    args = parser.parse_args()
    with running_router() as router, Grove(router.url, router.key) as grove:
        measured = _measure(grove, str(router.layout.sandboxes), args.n)
    report = {"date": utc_now(), "n": args.n, "machine": machine(), "code": code_version(), **measured}
    publish(NAME, report, _targets(report), _section)


if __name__ == "__main__":
    main()
