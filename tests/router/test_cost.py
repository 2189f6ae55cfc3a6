"""What a sandbox cost, through a real router on the local backend: CPU time, memory, disk and S3 measured on the
host and summed over runs, in the delete's answer, the trajectory record and its index entry."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from artifacts import trajectory as tj
from artifacts.catalog import ARTIFACT_PREFIX
from artifacts.s3config import S3Config
from artifacts.store import ObjectStore
from grove.client import Grove
from router.backends.local.cgroups import ACCOUNTING, CGROUP_ROOT
from tests.support.router_fixtures import RouterProcess, instance_of, wait_for, wait_removed

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\n"
"""A Python program that uses ``s`` CPU-seconds by its own clock."""
ALLOCATE = "b = bytearray(50 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\n"
"""Then holds 50 MiB, every page touched."""


@pytest.fixture(scope="module")
def bucket(router: RouterProcess) -> Iterator[ObjectStore]:
    """The router's bucket, read with its own credentials (as a data pipeline would)."""
    args = router.up_args
    config = S3Config(endpoint=args[args.index("--s3") + 1], access_key=router.extra_env["GROVE_S3_ACCESS_KEY"],
                      secret_key=router.extra_env["GROVE_S3_SECRET_KEY"], bucket=args[args.index("--s3-bucket") + 1])
    store = ObjectStore(config)
    yield store
    store.close()


def delete(router: RouterProcess, sandbox_id: str) -> dict[str, Any]:
    """DELETE the sandbox; its last record as the answer gives it."""
    reply = router.http("DELETE", f"/v1/sandboxes/{sandbox_id}")
    assert reply.status == 200, reply.body
    answer: dict[str, Any] = reply.json()
    return answer


def stored(bucket: ObjectStore, sandbox_id: str) -> tuple[dict[str, Any], int]:
    """The sandbox's index entry in the bucket, and the size of the record it points to."""
    summary: dict[str, Any] = json.loads(bucket.get_bytes(tj.by_id_key(sandbox_id)))
    return summary, bucket.stat(summary["key"]).size


def test_a_sandbox_costs_what_it_used(router: RouterProcess, grove: Grove, bucket: ObjectStore) -> None:
    t0 = time.time()
    idle = grove.create(heartbeat=False, memory_mb=512)
    busy = grove.create(heartbeat=False, memory_mb=512)
    accounting = CGROUP_ROOT / ACCOUNTING / f"grove-{instance_of(router.state_dir)}" / busy.id
    assert accounting.is_dir(), "the sandbox has no CPU accounting group"
    burned = busy.exec(["python3", "-c", BURN.format(s=1.0) + ALLOCATE])
    assert burned.exit_code == 0, burned.stderr
    wrote = busy.exec("head -c 20000000 /dev/urandom > /root/blob && head -c 1000000 /dev/urandom > /root/out.bin")
    assert wrote.exit_code == 0, wrote.stderr
    pushed = busy.push_artifacts(["/root/out.bin"])
    assert pushed[0]["size"] == 1_000_000

    answer = delete(router, busy.id)
    wall = time.time() - t0
    quiet = delete(router, idle.id)["cost"]
    cost = answer["cost"]
    assert set(cost) == {"cpu_s", "memory_gb_s", "memory_peak_mb", "disk_bytes", "s3_bytes", "running_s"}
    # 1 CPU-second burned, plus Python's start, the shell, the push and the executor serving them; the idle
    # sandbox's executor alone used next to nothing.
    assert 1.0 <= cost["cpu_s"] <= 2.0, cost
    assert quiet["cpu_s"] < 0.5, quiet
    # The 50 MiB it held, over what a sandbox holds that allocates nothing.
    assert cost["memory_peak_mb"] >= 50 and cost["memory_peak_mb"] - quiet["memory_peak_mb"] >= 45, (cost, quiet)
    # Its writable layer held the 21 MB it wrote; the idle one's next to nothing.
    assert cost["disk_bytes"] >= 21_000_000 and quiet["disk_bytes"] < 1_000_000, (cost, quiet)
    # Reserved memory is the limit (0.5 GiB) for the time it ran, which is within the test's own time.
    assert 1.0 <= cost["running_s"] <= wall, (cost, wall)
    assert cost["memory_gb_s"] == pytest.approx(0.5 * cost["running_s"], abs=0.002)

    # S3: exactly its artifact and its stored record, as the bucket lists them.
    summary, record_bytes = stored(bucket, busy.id)
    artifact_bytes = sum(o.size for o in bucket.list(f"{ARTIFACT_PREFIX}{busy.id}/"))
    assert artifact_bytes == 1_000_000
    assert cost["s3_bytes"] == artifact_bytes + record_bytes, (cost, artifact_bytes, record_bytes)
    assert quiet["s3_bytes"] == stored(bucket, idle.id)[1]  # its record alone

    # The same figures in the record (beside its outcome), its index entry, and the router's word on the id.
    record = grove.request("GET", f"/v1/trajectories/{busy.id}")
    assert record["cost"] == cost and summary["cost"] == cost
    after = grove.request("GET", f"/v1/sandboxes/{busy.id}")
    assert after["status"] == "deleted" and after["cost"] == cost and after["project"] == "default"
    wait_removed(router.state_dir, busy.id)  # its teardown's passes follow the delete
    assert not accounting.exists(), "the accounting group outlived the sandbox"


def test_a_sandbox_woken_from_zero_sums_its_runs(router: RouterProcess, grove: Grove) -> None:
    t0 = time.monotonic()
    sb = grove.create(heartbeat=False, idle_timeout_s=1, heartbeat_timeout_s=60)
    burn = ["python3", "-c", BURN.format(s=0.6)]
    assert sb.exec(burn).exit_code == 0
    wait_for(lambda: grove.request("GET", f"/v1/sandboxes/{sb.id}")["status"] == "idle", 8, 0.1, "scale to zero")
    time.sleep(2.0)  # asleep: no running time, no CPU
    assert sb.exec(burn).exit_code == 0  # woken
    cost = delete(router, sb.id)["cost"]
    wall = time.monotonic() - t0

    # Both runs' CPU (one alone is ~0.6 s), and no more than both with their executors' starts.
    assert 1.2 <= cost["cpu_s"] <= 2.2, cost
    # Both runs' time (the first lasted at least its idle timeout), none of the two seconds and more asleep.
    assert 1.0 + 0.6 <= cost["running_s"] <= wall - 2.0, (cost, wall)
    events = [s.get("event") for s in grove.request("GET", f"/v1/trajectories/{sb.id}")["steps"]
              if s.get("type") == "lifecycle"]
    assert events == ["scaled_to_zero", "resumed"], events
