"""The sandboxes' RuntimeClass, checked when the router starts: refuse to start rather than fail every create.

Sandbox pods run under a sandboxing RuntimeClass by default (``gvisor``): untrusted code then has a
kernel of its own (gVisor's Sentry, or Kata's VM) instead of the node's, which namespaces and seccomp
alone cannot give. Two things in the cluster must agree, and each one missing would otherwise show up
only as every create failing:

* the RuntimeClass must exist (else the API server refuses every pod, and each revision fails);
* Knative's ``kubernetes.podspec-runtimeclassname`` feature must be on (else its webhook refuses every
  Service naming one; Knative's default is ``disabled``).

Both are read at start with the rest of the cluster's requirements (:mod:`router.backends.knative.requirements`).
What cannot be read for want of RBAC (the router's ClusterRole and its Role in ``knative-serving`` are optional
grants of ``knative/rbac.yaml``) is logged as a warning, not a refusal. ``--runtime-class none`` opts out, with a
warning that the sandboxes share the node's kernel.
"""

from __future__ import annotations

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
