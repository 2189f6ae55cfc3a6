"""Sandbox pods run under a sandboxing RuntimeClass (gVisor) unless the router is told ``--runtime-class none``.

The router checks at start what every create would otherwise trip over: the RuntimeClass exists, and
Knative's ``kubernetes.podspec-runtimeclassname`` feature is on. The stand-in serves RuntimeClasses and
Knative's ConfigMaps, refuses a Service naming a RuntimeClass while the flag is off (Knative's webhook
text), and fails a revision whose RuntimeClass is missing (the API server's RuntimeClass admission).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

from artifacts.s3server import EmbeddedS3
from grove.core.errors import Invalid, NotFound, Unavailable
from router.backends.base import Network, SandboxSpec
from router.backends.knative.backend import KnativeBackend
from router.records.registry import new_id
from tests.support.knative_fixtures import NAMESPACE, Cluster, knative_router_on

T = TypeVar("T")
FLAG = "kubernetes.podspec-runtimeclassname"


def spec() -> SandboxSpec:
    return SandboxSpec(id=new_id(), image="python:3.11-slim", cpu=0.5, memory_mb=256, pids_max=128, env={},
                       workdir="/workspace", network=Network(), token="tk-1", labels={}, idle_timeout_s=60.0)


def run(cluster: Cluster, body: Callable[[KnativeBackend], Awaitable[T]], **options: Any) -> T:
    async def main() -> T:
        backend = KnativeBackend(cluster.options(**options))
        try:  # closed also when open refuses: its client and threads go either way
            await backend.open()
            return await body(backend)
        finally:
            await backend.close()
    return asyncio.run(main())


def opened(cluster: Cluster, **options: Any) -> None:
    async def nothing(backend: KnativeBackend) -> None:
        return None
    run(cluster, nothing, **options)


def template(cluster: Cluster, sandbox_id: str) -> dict[str, Any]:
    spec_: dict[str, Any] = cluster.api.objects[("services", NAMESPACE)][sandbox_id]["spec"]["template"]["spec"]
    return spec_


def test_sandbox_pods_run_under_gvisor_by_default(cluster: Cluster) -> None:
    sb = spec()

    async def body(backend: KnativeBackend) -> None:
        await backend.create(sb)
        assert template(cluster, sb.id)["runtimeClassName"] == "gvisor"
        await backend.delete(sb.id, {})

    run(cluster, body)
    # Checked once at start: the RuntimeClass and Knative's configuration, under knative/rbac.yaml's grants.
    assert cluster.api.calls[("*", "get", "runtimeclasses")] == 1
    assert cluster.api.calls[("*", "get", "configmaps")] == 3  # config-features, -defaults, -autoscaler
    assert cluster.api.calls[("*", "get", "deployments")] == 1  # the activator's grace period


def test_a_missing_runtime_class_refuses_to_start(cluster: Cluster, s3_server: EmbeddedS3) -> None:
    cluster.api.remove("runtimeclasses", "", "gvisor")
    with pytest.raises(RuntimeError) as err, knative_router_on(cluster, s3_server):
        pass
    message = str(err.value)
    assert "grove up exited with 1" in message
    assert "the cluster has no RuntimeClass 'gvisor'" in message
    assert "Install gVisor" in message and "--runtime-class NAME" in message and "--runtime-class none" in message
    assert not cluster.api.objects[("services", NAMESPACE)]


def test_none_opts_out_with_a_loud_warning(cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    cluster.api.remove("runtimeclasses", "", "gvisor")  # not needed, not looked for
    cluster.knative.set_feature(FLAG, None)
    sb = spec()

    async def body(backend: KnativeBackend) -> None:
        await backend.create(sb)
        assert "runtimeClassName" not in template(cluster, sb.id)
        await backend.delete(sb.id, {})

    with caplog.at_level(logging.WARNING, logger="grove.knative"):
        run(cluster, body, runtime_class=None)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("SANDBOXES SHARE THE NODE'S KERNEL" in w and "--runtime-class none" in w for w in warnings), warnings
    assert cluster.api.calls[("*", "get", "runtimeclasses")] == 0


@pytest.mark.parametrize("value", ["disabled", None], ids=["disabled", "unset"])
def test_the_feature_flag_off_refuses_to_start(cluster: Cluster, value: str | None) -> None:
    cluster.knative.set_feature(FLAG, value)  # unset: Knative's default, disabled
    with pytest.raises(Invalid) as err:
        opened(cluster)
    message = err.value.message
    assert f"Knative's {FLAG} feature is 'disabled'" in message
    assert "knative/knative-serving-config.yaml" in message and "--runtime-class none" in message


def test_the_webhooks_refusal_after_start_is_a_clear_error(cluster: Cluster) -> None:
    async def body(backend: KnativeBackend) -> None:
        cluster.knative.set_feature(FLAG, "disabled")  # someone reverted the patch while the router ran
        with pytest.raises(Invalid) as err:
            await backend.create(spec())
        message = err.value.message
        assert 'admission webhook "validation.webhook.serving.knative.dev" denied the request' in message
        assert "must not set the field(s): spec.template.spec.runtimeClassName" in message
        assert f"{FLAG} feature is off" in message and "--runtime-class none" in message

    run(cluster, body)
    assert not cluster.api.objects[("secrets", NAMESPACE)]  # the Secret made first went again


def test_a_runtime_class_deleted_after_start_fails_the_create_with_the_reason(cluster: Cluster) -> None:
    async def body(backend: KnativeBackend) -> None:
        cluster.api.remove("runtimeclasses", "", "gvisor")
        with pytest.raises(Unavailable, match='pod rejected: RuntimeClass "gvisor" not found'):
            await backend.create(spec())

    run(cluster, body)


def test_what_rbac_hides_is_a_warning_not_a_refusal(cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    cluster.api.forbidden |= {("get", "runtimeclasses"), ("get", "configmaps")}
    with caplog.at_level(logging.WARNING, logger="grove.knative"):
        opened(cluster)
    warnings = "\n".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert "cannot read RuntimeClass 'gvisor'" in warnings and "grove-router-runtimeclasses" in warnings
    assert f"not checked that {FLAG} is enabled" in warnings


def test_a_runtime_class_of_another_name_is_the_one_checked(cluster: Cluster) -> None:
    with pytest.raises(NotFound, match="no RuntimeClass 'kata'"):
        opened(cluster, runtime_class="kata")
