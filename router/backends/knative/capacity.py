"""How many sandboxes a namespace and a cluster hold, from Kubernetes' scalability thresholds.

Kubernetes states the sizes it is tested at (kubernetes/community, ``sig-scalability/configs-and-limits/
thresholds.md``): 5,000 Services and 2,000 Deployments per namespace, 10,000 Services per cluster. A sandbox
is a Knative Service, and Knative keeps, even at zero pods, three Kubernetes Services for it (the revision's
public and ``-private`` Services, and the Route's placeholder Service) and one Deployment (the revision's,
scaled to 0). So the Services threshold binds first: a namespace holds 1,666 sandboxes and a cluster 3,333.
``perf/SCALING.md`` has the whole count per sandbox.
"""

from __future__ import annotations

from grove.core.errors import QuotaExceeded

SERVICES_PER_NAMESPACE = 5_000
DEPLOYMENTS_PER_NAMESPACE = 2_000
SERVICES_PER_CLUSTER = 10_000
KUBE_SERVICES_PER_SANDBOX = 3
DEPLOYMENTS_PER_SANDBOX = 1

PER_NAMESPACE = min(SERVICES_PER_NAMESPACE // KUBE_SERVICES_PER_SANDBOX,
                    DEPLOYMENTS_PER_NAMESPACE // DEPLOYMENTS_PER_SANDBOX)
"""Sandboxes one namespace holds within the thresholds (1,666)."""
PER_CLUSTER = SERVICES_PER_CLUSTER // KUBE_SERVICES_PER_SANDBOX
"""Sandboxes one cluster holds within the thresholds (3,333)."""


def place(counts: dict[str, int], per_namespace: int, per_cluster: int) -> str:
    """The namespace a new sandbox goes to: the emptiest with room (the first listed on a tie).

    ``counts`` is the sandboxes each namespace holds now, in the configured order. Raises
    :class:`QuotaExceeded` (429) naming the limit and what to do when no namespace, or the cluster, has room.
    """
    total = sum(counts.values())
    if total >= per_cluster:
        raise QuotaExceeded(
            f"the cluster holds {total} sandboxes of this router, its limit of {per_cluster} (Kubernetes' 10,000 "
            f"Services per cluster, {KUBE_SERVICES_PER_SANDBOX} per sandbox): delete sandboxes, or add a router "
            "on another cluster", retry_after=30)
    room = [ns for ns, n in counts.items() if n < per_namespace]
    if not room:
        raise QuotaExceeded(
            f"every namespace ({', '.join(counts)}) holds {per_namespace} sandboxes, the most one namespace takes "
            f"(Kubernetes' 5,000 Services per namespace, {KUBE_SERVICES_PER_SANDBOX} per sandbox): delete "
            "sandboxes, or give the router another namespace (--namespaces)", retry_after=30)
    return min(room, key=lambda ns: counts[ns])
