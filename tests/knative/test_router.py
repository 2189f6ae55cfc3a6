"""``grove up --backend knative`` end to end: router subprocess → stand-in Kubernetes API → executor pods.

The router is the real CLI with a kubeconfig for the stand-in; S3 is the real embedded server.
Scale-to-zero is the stand-in autoscaler's (SIGTERM: the executor snapshots to S3); the next call goes
through the stand-in's activator, which starts a new pod with an empty filesystem that restores the
snapshot — so files that come back came back through S3. The router runs in the default ``revision``
endpoint mode; the tests share one cluster and router (``test_endpoint_modes`` runs the other modes).
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from artifacts.s3server import EmbeddedS3
from artifacts.store import ObjectStore
from grove.core.errors import UpstreamTimeout
from router.backends.knative.manifest import policy_name, secret_name, snapshot_key
from tests.support.knative_fixtures import INSTANCE, NAMESPACE, PART_MIB, Cluster
from tests.support.knative_standin import apply_defaults
from tests.support.router_fixtures import RouterProcess, error_of, wait_for
from tests.support.s3_fixtures import config_for


@pytest.fixture(scope="module")
def cluster(module_cluster: Cluster) -> Cluster:
    """The module's stand-in cluster."""
    return module_cluster


@pytest.fixture(scope="module")
def knative_router(module_knative_router: RouterProcess) -> RouterProcess:
    """The module's router, in the default ``revision`` endpoint mode."""
    return module_knative_router


def bucket_store(router: RouterProcess, s3: EmbeddedS3) -> ObjectStore:
    """The router's bucket on the shared S3 server."""
    return ObjectStore(config_for(s3, router.up_args[router.up_args.index("--s3-bucket") + 1]))


def writes(cluster: Cluster, sandbox_id: str) -> dict[str, int]:
    return {f"{verb} {plural}": n for (owner, verb, plural), n in cluster.api.calls.items()
            if owner == sandbox_id and verb in ("create", "delete")}


def test_files_survive_scale_to_zero_through_s3(knative_router: RouterProcess, cluster: Cluster,
                                                s3_server: EmbeddedS3) -> None:
    store = bucket_store(knative_router, s3_server)
    with knative_router.client() as grove:
        sb = grove.create("python:3.11-slim", heartbeat=False, metadata={"task_id": "swe/1", "model": "m"},
                          network={"egress": "allow", "allow": ["10.0.0.0/8:443"]})
        info = sb.info
        assert info["status"] == "ready" and info["image_digest"].startswith("sha256:")
        assert sb.exec("echo hello").stdout == b"hello\n"
        sb.write_file("notes/plan.txt", b"step 1\n")
        sb.exec("mkdir -p src && echo 'print(1)' > src/main.py && chmod 700 src")
        sb.exec("echo lost > ../outside-workdir.txt")  # outside the workdir: the container's layer only
        first_pod = cluster.knative.services[sb.id].pod
        assert first_pod is not None

        cluster.knative.scale_to_zero(sb.id)  # the autoscaler's decision: SIGTERM, snapshot, pod gone
        assert cluster.knative.services[sb.id].pod is None and store.exists(snapshot_key(INSTANCE, sb.id))

        # The next call wakes a new pod through the activator; its empty filesystem restores from S3.
        assert sb.read_file("notes/plan.txt") == b"step 1\n"
        second_pod = cluster.knative.services[sb.id].pod
        assert second_pod is not None and second_pod.proc.pid != first_pod.proc.pid
        assert sb.exec("cat src/main.py && stat -c %a src").stdout == b"print(1)\n700\n"
        assert cluster.knative.services[sb.id].starts == 2
        assert sb.exec("cat ../outside-workdir.txt").exit_code != 0  # exactly the workdir survives

        steps = knative_router.http("GET", f"/v1/sandboxes/{sb.id}/trajectory").json()
        assert sum(1 for s in steps["steps"] if s.get("type") == "exec") >= 3

        gone = knative_router.http("DELETE", f"/v1/sandboxes/{sb.id}")
        assert gone.status == 200 and gone.json()["status"] == "deleted"
        assert secret_name(sb.id) not in cluster.api.objects[("secrets", NAMESPACE)]
        assert policy_name(sb.id) not in cluster.api.objects[("networkpolicies", NAMESPACE)]
        wait_for(lambda: sb.id not in cluster.api.objects[("services", NAMESPACE)], 15, 0.05, "the Service to go")
        # Removed only after the pod (which wrote a last snapshot while terminating) was gone.
        wait_for(lambda: not store.exists(snapshot_key(INSTANCE, sb.id)), 10, 0.05, "the snapshot to be removed")
    assert writes(cluster, sb.id) == {"create secrets": 1, "create services": 1, "create networkpolicies": 1,
                                      "delete services": 1, "delete secrets": 1, "delete networkpolicies": 1}
    store.close()


def test_router_idle_and_resume_make_no_api_writes(knative_router: RouterProcess, cluster: Cluster) -> None:
    with knative_router.client() as grove:
        sb = grove.create(heartbeat=False, idle_timeout_s=1)
        assert sb.exec("echo a > a.txt").exit_code == 0
        wait_for(lambda: knative_router.http("GET", f"/v1/sandboxes/{sb.id}").json()["status"] == "idle", 10, 0.1,
                 "the router to mark the sandbox idle")
        assert sb.exec("cat a.txt").stdout == b"a\n"
        assert knative_router.http("GET", f"/v1/sandboxes/{sb.id}").json()["status"] == "ready"
        assert writes(cluster, sb.id) == {"create secrets": 1, "create services": 1}
        service = cluster.api.objects[("services", NAMESPACE)][sb.id]
        image = service["spec"]["template"]["spec"]["containers"][0]["image"]
        assert image == "docker.io/library/debian:bookworm-slim"  # what "default" means on a cluster


def test_a_restarted_router_readopts_its_sandboxes(knative_router: RouterProcess, cluster: Cluster) -> None:
    with knative_router.client() as grove:
        sb = grove.create(heartbeat=False)
        sb.write_file("/tmp/x", b"x")
    knative_router.stop()
    knative_router.start()
    with knative_router.client() as grove:
        again = grove.attach(sb.id)
        assert again.info["status"] == "ready"
        assert again.read_file("/tmp/x") == b"x"
        assert writes(cluster, sb.id) == {"create secrets": 1, "create services": 1}  # adopted, not made again
        again.close()


def test_a_failed_revision_is_reported_by_the_api(knative_router: RouterProcess, cluster: Cluster) -> None:
    cluster.knative.bad_images["ghcr.io/nobody/missing:1"] = "denied: requested access to the resource is denied"
    before = set(cluster.leftovers())
    reply = knative_router.http("POST", "/v1/sandboxes", json_body={"image": "ghcr.io/nobody/missing:1"})
    assert reply.status == 503
    message = error_of(reply)["message"]
    assert "failed" in message and 'Unable to fetch image "ghcr.io/nobody/missing:1": denied' in message
    deadline = time.monotonic() + 5
    while set(cluster.leftovers()) - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not set(cluster.leftovers()) - before


def test_a_workspace_near_its_disk_limit_snapshots_without_eviction(knative_router: RouterProcess,
                                                                   cluster: Cluster, s3_server: EmbeddedS3) -> None:
    """A snapshot is a multipart upload from one part of memory, nothing on the pod's disk: 40 MiB in a
    64 MiB sandbox (over half its quota) survives scale-to-zero in nine parts of 5 MiB (staged in /tmp it
    would be 80 MiB, and the kubelet would evict the pod mid-snapshot). The kubelet's SIGKILL in the middle
    of the next snapshot leaves the last one (only a completed upload replaces it); the upload left behind
    is aborted by the snapshot after."""
    store = bucket_store(knative_router, s3_server)
    with knative_router.client() as grove:
        sb = grove.create("python:3.11-slim", heartbeat=False, disk_mb=64)
        key, evictions = snapshot_key(INSTANCE, sb.id), cluster.knative.evictions
        digest = sb.exec("head -c 40M /dev/urandom > big.bin && sha256sum big.bin").stdout
        cluster.knative.scale_to_zero(sb.id)
        assert cluster.knative.evictions == evictions
        good = store.stat(key)
        assert good.size > 8 * PART_MIB * 2**20 and store.incomplete_uploads(key) == []
        assert sb.exec("sha256sum big.bin && echo v2 > state.txt").stdout == digest

        pod = cluster.knative.services[sb.id].pod
        assert pod is not None
        pod.proc.send_signal(signal.SIGTERM)  # the executor starts its exit snapshot ...
        wait_for(lambda: store.incomplete_uploads(key), 20, 0.01, "the exit snapshot's upload to start")
        os.killpg(pod.proc.pid, signal.SIGKILL)  # ... and dies before it completes
        cluster.knative.scale_to_zero(sb.id)
        assert store.stat(key).etag == good.etag and len(store.incomplete_uploads(key)) == 1
        assert sb.exec("sha256sum big.bin").stdout == digest  # the last good snapshot came back
        assert sb.exec("test -e state.txt").exit_code == 1
        sb.write_file("state.txt", b"v3\n")
        cluster.knative.scale_to_zero(sb.id)
        assert store.stat(key).etag != good.etag and store.incomplete_uploads(key) == []
        assert sb.read_file("state.txt") == b"v3\n"

        # Past the limit, the stand-in's kubelet evicts the pod, as a real one would.
        sb.exec("head -c 30M /dev/urandom > more.bin", timeout_s=30)
        wait_for(lambda: cluster.knative.evictions == evictions + 1, 10, 0.05, "the eviction")
        sb.close()
    wait_for(lambda: not store.exists(key) and not store.incomplete_uploads(key), 10, 0.05, "the snapshot to go")
    store.close()


def test_a_call_queue_proxy_cuts_is_a_clear_504_not_a_retry(knative_router: RouterProcess, cluster: Cluster) -> None:
    """A revision whose response-start timeout is the cluster's default (as before grove set its own): the
    stand-in's queue-proxy (a warm revision's Service goes straight to it) answers a plain-text 504, which the
    router names instead of passing on."""
    with knative_router.client() as grove:
        sb = grove.create("python:3.11-slim", heartbeat=False)
        template = cluster.knative.services[sb.id].obj["spec"]["template"]["spec"]
        del template["responseStartTimeoutSeconds"]
        apply_defaults(template, {**cluster.knative.config["config-defaults"],
                                  "revision-response-start-timeout-seconds": "1"})
        timeouts, activations = cluster.knative.timeouts, cluster.knative.hops["activator"]
        with pytest.raises(UpstreamTimeout) as err:
            sb.exec("sleep 2; echo late > late.txt")
        assert "cut the call with a 504 ('request timeout')" in err.value.message
        # One call: the SDK did not retry into the same request id; and not through the activator.
        assert cluster.knative.timeouts == timeouts + 1 and cluster.knative.hops["activator"] == activations
        sb.close()


def test_a_cold_start_counts_against_the_activators_timeout(knative_router: RouterProcess, cluster: Cluster) -> None:
    """The activator's timeout handler starts when the request arrives, so a cold start (here a 1.5 s image
    pull) slower than the revision's response-start timeout is the activator's 504, which the router names;
    the pod the activator asked for comes up regardless, and the next call reaches it."""
    with knative_router.client() as grove:
        sb = grove.create("python:3.11-slim", heartbeat=False)
        ks = cluster.knative.services[sb.id]
        ks.obj["spec"]["template"]["spec"]["responseStartTimeoutSeconds"] = 1
        cluster.knative.scale_to_zero(sb.id)
        cluster.knative.pull_s = 1.5
        try:
            with pytest.raises(UpstreamTimeout) as err:
                sb.exec("echo cold")
        finally:
            cluster.knative.pull_s = 0.0
        assert "cut the call with a 504 ('activator request timeout')" in err.value.message
        assert "cold start" in err.value.message
        wait_for(lambda: ks.pod is not None and ks.pod.serving, 15, 0.05, "the pod the activator asked for")
        assert sb.exec("echo warm").stdout == b"warm\n"
        sb.close()
