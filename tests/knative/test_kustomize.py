"""The ``knative/`` manifests: every object validates against the Kubernetes schemas, and they fit together.

``kubernetes-validate`` (strict: unknown fields are errors) checks each resource file the kustomization
lists, and the Secrets its generators make. Cross-checks: every YAML file is listed, the router's
Role grants exactly what the Knative backend calls (the backend test runs under that Role), names and
selectors refer to objects that exist.
"""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
import yaml

from grove.cli import build_parser
from tests.support.crd_schema import REPO
from tests.support.knative_fixtures import role_rules

KNATIVE = REPO / "knative"
K8S_VERSION = "1.31.0"


def kustomization() -> dict[str, Any]:
    data = yaml.safe_load((KNATIVE / "kustomization.yaml").read_text())
    assert isinstance(data, dict)
    return data


def resources() -> list[dict[str, Any]]:
    docs = []
    for name in kustomization()["resources"]:
        docs += [d for d in yaml.safe_load_all((KNATIVE / name).read_text()) if d]
    return docs


def generated_secrets() -> list[dict[str, Any]]:
    """The Secrets kustomize would make, with placeholder values for the env files README step 2 writes."""
    keys = {"secrets/minio.env": ["MINIO_ROOT_USER", "MINIO_ROOT_PASSWORD"], "secrets/api.env": ["GROVE_API_KEY"]}
    made = []
    for gen in kustomization()["secretGenerator"]:
        data = {k: "cGxhY2Vob2xkZXI=" for env in gen["envs"] for k in keys[env]}
        made.append({"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "data": data,
                     "metadata": {"name": gen["name"], "namespace": gen["namespace"]}})
    return made


@pytest.mark.parametrize("obj", resources() + generated_secrets(),
                         ids=lambda o: f"{o['kind']}/{o['metadata']['name']}")
def test_object_validates(obj: dict[str, Any]) -> None:
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_every_manifest_is_in_the_kustomization() -> None:
    listed = set(kustomization()["resources"])
    on_disk = {p.name for p in KNATIVE.glob("*.yaml")} - {"kustomization.yaml"}
    assert on_disk == listed
    assert (KNATIVE / "secrets" / "README.md").is_file()
    assert "/knative/secrets/*.env" in (REPO / ".gitignore").read_text()


def test_rbac_is_least_privilege() -> None:
    docs = resources()
    # Outside the sandbox namespace, reads for the start-up check (router/backends/knative/requirements.py):
    # RuntimeClasses (cluster-scoped, hence the one ClusterRole), and by name Knative's three ConfigMaps grove
    # depends on and the activator's Deployment (its grace period).
    assert [r for d in docs if d["kind"] == "ClusterRole" for r in d["rules"]] == [
        {"apiGroups": ["node.k8s.io"], "resources": ["runtimeclasses"], "verbs": ["get"]}]
    roles = {d["metadata"]["namespace"]: d for d in docs if d["kind"] == "Role"}
    assert set(roles) == {"grove-sandboxes", "knative-serving"}
    assert roles["knative-serving"]["rules"] == [
        {"apiGroups": [""], "resources": ["configmaps"],
         "resourceNames": ["config-features", "config-defaults", "config-autoscaler"], "verbs": ["get"]},
        {"apiGroups": ["apps"], "resources": ["deployments"], "resourceNames": ["activator"], "verbs": ["get"]}]
    granted = role_rules()
    assert ("get", "secrets") not in granted and ("create", "pods") not in granted
    assert not any(verb in ("*", "update", "deletecollection") for verb, _ in granted)
    # Patch only where a warm-pool claim needs it: its Secret's token, env and labels (never the Service).
    assert {res for verb, res in granted if verb == "patch"} == {"secrets"}
    account = next(d for d in docs if d["kind"] == "ServiceAccount")
    named = {(d["kind"], d["metadata"]["name"], d["metadata"].get("namespace")) for d in docs}
    bindings = [d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")]
    assert len(bindings) == 3
    for binding in bindings:
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                        "namespace": account["metadata"]["namespace"]}]
        ref = binding["roleRef"]
        scope = binding["metadata"].get("namespace") if ref["kind"] == "Role" else None
        assert (ref["kind"], ref["name"], scope) in named, ref
    router = next(d for d in docs if d["kind"] == "Deployment")
    assert router["spec"]["template"]["spec"]["serviceAccountName"] == account["metadata"]["name"]


def test_sandbox_namespace_denies_by_default() -> None:
    policies = {d["metadata"]["name"]: d for d in resources() if d["kind"] == "NetworkPolicy"}
    deny = policies["default-deny"]["spec"]
    assert deny["podSelector"] == {} and set(deny["policyTypes"]) == {"Ingress", "Egress"}
    assert "ingress" not in deny and "egress" not in deny
    storage = policies["sandbox-egress-storage"]["spec"]["egress"]
    assert storage[0]["ports"] == [{"protocol": "TCP", "port": 9000}]
    minio = next(d for d in resources() if d["kind"] == "StatefulSet")
    assert storage[0]["to"][0]["podSelector"]["matchLabels"].items() <= minio["spec"]["template"]["metadata"][
        "labels"].items()
    # Executors ask the router for their snapshots' multipart uploads: its API port, and nothing else of it.
    router = next(d for d in resources() if d["kind"] == "Deployment")
    assert storage[1]["ports"] == [{"protocol": "TCP", "port": 8470}]
    assert storage[1]["to"][0]["podSelector"]["matchLabels"].items() <= router["spec"]["template"]["metadata"][
        "labels"].items()
    assert storage[1]["to"][0]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "grove-system"}


def test_system_namespace_denies_by_default_and_opens_only_what_grove_uses() -> None:
    system = {d["metadata"]["name"]: d for d in resources()
              if d["kind"] == "NetworkPolicy" and d["metadata"]["namespace"] == "grove-system"}
    deny = system["system-default-deny"]["spec"]
    assert deny["podSelector"] == {} and set(deny["policyTypes"]) == {"Ingress", "Egress"}
    assert "ingress" not in deny and "egress" not in deny
    minio = system["minio"]["spec"]
    assert "Egress" not in minio["policyTypes"] and minio["ingress"][0]["ports"] == [{"protocol": "TCP", "port": 9000}]
    router = system["router"]["spec"]
    assert router["ingress"] == [{"ports": [{"protocol": "TCP", "port": 8470}]}]
    deployment = next(d for d in resources() if d["kind"] == "Deployment")
    assert router["podSelector"]["matchLabels"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()


def test_router_is_configured_for_the_cluster() -> None:
    router = next(d for d in resources() if d["kind"] == "Deployment")
    args = router["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--backend=knative" in args and "--namespace=grove-sandboxes" in args
    container = router["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["valueFrom"]["secretKeyRef"]["name"] for e in container["env"]}
    generated = {g["name"] for g in kustomization()["secretGenerator"]}
    assert set(env.values()) <= generated
    assert any(a.startswith("--s3=http://minio.grove-system.svc") for a in args)
    # The arguments are the CLI's own: they parse, and artifacts expire after 30 days, trajectories are kept.
    parsed = build_parser().parse_args(args)
    assert parsed.artifact_retention_days == 30 and parsed.trajectory_retention_days is None
    # Sandbox pods reach the router at its Service's name: the default of --router-url.
    service = next(d for d in resources() if d["kind"] == "Service" and d["metadata"]["name"] == "grove-router")
    port = service["spec"]["ports"][0]["port"]
    assert parsed.router_url == f"http://grove-router.{service['metadata']['namespace']}.svc.cluster.local:{port}"


def test_readme_walks_from_empty_cluster_to_first_sandbox() -> None:
    text = (KNATIVE / "README.md").read_text()
    for step in ("kubectl apply --server-side -k knative/", "sandbox_image/Dockerfile", "knative/router.Dockerfile",
                 "secrets/minio.env", " create --image", " exec $ID", "port-forward", "grove knative manifest"):
        assert step in text, step


