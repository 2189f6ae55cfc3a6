"""``grove image build`` of the SWE-bench adapter's Dockerfile shape on a local base: fresh and cached.

``python -m perf.bench_build [--n 3]`` starts a router (``grove up``) on a private state dir, imports a local
base (a busybox rootfs with a 300-file repository under ``/testbed``, standing in for a SWE-bench instance image),
and builds Harbor's SWE-bench adapter shape on it — ``FROM`` the instance image, ``WORKDIR /testbed``, a ``RUN``
preparing the log and agent directories, a ``COPY`` of a setup script, a ``RUN`` of it — through the real
builder (:mod:`grove.build.builder`), every step in a sandbox:

- **first**: the very first build, which also puts the imported base into the layer store once;
- **fresh**: ``--no-cache`` builds (every step runs in a sandbox and is committed), ``--n`` times;
- **cached**: unchanged rebuilds (every step found in the cache), ``--n`` times.

Writes ``perf/results/build.json`` and the "Image builds" section of ``perf/README.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

from grove.build.builder import BuildOptions, build
from grove.client.aio import AsyncGrove
from perf.common import Target, machine, machine_line, publish, running_router, target_table, utc_now
from router.backends.local.images import ImageStore
from tests.support.imagetools import make_busybox_rootfs

NAME = "build"
SECTION = "## Image builds: the SWE-bench adapter's Dockerfile, fresh and cached"
_TARGET_RATIO = 10.0
DOCKERFILE = """\
FROM swe-instance
WORKDIR /testbed
RUN mkdir -p /logs/agent /logs/verifier /installed-agent && echo ready > /logs/.prepared
COPY setup.sh /installed-agent/setup.sh
RUN sh /installed-agent/setup.sh
"""
SETUP = "cd /testbed && find . -name '*.py' | wc -l > /installed-agent/files && echo setup done\n"


def _base(work: Path) -> Path:
    root = make_busybox_rootfs(work / "rootfs")
    for pkg in range(30):
        package = root / "testbed" / f"pkg{pkg}"
        package.mkdir(parents=True)
        for mod in range(10):
            (package / f"mod{mod}.py").write_text(f"def f{mod}():\n    return {pkg * mod}\n" * 20)
    return root


async def _time(client: AsyncGrove, options: BuildOptions) -> tuple[float, int]:
    result = await build(client, options, emit=lambda line: None)
    return result.seconds, result.cached


async def measure(url: str, key: str, context: Path, n: int) -> dict[str, Any]:
    """Seconds of the first build, of ``n`` fresh ones and of ``n`` cached ones."""
    fresh = BuildOptions(context / "Dockerfile", context, "swe-task", cache=False)
    cached = BuildOptions(context / "Dockerfile", context, "swe-task")
    async with AsyncGrove(url, key) as client:
        first, _ = await _time(client, cached)
        fresh_s = [(await _time(client, fresh))[0] for _ in range(n)]
        cached_runs = [await _time(client, cached) for _ in range(n)]
    assert all(hits == 4 for _, hits in cached_runs), cached_runs
    cached_s = [s for s, _ in cached_runs]
    return {"first_s": round(first, 3), "fresh_s": [round(s, 3) for s in fresh_s],
            "cached_s": [round(s, 3) for s in cached_s], "fresh_median_s": round(statistics.median(fresh_s), 3),
            "cached_median_s": round(statistics.median(cached_s), 3),
            "ratio": round(statistics.median(fresh_s) / statistics.median(cached_s), 1)}


def _section(report: dict[str, Any], rows: list[Target]) -> str:
    b = report["build"]
    lines = [
        SECTION, "",
        f"`python -m perf.bench_build --n {report['n']}` — {report['date']}. " + machine_line(report["machine"]), "",
        *target_table(rows), "",
        "The Dockerfile (Harbor's SWE-bench adapter shape, on a local busybox base with a 300-file `/testbed`):", "",
        "```dockerfile", DOCKERFILE.rstrip("\n"), "```", "",
        f"First build {b['first_s']:.2f} s (it also puts the imported base into the layer store once); fresh "
        f"(`--no-cache`: four steps each in its own sandbox, committed) median {b['fresh_median_s']:.2f} s; cached "
        f"median {b['cached_median_s']:.2f} s (four cache lookups and the final image named: no sandbox). "
        "A fresh step costs a sandbox's create → ready, the step itself, the commit (freeze, read the layer, "
        "unpack it into the layer store) and the delete.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    """Run the builds and publish."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=3, help="fresh and cached builds each")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="grove-bench-build-"))
    try:
        context = work / "context"
        context.mkdir()
        (context / "Dockerfile").write_text(DOCKERFILE)
        (context / "setup.sh").write_text(SETUP)
        with running_router() as router:
            ImageStore(router.state_dir / "images").import_image("swe-instance", _base(work))
            result = asyncio.run(measure(router.url, router.key, context, args.n))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = [Target("build, fresh / cached (median)", f"{result['ratio']}x ({result['fresh_median_s']:.2f} vs "
                   f"{result['cached_median_s']:.2f} s)", f"≥ {_TARGET_RATIO:g}x", result["ratio"] >= _TARGET_RATIO)]
    report = {"date": utc_now(), "machine": machine(), "n": args.n, "build": result}
    publish(NAME, report, rows, _section)


if __name__ == "__main__":
    main()
