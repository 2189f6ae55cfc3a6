"""The Knative backend against the stand-in API server, through the real ``kubernetes`` client.

Everything runs under the router's Role from ``knative/rbac.yaml`` (the stand-in refuses the rest).
Readiness comes from the shared watch: the tests count the API calls to prove there is no polling.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiohttp
import pytest

from grove.core.errors import Conflict, Forbidden, Invalid, Unavailable
from router.backends.base import Network, SandboxSpec, Started
from router.backends.knative.backend import KnativeBackend
from router.backends.knative.ratelimit import TokenBucket
from router.records.registry import new_id
from tests.support.k8s_standin import Fault
from tests.support.knative_fixtures import NAMESPACE, Cluster

T = TypeVar("T")


def spec(**overrides: Any) -> SandboxSpec:
    values: dict[str, Any] = dict(id=new_id(), image="python:3.11-slim", cpu=0.5, memory_mb=256, pids_max=128,
                                  env={"GREETING": "hi"}, workdir="/workspace", network=Network(), token="tk-1",
                                  labels={"task_id": "t/1"}, idle_timeout_s=60.0)
    values.update(overrides)
    return SandboxSpec(**values)


def run(cluster: Cluster, body: Callable[[KnativeBackend], Awaitable[T]], **options: Any) -> T:
    """Open a backend on the cluster, run ``body``, close it (in the default ``revision`` endpoint mode
    unless ``endpoint_mode`` says otherwise)."""
    async def main() -> T:
        backend = KnativeBackend(cluster.options(**{"endpoint_mode": "revision", **options}))
        await backend.open()
        try:
            return await body(backend)
        finally:
            await backend.close()
    return asyncio.run(main())


async def exec_(cluster: Cluster, started: Started, command: str) -> dict[str, Any]:
    """POST /v1/exec as the router would; a revision URL through the cluster's Service network."""
    url = started.endpoint.url
    async with aiohttp.ClientSession() as session, session.post(
        url + "/v1/exec", json={"command": command}, headers={"Authorization": f"Bearer {started.endpoint.token}"},
        proxy=cluster.knative.gateway if ".svc." in url else None,
    ) as resp:
        assert resp.status == 200, await resp.text()
        result: dict[str, Any] = await resp.json()
        return result


def calls(cluster: Cluster, sandbox_id: str) -> dict[str, int]:
    return {f"{verb} {plural}": n for (owner, verb, plural), n in cluster.api.calls.items() if owner == sandbox_id}


def test_create_ready_by_watch_then_delete(cluster: Cluster) -> None:
    sb = spec(network=Network("allow", ("10.0.0.0/8:443",)))

    async def body(backend: KnativeBackend) -> None:
        started = await backend.create(sb)
        assert started.image_digest.startswith("sha256:") and started.handle["revision"] == f"{sb.id}-00001"
        assert started.endpoint.url == f"http://{sb.id}-00001.{NAMESPACE}.svc.cluster.local"  # the default mode
        result = await exec_(cluster, started, 'echo "$GREETING" && pwd')  # the env came from the Secret
        assert result["stdout"].startswith("hi\n") and result["stdout"].rstrip().endswith("/workspace")
        assert await backend.is_running(sb.id, started.handle)
        assert (await backend.image_digest("python:3.11-slim")) == started.image_digest
        await backend.delete(sb.id, started.handle)
        await backend.delete(sb.id, started.handle)  # gone already: fine

    run(cluster, body)
    made = calls(cluster, sb.id)
    # One write per object, one read of the revision (for its digest), and no polling GET of the Service.
    assert made == {"create secrets": 1, "create services": 1, "create networkpolicies": 1, "get revisions": 1,
                    "delete services": 2, "delete secrets": 2, "delete networkpolicies": 2}, made
    assert cluster.api.calls[("*", "watch", "services")] == 1


def test_a_denied_egress_sandbox_costs_four_writes(cluster: Cluster) -> None:
    sb = spec()  # egress deny: the namespace's default-deny policy covers it, no policy of its own

    async def body(backend: KnativeBackend) -> None:
        started = await backend.create(sb)
        assert started.handle["policy"] is False
        await backend.delete(sb.id, started.handle)

    run(cluster, body)
    made = calls(cluster, sb.id)
    assert made == {"create secrets": 1, "create services": 1, "get revisions": 1,
                    "delete services": 1, "delete secrets": 1}, made


def test_second_sandbox_of_an_image_runs_it_pinned_by_digest(cluster: Cluster) -> None:
    async def body(backend: KnativeBackend) -> list[str]:
        first, second = spec(), spec()
        a = await backend.create(first)
        await backend.create(second)
        services = cluster.api.objects[("services", NAMESPACE)]
        images = [services[s.id]["spec"]["template"]["spec"]["containers"][0]["image"] for s in (first, second)]
        for s in (first, second):
            await backend.delete(s.id, {})
        assert images[1] == f"python@{a.image_digest}"
        return images

    assert run(cluster, body)[0] == "python:3.11-slim"


def test_409_is_a_conflict_and_leaves_the_existing_sandbox_alone(cluster: Cluster) -> None:
    sb = spec()

    async def body(backend: KnativeBackend) -> None:
        await backend.create(sb)
        with pytest.raises(Conflict, match="already exists"):
            await backend.create(sb)
        assert await backend.is_running(sb.id, {})
        await backend.delete(sb.id, {})

    run(cluster, body)


def test_403_names_the_missing_permission_and_the_fix(cluster: Cluster) -> None:
    cluster.api.forbidden.add(("create", "services"))

    async def body(backend: KnativeBackend) -> None:
        with pytest.raises(Forbidden) as err:
            await backend.create(spec())
        message = err.value.message
        assert "cannot create resource" in message and "knative/rbac.yaml" in message
        assert "kubectl auth can-i create services.serving.knative.dev" in message

    run(cluster, body)
    assert not cluster.api.objects[("secrets", NAMESPACE)]  # the Secret made first was removed again


def test_422_carries_the_webhooks_message(cluster: Cluster) -> None:
    async def body(backend: KnativeBackend) -> None:
        # Turned off after the start-up check passed (off before it, the router refuses to start: test_doctor).
        cluster.knative.set_feature("kubernetes.podspec-init-containers", None)  # Knative's default: disabled
        with pytest.raises(Invalid) as err:
            await backend.create(spec())
        assert 'admission webhook "validation.webhook.serving.knative.dev" denied' in err.value.message
        assert "spec.template.spec.initContainers" in err.value.message

    run(cluster, body)


def test_transient_errors_are_retried_with_backoff(cluster: Cluster) -> None:
    cluster.api.faults += [Fault("create", "services", 503, "etcdserver: leader changed", count=2),
                           Fault("create", "secrets", 429, "too many requests", count=1, reason="TooManyRequests",
                                 retry_after=0)]
    sb = spec()

    async def body(backend: KnativeBackend) -> None:
        await backend.create(sb)
        await backend.delete(sb.id, {})

    run(cluster, body)
    made = calls(cluster, sb.id)
    assert made["create services"] == 3 and made["create secrets"] == 2


def test_errors_that_do_not_go_away_become_unavailable(cluster: Cluster) -> None:
    cluster.api.faults.append(Fault("create", "secrets", 500, "boom", count=100))

    async def body(backend: KnativeBackend) -> None:
        with pytest.raises(Unavailable, match="kept failing"):
            await backend.create(spec())

    run(cluster, body, retries=2)


def test_a_failed_revision_surfaces_its_message(cluster: Cluster) -> None:
    cluster.knative.bad_images["registry.example/nope:1"] = "MANIFEST_UNKNOWN: manifest unknown"
    sb = spec(image="registry.example/nope:1")

    async def body(backend: KnativeBackend) -> None:
        with pytest.raises(Unavailable) as err:
            await backend.create(sb)
        assert f"revision {sb.id}-00001 failed" in err.value.message
        assert 'Unable to fetch image "registry.example/nope:1": MANIFEST_UNKNOWN' in err.value.message

    run(cluster, body)
    assert sb.id not in cluster.api.objects[("services", NAMESPACE)]


def test_the_watch_recovers_from_expired_versions(cluster: Cluster) -> None:
    async def body(backend: KnativeBackend) -> int:
        first = spec()
        await backend.create(first)
        cluster.api.run(_async(cluster.api.expire_history))
        cluster.api.run(_async(cluster.api.drop_watches))  # the client comes back with a version now gone
        second = spec()
        await backend.create(second)
        for s in (first, second):
            await backend.delete(s.id, {})
        return backend._services[NAMESPACE].relists

    # The second create got ready by watch after a 410 forced a relist; on a loaded machine the stand-in's
    # watch may also time out and come back once more, so count "at least one relist after the first list".
    assert run(cluster, body) >= 2


async def _async(fn: Callable[[], None]) -> None:
    fn()


def test_pod_endpoint_from_endpointslices_and_fallback(cluster: Cluster) -> None:
    sb = spec()

    async def body(backend: KnativeBackend) -> None:
        started = await backend.create(sb)
        pod = cluster.knative.services[sb.id].pod
        assert pod is not None and started.endpoint.url == f"http://{pod.address}:8012"  # queue-proxy's port
        assert (await exec_(cluster, started, "echo direct"))["stdout"] == "direct\n"
        await asyncio.to_thread(cluster.knative.scale_to_zero, sb.id)
        deadline = time.monotonic() + 5
        while await backend.is_running(sb.id, started.handle) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert not await backend.is_running(sb.id, started.handle)  # its pod left: the router goes idle
        handle = await backend.stop(sb.id, started.handle)
        again = await backend.resume(sb, handle)
        # No pod now: the revision's Service (the activator on a cluster) wakes one.
        assert again.endpoint.url == f"http://{sb.id}-00001.{NAMESPACE}.svc.cluster.local"
        await backend.delete(sb.id, {})

    run(cluster, body, endpoint_mode="pod")


def test_orphans_are_collected_and_a_lost_service_is_recreated(cluster: Cluster) -> None:
    kept, orphan = spec(), spec()

    async def first(backend: KnativeBackend) -> None:
        await backend.create(kept)
        await backend.create(orphan)

    run(cluster, first)

    async def second(backend: KnativeBackend) -> None:
        assert await backend.collect_orphans({kept.id}) == [orphan.id]
        # Someone deleted the kept sandbox's Service behind the router's back: resume makes it again.
        cluster.api.run(cluster.knative.deleted(cluster.api.objects[("services", NAMESPACE)][kept.id]))
        cluster.api.run(_async(lambda: cluster.api.remove("services", NAMESPACE, kept.id) and None))
        deadline = time.monotonic() + 5
        while await backend.is_running(kept.id, {}) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        started = await backend.resume(kept, {})
        assert (await exec_(cluster, started, "echo back"))["stdout"] == "back\n"
        await backend.delete(kept.id, {})

    run(cluster, second)


def test_token_bucket_bounds_the_rate() -> None:
    async def body() -> float:
        bucket = TokenBucket(rate=50.0, burst=5)
        started = time.monotonic()
        await asyncio.gather(*(bucket.acquire() for _ in range(15)))
        return time.monotonic() - started

    took = asyncio.run(body())
    assert 0.17 < took < 1.0  # 5 at once, then 10 at 50/s
