"""The Kubernetes objects of one sandbox: its Knative Service, its Secret and its egress NetworkPolicy.

Pure functions of the sandbox's spec and the backend's options, so ``grove knative manifest`` prints
exactly what a create sends. The Service's template never changes after the create (any change would
make a new revision, i.e. a new pod, and lose the workspace): everything that differs per sandbox and
is secret — the executor token, the command environment, the snapshot's GET URL and upload token — is in
the Secret.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from grove.core.errors import Invalid
from router.backends.base import Network, SandboxSpec
from router.backends.knative import egress
from router.backends.knative import labels as L
from router.backends.knative.options import KnativeOptions
from sandbox_image.bundle import DEFAULT_MOUNT_POINT, PORTABLE_LOADER, Bundle

PORT = 8080
DEFAULT_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root"}
RUNTIME_VOLUME = "grove-runtime"
DROPPED_CAPABILITIES = ("NET_RAW", "MKNOD", "AUDIT_WRITE", "SETFCAP", "SYS_CHROOT")
"""Capabilities of the container runtime's default set that no command needs."""
# Knative's own bounds for the autoscaling window (6 s to 1 h); the retention period fills the rest.
_WINDOW_MIN_S, _WINDOW_MAX_S = 6, 3600


@dataclass(frozen=True)
class SandboxObjects:
    """What the backend creates for one sandbox, in creation order."""

    secret: dict[str, Any]
    service: dict[str, Any]
    policy: dict[str, Any] | None
    """The egress NetworkPolicy, only with ``egress: allow`` (the namespace denies by default)."""

    def all(self) -> list[dict[str, Any]]:
        """The objects in the order they are created."""
        return [o for o in (self.secret, self.service, self.policy) if o is not None]


def secret_name(sandbox_id: str) -> str:
    """Name of the sandbox's Secret."""
    return f"{sandbox_id}-grove"


def policy_name(sandbox_id: str) -> str:
    """Name of the sandbox's egress NetworkPolicy."""
    return f"{sandbox_id}-egress"


def snapshot_prefix(instance: str) -> str:
    """Where the snapshots of one router instance's sandboxes live in the bucket: routers sharing a bucket
    sweep only their own."""
    return f"snapshots/{L.sanitize_value(instance)}/"


def snapshot_key(instance: str, sandbox_id: str) -> str:
    """Where the sandbox's workspace snapshot lives in the bucket."""
    return f"{snapshot_prefix(instance)}{sandbox_id}/workspace.tar.zst"


def build(
    spec: SandboxSpec,
    options: KnativeOptions,
    *,
    image: str,
    snapshot_access: tuple[str, str] | None = None,
    namespace: str | None = None,
) -> SandboxObjects:
    """The sandbox's objects in ``namespace`` (None: the options' first); ``image`` is the reference to run
    (pinned by digest when known)."""
    if not PurePosixPath(spec.workdir).is_absolute():
        raise Invalid("'workdir' must be an absolute path")
    common = {L.MANAGED_BY: "grove", L.INSTANCE: L.sanitize_value(options.instance), L.SANDBOX: spec.id}

    def meta(name: str, extra: dict[str, str]) -> dict[str, Any]:
        return {"name": name, "namespace": namespace or options.spread[0], "labels": {**common, **extra}}

    return SandboxObjects(
        secret={
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": meta(secret_name(spec.id), L.metadata_labels(spec.labels)),
            "type": "Opaque",
            "stringData": _secret_data(spec, snapshot_access),
        },
        service=_service(spec, options, image, meta(spec.id, _service_labels(spec))),
        policy=_policy(spec, options, meta(policy_name(spec.id), {})) if spec.network.egress == "allow" else None,
    )


def claim_patch(spec: SandboxSpec, made_with: Mapping[str, str],
                snapshot_access: tuple[str, str] | None = None) -> dict[str, Any]:
    """The merge patch that makes a pool member's Secret the claim's: the token, env and a snapshot GET URL as
    fresh as the claim (the member's was signed when the pool made it) its pods start with, and the claim's
    metadata labels in place of the pool's (``made_with``: the member's labels when it was made).

    The claim writes nothing else. Knative copies a Service's labels and annotations to its Configuration and
    Route (``MakeConfigurationFromExisting``, ``MakeRoute``), and the Route's on to the KIngress, so a label
    or annotation on the Service would cost those three writes on every claim; and its webhook defaults the
    template on every Service write, so with defaults changed since the member was made even a label patch
    would make a new revision. The Secret is grove's own: nothing copies it, and no write of it can start a
    pod. The Service keeps the labels it was made with (the pool's, for a member)."""
    labels: dict[str, str | None] = {key: None for key in made_with if key not in _FIXED_LABELS}
    labels.update(L.metadata_labels(spec.labels))
    return {"metadata": {"labels": labels}, "stringData": _secret_data(spec, snapshot_access)}


def executor_env(spec: SandboxSpec) -> str:
    """The executor's environment, as its Secret holds it (JSON)."""
    return json.dumps({**DEFAULT_ENV, **spec.env}, sort_keys=True)


_FIXED_LABELS = frozenset((L.MANAGED_BY, L.INSTANCE, L.SANDBOX, L.EGRESS, L.ROLE, L.VISIBILITY))
"""The labels of a sandbox's objects that are not its metadata's (a claim keeps them)."""


def _service_labels(spec: SandboxSpec) -> dict[str, str]:
    return {L.VISIBILITY: "cluster-local", L.ROLE: "sandbox", **L.metadata_labels(spec.labels)}


def _secret_data(spec: SandboxSpec, snapshot_access: tuple[str, str] | None) -> dict[str, str]:
    data = {"token": spec.token, "env": executor_env(spec)}
    if snapshot_access is not None:
        data["snapshot-get-url"], data["snapshot-upload-token"] = snapshot_access
    return data


def snapshot_upload_url(options: KnativeOptions, sandbox_id: str) -> str:
    """Where the sandbox's executor asks the router for its snapshots' multipart uploads."""
    return f"{options.router_url.rstrip('/')}/v1/sandboxes/{sandbox_id}/snapshot-upload"


def autoscaling_annotations(idle_timeout_s: float, options: KnativeOptions) -> dict[str, str]:
    """Scale-to-zero after ``idle_timeout_s`` without traffic: the stable window, then the retention."""
    idle = max(1, round(idle_timeout_s))
    window = min(max(idle, _WINDOW_MIN_S), _WINDOW_MAX_S)
    retention = min(max(idle - window, 0), _WINDOW_MAX_S)
    return {
        "autoscaling.knative.dev/min-scale": "0",
        "autoscaling.knative.dev/max-scale": "1",
        "autoscaling.knative.dev/target-burst-capacity": "0",
        "autoscaling.knative.dev/window": f"{window}s",
        "autoscaling.knative.dev/scale-to-zero-pod-retention-period": f"{retention}s",
        "serving.knative.dev/progress-deadline": f"{options.progress_deadline_s}s",
    }


def exec_timeout_limit(request_timeout_s: int) -> int:
    """The longest ``timeout_s`` an exec may ask for: its result must reach queue-proxy before the revision's
    ``timeoutSeconds`` cuts the call (a 504 the caller could not tell from a lost sandbox). The margin is
    the time to kill the command's tree and send its output: a tenth of the timeout, 2 to 30 s (on a busy
    node, a kill and the answer behind it took more than 1 s)."""
    return max(1, request_timeout_s - min(30, max(2, request_timeout_s // 10)))


def executor_command() -> list[str]:
    """The task container's command: the bundled Python through the bundled loader, serving the executor."""
    # Through the bundle's arch-neutral loader link: the same Service runs on amd64 and arm64 nodes.
    bundle = Bundle(Path(DEFAULT_MOUNT_POINT), stamp="", loader=PORTABLE_LOADER)
    return [*bundle.python_argv(DEFAULT_MOUNT_POINT), "-m", "executor", "--bind", f"0.0.0.0:{PORT}"]


def _from_secret(name: str, sandbox_id: str, key: str, *, optional: bool = False) -> dict[str, Any]:
    ref: dict[str, Any] = {"name": secret_name(sandbox_id), "key": key}
    if optional:
        ref["optional"] = True
    return {"name": name, "valueFrom": {"secretKeyRef": ref}}


def _service(spec: SandboxSpec, options: KnativeOptions, image: str, metadata: dict[str, Any]) -> dict[str, Any]:
    pod_labels = {
        L.MANAGED_BY: "grove",
        L.SANDBOX: spec.id,
        L.ROLE: "sandbox",
        L.EGRESS: spec.network.egress,
    }
    cpu_m = max(1, round(spec.cpu * 1000))
    env = [
        _from_secret("GROVE_EXECUTOR_TOKEN", spec.id, "token"),
        _from_secret("GROVE_EXECUTOR_ENV", spec.id, "env"),
        _from_secret("GROVE_EXECUTOR_SNAPSHOT_GET_URL", spec.id, "snapshot-get-url", optional=True),
        _from_secret("GROVE_EXECUTOR_SNAPSHOT_UPLOAD_TOKEN", spec.id, "snapshot-upload-token", optional=True),
        {"name": "GROVE_EXECUTOR_SNAPSHOT_UPLOAD_URL", "value": snapshot_upload_url(options, spec.id)},
        {"name": "GROVE_EXECUTOR_WORKDIR", "value": spec.workdir},
        *([{"name": "GROVE_EXECUTOR_DESKTOP", "value": json.dumps(vars(spec.desktop))}] if spec.desktop else []),
        {"name": "GROVE_EXECUTOR_SNAPSHOT_DIR", "value": spec.workdir},
        {"name": "GROVE_EXECUTOR_IDLE_SNAPSHOT_S", "value": f"{options.idle_snapshot_s:g}"},
        # A command ends (and its result is sent) before queue-proxy would cut the call at timeoutSeconds.
        # grove's own seccomp filter on the executor and its commands, as under the local backend's PID 1.
        {"name": "GROVE_EXECUTOR_SECCOMP", "value": "1"},
        {"name": "GROVE_EXECUTOR_MAX_TIMEOUT_S", "value": str(exec_timeout_limit(options.request_timeout_s))},
    ]
    container = {
        "name": "sandbox",
        "image": image,
        "command": executor_command(),
        "ports": [{"name": "http1", "containerPort": PORT}],
        "env": env,
        # The disk quota is the container's ephemeral-storage limit: the kubelet evicts a pod whose
        # writable layer and emptyDirs outgrow it (an eviction, where the local backend's is an ENOSPC).
        # Requested as 0, like the local backend's sparse images: the quota is a ceiling, not a reservation.
        "resources": {
            "requests": {"cpu": f"{cpu_m}m", "memory": f"{spec.memory_mb}Mi", "ephemeral-storage": "0"},
            "limits": {"cpu": f"{cpu_m}m", "memory": f"{spec.memory_mb}Mi", "ephemeral-storage": f"{spec.disk_mb}Mi"},
        },
        # periodSeconds 0: queue-proxy probes every 50 ms until the executor answers, so a cold start
        # is ready the moment it can serve (with 1, up to a second later: the kubelet's period).
        "readinessProbe": {"httpGet": {"path": "/healthz"}, "periodSeconds": 0},
        "securityContext": {
            "allowPrivilegeEscalation": False, "privileged": False, "seccompProfile": {"type": "RuntimeDefault"},
            # Commands run as the image's root (package installs, chown, switching users): only what no
            # task needs goes — raw sockets (spoofing on the node's network), device nodes, audit, file
            # capabilities and chroot.
            "capabilities": {"drop": list(DROPPED_CAPABILITIES)},
            # Said explicitly: with secure-pod-defaults enabled Knative would set runAsNonRoot: true where it is
            # unset, and the kubelet then refuses every image whose user is root (most task images).
            "runAsNonRoot": False,
        },
        "volumeMounts": [{"name": RUNTIME_VOLUME, "mountPath": DEFAULT_MOUNT_POINT, "readOnly": True}],
    }
    init = {
        "name": "grove-runtime",
        "image": options.runtime_image,
        "args": ["/mnt/grove"],
        "resources": {
            "requests": {"cpu": options.init_cpu, "memory": options.init_memory},
            "limits": {"cpu": options.init_cpu, "memory": options.init_memory},
        },
        "volumeMounts": [{"name": RUNTIME_VOLUME, "mountPath": "/mnt/grove"}],
        # It only copies files into the emptyDir: no capability, no privilege, a read-only root.
        "securityContext": {
            "allowPrivilegeEscalation": False, "privileged": False, "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    return {
        "apiVersion": "serving.knative.dev/v1",
        "kind": "Service",
        "metadata": metadata,
        "spec": {
            "template": {
                "metadata": {
                    "labels": pod_labels,
                    "annotations": autoscaling_annotations(spec.idle_timeout_s, options),
                },
                "spec": {
                    "containerConcurrency": 0,
                    # A plain exec answers only when its command ends: queue-proxy and the activator must
                    # wait for the first byte as long as for the whole call. Unset, the webhook defaults
                    # the response-start timeout to 300 s (revision-response-start-timeout-seconds) and
                    # any command over 5 minutes would end in a 504.
                    "timeoutSeconds": options.request_timeout_s,
                    "responseStartTimeoutSeconds": options.request_timeout_s,
                    "idleTimeoutSeconds": options.request_timeout_s,
                    # The sandbox runs unreviewed code: no cluster credentials, no service env flood.
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "initContainers": [init],
                    "containers": [container],
                    "volumes": [{"name": RUNTIME_VOLUME, "emptyDir": {}}],
                    **({"runtimeClassName": options.runtime_class} if options.runtime_class else {}),
                },
            }
        },
    }


def _policy(spec: SandboxSpec, options: KnativeOptions, metadata: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata,
        "spec": {
            "podSelector": {"matchLabels": {L.SANDBOX: spec.id}},
            "policyTypes": ["Egress"],
            "egress": egress_rules(spec.network, options.cluster_cidrs),
        },
    }


def egress_rules(network: Network, cluster_cidrs: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """NetworkPolicy egress rules for an ``allow`` policy (:mod:`router.backends.knative.egress`)."""
    return egress.rules(tuple(network.allow), cluster_cidrs)
