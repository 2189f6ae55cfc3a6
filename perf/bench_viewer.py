"""The viewer's trajectory search over many stored records: how long one page takes.

Seeds ``--records`` records' keys and index entries (the trajectory object itself holds a few bytes:
the search never reads it) into an embedded S3, then times the first page, a deep page, and pages
filtered by task, model, outcome and run, the way ``/ui/api/trajectories`` serves them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from artifacts import trajectory as tj
from artifacts.s3config import S3Config
from artifacts.s3server import EmbeddedS3
from artifacts.store import ObjectStore
from router.ui.search import Query, Summaries, search
from tests.support.trajectory_samples import make_record

DAY = 86400.0
START = 1_795_000_000.0


def record(n: int) -> dict[str, object]:
    """A small record as the router makes it (its own recorder and journal): 20 tasks, 3 models, 10 runs, one day
    in 50, every 20th an infra error."""
    result = "infra_error" if n % 20 == 0 else ("pass" if n % 3 else "fail")
    return make_record(f"sb-{n:016x}", task_id=f"task-{n % 20}", model=f"model-{n % 3}", harness="mini",
                       labels={"run_id": f"run-{n % 10}"}, created_at=START + (n % 50) * DAY + n, steps=[],
                       outcome={"result": result, "reward": 1.0 if result == "pass" else 0.0})


def seed(objects: ObjectStore, count: int) -> float:
    """Store ``count`` records' objects and index entries; seconds taken."""
    records = [record(n) for n in range(count)]  # made before the clock starts: storing is what is timed
    started = time.monotonic()

    def put(n: int) -> None:
        rec = records[n]
        objects.put_bytes(tj.trajectory_key(rec), b"{}")
        for key, body in tj.index_entries(rec).items():
            objects.put_bytes(key, body)

    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(put, range(count)))
    return time.monotonic() - started


def timed(objects: ObjectStore, query: Query, summaries: Summaries | None = None) -> tuple[float, dict[str, object]]:
    """One search, and how long it took (with no summary read before, unless ``summaries`` has them)."""
    started = time.monotonic()
    page = search(objects, query, summaries)
    return time.monotonic() - started, page


def main(argv: list[str] | None = None) -> int:
    """Seed, search, print the figures."""
    parser = argparse.ArgumentParser(prog="python -m perf.bench_viewer", description=__doc__)
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--data", type=Path, help="keep the seeded S3 here and reuse it on the next run "
                        "(seeding 10,000 records takes minutes); default: a temporary dir")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        data = args.data or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="grove-bench-viewer-")))
        s3 = stack.enter_context(EmbeddedS3(data / "s3"))
        objects = ObjectStore(S3Config(endpoint=s3.endpoint, access_key=s3.access_key, secret_key=s3.secret_key))
        marker = data / f"seeded-{args.records}"
        if not marker.exists():
            print(f"seeded {args.records} records in {seed(objects, args.records):.1f} s", flush=True)
            marker.touch()
        _, first = timed(objects, Query())
        cursor = str(first["next"])
        cases = {
            "first page (50)": Query(),
            "next page": Query(after=cursor),
            "task filter": Query(task_id="task-7"),
            "model filter": Query(model="model-1"),
            "outcome infra_error": Query(outcome="infra_error"),
            "run filter": Query(run_id="run-3"),
            "one day": Query(date_from="2026-11-30", date_to="2026-11-30"),
        }
        figures = {}
        warm = Summaries()
        for name, query in cases.items():
            took, page = timed(objects, query)
            again, _ = timed(objects, query, warm)
            again, _ = timed(objects, query, warm)
            items = page["items"]
            assert isinstance(items, list) and items, name
            figures[name] = round(took, 3)
            figures[f"{name}, summaries kept"] = round(again, 3)
            print(f"{name:>22}: {took * 1000:7.0f} ms cold, {again * 1000:6.0f} ms with the summaries kept "
                  f"({len(items)} items, {page['scanned']} summaries read)")
        print(json.dumps({"records": args.records, "seconds": figures}))
        objects.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
