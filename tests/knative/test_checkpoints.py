"""Checkpoints and forks on the Knative backend: the stand-in cluster's real executor pods and real S3.

A checkpoint of a running sandbox is its executor's workspace snapshot, uploaded through the router's broker
and copied in S3 under the checkpoint's key; a sandbox made from it starts with that copy as its own snapshot,
which its pod restores. So files a child sees came to it through S3.
"""

from __future__ import annotations

from artifacts.s3server import EmbeddedS3
from router.backends.knative.snapshots import checkpoint_key
from tests.knative.test_router import bucket_store
from tests.support.knative_fixtures import INSTANCE, Cluster
from tests.support.router_fixtures import RouterProcess, error_of, wait_for


def test_checkpoints_forks_and_restores_go_through_s3(knative_router: RouterProcess, cluster: Cluster,
                                                      s3_server: EmbeddedS3) -> None:
    store = bucket_store(knative_router, s3_server)
    with knative_router.client() as grove:
        parent = grove.create("python:3.11-slim", heartbeat=False)
        parent.write_file("notes/plan.txt", b"step 1\n")
        made = parent.checkpoint()
        assert made["copy_on_write"] is False and made["bytes"] > 0
        assert store.exists(checkpoint_key(INSTANCE, parent.id, made["id"]))
        parent.write_file("notes/plan.txt", b"step 2\n")  # after the checkpoint: not in it

        restored = grove.create(heartbeat=False, checkpoint=made["id"])
        assert restored.read_file("notes/plan.txt") == b"step 1\n"
        assert restored.info["lineage"] == {"parent": parent.id, "step": made["step"], "checkpoint": made["id"],
                                            "kind": "restore"}
        a, b = parent.fork(2)
        assert a.read_file("notes/plan.txt") == b.read_file("notes/plan.txt") == b"step 2\n"
        a.write_file("notes/plan.txt", b"branch a\n")
        assert b.read_file("notes/plan.txt") == b"step 2\n"
        assert parent.read_file("notes/plan.txt") == b"step 2\n"

        keys = [checkpoint_key(INSTANCE, parent.id, c["id"]) for c in parent.checkpoints()]
        assert len(keys) == 2 and all(store.exists(k) for k in keys)
        parent.close()  # its checkpoints go with it
        assert not any(store.exists(k) for k in keys)
        reply = knative_router.http("POST", "/v1/sandboxes", json_body={"checkpoint": made["id"]})
        assert reply.status == 404 and "no checkpoint" in error_of(reply)["message"]
        assert a.read_file("notes/plan.txt") == b"branch a\n"
        for child in (restored, a, b):
            child.close()
        wait_for(lambda: not store.list("checkpoints/"), 10, 0.05, "no checkpoint object left")
    store.close()
