"""Sandboxes spread over several namespaces, each kept within its capacity, against the stand-in cluster.

A router given ``--namespaces`` puts each new sandbox in the emptiest namespace with room, watches every one
of them, and refuses a create no namespace has room for with a 429 that names the limit and what to do. The
capacities are tiny here; by default they come from Kubernetes' thresholds
(:mod:`router.backends.knative.capacity`).
"""

from __future__ import annotations

import pytest

from artifacts.s3server import EmbeddedS3
from grove.core.errors import Invalid, QuotaExceeded
from router.backends.knative import capacity
from router.backends.knative.options import KnativeOptions
from tests.support.knative_fixtures import NAMESPACE, Cluster, knative_router_on, role_rules
from tests.support.router_fixtures import error_of, wait_for

OTHER = "grove-sandboxes-b"
IMAGE = "python:3.11-slim"


def _namespace_of(cluster: Cluster, sandbox_id: str) -> str:
    return next(ns for (plural, ns), objs in cluster.api.objects.items() if plural == "services" and sandbox_id in objs)


def _grant_other(cluster: Cluster) -> None:
    """The router's Role (``knative/rbac.yaml``) applied in the second namespace too, as the operator does."""
    assert cluster.api.allowed is not None
    cluster.api.allowed |= {(verb, resource, OTHER) for verb, resource in role_rules()}


def test_creates_spread_over_the_namespaces_and_a_full_set_is_refused_with_what_to_do(
        cluster: Cluster, s3_server: EmbeddedS3) -> None:
    _grant_other(cluster)
    with knative_router_on(cluster, s3_server, "--namespaces", f"{NAMESPACE},{OTHER}",
                           "--namespace-capacity", "1") as router, router.client() as grove:
        first, second = grove.create(IMAGE, heartbeat=False), grove.create(IMAGE, heartbeat=False)
        assert {_namespace_of(cluster, first.id), _namespace_of(cluster, second.id)} == {NAMESPACE, OTHER}
        assert second.exec("echo hi").stdout == b"hi\n"  # reached through its own namespace's revision URL

        refused = router.http("POST", "/v1/sandboxes", json_body={"image": IMAGE})
        assert refused.status == 429
        message = error_of(refused)["message"]
        assert f"every namespace ({NAMESPACE}, {OTHER}) holds 1 sandboxes" in message
        assert "--namespaces" in message
        assert sorted(s["id"] for s in grove.list()) == sorted([first.id, second.id])

        # Room again in the namespace the first leaves, once its Service is gone; the full one is skipped.
        where = _namespace_of(cluster, first.id)
        first.close()
        wait_for(lambda: first.id not in cluster.api.objects[("services", where)], 15, 0.05, "the Service to go")
        third = grove.create(IMAGE, heartbeat=False)
        assert _namespace_of(cluster, third.id) == where


def test_a_namespace_without_the_routers_role_is_named_in_the_error(cluster: Cluster, s3_server: EmbeddedS3) -> None:
    assert cluster.api.allowed is not None  # the Role in the second namespace lacks creating Secrets
    cluster.api.allowed |= {(verb, resource, OTHER) for verb, resource in role_rules()
                            if (verb, resource) != ("create", "secrets")}
    with knative_router_on(cluster, s3_server, "--namespaces", f"{NAMESPACE},{OTHER}",
                           "--namespace-capacity", "1") as router, router.client() as grove:
        grove.create(IMAGE, heartbeat=False)
        refused = router.http("POST", "/v1/sandboxes", json_body={"image": IMAGE})
        assert refused.status == 503
        message = error_of(refused)["message"]
        assert "create secrets '" in message and f"in namespace '{OTHER}'" in message, message


def test_the_defaults_keep_within_kubernetes_thresholds_and_bad_namespaces_are_refused() -> None:
    options = KnativeOptions()
    # 3 Kubernetes Services per sandbox against 5,000 per namespace and 10,000 per cluster.
    assert options.namespace_capacity * capacity.KUBE_SERVICES_PER_SANDBOX <= capacity.SERVICES_PER_NAMESPACE
    assert options.namespace_capacity * capacity.DEPLOYMENTS_PER_SANDBOX <= capacity.DEPLOYMENTS_PER_NAMESPACE
    assert options.cluster_capacity * capacity.KUBE_SERVICES_PER_SANDBOX <= capacity.SERVICES_PER_CLUSTER
    assert (options.namespace_capacity, options.cluster_capacity) == (1666, 3333)
    assert options.spread == ("grove-sandboxes",)
    with pytest.raises(Invalid, match="'Bad_NS' is not a valid namespace name"):
        KnativeOptions(namespaces=("a", "Bad_NS"))
    with pytest.raises(Invalid, match="name one more than once"):
        KnativeOptions(namespaces=("a", "a"))
    with pytest.raises(QuotaExceeded, match="the cluster holds 4 sandboxes of this router, its limit of 4"):
        capacity.place({"a": 2, "b": 2}, per_namespace=10, per_cluster=4)
    assert capacity.place({"a": 2, "b": 1, "c": 1}, per_namespace=2, per_cluster=10) == "b"
