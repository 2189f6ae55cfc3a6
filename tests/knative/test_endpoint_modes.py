"""A sandbox's whole life through a ``grove up --backend knative`` subprocess in each endpoint mode.

Each mode reaches the executor by its own path through the stand-in's data plane, which the test checks
hop by hop (``KnativeStandin.hops``):

* ``revision`` (the default): ``<revision>.<ns>.svc.cluster.local``, resolved by the router's own resolver to
  the revision's ClusterIP; a warm pod's queue-proxy directly (``target-burst-capacity: 0``), the
  activator (by Host header) when the revision has no pod.
* ``address``: ``status.address.url``, the cluster-local gateway, which adds Knative's revision headers and
  goes on to the same ClusterIP.
* ``pod``: the ready pod's IP on queue-proxy's 8012, from the EndpointSlice; with no pod, the revision URL.

The routers share one stand-in cluster (one per module); everything else about the Knative backend runs in
``revision`` mode in the other modules.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

import pytest

from artifacts.s3server import EmbeddedS3
from sandbox_image.bundle import Bundle
from tests.support.knative_fixtures import NAMESPACE, Cluster, knative_router_on, stand_in_cluster
from tests.support.knative_standin import QUEUE_PORT
from tests.support.router_fixtures import RouterProcess, wait_for


@pytest.fixture(scope="module")
def shared_cluster(runtime_bundle: Bundle) -> Iterator[Cluster]:
    """One stand-in cluster for the module's routers."""
    with stand_in_cluster(runtime_bundle) as found:
        yield found


@pytest.fixture(scope="module", params=["revision", "address", "pod"])
def mode_router(request: pytest.FixtureRequest, shared_cluster: Cluster,
                s3_server: EmbeddedS3) -> Iterator[RouterProcess]:
    """A router in each endpoint mode."""
    with knative_router_on(shared_cluster, s3_server, mode=request.param) as router:
        yield router


def _record(router: RouterProcess, sandbox_id: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(router.layout.record(sandbox_id).read_text())
    return found


def _activator(address: str, headers: dict[str, str]) -> int:
    """The status of a readiness check sent straight to the activator with ``headers``."""
    connection = http.client.HTTPConnection(address, QUEUE_PORT, timeout=30)
    try:
        connection.request("GET", "/healthz", headers=headers)
        return connection.getresponse().status
    finally:
        connection.close()


def _mode(router: RouterProcess) -> str:
    return router.up_args[router.up_args.index("--endpoint-mode") + 1]


def test_create_exec_files_scale_to_zero_wake_delete(mode_router: RouterProcess, shared_cluster: Cluster) -> None:
    mode, knative = _mode(mode_router), shared_cluster.knative
    with mode_router.client() as grove:
        sb = grove.create("python:3.11-slim", heartbeat=False)
        ks = knative.services[sb.id]
        assert ks.pod is not None
        expected = {"revision": f"http://{ks.revision}.{NAMESPACE}.svc.cluster.local",
                    "address": ks.address, "pod": f"http://{ks.pod.address}:{QUEUE_PORT}"}[mode]
        assert _record(mode_router, sb.id)["endpoint_url"] == expected

        # Warm: never the activator; the gateway only in address mode; queue-proxy always.
        before = dict(knative.hops)
        sb.write_file("in/data.bin", b"\x00payload\xff")
        assert sb.exec("cat in/data.bin | wc -c").stdout == b"9\n"
        assert sb.read_file("in/data.bin") == b"\x00payload\xff"
        hops = {k: v - before.get(k, 0) for k, v in knative.hops.items()}
        assert hops.get("activator", 0) == 0 and hops["queue-proxy"] >= 3, hops
        assert (hops.get("gateway", 0) >= 3) == (mode == "address"), hops

        # The activator finds the revision as Knative's does: its headers, else a Host <revision>.<ns>.svc.<domain>.
        assert _activator(knative.activator, {"Host": f"{ks.revision}.{NAMESPACE}.svc.cluster.local"}) == 200
        assert _activator(knative.activator, {"Host": f"{ks.revision}.{NAMESPACE}.svc.cluster.local:80"}) == 200
        assert _activator(knative.activator, {"Host": "anything", "Knative-Serving-Revision": ks.revision,
                                              "Knative-Serving-Namespace": NAMESPACE}) == 200
        assert _activator(knative.activator, {"Host": f"{ks.revision}.{NAMESPACE}"}) == 404
        assert _activator(knative.activator, {"Host": f"{ks.revision}.{NAMESPACE}.svc.example.org"}) == 404

        # Cold: the pod snapshots and goes; the next call wakes a new one through the activator. In pod mode the
        # EndpointSlice lags, so the call first dials the gone pod's address: the router sends it again.
        knative.slice_lag_s = 1.0 if mode == "pod" else 0.0
        try:
            knative.scale_to_zero(sb.id)
            before = dict(knative.hops)
            assert sb.read_file("in/data.bin") == b"\x00payload\xff"  # restored from the snapshot in S3
        finally:
            knative.slice_lag_s = 0.0
        assert knative.hops["activator"] - before.get("activator", 0) >= 1
        assert ks.starts == 2 and ks.pod is not None
        if mode == "pod":  # its pod gone from the EndpointSlice, the router woke it by the revision URL
            assert _record(mode_router, sb.id)["endpoint_url"] == f"http://{ks.revision}.{NAMESPACE}.svc.cluster.local"
        assert sb.exec("echo again").stdout == b"again\n"

        gone = mode_router.http("DELETE", f"/v1/sandboxes/{sb.id}")
        assert gone.status == 200
        wait_for(lambda: sb.id not in shared_cluster.api.objects[("services", NAMESPACE)], 15, 0.05,
                 "the Service to go")
