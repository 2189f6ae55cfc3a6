"""The objects a sandbox is made of: the Service against Knative's CRD schema, labels, annotations, CLI.

Validation uses the in-repo schema copy (``knative/schema/service-v1.schema.yaml``); nothing here needs
``../shared``. The freshness test compares that copy with a full CRD file when one is provided:
``GROVE_KNATIVE_CRD=/path/to/service-crd.yaml`` (default: ``../shared/knative/service-crd.yaml``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from grove.cli.knative import add_cluster_options, options_from_args
from grove.core.errors import Invalid
from router.backends.base import Network, SandboxSpec
from router.backends.knative import labels as L
from router.backends.knative import manifest, status
from router.backends.knative.options import KnativeOptions
from tests.support.crd_schema import REPO, SCHEMA_COPY, SHARED_CRD, extract, is_valid_key, load_schema, validate
from tests.support.knative_standin import serving_config
from tests.support.router_fixtures import GROVE_BIN

pytestmark = pytest.mark.fast  # pure logic: `make test-fast`

K8S_VERSION = "1.31.0"


def spec(**overrides: Any) -> SandboxSpec:
    values: dict[str, Any] = dict(id="sb-0123456789abcdef", image="python:3.11-slim", cpu=0.5, memory_mb=768,
                                  pids_max=256, env={"A": "1"}, workdir="/workspace", network=Network(),
                                  token="tk-9f8e7d6c5b", idle_timeout_s=300.0, ttl_s=7200.0,
                                  labels={"task_id": "django__django-11099", "model": "gpt/4o:mini"})
    values.update(overrides)
    return SandboxSpec(**values)


def build(**overrides: Any) -> manifest.SandboxObjects:
    return manifest.build(spec(**overrides), KnativeOptions(), image="python:3.11-slim",
                          snapshot_access=("http://s3/get?X-Amz-Signature=s1g", "1024.s1g"))


@pytest.mark.parametrize("network", [Network(), Network("allow"), Network("allow", ("10.0.0.0/8:443", "1.2.3.4"))])
def test_service_validates_against_the_crd_schema(network: Network) -> None:
    objects = build(network=network)
    service = objects.service
    assert validate(service, load_schema()) == []
    template = service["spec"]["template"]
    assert service["metadata"]["labels"][L.VISIBILITY] == "cluster-local"
    assert template["spec"]["containerConcurrency"] == 0 and template["spec"]["timeoutSeconds"] == 3600
    assert template["spec"]["automountServiceAccountToken"] is False
    notes = template["metadata"]["annotations"]
    assert notes["autoscaling.knative.dev/min-scale"] == "0" and notes["autoscaling.knative.dev/max-scale"] == "1"
    assert notes["autoscaling.knative.dev/target-burst-capacity"] == "0"
    assert notes["autoscaling.knative.dev/window"] == "300s"
    container = template["spec"]["containers"][0]
    assert container["command"][:2] == ["/.grove/lib/ld.so", "--library-path"]  # the node's arch picks the loader
    assert container["readinessProbe"]["periodSeconds"] == 0  # queue-proxy's 50 ms probing on cold starts
    assert {"NET_RAW", "MKNOD"} <= set(container["securityContext"]["capabilities"]["drop"])
    assert {"name": "GROVE_EXECUTOR_SECCOMP", "value": "1"} in container["env"]
    init = template["spec"]["initContainers"][0]["securityContext"]
    assert init["capabilities"] == {"drop": ["ALL"]} and init["readOnlyRootFilesystem"] is True
    assert init["allowPrivilegeEscalation"] is False
    assert container["resources"]["limits"] == {"cpu": "500m", "memory": "768Mi", "ephemeral-storage": "10240Mi"}
    assert container["resources"]["requests"]["ephemeral-storage"] == "0"  # a ceiling, not a reservation
    secret_refs = {e["name"] for e in container["env"] if "valueFrom" in e}
    assert {"GROVE_EXECUTOR_TOKEN", "GROVE_EXECUTOR_ENV", "GROVE_EXECUTOR_SNAPSHOT_GET_URL",
            "GROVE_EXECUTOR_SNAPSHOT_UPLOAD_TOKEN"} <= secret_refs
    upload = {e["name"]: e.get("value") for e in container["env"]}["GROVE_EXECUTOR_SNAPSHOT_UPLOAD_URL"]
    assert upload == "http://grove-router.grove-system.svc.cluster.local:8470/v1/sandboxes/sb-0123456789abcdef/snapshot-upload"
    assert "tk-9f8e7d6c5b" not in json.dumps(service) and "s1g" not in json.dumps(service)  # secrets stay in the Secret
    assert template["spec"]["initContainers"][0]["volumeMounts"][0]["name"] == template["spec"]["volumes"][0]["name"]
    assert (objects.policy is not None) == (network.egress == "allow")


def test_the_validator_rejects_what_the_api_server_would() -> None:
    """Negative control: the structural check is not a rubber stamp."""
    service = build().service
    service["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 30  # Knative strips/forbids it
    service["spec"]["template"]["spec"]["containers"][0]["lifecycle"] = {}
    service["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "half"
    service["metadata"]["labels"]["grove.dev/model"] = "gpt/4o"
    problems = validate(service, load_schema())
    assert any('unknown field "terminationGracePeriodSeconds"' in p for p in problems)
    assert any('unknown field "lifecycle"' in p for p in problems)
    assert any("limits.cpu" in p for p in problems) and any("grove.dev/model" in p for p in problems)


def test_other_objects_validate_against_kubernetes_schemas() -> None:
    objects = build(network=Network("allow", ("192.168.0.0/16:5432", "2001:db8::/32:443")))
    for obj in (objects.secret, objects.policy):
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    assert objects.policy is not None
    rules = objects.policy["spec"]["egress"]
    assert rules[0] == {"to": [{"ipBlock": {"cidr": "192.168.0.0/16"}}],
                        "ports": [{"protocol": "TCP", "port": 5432}, {"protocol": "UDP", "port": 5432}]}
    assert rules[1]["to"][0]["ipBlock"]["cidr"] == "2001:db8::/32"
    assert rules[-1]["ports"][0]["port"] == 53  # names resolve
    open_policy = build(network=Network("allow")).policy
    assert open_policy is not None and "169.254.0.0/16" in json.dumps(open_policy)  # no cloud metadata
    with pytest.raises(Invalid, match=r"10\.0\.0\.0/8:99999"):
        build(network=Network("allow", ("10.0.0.0/8:99999",)))


def test_labels_are_sanitized_and_stay_distinct() -> None:
    labels = build().service["metadata"]["labels"]
    assert labels["grove.dev/task-id"] == "django__django-11099"  # valid values are kept as they are
    assert L.is_valid_value(labels["grove.dev/model"]) and labels["grove.dev/model"].startswith("gpt_4o_mini-")
    assert L.sanitize_value("a/b") != L.sanitize_value("a:b")
    long = L.sanitize_value("x" * 200)
    assert len(long) <= 63 and L.is_valid_value(long)
    assert L.sanitize_value("---") and L.is_valid_value(L.sanitize_value("---"))
    assert all(is_valid_key(k) and L.is_valid_value(v) for k, v in labels.items())


def test_autoscaling_follows_idle_timeout_within_knative_bounds() -> None:
    options = KnativeOptions()
    short = manifest.autoscaling_annotations(2, options)
    assert short["autoscaling.knative.dev/window"] == "6s"  # Knative's minimum
    long = manifest.autoscaling_annotations(5400, options)
    assert long["autoscaling.knative.dev/window"] == "3600s"
    assert long["autoscaling.knative.dev/scale-to-zero-pod-retention-period"] == "1800s"


def test_image_is_pinned_by_digest_once_known() -> None:
    digest = "sha256:" + "a" * 64
    assert status.pinned("python:3.11", digest) == f"python@{digest}"
    assert status.pinned("reg.io:5000/team/img:tag", digest) == f"reg.io:5000/team/img@{digest}"
    assert status.pinned("img@sha256:" + "b" * 64, digest) == "img@sha256:" + "b" * 64
    assert status.pinned("img", None) == "img"


def test_serving_config_enables_what_the_template_uses() -> None:
    template = build().service["spec"]["template"]["spec"]
    features = serving_config()["config-features"]
    assert "initContainers" in template and features["kubernetes.podspec-init-containers"] == "enabled"
    assert "emptyDir" in template["volumes"][0] and features["kubernetes.podspec-volumes-emptydir"] == "enabled"
    limit = int(serving_config()["config-defaults"]["max-revision-timeout-seconds"])
    assert template["timeoutSeconds"] <= limit


def test_a_runtime_class_puts_every_sandbox_under_it() -> None:
    assert build().service["spec"]["template"]["spec"]["runtimeClassName"] == "gvisor"  # the default
    none = manifest.build(spec(), KnativeOptions(runtime_class=None), image="python:3.11-slim")
    assert "runtimeClassName" not in none.service["spec"]["template"]["spec"]
    objects = manifest.build(spec(), KnativeOptions(runtime_class="kata"), image="python:3.11-slim",
                             snapshot_access=None)
    template = objects.service["spec"]["template"]["spec"]
    assert template["runtimeClassName"] == "kata"
    assert validate(objects.service, load_schema()) == []
    assert serving_config()["config-features"]["kubernetes.podspec-runtimeclassname"] == "enabled"
    for bad in ("gVisor", "-kata", "a_b", "x" * 254, ""):
        with pytest.raises(Invalid, match="not a valid RuntimeClass name"):
            KnativeOptions(runtime_class=bad)


def test_the_cluster_domain_is_an_option_and_a_dns_name() -> None:
    """Revision URLs end in the cluster's domain (the activator matches it in the Host): settable, checked."""
    parser = argparse.ArgumentParser()
    add_cluster_options(parser)
    assert options_from_args(parser.parse_args([])).cluster_domain == "cluster.local"
    assert options_from_args(parser.parse_args(["--cluster-domain", "corp.internal"])).cluster_domain == "corp.internal"
    for bad in ("", "Cluster.Local", "a..b", "cluster.local:80"):
        with pytest.raises(Invalid, match="cluster domain"):
            KnativeOptions(cluster_domain=bad)


@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_grove_knative_manifest_prints_what_a_create_makes(fmt: str) -> None:
    proc = subprocess.run(
        [GROVE_BIN, "knative", "manifest", "--image", "ubuntu:24.04", "--cpu", "2", "--egress", "allow",
         "--allow", "10.1.0.0/16:443", "--task", "task one", "--idle-timeout", "120", "--namespace", "ns-a",
         "--id", "sb-00000000000000aa", "--format", fmt],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    objects = json.loads(proc.stdout) if fmt == "json" else list(yaml.safe_load_all(proc.stdout))
    assert [o["kind"] for o in objects] == ["Secret", "Service", "NetworkPolicy"]
    secret, service, policy = objects
    assert validate(service, load_schema()) == []
    kubernetes_validate.validate(secret, K8S_VERSION, strict=True)
    kubernetes_validate.validate(policy, K8S_VERSION, strict=True)
    assert {o["metadata"]["namespace"] for o in objects} == {"ns-a"}
    assert service["metadata"]["name"] == "sb-00000000000000aa"
    assert service["spec"]["template"]["spec"]["containers"][0]["image"] == "ubuntu:24.04"
    assert service["metadata"]["labels"]["grove.dev/task-id"].startswith("task_one-")
    assert service["spec"]["template"]["spec"]["runtimeClassName"] == "gvisor"  # untrusted code: gVisor unless told


def test_runtime_class_none_is_the_explicit_opt_out() -> None:
    parser = argparse.ArgumentParser()
    add_cluster_options(parser)
    assert options_from_args(parser.parse_args([])).runtime_class == "gvisor"
    assert options_from_args(parser.parse_args(["--runtime-class", "kata"])).runtime_class == "kata"
    assert options_from_args(parser.parse_args(["--runtime-class", "none"])).runtime_class is None


def test_grove_knative_manifest_rejects_what_the_api_rejects() -> None:
    proc = subprocess.run([GROVE_BIN, "knative", "manifest", "--cpu", "500"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 1 and "cpu" in proc.stderr


def test_schema_copy_matches_the_crd() -> None:
    """The in-repo schema is the CRD's; point GROVE_KNATIVE_CRD at a CRD file to check a newer one."""
    given = os.environ.get("GROVE_KNATIVE_CRD")
    path = Path(given) if given else SHARED_CRD
    if not path.is_file():
        if given:
            pytest.fail(f"GROVE_KNATIVE_CRD={given} does not exist: point it at Knative's service CRD YAML")
        pytest.skip(f"no CRD file to compare with: set GROVE_KNATIVE_CRD=/path/to/service-crd.yaml "
                    f"(default {SHARED_CRD}); the in-repo copy {SCHEMA_COPY.relative_to(REPO)} is used meanwhile")
    assert extract(yaml.safe_load(path.read_text())) == load_schema()
