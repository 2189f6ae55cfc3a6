"""``grove knative doctor`` and the router's start-up check, against the stand-in cluster in its good configuration
(the repository's ``knative-serving-config.yaml`` applied, gVisor's RuntimeClass, the activator's grace raised) and
in each broken one. The doctor is the real CLI with a kubeconfig for the stand-in; where it says a create would
fail, the stand-in's webhook (Knative's checks) is what shows it does.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Callable

import pytest
import yaml

from grove.core.errors import GroveError, Invalid, NotFound
from router.backends.knative.backend import KnativeBackend
from tests.knative.test_runtime_class import opened, spec
from tests.support.crd_schema import REPO
from tests.support.knative_fixtures import Cluster
from tests.support.knative_standin import SYSTEM_NS, activator_deployment, serving_config
from tests.support.router_fixtures import GROVE_BIN

INIT = "kubernetes.podspec-init-containers"
RUNTIME = "kubernetes.podspec-runtimeclassname"
EMPTYDIR = "kubernetes.podspec-volumes-emptydir"


def doctor(cluster: Cluster, *args: str) -> tuple[int, list[str]]:
    """Run ``grove knative doctor`` on the stand-in: its exit status and output lines."""
    done = subprocess.run([GROVE_BIN, "knative", "doctor", "--kubeconfig", str(cluster.kubeconfig),
                           "--namespace", "grove-sandboxes", *args],
                          capture_output=True, text=True, timeout=60, check=False, env={**os.environ})
    assert not done.stderr.strip() or done.returncode in (0, 1), done.stderr
    return done.returncode, done.stdout.splitlines()


def line(lines: list[str], needle: str) -> str:
    found = [ln for ln in lines if needle in ln and not ln.lstrip().startswith("fix:")]
    assert len(found) == 1, lines
    return found[0]


def fix_of(lines: list[str], needle: str) -> str:
    at = lines.index(line(lines, needle))
    assert lines[at + 1].lstrip().startswith("fix: "), lines
    return lines[at + 1]


def test_a_good_cluster_passes_everything_and_the_doctor_only_reads(cluster: Cluster) -> None:
    before = dict(cluster.api.calls)
    code, lines = doctor(cluster)
    assert code == 0, lines
    checks = [ln for ln in lines if ln[:5].strip() in ("PASS", "WARN", "FAIL")]
    assert len(checks) == 9 and all(ln.startswith("PASS") for ln in checks), lines
    for needle in (INIT, RUNTIME, EMPTYDIR, "RuntimeClass 'gvisor' exists", "max-revision-timeout-seconds is 3600",
                   "secure-pod-defaults", "enable-scale-to-zero", "terminationGracePeriodSeconds is 3600"):
        line(lines, needle)
    made = {key for key, n in cluster.api.calls.items() if n != before.get(key, 0)}
    assert made and {verb for _, verb, _ in made} <= {"get", "list"}, made


def _flag_off(flag: str) -> Callable[[Cluster], None]:
    return lambda cluster: cluster.knative.set_feature(flag, "disabled")


@pytest.mark.parametrize(("breaks", "needle", "fix", "error"), [
    (_flag_off(INIT), f"{INIT} feature is 'disabled'", f'"{INIT}":"enabled"', Invalid),
    (lambda c: c.knative.set_feature(INIT, None), f"{INIT} feature is 'disabled'", "knative-serving-config.yaml",
     Invalid),
    (_flag_off(RUNTIME), f"{RUNTIME} feature is 'disabled'", f'"{RUNTIME}":"enabled"', Invalid),
    (_flag_off(EMPTYDIR), f"{EMPTYDIR} feature is 'disabled'", f'"{EMPTYDIR}":"enabled"', Invalid),
    (lambda c: c.knative.config["config-defaults"].update({"max-revision-timeout-seconds": "600"}),
     "max-revision-timeout-seconds is 600", '"max-revision-timeout-seconds":"3600"', Invalid),
    (lambda c: c.api.remove("runtimeclasses", "", "gvisor"), "no RuntimeClass 'gvisor'", "Install gVisor", NotFound),
], ids=["init-containers-off", "init-containers-unset", "runtimeclass-flag-off", "emptydir-off", "timeout-600",
        "no-runtimeclass"])
def test_each_broken_requirement_fails_with_its_exact_fix_and_refuses_the_start(
        cluster: Cluster, breaks: Callable[[Cluster], None], needle: str, fix: str, error: type[GroveError]) -> None:
    breaks(cluster)
    code, lines = doctor(cluster)
    assert code == 1, lines
    assert line(lines, needle).startswith("FAIL")
    assert fix in fix_of(lines, needle)
    assert sum(ln.startswith("FAIL") for ln in lines) == 1, lines  # only what is broken
    with pytest.raises(error) as refused:  # the router's start refuses with the same words
        opened(cluster)
    assert needle in refused.value.message


def test_what_the_doctor_fails_is_what_the_webhook_refuses(cluster: Cluster) -> None:
    """Started with the good configuration, then one flag turned off: the create is the 422 the doctor named."""
    async def body() -> None:
        backend = KnativeBackend(cluster.options())
        try:
            await backend.open()
            cluster.knative.set_feature(INIT, "disabled")
            with pytest.raises(Invalid, match=r"must not set the field\(s\): spec.template.spec.initContainers"):
                await backend.create(spec())
        finally:
            await backend.close()

    asyncio.run(body())
    code, lines = doctor(cluster)
    assert code == 1 and line(lines, INIT).startswith("FAIL")


@pytest.mark.parametrize(("breaks", "needle"), [
    (lambda c: c.api.put("configmaps", SYSTEM_NS, {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "config-autoscaler", "namespace": SYSTEM_NS},
        "data": {"enable-scale-to-zero": "false"}}, "ADDED"), "enable-scale-to-zero is 'false'"),
    (lambda c: c.api.put("deployments", SYSTEM_NS, activator_deployment(30)), "terminationGracePeriodSeconds is 30"),
], ids=["no-scale-to-zero", "activator-grace-30"])
def test_what_only_degrades_grove_is_a_warning_with_its_fix(
        cluster: Cluster, breaks: Callable[[Cluster], None], needle: str) -> None:
    breaks(cluster)
    code, lines = doctor(cluster)
    assert code == 0, lines
    assert line(lines, needle).startswith("WARN")
    assert "kubectl" in fix_of(lines, needle)


def test_what_rbac_hides_is_a_warning_naming_what_was_not_checked(cluster: Cluster) -> None:
    cluster.api.forbidden |= {("get", "configmaps"), ("get", "deployments")}
    code, lines = doctor(cluster)
    assert code == 0, lines
    assert line(lines, f"not checked that {INIT} is enabled").startswith("WARN")
    assert line(lines, "cannot read Knative's config-defaults").startswith("WARN")
    assert line(lines, "cannot read the activator's Deployment").startswith("WARN")


def test_an_unreachable_api_server_is_one_clear_failure(cluster: Cluster) -> None:
    cluster.kubeconfig.write_text(cluster.kubeconfig.read_text().replace(cluster.api.url, "https://127.0.0.1:1"))
    code, lines = doctor(cluster, "--request-timeout", "60")
    assert code == 1 and lines[0].startswith("FAIL  the Kubernetes API") and "unreachable" in lines[0], lines


def test_secure_pod_defaults_leave_root_task_images_running(cluster: Cluster) -> None:
    """Knative's ``secure-pod-defaults: enabled`` sets runAsNonRoot where it is unset; grove's template says false."""
    cluster.knative.set_feature("secure-pod-defaults", "enabled")
    sb = spec()

    async def body() -> None:
        backend = KnativeBackend(cluster.options())
        try:
            await backend.open()
            await backend.create(sb)
            await backend.delete(sb.id, {})
        finally:
            await backend.close()

    asyncio.run(body())
    code, lines = doctor(cluster)
    assert code == 0 and "'enabled'" in line(lines, "secure-pod-defaults")


def test_the_operator_manifest_says_what_the_configmap_patch_says() -> None:
    """On an Operator-run cluster, KnativeServing's spec.config replaces ``knative-serving-config.yaml``: same keys."""
    shipped = yaml.safe_load((REPO / "knative" / "operator" / "knative-serving.yaml").read_text())
    assert shipped["kind"] == "KnativeServing" and shipped["apiVersion"] == "operator.knative.dev/v1beta1"
    assert shipped["spec"]["config"] == {name.removeprefix("config-"): data for name, data in serving_config().items()}
    assert {d["name"] for d in shipped["spec"]["deployments"]} == {"activator"}


def test_each_namespace_of_a_spread_router_is_checked_and_one_without_the_role_fails_with_its_fix(
        cluster: Cluster) -> None:
    code, lines = doctor(cluster, "--namespaces", "grove-sandboxes,grove-sandboxes-b")
    assert code == 1, lines
    assert line(lines, "the namespace 'grove-sandboxes'").startswith("PASS")
    refused = line(lines, "the namespace 'grove-sandboxes-b'")
    assert refused.startswith("FAIL") and "in namespace 'grove-sandboxes-b'" in refused
    assert "Role and RoleBinding `grove-router` in 'grove-sandboxes-b'" in fix_of(lines, "'grove-sandboxes-b'")
