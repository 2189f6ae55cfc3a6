"""APIs of other sandbox services served over grove's sandboxes, so their clients work unchanged: E2B's
(:mod:`router.api.compat.e2b`) and SandboxFusion's ``run_code`` (:mod:`router.api.compat.fusion`)."""
