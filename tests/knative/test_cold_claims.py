"""Claiming a pool member whose pod is gone, against the stand-in cluster.

Nothing sends an idle pool member traffic, so Knative scales it to zero; and a container can restart at any
time. Either way the claim's ``POST /v1/claim`` meets a pod that started from the Secret the claim has just
patched: it already holds the claimant's token and env. The claim must still hold (the claimant's token works,
the pool's does not), and a warm member's claim is unchanged.
"""

from __future__ import annotations

import json

from router.backends.knative.manifest import secret_name
from tests.knative.test_pools import IMAGE, _members, _status
from tests.support.k8s_standin import Obj
from tests.support.knative_fixtures import NAMESPACE, Cluster
from tests.support.router_fixtures import RouterProcess, wait_for


def _one_ready_member(router: RouterProcess) -> dict[str, object]:
    with router.client() as grove:
        grove.create_pool("cold", IMAGE, size=1, resources={"cpu": 0.5, "memory_mb": 256})
        wait_for(lambda: grove.pool("cold")["ready"] == 1, 120, what="a ready member")
    (member,) = _members(router, "cold").values()
    return member


def _claim_and_check(router: RouterProcess, cluster: Cluster, member: dict[str, object]) -> int:
    """Claim the member and check the claim holds; the member's pod starts by then."""
    with router.client() as grove:
        sb = grove.create(pool="cold", env={"TASK_VAR": "claimed"}, heartbeat=False)
        assert sb.id == member["id"]
        assert sb.exec("echo $TASK_VAR").stdout == b"claimed\n"
        assert sb.status()["status"] == "ready"
        token = json.loads(router.layout.record(sb.id).read_text())["token"]
        assert _status(cluster, sb.id, str(member["token"])) == 401
        assert _status(cluster, sb.id, token) == 200
        starts = cluster.knative.services[sb.id].starts
        sb.close()
        grove.delete_pool("cold")
    return starts


def test_a_claim_of_a_member_scaled_to_zero_holds(knative_router: RouterProcess, cluster: Cluster) -> None:
    member = _one_ready_member(knative_router)
    cluster.knative.scale_to_zero(str(member["id"]))
    assert cluster.knative.services[str(member["id"])].pod is None
    assert _claim_and_check(knative_router, cluster, member) == 2  # the claim woke it


def test_a_claim_of_a_warm_member_holds_on_its_pod(knative_router: RouterProcess, cluster: Cluster) -> None:
    member = _one_ready_member(knative_router)
    assert _claim_and_check(knative_router, cluster, member) == 1


def test_a_claim_holds_when_the_container_restarts_between_patch_and_claim(
        knative_router: RouterProcess, cluster: Cluster) -> None:
    member = _one_ready_member(knative_router)
    restarted: list[str] = []

    async def restart(secret: Obj) -> None:
        # The Secret is patched; before the router's POST /v1/claim, the container restarts and reads it.
        if secret["metadata"]["name"] == secret_name(str(member["id"])):
            await cluster.knative.restart(str(member["id"]))
            restarted.append(secret["metadata"]["name"])

    cluster.api.on_patch["secrets"] = restart
    assert _claim_and_check(knative_router, cluster, member) == 2
    assert restarted


def test_a_claim_makes_no_revision_when_knatives_defaults_changed_since_the_member_was_made(
        knative_router: RouterProcess, cluster: Cluster) -> None:
    """Knative's webhook defaults the template on every Service write: with a default added since the member
    was made, any patch of the Service would make a new revision. A claim writes only the member's Secret, so
    the member keeps its revision and its pod, and the claimant gets it."""
    member = _one_ready_member(knative_router)
    sandbox_id = str(member["id"])
    cluster.knative.new_template_defaults = {"serving.knative.dev/a-newer-default": "on"}
    before = dict(cluster.api.calls)
    with knative_router.client() as grove:
        sb = grove.create(pool="cold", env={"TASK_VAR": "claimed"}, heartbeat=False)
        assert sb.id == sandbox_id
        assert sb.exec("echo $TASK_VAR").stdout == b"claimed\n"
        service = cluster.api.objects[("services", NAMESPACE)][sb.id]
        # The Service as the pool made it: generation 1, the defaults of then, the same pod.
        assert service["metadata"]["generation"] == 1
        assert "serving.knative.dev/a-newer-default" not in service["spec"]["template"]["metadata"]["annotations"]
        assert cluster.knative.services[sb.id].starts == 1
        made = {f"{verb} {plural}": n - before.get((owner, verb, plural), 0)
                for (owner, verb, plural), n in cluster.api.calls.items() if owner == sb.id}
        assert {k: v for k, v in made.items() if v} == {"patch secrets": 1}
        token = json.loads(knative_router.layout.record(sb.id).read_text())["token"]
        assert _status(cluster, sb.id, str(member["token"])) == 401
        assert _status(cluster, sb.id, token) == 200
        sb.close()
        grove.delete_pool("cold")
