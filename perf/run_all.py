"""``make bench``: every benchmark in turn, each in its own interpreter, with its default arguments.

A failing benchmark does not stop the others; the exit status says whether all of them passed.
``python -m perf.run_all --only router`` runs a subset (names as in :data:`BENCHMARKS`).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from perf.common import REPO

BENCHMARKS = {
    "executor": "perf.bench_executor",
    "router": "perf.bench_router",
    "record": "perf.bench_record",
    "burst": "perf.bench_burst",
    "step": "perf.bench_step",
    "noisy": "perf.bench_noisy",
    "rollouts": "perf.bench_rollouts",
    "grading": "perf.bench_grading",
    "projects": "perf.bench_projects",
    "desktop": "perf.bench_desktop",
    "images": "perf.bench_images",
    "checkpoints": "perf.bench_checkpoints",
    "knative": "perf.knative_calls",
}


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks; 0 if every one succeeded."""
    parser = argparse.ArgumentParser(prog="python -m perf.run_all", description=__doc__)
    parser.add_argument("--only", action="append", choices=sorted(BENCHMARKS), help="run just this one (repeatable)")
    args = parser.parse_args(argv)
    failed: list[str] = []
    for name in args.only or list(BENCHMARKS):
        module = BENCHMARKS[name]
        print(f"==> {module}", flush=True)
        started = time.monotonic()
        code = subprocess.run([sys.executable, "-m", module], cwd=REPO, check=False).returncode
        took = time.monotonic() - started
        print(f"<== {module}: {'ok' if code == 0 else f'FAILED (exit {code})'} in {took:.0f} s", flush=True)
        if code != 0:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
