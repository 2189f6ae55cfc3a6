"""The cost of the record: trajectory recording on the exec path, and trajectory write throughput to S3.

``python -m perf.bench_record`` measures, in one run:

- the router's exec p50 of ``["true"]`` through a real router (the reference), and the cost of what the
  router adds per exec to record it — parsing the request and the result and appending the step to the
  sandbox's journal — timed on the same code (:func:`router.api.datapath._exec_step`, :class:`Journal`);
- trajectory write throughput: records of a realistic size stored through :class:`TrajectoryArchive`
  into a real embedded S3 server, and into the spool when S3 is down.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import msgpack

from artifacts.archive import TrajectoryArchive
from artifacts.s3config import S3Config
from artifacts.s3server import EmbeddedS3
from artifacts.store import ObjectStore
from perf.common import (
    Target,
    machine,
    machine_line,
    percentile,
    running_router,
    sigterm_as_exit,
    summarize,
    target_table,
    update_readme,
    utc_now,
    write_results,
)
from router.trajectory.journal import Journal
from tests.support.trajectory_samples import make_record

SECTION = "## Recording cost and trajectory throughput"
TARGET_SHARE = 0.05


class _Request:
    """Just what ``_exec_step`` reads of an aiohttp request."""

    content_type = "application/msgpack"
    headers = {"Accept": "application/msgpack"}
    query: dict[str, str] = {}


def _exec_round_trips(calls: int) -> list[float]:
    samples = []
    with running_router() as router:
        api = router.api()
        sandbox = api.call("POST", "/v1/sandboxes", {"metadata": {"task_id": "bench"}})["id"]
        for i in range(calls + 20):
            started = time.perf_counter()
            api.call("POST", f"/v1/sandboxes/{sandbox}/exec", {"command": ["true"]})
            if i >= 20:
                samples.append(time.perf_counter() - started)
        api.call("DELETE", f"/v1/sandboxes/{sandbox}")
        api.close()
    return samples


def _recording_costs(calls: int, scratch: Path) -> list[float]:
    from router.api.datapath import _exec_step

    journal = Journal(scratch)
    journal.start("sb-0000000000000000", {"id": "sb-0000000000000000"})
    body = msgpack.packb({"command": ["true"], "request_id": "r" * 32}, use_bin_type=True)
    result = {
        "exit_code": 0, "stdout": b"ok\n" * 20, "stderr": b"", "stdout_truncated": False,
        "stderr_truncated": False, "stdout_bytes": 60, "stderr_bytes": 0, "stdout_sha256": "0" * 64,
        "stderr_sha256": "0" * 64, "stdout_file": None, "stderr_file": None, "timed_out": False,
        "oom_killed": False, "duration_s": 0.001, "request_id": "r" * 32,
    }
    answer = msgpack.packb(result, use_bin_type=True)
    request: Any = _Request()
    samples = []
    for _ in range(calls):
        started = time.perf_counter()
        step = _exec_step(body, request, answer, 200, time.time())
        assert step is not None
        journal.append("sb-0000000000000000", step)
        samples.append(time.perf_counter() - started)
    return samples


def _record(i: int, steps: int) -> dict[str, Any]:
    """A record as the router makes it (its own recorder and journal; see tests/support/trajectory_samples.py)."""
    commands = [{"type": "exec", "t": time.time(), "command": f"python3 step_{s}.py", "exit_code": 0,
                 "stdout": b"x" * 2000, "stderr": b"", "stdout_sha256": "0" * 64} for s in range(steps)]
    return make_record(f"sb-{i:016x}", task_id=f"task-{i % 50}", model="m", harness="bench", harness_version="1",
                       created_at=time.time(), steps=commands)


def _throughput(count: int, steps: int, scratch: Path) -> dict[str, Any]:
    with EmbeddedS3(scratch / "s3") as s3:
        store = ObjectStore(S3Config(endpoint=s3.endpoint, access_key=s3.access_key, secret_key=s3.secret_key,
                                     bucket="bench"))
        archive = TrajectoryArchive(store, scratch / "spool")
        archive.store(_record(10**9, steps))  # the first PUT allocates a volume: not what we measure
        size = len(msgpack.packb(_record(0, steps), use_bin_type=True))
        started = time.perf_counter()
        for i in range(count):
            assert not archive.store(_record(i, steps)).spooled
        to_s3 = time.perf_counter() - started
        s3.stop()
        started = time.perf_counter()
        for i in range(count, 2 * count):
            assert archive.store(_record(i, steps)).spooled
        to_spool = time.perf_counter() - started
        s3.start()
        started = time.perf_counter()
        flushed = archive.flush_spool()
        flush = time.perf_counter() - started
        store.close()
    return {
        "records": count, "steps_per_record": steps, "record_bytes": size,
        "s3_records_per_s": round(count / to_s3, 1), "s3_mb_per_s": round(count * size / to_s3 / 1e6, 2),
        "spool_records_per_s": round(count / to_spool, 1),
        "flush_records_per_s": round(flushed / flush, 1), "flushed": flushed,
    }


def main() -> None:
    """Run, write perf/results/record.json and the README section."""
    parser = argparse.ArgumentParser(prog="perf.bench_record", description=__doc__)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--records", type=int, default=200)
    args = parser.parse_args()
    sigterm_as_exit()
    with tempfile.TemporaryDirectory(prefix="gbr-") as tmp:
        scratch = Path(tmp)
        exec_samples = _exec_round_trips(args.calls)
        record_samples = _recording_costs(args.calls * 4, scratch)
        throughput = _throughput(args.records, 20, scratch)
    exec_p50 = percentile(exec_samples, 50)
    record_p50 = percentile(record_samples, 50)
    share = record_p50 / exec_p50
    host = machine()
    report: dict[str, Any] = {
        "when": utc_now(), "machine": host,
        "exec_via_router": summarize(exec_samples), "recording_per_exec": summarize(record_samples, scale=1e6),
        "recording_share_of_exec_p50": round(share, 4), "trajectory_writes": throughput,
    }
    write_results("record", report)
    rows = [
        Target("exec p50 via the router (`[\"true\"]`)", f"{exec_p50 * 1000:.2f} ms", "—", None),
        Target("recording an exec step (parse + journal append), p50", f"{record_p50 * 1e6:.0f} µs", "—", None),
        Target("recording as a share of exec p50", f"{share * 100:.1f} %", "< 5 %", share < TARGET_SHARE),
        Target("trajectories stored to S3", f"{throughput['s3_records_per_s']} records/s "
               f"({throughput['s3_mb_per_s']} MB/s, {throughput['record_bytes'] // 1024} KiB each)", "—", None),
        Target("trajectories spooled while S3 is down", f"{throughput['spool_records_per_s']} records/s", "—", None),
        Target("spool flushed when S3 is back", f"{throughput['flush_records_per_s']} records/s "
               f"({throughput['flushed']} of {args.records})", "all", throughput["flushed"] == args.records),
    ]
    update_readme("\n".join([
        SECTION, "",
        f"`python -m perf.bench_record` — {report['when']}. {machine_line(host)}", "",
        *target_table(rows), "",
        "The recording cost is timed on the router's own code path (`router.api.datapath._exec_step` and "
        "`Journal.append`) in the same run as the exec round trips. Raw figures: `perf/results/record.json`.",
    ]))
    print(json.dumps(report["trajectory_writes"]), f"recording share {share:.3%}")


if __name__ == "__main__":
    main()
