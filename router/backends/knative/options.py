"""The Knative backend's configuration: one frozen value, built by the CLI (or a test), passed in."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from grove.core.errors import Invalid
from router.backends.knative import capacity

DEFAULT_RUNTIME_IMAGE = "ghcr.io/grove-sandbox/grove-runtime:0.1.0"
ENDPOINT_MODES = ("revision", "address", "pod")
DEFAULT_RUNTIME_CLASS = "gvisor"
"""Sandboxes run untrusted code: under gVisor unless the router is told otherwise (GKE Sandbox's name too)."""
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


@dataclass(frozen=True)
class KnativeOptions:
    """How the router reaches the cluster and what every sandbox's objects look like."""

    namespace: str = "grove-sandboxes"
    """Namespace the sandboxes' Knative Services, Secrets and NetworkPolicies live in (unless ``namespaces``)."""
    namespaces: tuple[str, ...] = ()
    """Namespaces to spread the sandboxes over, each new one to the emptiest with room; empty: ``namespace``
    alone. Each needs the router's Role (``knative/rbac.yaml``) and grove's NetworkPolicies."""
    namespace_capacity: int = capacity.PER_NAMESPACE
    """Sandboxes one namespace takes: by default what keeps it within Kubernetes' thresholds."""
    cluster_capacity: int = capacity.PER_CLUSTER
    """Sandboxes of this router the cluster takes: by default what keeps it within Kubernetes' thresholds."""
    kubeconfig: str | None = None
    """A kubeconfig file; None: in-cluster config when running in a pod, else ``~/.kube/config``."""
    context: str | None = None
    """Context of the kubeconfig to use (None: its current context)."""
    runtime_image: str = DEFAULT_RUNTIME_IMAGE
    """Image of the init container that copies the runtime bundle (``sandbox_image/Dockerfile``)."""
    default_image: str = "docker.io/library/debian:bookworm-slim"
    """The image of sandboxes that ask for ``default`` (the local backend's built-in image name)."""
    instance: str = "grove"
    """This router's name in the ``grove.dev/instance`` label: orphan collection touches only its own."""
    endpoint_mode: str = "revision"
    """``revision``: the revision's own Service (activator when cold, pod when warm); ``address``: the
    Knative Service's ``status.address.url`` (through the cluster-local gateway); ``pod``: the ready
    pod's IP on the queue-proxy port from its EndpointSlice, falling back to the revision URL."""
    cluster_domain: str = "cluster.local"
    """DNS suffix of cluster Services, for revision URLs: Knative's activator takes the revision from a Host
    ``<revision>.<namespace>.svc.<cluster domain>`` and answers 404 to any other domain."""
    request_timeout_s: int = 3600
    """``timeoutSeconds`` of each revision: the longest single data-path call (a long exec)."""
    ready_timeout_s: float = 600.0
    """How long a create or resume waits for ``Ready=True`` before giving up."""
    progress_deadline_s: int = 300
    """``serving.knative.dev/progress-deadline``: when Knative declares a revision that never got ready failed."""
    idle_snapshot_s: float = 60.0
    """The executor snapshots its workspace after this long without a request (0: only on SIGTERM)."""
    router_url: str = "http://grove-router.grove-system.svc.cluster.local:8470"
    """The router as sandbox pods reach it: executors ask it for their snapshots' multipart uploads."""
    snapshot_part_bytes: int = 16 * 1024 * 1024
    """One part of a snapshot's multipart upload: what an executor holds in memory while it snapshots.
    At least 5 MiB: S3 (AWS, MinIO and SeaweedFS alike) refuses smaller parts but the last."""
    create_qps: float = 20.0
    """Sustained Kubernetes write calls per second for creates (token bucket rate)."""
    create_burst: int = 40
    """Writes allowed at once before the rate applies (token bucket size)."""
    delete_qps: float = 20.0
    """Sustained Kubernetes write calls per second for deletes."""
    delete_burst: int = 40
    """Deletes allowed at once before the rate applies."""
    retries: int = 5
    """Attempts after the first on 429, 5xx and connection errors (exponential backoff with jitter)."""
    backoff_s: float = 0.2
    """First backoff delay; doubled per attempt, capped at 10 s, or the server's Retry-After."""
    api_timeout_s: float = 30.0
    """Read timeout of every Kubernetes call (a call that hangs longer is retried like a dropped connection)."""
    watch_idle_timeout_s: float = 90.0
    """A watch silent this long is restarted from its version (the API server sends bookmarks about every
    minute, so silence this long means a connection dropped without being closed)."""
    list_page_size: int = 500
    """Objects per page when the informers list (``limit``/``continue``)."""
    api_threads: int = 16
    """Threads making blocking Kubernetes calls (and the client's connection pool size)."""
    init_cpu: str = "100m"
    """CPU request and limit of the init container."""
    init_memory: str = "128Mi"
    """Memory request and limit of the init container."""
    runtime_class: str | None = DEFAULT_RUNTIME_CLASS
    """``runtimeClassName`` of every sandbox pod, e.g. ``gvisor`` or ``kata``: a kernel boundary between
    sandbox and node, which namespaces alone (the local backend) cannot give. The RuntimeClass must exist
    in the cluster, and Knative's ``kubernetes.podspec-runtimeclassname`` feature be enabled (checked at
    start, :mod:`router.backends.knative.runtimeclass`). None (``--runtime-class none``): the node's own runtime."""

    cluster_cidrs: tuple[str, ...] = ()
    """The cluster's pod, service and node CIDRs: an ``egress: allow`` sandbox reaches none of them unless an
    allow-list entry lies inside one (RFC 1918, 100.64/10 and fc00::/7 are closed the same way already)."""

    def __post_init__(self) -> None:
        for ns in self.spread:
            if not _DNS_LABEL.fullmatch(ns):
                raise Invalid(f"namespace {ns!r} is not a valid namespace name (lowercase letters, digits and '-', "
                              "at most 63 characters)")
        if len(set(self.spread)) != len(self.spread):
            raise Invalid(f"the namespaces {', '.join(self.spread)} name one more than once")
        if min(self.namespace_capacity, self.cluster_capacity) < 1:
            raise Invalid("namespace and cluster capacities must be at least 1 sandbox")
        if self.endpoint_mode not in ENDPOINT_MODES:
            raise Invalid(f"endpoint mode must be one of {', '.join(ENDPOINT_MODES)}, got {self.endpoint_mode!r}")
        if self.request_timeout_s < 1 or self.progress_deadline_s < 1:
            raise Invalid("request timeout and progress deadline must be at least 1 s")
        if min(self.create_qps, self.delete_qps) <= 0 or min(self.create_burst, self.delete_burst) < 1:
            raise Invalid("rate limits need a positive rate and a burst of at least 1")
        for cidr in self.cluster_cidrs:
            try:
                ipaddress.ip_network(cidr, strict=True)
            except ValueError as exc:
                raise Invalid(f"cluster CIDR {cidr!r} is not a network (e.g. 10.244.0.0/16): {exc}") from exc
        if self.snapshot_part_bytes < 5 * 1024 * 1024:
            raise Invalid(f"a snapshot part must be at least 5 MiB (S3's smallest), got {self.snapshot_part_bytes} B")
        if not self.router_url.startswith(("http://", "https://")):
            raise Invalid(f"the router URL for sandboxes must be http(s)://host:port, got {self.router_url!r}")
        if not _DNS_SUBDOMAIN.fullmatch(self.cluster_domain):
            raise Invalid(f"cluster domain {self.cluster_domain!r} is not a DNS name (the cluster's: cluster.local, "
                          "unless its kubelets were configured otherwise)")
        if self.runtime_class is not None and not _DNS_SUBDOMAIN.fullmatch(self.runtime_class):
            raise Invalid(
                f"runtime class {self.runtime_class!r} is not a valid RuntimeClass name "
                "(lowercase letters, digits, '-' and '.', at most 253 characters)"
            )

    @property
    def spread(self) -> tuple[str, ...]:
        """The namespaces sandboxes go to, in order."""
        return self.namespaces or (self.namespace,)

    def image_for(self, image: str) -> str:
        """The image reference to run for a requested image name."""
        return self.default_image if image == "default" else image
