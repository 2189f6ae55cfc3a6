"""Warm pools on Knative, against the stand-in cluster: members are ready Services made ahead; a claim is two
merge patches (the Secret's token and env, the Service's labels, after a dry run of the latter), no create and
no new revision, and the
claim holds when Knative restarts the pod (it reads the patched Secret)."""

from __future__ import annotations

import base64
import json
from typing import Any

import aiohttp

from router.backends.knative.manifest import secret_name
from tests.support.knative_fixtures import NAMESPACE, Cluster
from tests.support.router_fixtures import RouterProcess, wait_for

IMAGE = "python:3.11-slim"


def _members(router: RouterProcess, pool: str) -> dict[str, dict[str, Any]]:
    found = {}
    for path in router.layout.records.glob("sb-*.json"):
        record = json.loads(path.read_text())
        if record.get("pool") == pool:
            found[record["id"]] = record
    return found


def _status(cluster: Cluster, sandbox_id: str, token: str) -> int:
    """An exec straight at the sandbox's pod with a token: the HTTP status."""
    pod = cluster.knative.services[sandbox_id].pod
    assert pod is not None

    async def call() -> int:
        async with aiohttp.ClientSession() as session, session.post(
                f"http://127.0.0.1:{pod.port}/v1/exec", json={"command": "true"},
                headers={"Authorization": f"Bearer {token}"}) as resp:
            return resp.status

    return int(cluster.api.run(call()))


def test_a_claim_is_one_patch_of_its_secret_and_no_new_revision(
        knative_router: RouterProcess, cluster: Cluster) -> None:
    with knative_router.client() as grove:
        grove.create_pool("kn", IMAGE, size=2, resources={"cpu": 0.5, "memory_mb": 256})
        wait_for(lambda: grove.pool("kn")["ready"] == 2, 120, what="two ready members")
        members = _members(knative_router, "kn")
        before = dict(cluster.api.calls)

        sb = grove.create(pool="kn", env={"TASK_VAR": "claimed"}, metadata={"task_id": "kn-task"},
                          heartbeat=False)
        assert sb.id in members
        # The create answers before the hand-over ends; the first call waits for it.
        assert sb.exec("echo $TASK_VAR").stdout == b"claimed\n"
        made = {f"{verb} {plural}": n - before.get((owner, verb, plural), 0)
                for (owner, verb, plural), n in cluster.api.calls.items() if owner == sb.id}
        # Only the Secret is written: the Service (and so its Configuration, Route and KIngress) is not.
        assert {k: v for k, v in made.items() if v} == {"patch secrets": 1}

        # No new revision: the Service's spec (and so its generation) is as the pool made it; same pod.
        ks = cluster.knative.services[sb.id]
        service = cluster.api.objects[("services", NAMESPACE)][sb.id]
        assert service["metadata"]["generation"] == 1 and ks.starts == 1
        # The claim's metadata labels are on the Secret, which Knative copies nowhere.
        secret_labels = cluster.api.objects[("secrets", NAMESPACE)][secret_name(sb.id)]["metadata"]["labels"]
        assert secret_labels["grove.dev/task-id"] == "kn-task"
        assert "grove.dev/task-id" not in service["metadata"]["labels"]

        token = json.loads(knative_router.layout.record(sb.id).read_text())["token"]
        assert _status(cluster, sb.id, members[sb.id]["token"]) == 401
        assert _status(cluster, sb.id, token) == 200
        secret = cluster.api.objects[("secrets", NAMESPACE)][secret_name(sb.id)]["data"]
        assert base64.b64decode(secret["token"]).decode() == token

        # A new pod (after scale-to-zero) starts from the patched Secret: the claim's token and env.
        cluster.knative.scale_to_zero(sb.id)
        assert sb.exec("echo $TASK_VAR").stdout == b"claimed\n"
        assert cluster.knative.services[sb.id].starts == 2

        # The working dir is in the revision template: a claim asking for another gets a fresh Service.
        other = grove.create(pool="kn", workdir="/elsewhere", heartbeat=False)
        assert other.id not in members and grove.pool("kn")["misses"] == 1
        wait_for(lambda: grove.pool("kn")["ready"] == 2, 120, what="the pool refilled")
        for s in (sb, other):
            s.close()
        grove.delete_pool("kn")
