"""E2B's API over grove's sandboxes, so code written against the ``e2b`` SDK runs unchanged with
``E2B_API_URL={router}/e2b``, ``E2B_SANDBOX_URL={router}/e2b/sandbox`` and ``E2B_API_KEY=<a grove key>``:
the control plane (:mod:`.control`) and the sandbox side, envd's Connect-RPC services and plain routes
(:mod:`.envd`)."""
