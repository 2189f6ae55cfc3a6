"""The informer at scale against the stand-in: paginated lists, bookmarks, a watch dropped without a close.

A watch can die silently (a NAT or load balancer forgets the connection and never sends a FIN): without
a read timeout the informer would wait on it forever and every create would time out waiting for Ready.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from router.backends.knative import labels as L
from router.backends.knative.backend import KnativeBackend
from tests.knative.test_backend import run, spec
from tests.support.knative_fixtures import NAMESPACE, Cluster


def _fake_service(name: str) -> dict[str, Any]:
    return {"apiVersion": "serving.knative.dev/v1", "kind": "Service",
            "metadata": {"name": name, "namespace": NAMESPACE, "generation": 1,
                         "labels": {L.MANAGED_BY: "grove", L.INSTANCE: "grove", L.SANDBOX: name},
                         "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {"x": "y" * 4000}}}]},
            "spec": {"template": {"spec": {"containers": [{"image": "python:3.11-slim", "env": [{"name": "A"}]}]}}},
            "status": {"observedGeneration": 1, "conditions": [{"type": "Ready", "status": "True"}],
                       "latestReadyRevisionName": f"{name}-00001"}}


def test_the_list_is_paginated_and_only_read_fields_are_cached(cluster: Cluster) -> None:
    names = [f"sb-{i:016x}" for i in range(5)]

    async def put_all() -> None:
        for name in names:
            cluster.api.put("services", NAMESPACE, _fake_service(name), "ADDED")

    cluster.api.run(put_all())
    before = cluster.api.pages

    async def body(backend: KnativeBackend) -> dict[str, Any]:
        return dict(backend._services[NAMESPACE].objects)

    cached = run(cluster, body, list_page_size=2)
    assert sorted(cached) == names and cluster.api.pages - before == 3  # 2 + 2 + 1
    one = cached[names[0]]
    assert "managedFields" not in one["metadata"] and one["spec"]["template"]["spec"]["containers"] == [
        {"image": "python:3.11-slim"}]
    assert one["status"]["latestReadyRevisionName"] == f"{names[0]}-00001"
    for name in names:
        cluster.api.run(_remove(cluster, name))


async def _remove(cluster: Cluster, name: str) -> None:
    cluster.api.remove("services", NAMESPACE, name)


def test_bookmarks_arrive_and_a_silently_dropped_watch_is_restarted(cluster: Cluster) -> None:
    cluster.api.bookmark_interval_s = 0.5
    idle = 2.0
    sb = spec()

    async def body(backend: KnativeBackend) -> float:
        deadline = time.monotonic() + 10
        while backend._services[NAMESPACE].bookmarks == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert backend._services[NAMESPACE].bookmarks > 0
        cluster.api.stall_watches()  # silent from now on, never closed
        began = time.monotonic()
        await backend.create(sb)  # Ready arrives on the watch that replaced the stalled one
        took = time.monotonic() - began
        await backend.delete(sb.id, {})
        return took

    # The stated bound: the idle timeout, the restart's backoff, and the create itself (seconds here).
    took = run(cluster, body, watch_idle_timeout_s=idle, ready_timeout_s=30.0)
    assert took < idle + 10, took
    assert cluster.api.calls[("*", "watch", "services")] >= 2


def test_five_thousand_services_over_three_namespaces_are_listed_in_pages_and_survive_dropped_watches(
        cluster: Cluster) -> None:
    """Issue 37 item 7's scale, functionally (the figures are ``perf/knative_scale.py``'s): every Service is
    seen, each namespace listed in pages of 500, and a watch the server ends resumes from its version with
    no list again."""
    from perf.knative_scale import clear, fill, measure
    from tests.support.knative_fixtures import role_rules

    spread = (NAMESPACE, f"{NAMESPACE}-2", f"{NAMESPACE}-3")
    assert cluster.api.allowed is not None
    cluster.api.allowed |= {(verb, resource, ns) for verb, resource in role_rules() for ns in spread}
    options = cluster.options(namespaces=spread)
    fill(cluster, options, 5000)
    try:
        found = asyncio.run(measure(cluster, options))
    finally:
        clear(cluster, options)
    assert found["services_seen"] == 5000
    assert found["list_pages"] == 3 * 4 and found["calls"]["list services"] == 12  # 1,667 per namespace
    assert found["after_watches_dropped"]["relists"] == 0
    assert found["calls"]["watch services"] > 3  # each namespace's watch was opened again
