"""Replay on the Knative backend: the stand-in cluster (a real HTTP server speaking the Kubernetes protocol, its
pods real executors) and the real S3 server. The replayed sandbox is a Knative Service of its own."""

from __future__ import annotations

from tests.support.router_fixtures import RouterProcess


def test_a_trajectory_replays_on_knative(knative_router: RouterProcess) -> None:
    with knative_router.client() as grove:
        sb = grove.create(metadata={"task_id": "kn-replay"})
        sb.write_file("/workspace/notes.txt", "first\n")
        sb.exec("cat notes.txt && ls -la /workspace", cwd="/workspace")
        assert sb.read_file("/workspace/notes.txt") == b"first\n"
        sb.close()
    reply = knative_router.http("POST", f"/v1/trajectories/{sb.id}/replay", json_body={})
    assert reply.status == 200, reply.body
    report = reply.json()
    assert report["total"] == report["matched"] == 3 and report["kept"], report["steps"]
    with knative_router.client() as grove:
        rebuilt = grove.attach(report["sandbox_id"])
        assert rebuilt.read_file("/workspace/notes.txt") == b"first\n"
        lineage = grove.request("GET", f"/v1/sandboxes/{rebuilt.id}/trajectory")["sandbox"]["lineage"]
        rebuilt.close()
    assert lineage == {"parent": sb.id, "step": report["until"], "checkpoint": None, "kind": "replay"}
