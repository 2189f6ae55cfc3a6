"""Two routers on one cluster and one S3 bucket, told apart by ``--instance``: neither touches the other's.

Each router's start-up collects orphans: the Services, Secrets and policies of its instance that belong to no
sandbox it knows, and the snapshots of such sandboxes. A second router starting beside the first must leave
the first's sandboxes, and their snapshots in the shared bucket, alone; and each lists only its own.
"""

from __future__ import annotations

from artifacts.s3server import EmbeddedS3
from artifacts.store import ObjectStore
from tests.support.knative_fixtures import Cluster, knative_router_on
from tests.support.s3_fixtures import config_for, new_bucket

IMAGE = "python:3.11-slim"


def _snapshots_of(store: ObjectStore, sandbox_id: str) -> list[str]:
    return [str(o.key) for o in store.list("snapshots/") if f"/{sandbox_id}/" in o.key]


def test_two_routers_on_one_bucket_keep_each_others_snapshots_and_list_only_their_own(
        cluster: Cluster, s3_server: EmbeddedS3) -> None:
    bucket = new_bucket()
    store = ObjectStore(config_for(s3_server, bucket))
    try:
        with knative_router_on(cluster, s3_server, "--instance", "shard-a", bucket=bucket) as a, \
                a.client() as grove_a:
            first = grove_a.create(IMAGE, heartbeat=False)
            first.write_file("kept.txt", b"shard a's\n")
            cluster.knative.scale_to_zero(first.id)  # the pod went: its workspace is a snapshot now
            assert _snapshots_of(store, first.id)

            # The second router's start-up sweeps its own orphans' snapshots, and only those.
            with knative_router_on(cluster, s3_server, "--instance", "shard-b", bucket=bucket) as b:
                assert _snapshots_of(store, first.id), "the second router deleted the first's snapshot"
                with b.client() as grove_b:
                    second = grove_b.create(IMAGE, heartbeat=False)
                    second.write_file("mine.txt", b"shard b's\n")
                    assert [s["id"] for s in grove_b.list()] == [second.id]
                assert [s["id"] for s in grove_a.list()] == [first.id]

            assert first.read_file("kept.txt") == b"shard a's\n"  # woken from its snapshot
            assert cluster.knative.services[first.id].starts == 2
            first.close()
    finally:
        store.close()
