"""A cluster for the Knative tests without a cluster: the stand-in API server with Knative on top.

``cluster`` is a :class:`Cluster`: the real-protocol API server (:mod:`tests.support.k8s_standin`), Knative's
part (:mod:`tests.support.knative_standin`) running executors from a real runtime bundle, and a kubeconfig file
pointing at it. ``knative_router`` is ``grove up --backend knative --kubeconfig FILE`` as a subprocess on
it, in the default ``revision`` endpoint mode (it resolves revision hostnames through the stand-in's DNS,
see :class:`tests.support.cluster_network.ServiceNetwork`), using the session's real S3 server with a
bucket of its own. At the end every sandbox is deleted through the API, and the test fails if any Knative
Service, Secret, NetworkPolicy or pod is left; whatever is left is killed regardless.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from artifacts.s3server import EmbeddedS3
from router.backends.knative.options import DEFAULT_RUNTIME_CLASS, KnativeOptions
from sandbox_image.bundle import Bundle, build_bundle
from tests.conftest import free_tcp_port
from tests.support.crd_schema import REPO
from tests.support.k8s_standin import KubeStandin
from tests.support.knative_standin import KnativeStandin
from tests.support.router_fixtures import RouterProcess, router_state
from tests.support.s3_fixtures import new_bucket

NAMESPACE = "grove-sandboxes"
INSTANCE = KnativeOptions.instance
"""The ``--instance`` of the stand-in routers unless a test gives another (``grove up``'s default)."""
PART_MIB = 5
"""Part size of the stand-in routers' snapshot uploads."""


@dataclass
class Cluster:
    """The stand-in cluster of one test."""

    api: KubeStandin
    knative: KnativeStandin
    kubeconfig: Path
    scratch: Path

    def options(self, **overrides: object) -> KnativeOptions:
        """Backend options for this cluster (the default ``revision`` endpoint mode: an in-process client
        reaches revision URLs through the stand-in's ``gateway``)."""
        values: dict[str, object] = {"namespace": NAMESPACE, "kubeconfig": str(self.kubeconfig),
                                     "backoff_s": 0.01, "ready_timeout_s": 30.0, "idle_snapshot_s": 0.0}
        values.update(overrides)
        return KnativeOptions(**values)  # type: ignore[arg-type]

    def leftovers(self) -> list[str]:
        """Grove's objects whose deletion nobody asked for (a Service being deleted waits for its pod)."""
        return [f"{plural}/{name}" for (plural, _), objs in self.api.objects.items()
                if plural in ("services", "secrets", "networkpolicies")
                for name, obj in objs.items() if not obj["metadata"].get("deletionTimestamp")]


def role_rules() -> set[tuple[str, str]]:
    """(verb, resource) pairs the router's Role in the sandbox namespace (``knative/rbac.yaml``) grants."""
    docs = yaml.safe_load_all((REPO / "knative" / "rbac.yaml").read_text())
    role = next(d for d in docs if d and d["kind"] == "Role" and d["metadata"]["namespace"] == NAMESPACE)
    return {(verb, res) for rule in role["rules"] for res in rule["resources"] for verb in rule["verbs"]}


def granted() -> set[tuple[str, str, str]]:
    """(verb, resource, namespace) the router gets from every Role and ClusterRole of ``knative/rbac.yaml``
    (namespace "" for a ClusterRole's)."""
    docs = yaml.safe_load_all((REPO / "knative" / "rbac.yaml").read_text())
    return {(verb, res, d["metadata"].get("namespace", "") if d["kind"] == "Role" else "")
            for d in docs if d and d["kind"] in ("Role", "ClusterRole")
            for rule in d["rules"] for res in rule["resources"] for verb in rule["verbs"]}


def add_runtime_class(api: KubeStandin, name: str = DEFAULT_RUNTIME_CLASS) -> None:
    """Install a RuntimeClass, as an operator who set up gVisor on the nodes would."""
    api.put("runtimeclasses", "", {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": name},
                                   "handler": "runsc"}, "ADDED")


@pytest.fixture(scope="session")
def runtime_bundle(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    """The runtime bundle the stand-in's init container 'copies' (built once per session)."""
    return build_bundle(tmp_path_factory.mktemp("knative-bundle") / "runtime")


@contextlib.contextmanager
def stand_in_cluster(bundle: Bundle) -> Iterator[Cluster]:
    """A fresh stand-in cluster for the block; fails if grove left anything in it."""
    scratch = Path(tempfile.mkdtemp(prefix="gk-"))
    api = KubeStandin(token="t-" + secrets.token_hex(8)).start()
    api.allowed = granted()  # everything grove does must be allowed by knative/rbac.yaml's roles
    knative = KnativeStandin(api, bundle, scratch, time_scale=0.05).install()
    add_runtime_class(api)  # sandboxes run under gVisor by default: the cluster has it
    kubeconfig = scratch / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(api.kubeconfig(NAMESPACE)))
    found = Cluster(api, knative, kubeconfig, scratch)
    try:
        yield found
        left = found.leftovers()
    finally:
        knative.close()
        api.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    assert not left, f"grove left objects in the cluster: {left}"


@contextlib.contextmanager
def knative_router_on(
    cluster: Cluster, s3: EmbeddedS3, *more_args: str, mode: str = "revision", bucket: str | None = None,
    port: int | None = None, key: str | None = None, env: dict[str, str] | None = None,
) -> Iterator[RouterProcess]:
    """``grove up --backend knative [more_args]`` against the stand-in for the block, with the real S3 server, in
    endpoint mode ``mode``, on ``bucket`` (None: a new bucket of its own); it runs with the cluster's DNS, so
    revision URLs resolve to their Services' ClusterIPs. ``port``, ``key`` (None: a free one, a new one) and
    ``env`` for routers that must know each other before they start (shards)."""
    state = Path(os.path.realpath(tempfile.mkdtemp(prefix="gkr-")))
    port = port or free_tcp_port()
    router = RouterProcess(
        state, key=key or "gk-" + secrets.token_hex(16), port=port,
        # Executors reach the router on loopback for their snapshot uploads, in parts of S3's smallest size
        # (5 MiB), so a few tens of MiB of workspace make a snapshot of several parts.
        up_args=("--backend", "knative", "--namespace", NAMESPACE, "--kubeconfig", str(cluster.kubeconfig),
                 "--endpoint-mode", mode, "--s3", s3.endpoint, "--s3-bucket", bucket or new_bucket(),
                 "--router-url", f"http://127.0.0.1:{port}", "--snapshot-part-mib", str(PART_MIB), *more_args),
        extra_env={"GROVE_S3_ACCESS_KEY": s3.access_key, "GROVE_S3_SECRET_KEY": s3.secret_key, **(env or {})},
        backend="knative", launcher=cluster.knative.network.wrap(),
    )
    try:
        router.start()
        yield router
        router.delete_all()
    finally:
        code = router.stop()
        log = router.log()
        shutil.rmtree(state, ignore_errors=True)
    assert code in (None, 0), f"the router exited with {code}:\n{log}"


@pytest.fixture
def cluster(runtime_bundle: Bundle) -> Iterator[Cluster]:
    """A fresh stand-in cluster; fails the test if grove left anything in it."""
    with stand_in_cluster(runtime_bundle) as found:
        yield found


@pytest.fixture
def knative_router(cluster: Cluster, s3_server: EmbeddedS3) -> Iterator[RouterProcess]:
    """``grove up --backend knative`` against the stand-in, with the real S3 server."""
    with knative_router_on(cluster, s3_server) as router:
        yield router


@pytest.fixture(scope="module")
def module_cluster(runtime_bundle: Bundle) -> Iterator[Cluster]:
    """A stand-in cluster shared by a module's tests (fails the module if grove left anything in it)."""
    with stand_in_cluster(runtime_bundle) as found:
        yield found


@pytest.fixture(scope="module")
def module_knative_router(module_cluster: Cluster, s3_server: EmbeddedS3) -> Iterator[RouterProcess]:
    """A router on the module's cluster, in the default ``revision`` endpoint mode."""
    with knative_router_on(module_cluster, s3_server) as router:
        yield router


@pytest.fixture(scope="module", params=["local", "knative"])
def any_router(
    request: pytest.FixtureRequest, runtime_bundle: Bundle, s3_server: EmbeddedS3
) -> Iterator[RouterProcess]:
    """The module's router, once per backend: modules that use it as ``router`` run against both.

    A test about the host (cgroups, namespaces, the router's own memory) is marked ``local_only`` and
    is not collected for Knative, where a cluster provides its own.
    """
    if request.param == "local":
        with router_state(s3=s3_server) as router:
            yield router
    else:
        with stand_in_cluster(runtime_bundle) as found, knative_router_on(found, s3_server) as router:
            yield router
