"""The cost of per-sandbox disk quotas: local create and delete with and without the disk layer, and disk use.

``python -m perf.bench_disk [--n 40]`` opens the real local backend (runtime bundle, zygote, cgroups) on
a private state dir and, interleaved so both see the same machine load: creates a sandbox the way every
sandbox is now made (a sparse copy of the formatted ext4 template, loop-attached and mounted by its PID 1),
and starts one over a plain-directory layer (as sandboxes were made before disk quotas, and as those
still resume); each is deleted at once. Then it measures what an idle sandbox's image takes on the host.
Writes ``perf/results/disk.json`` and the "Disk quota: create cost and disk use" section of
``perf/README.md``. Everything it made is removed, also on failure.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from perf.common import MIB, code_version, machine, machine_line, summarize, update_readme, utc_now, write_results
from router.backends.base import Network, SandboxSpec
from router.backends.local import disk
from router.backends.local.backend import LocalBackend
from router.records.registry import new_id

NAME = "disk"
SECTION = "## Disk quota: create cost and disk use"


def _spec(disk_mb: int = 10240) -> SandboxSpec:
    return SandboxSpec(id=new_id(), image="default", cpu=1.0, memory_mb=512, pids_max=256, env={},
                       workdir="/workspace", network=Network(), token=secrets.token_urlsafe(16), disk_mb=disk_mb)


def _allocated(path: Path) -> int:
    return path.stat().st_blocks * 512


async def _measure(state: Path, n: int) -> dict[str, Any]:
    backend = LocalBackend(state)
    await backend.open()
    made: list[tuple[str, dict[str, Any]]] = []
    try:
        # The first create pays for the zygote and for formatting the 10 GiB template: measured apart.
        spec = _spec()
        t0 = time.perf_counter()
        started = await backend.create(spec)
        first_ms = (time.perf_counter() - t0) * 1000
        await backend.delete(spec.id, started.handle)

        times: dict[str, list[float]] = {"with_disk": [], "without_disk": [], "delete_with_disk": [],
                                         "delete_without_disk": []}
        for _ in range(n):
            spec = _spec()
            t0 = time.perf_counter()
            started = await backend.create(spec)
            times["with_disk"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            await backend.delete(spec.id, started.handle)
            times["delete_with_disk"].append(time.perf_counter() - t0)

            spec = _spec()
            base = state / "sandboxes" / spec.id
            t0 = time.perf_counter()
            for sub in ("upper", "work", "merged"):  # what create did before disk quotas
                (base / sub).mkdir(parents=True)
            started = await backend.resume(spec, {})
            times["without_disk"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            await backend.delete(spec.id, started.handle)
            times["delete_without_disk"].append(time.perf_counter() - t0)

        # An idle sandbox's image: right after create, and once scaled to zero (everything flushed).
        spec = _spec()
        started = await backend.create(spec)
        made.append((spec.id, started.handle))
        image = state / "sandboxes" / spec.id / disk.IMAGE_NAME
        running = _allocated(image)
        await backend.stop(spec.id, started.handle)
        stopped = _allocated(image)
        template = next((state / "disk-templates").glob("10240m-*.img"))
        return {
            "first_create_ms": round(first_ms, 1),
            "create": {k: summarize(v) for k, v in times.items()},
            "idle_image_bytes": {"running": running, "scaled_to_zero": stopped, "template": _allocated(template),
                                 "apparent": image.stat().st_size},
        }
    finally:
        for sandbox_id, handle in made:
            await backend.delete(sandbox_id, handle)
        await backend.close()


def _section(report: dict[str, Any]) -> str:
    c, use = report["create"], report["idle_image_bytes"]
    return "\n".join([
        SECTION,
        "",
        f"{report['date']}, `python -m perf.bench_disk --n {report['n']}`. {machine_line(report['machine'])}",
        "",
        "Local backend, sandboxes of the default 10 GiB quota, created and deleted one at a time, the two",
        "kinds interleaved. *Without* starts the same sandbox over plain directories (as before disk quotas).",
        "",
        "| | p50 | p99 |",
        "|---|---|---|",
        f"| create with the disk layer | {c['with_disk']['p50_ms']} ms | {c['with_disk']['p99_ms']} ms |",
        f"| create without | {c['without_disk']['p50_ms']} ms | {c['without_disk']['p99_ms']} ms |",
        f"| delete with the disk layer | {c['delete_with_disk']['p50_ms']} ms | {c['delete_with_disk']['p99_ms']} ms |",
        f"| delete without | {c['delete_without_disk']['p50_ms']} ms | {c['delete_without_disk']['p99_ms']} ms |",
        "",
        f"The first create also formats the size's template once: {report['first_create_ms']} ms in all.",
        f"An idle sandbox's image takes {use['running'] / MIB:.1f} MiB of the host's disk while it runs and "
        f"{use['scaled_to_zero'] / MIB:.1f} MiB scaled to zero (apparent size {use['apparent'] / MIB:.0f} MiB; "
        f"the template: {use['template'] / MIB:.1f} MiB).",
        "",
    ])


def main() -> None:
    """Measure, write the results file and the README section."""
    parser = argparse.ArgumentParser(prog="python -m perf.bench_disk", description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=40, help="sandboxes of each kind")
    args = parser.parse_args()
    state = Path(tempfile.mkdtemp(prefix="gb-disk-"))
    try:
        measured = asyncio.run(_measure(state, args.n))
    finally:
        shutil.rmtree(state, ignore_errors=True)
    report = {"date": utc_now(), "n": args.n, "machine": machine(), "code": code_version(), **measured}
    write_results(NAME, report)
    update_readme(_section(report))
    print(_section(report))


if __name__ == "__main__":
    main()
