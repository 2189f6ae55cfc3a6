"""The sandboxes' RuntimeClass, checked when the router starts: refuse to start rather than fail every create.

Sandbox pods run under a sandboxing RuntimeClass by default (``gvisor``): untrusted code then has a
kernel of its own (gVisor's Sentry, or Kata's VM) instead of the node's, which namespaces and seccomp
alone cannot give. Two things in the cluster must agree, and each one missing would otherwise show up
only as every create failing:

* the RuntimeClass must exist (else the API server refuses every pod, and each revision fails);
* Knative's ``kubernetes.podspec-runtimeclassname`` feature must be on (else its webhook refuses every
  Service naming one; Knative's default is ``disabled``).

Both are read at start. What cannot be read for want of RBAC (the router's ClusterRole and its Role in
``knative-serving`` are optional grants of ``knative/rbac.yaml``) is logged as a warning, not a refusal.
``--runtime-class none`` opts out, with a warning that the sandboxes share the node's kernel.
"""

from __future__ import annotations

import logging

from grove.core.errors import Forbidden, Invalid, NotFound
from router.backends.knative.kube import Kube

log = logging.getLogger("grove.knative")

KNATIVE_NAMESPACE = "knative-serving"
"""Where Knative Serving keeps its configuration (``config-features``)."""
FEATURE = "kubernetes.podspec-runtimeclassname"
OPT_OUT = "--runtime-class none"
ENABLE = (f"enable it: `kubectl apply --server-side -f knative/knative-serving-config.yaml`, or `kubectl patch "
          f"configmap config-features -n {KNATIVE_NAMESPACE} --type merge -p "
          f"'{{\"data\":{{\"{FEATURE}\":\"enabled\"}}}}'`")


def webhook_hint(message: str) -> str:
    """What to do about a webhook refusal of a Service that names a RuntimeClass ("" if it is about something
    else)."""
    if "runtimeClassName" not in message:
        return ""
    return (f" Knative's {FEATURE} feature is off in the cluster (ConfigMap config-features in "
            f"{KNATIVE_NAMESPACE}); {ENABLE}. Or start the router with {OPT_OUT} (sandboxes then share the "
            "node's kernel).")


async def check(kube: Kube, runtime_class: str | None) -> None:
    """Refuse to start if sandbox pods could not run under ``runtime_class``; warn about what cannot be read."""
    if runtime_class is None:
        log.warning(
            "SANDBOXES SHARE THE NODE'S KERNEL: started with %s, sandbox pods run under the node's default "
            "runtime. Namespaces and seccomp narrow what untrusted code can reach; a kernel exploit still "
            "reaches the node and every pod on it. Use --runtime-class gvisor (or kata) for untrusted code.",
            OPT_OUT)
        return
    await _check_exists(kube, runtime_class)
    await _check_feature(kube, runtime_class)


async def _check_exists(kube: Kube, name: str) -> None:
    try:
        await kube.call("get", "runtimeclasses.node.k8s.io", name, kube.node.read_runtime_class, name)
    except NotFound as exc:
        raise NotFound(
            f"the cluster has no RuntimeClass {name!r}, which every sandbox pod runs under (a kernel of its own "
            f"for untrusted code); without it every sandbox would fail to start. Install gVisor on the sandbox "
            f"nodes and create the RuntimeClass (https://gvisor.dev/docs/user_guide/containerd/quick_start/; on "
            f"GKE, a node pool with --sandbox type=gvisor makes one named gvisor), name another one with "
            f"--runtime-class NAME (e.g. kata), or start with {OPT_OUT} to run sandboxes on the node's kernel"
        ) from exc
    except Forbidden:
        log.warning("cannot read RuntimeClass %r (the router lacks the ClusterRole grove-router-runtimeclasses of "
                    "knative/rbac.yaml): not checked; if it is missing, every sandbox's revision will fail", name)


async def _check_feature(kube: Kube, runtime_class: str) -> None:
    try:
        config = await kube.call("get", "configmaps", "config-features", kube.core.read_namespaced_config_map,
                                 "config-features", KNATIVE_NAMESPACE)
    except (Forbidden, NotFound) as exc:
        log.warning("cannot read Knative's config-features in %s (%s): not checked that %s is enabled; if it is "
                    "not, Knative's webhook refuses every sandbox", KNATIVE_NAMESPACE, type(exc).__name__, FEATURE)
        return
    # Knative reads the flag case-insensitively; "allowed" lets a Service set the field as "enabled" does.
    value = str((config.data or {}).get(FEATURE, "disabled"))
    if value.lower() not in ("enabled", "allowed"):
        raise Invalid(
            f"Knative's {FEATURE} feature is {value!r} (ConfigMap config-features in {KNATIVE_NAMESPACE}), so "
            f"its webhook would refuse every sandbox Service that asks for RuntimeClass {runtime_class!r}; "
            f"{ENABLE}. Or start the router with {OPT_OUT} (sandboxes then share the node's kernel)"
        )
