"""What a cluster must provide for grove's sandboxes, read (never changed) and judged one requirement at a time.

Each requirement missing would otherwise show up only as every create failing (a 422 from Knative's webhook,
a revision that never starts) or as calls cut short. :func:`survey` reads the cluster with ``get`` calls only
and returns a :class:`Finding` per requirement: ``pass``, ``fail`` with the exact fix, or ``warn`` when it
cannot be read (RBAC) or only degrades grove. The router runs it at start (:func:`enforce`: a failure refuses
the start, a warning is logged); ``grove knative doctor`` prints it.

Sources: Knative Serving's ``pkg/apis/config/features.go`` (flags and their defaults), ``defaults.go``
(``max-revision-timeout-seconds``, 600 by default) and ``revision_defaults.go`` (``secure-pod-defaults``).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any, Literal

from grove.core.errors import Forbidden, GroveError, Invalid, NotFound
from router.backends.knative import runtimeclass
from router.backends.knative.kube import Kube
from router.backends.knative.options import KnativeOptions

log = logging.getLogger("grove.knative")
SYSTEM = runtimeclass.KNATIVE_NAMESPACE
CONFIG_FILE = "knative/knative-serving-config.yaml"
DEFAULT_MAX_TIMEOUT_S = 600
"""Knative's ``max-revision-timeout-seconds`` when the ConfigMap does not set it."""
State = Literal["pass", "fail", "warn"]


@dataclass(frozen=True)
class Finding:
    """One requirement as the cluster meets it."""

    requirement: str
    """What grove needs, in a few words."""
    state: State
    found: str
    """What the cluster has (or why it could not be read)."""
    fix: str = ""
    """The exact change that makes it pass (empty when it passes)."""
    error: type[GroveError] = Invalid
    """The error a failure refuses the router's start with."""

    def message(self) -> str:
        """The finding as one sentence and its fix."""
        return f"{self.found}; {self.fix}" if self.fix else self.found


def _patch(configmap: str, key: str, value: str) -> str:
    return (f"`kubectl apply --server-side -f {CONFIG_FILE}`, or `kubectl patch configmap {configmap} -n {SYSTEM} "
            f"--type merge -p '{{\"data\":{{\"{key}\":\"{value}\"}}}}'` (on a cluster run by the Knative Operator, "
            f"set it in KnativeServing's spec.config.{configmap.removeprefix('config-')} instead: "
            "knative/operator/knative-serving.yaml)")


def _flag(features: dict[str, str], flag: str, default: str) -> str:
    """Knative's ``asFlag``: ``enabled``, ``allowed`` or ``disabled`` in any case; anything else is the default."""
    value = features.get(flag, default).lower()
    return value if value in ("enabled", "allowed", "disabled") else default


async def _configmap(kube: Kube, name: str) -> dict[str, str] | GroveError:
    try:
        found = await kube.call("get", "configmaps", name, kube.core.read_namespaced_config_map, name, SYSTEM,
                                namespace=SYSTEM)
    except (Forbidden, NotFound) as exc:
        return exc
    return dict(found.data or {})


async def survey(kube: Kube, options: KnativeOptions) -> list[Finding]:
    """Every requirement, in the order a create meets them (read-only: ``get`` calls)."""
    found = [await _runtime_class(kube, options.runtime_class)]
    features = await _configmap(kube, "config-features")
    found += _features(features, options.runtime_class)
    found.append(_timeout(await _configmap(kube, "config-defaults"), options.request_timeout_s))
    found.append(_scale_to_zero(await _configmap(kube, "config-autoscaler")))
    found.append(await _activator_grace(kube, options.request_timeout_s))
    return found


async def serving_installed(kube: Kube, namespace: str) -> Finding:
    """Knative Serving answers for the sandboxes' namespace (a ``list`` of one Service)."""
    what = f"Knative Serving, and the namespace {namespace!r}"
    try:
        one = functools.partial(kube.custom.list_namespaced_custom_object, limit=1)  # Kube.call's own `limit`
        await kube.call("list", "services.serving.knative.dev", "*", one, "serving.knative.dev", "v1", namespace,
                        "services", namespace=namespace)
    except NotFound:
        return Finding(what, "fail", f"the API server has no services.serving.knative.dev in {namespace!r}", (
            "install Knative Serving (https://knative.dev/docs/install/) and create the namespace: "
            "`kubectl apply -k knative/`"), NotFound)
    except Forbidden as exc:
        return Finding(what, "fail", exc.message, f"apply knative/rbac.yaml's Role and RoleBinding `grove-router` in "
                       f"{namespace!r} too (each sandbox namespace needs them)", Forbidden)
    return Finding(what, "pass", f"Knative Services can be listed in {namespace!r}")


async def enforce(kube: Kube, options: KnativeOptions) -> list[Finding]:
    """:func:`survey` at the router's start: warnings logged, failures refuse the start (all of them named,
    the first one's kind of error)."""
    findings = await survey(kube, options)
    for finding in findings:
        if finding.state == "warn":
            log.warning("%s", finding.message())
    failed = [f for f in findings if f.state == "fail"]
    if failed:
        raise failed[0].error("; and ".join(f.message() for f in failed))
    return findings


async def _runtime_class(kube: Kube, name: str | None) -> Finding:
    what = "a sandboxing RuntimeClass for sandbox pods"
    if name is None:
        return Finding(what, "warn", (
            f"SANDBOXES SHARE THE NODE'S KERNEL: started with {runtimeclass.OPT_OUT}, sandbox pods run under the "
            "node's default runtime. Namespaces and seccomp narrow what untrusted code can reach; a kernel exploit "
            "still reaches the node and every pod on it. Use --runtime-class gvisor (or kata) for untrusted code"))
    try:
        await kube.call("get", "runtimeclasses.node.k8s.io", name, kube.node.read_runtime_class, name)
    except NotFound:
        return Finding(what, "fail", (
            f"the cluster has no RuntimeClass {name!r}, which every sandbox pod runs under (a kernel of its own for "
            "untrusted code); without it every sandbox would fail to start"), (
            "Install gVisor on the sandbox nodes and create the RuntimeClass "
            "(https://gvisor.dev/docs/user_guide/containerd/quick_start/; on GKE, a node pool with --sandbox "
            "type=gvisor makes one named gvisor), name another one with --runtime-class NAME (e.g. kata), or start "
            f"with {runtimeclass.OPT_OUT} to run sandboxes on the node's kernel"), NotFound)
    except Forbidden:
        return Finding(what, "warn", (
            f"cannot read RuntimeClass {name!r} (the router lacks the ClusterRole grove-router-runtimeclasses of "
            "knative/rbac.yaml): not checked; if it is missing, every sandbox's revision will fail"))
    return Finding(what, "pass", f"RuntimeClass {name!r} exists")


def _features(features: dict[str, str] | GroveError, runtime_class: str | None) -> list[Finding]:
    # (flag, Knative's default, what grove's template uses it for)
    wanted = [("kubernetes.podspec-init-containers", "disabled", "the init container that copies the runtime bundle"),
              ("kubernetes.podspec-volumes-emptydir", "enabled", "the emptyDir the runtime bundle is copied into")]
    if runtime_class is not None:
        wanted.append((runtimeclass.FEATURE, "disabled", f"runtimeClassName {runtime_class!r}"))
    if isinstance(features, GroveError):
        return [Finding(f"Knative feature {flag}", "warn", (
            f"cannot read Knative's config-features in {SYSTEM} ({type(features).__name__}): not checked that "
            f"{flag} is enabled; if it is not, Knative's webhook refuses every sandbox")) for flag, _, _ in wanted] + [
            Finding("secure-pod-defaults leaves root task images alone", "pass",
                    "not read; grove's template sets runAsNonRoot: false itself")]
    found = []
    for flag, default, use in wanted:
        value = _flag(features, flag, default)
        if value in ("enabled", "allowed"):
            found.append(Finding(f"Knative feature {flag}", "pass", f"{flag} is {value!r}"))
            continue
        if flag == runtimeclass.FEATURE:
            found.append(Finding(f"Knative feature {flag}", "fail", (
                f"Knative's {flag} feature is {value!r} (ConfigMap config-features in {SYSTEM}), so its webhook "
                f"would refuse every sandbox Service that asks for RuntimeClass {runtime_class!r}"),
                f"{runtimeclass.ENABLE}. Or start the router with {runtimeclass.OPT_OUT} (sandboxes then share "
                "the node's kernel)"))
            continue
        found.append(Finding(f"Knative feature {flag}", "fail", (
            f"Knative's {flag} feature is {value!r} (ConfigMap config-features in {SYSTEM}), so its webhook would "
            f"refuse every sandbox Service ({use}: a 422 on every create)"), "enable it: " + _patch(
                "config-features", flag, "enabled")))
    secure = features.get("secure-pod-defaults", "disabled")
    found.append(Finding("secure-pod-defaults leaves root task images alone", "pass", (
        f"secure-pod-defaults is {secure!r}; grove's template sets runAsNonRoot: false, allowPrivilegeEscalation, "
        "seccompProfile and the capabilities it drops itself, so Knative adds nothing to them")))
    return found


def _timeout(defaults: dict[str, str] | GroveError, request_timeout_s: int) -> Finding:
    what = f"max-revision-timeout-seconds at least --request-timeout ({request_timeout_s})"
    if isinstance(defaults, GroveError):
        return Finding(what, "warn", (
            f"cannot read Knative's config-defaults in {SYSTEM} ({type(defaults).__name__}): not checked; if its "
            f"max-revision-timeout-seconds is below {request_timeout_s}, Knative's webhook refuses every sandbox"))
    raw = defaults.get("max-revision-timeout-seconds", str(DEFAULT_MAX_TIMEOUT_S))
    try:
        limit = int(raw)
    except ValueError:
        limit = DEFAULT_MAX_TIMEOUT_S
    if limit >= request_timeout_s:
        return Finding(what, "pass", f"max-revision-timeout-seconds is {limit}")
    return Finding(what, "fail", (
        f"Knative's max-revision-timeout-seconds is {limit} (ConfigMap config-defaults in {SYSTEM}), below the "
        f"timeoutSeconds {request_timeout_s} of grove's revisions (--request-timeout): its webhook would refuse "
        "every sandbox Service with a 422"), (
        f"raise it: {_patch('config-defaults', 'max-revision-timeout-seconds', str(request_timeout_s))}; or start "
        f"the router with --request-timeout {limit} (no command may then run longer)"))


def _scale_to_zero(autoscaler: dict[str, str] | GroveError) -> Finding:
    what = "scale to zero (idle sandboxes cost nothing)"
    if isinstance(autoscaler, Forbidden):
        return Finding(what, "warn", f"cannot read Knative's config-autoscaler in {SYSTEM} (Forbidden): not checked")
    value = "true" if isinstance(autoscaler, GroveError) else autoscaler.get("enable-scale-to-zero", "true")
    if value.lower() != "false":
        return Finding(what, "pass", "enable-scale-to-zero is on (Knative's default)")
    return Finding(what, "warn", (
        "Knative's enable-scale-to-zero is 'false' (config-autoscaler): every idle sandbox keeps its pod and its "
        "node's memory until it is deleted"), "turn it on: " + _patch("config-autoscaler", "enable-scale-to-zero",
                                                                       "true"))


async def _activator_grace(kube: Kube, request_timeout_s: int) -> Finding:
    what = f"the activator drains for --request-timeout ({request_timeout_s} s)"
    try:
        deployment: Any = await kube.call("get", "deployments.apps", "activator",
                                          kube.apps.read_namespaced_deployment, "activator", SYSTEM,
                                          namespace=SYSTEM)
    except (Forbidden, NotFound) as exc:
        return Finding(what, "warn", (
            f"cannot read the activator's Deployment in {SYSTEM} ({type(exc).__name__}): not checked that its "
            f"terminationGracePeriodSeconds is at least {request_timeout_s}"))
    grace = deployment.spec.template.spec.termination_grace_period_seconds or 30
    if grace >= request_timeout_s:
        return Finding(what, "pass", f"the activator's terminationGracePeriodSeconds is {grace}")
    return Finding(what, "warn", (
        f"the activator's terminationGracePeriodSeconds is {grace}: when it restarts (an upgrade, a node drain), a "
        f"call through it that runs longer is cut"), (
        f"`kubectl -n {SYSTEM} patch deployment activator --type merge -p '{{\"spec\":{{\"template\":{{\"spec\":"
        f"{{\"terminationGracePeriodSeconds\":{request_timeout_s}}}}}}}}}'`; on a cluster run by the Knative "
        "Operator, which undoes that patch and whose spec.deployments cannot set it, run two activators "
        f"(knative/operator/knative-serving.yaml) or start the router with --request-timeout {grace}"))
