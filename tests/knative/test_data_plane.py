"""Knative's data plane as grove's sandboxes meet it: timeouts on long execs, readiness probing.

Long execs: the revision's timeouts, defaulted and enforced by the stand-in like Knative does.

Since Knative 1.13 the webhook defaults ``responseStartTimeoutSeconds`` (300 s) and queue-proxy answers 504
to a call that sent no byte by then; a plain exec answers only when its command ends. The stand-in's
``config-defaults`` are scaled down here (a 1 s response start, a 4 s revision timeout) so the same
situation runs in seconds.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp

from router.backends.knative.backend import KnativeBackend
from router.backends.knative.manifest import exec_timeout_limit
from tests.knative.test_backend import run, spec
from tests.support.knative_fixtures import NAMESPACE, Cluster
from tests.support.knative_standin import apply_defaults, probe_interval, probe_timeout


async def _exec(cluster: Cluster, url: str, token: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.post(
        url + "/v1/exec", json=body, headers={"Authorization": f"Bearer {token}"},
        proxy=cluster.knative.gateway if ".svc." in url else None,
    ) as resp:
        return resp.status, (await resp.json() if resp.content_type == "application/json" else await resp.text())


def test_the_stand_in_defaults_timeouts_like_knatives_webhook() -> None:
    unset: dict[str, Any] = {}
    apply_defaults(unset, {})
    assert unset == {"timeoutSeconds": 300}  # the response start defaults to 300, not below 300: left unset
    long: dict[str, Any] = {"timeoutSeconds": 3600}
    apply_defaults(long, {})
    assert long == {"timeoutSeconds": 3600, "responseStartTimeoutSeconds": 300}  # the 1.13+ trap
    ours: dict[str, Any] = {"timeoutSeconds": 3600, "responseStartTimeoutSeconds": 3600, "idleTimeoutSeconds": 3600}
    apply_defaults(ours, {"revision-response-start-timeout-seconds": "60", "revision-idle-timeout-seconds": "30"})
    assert ours == {"timeoutSeconds": 3600, "responseStartTimeoutSeconds": 3600, "idleTimeoutSeconds": 3600}


def test_an_exec_longer_than_the_response_start_default_answers(cluster: Cluster) -> None:
    cluster.knative.config["config-defaults"]["revision-response-start-timeout-seconds"] = "1"
    sb = spec()
    limit = exec_timeout_limit(4)

    async def body(backend: KnativeBackend) -> None:
        started = await backend.create(sb)
        template = cluster.api.objects[("services", NAMESPACE)][sb.id]["spec"]["template"]["spec"]
        assert template["responseStartTimeoutSeconds"] == template["timeoutSeconds"] == 4
        url, token = started.endpoint.url, started.endpoint.token
        # 1.5 s of silence: past the cluster's 1 s response-start default, within the revision's own.
        status, result = await _exec(cluster, url, token, {"command": "sleep 1.5; echo done"})
        assert status == 200 and result["stdout"] == "done\n", result
        # Past what the revision allows: refused at once, naming the limit (not a 504 after the wait).
        status, result = await _exec(cluster, url, token, {"command": "true", "timeout_s": 4})
        assert status == 422 and f"and {limit} (this sandbox's longest call)" in result["error"]["message"], result
        # A command that runs to the limit ends with its own timed-out result before queue-proxy cuts.
        began = time.monotonic()
        status, result = await _exec(cluster, url, token, {"command": "sleep 30", "timeout_s": limit})
        assert status == 200 and result["timed_out"] and time.monotonic() - began < 4, result
        await backend.delete(sb.id, {})

    run(cluster, body, request_timeout_s=4)
    assert cluster.knative.timeouts == 0


def test_queue_proxy_cuts_a_call_past_the_response_start_timeout(cluster: Cluster) -> None:
    """The stand-in's enforcement itself: a revision made without grove's timeouts meets the default."""
    cluster.knative.config["config-defaults"]["revision-response-start-timeout-seconds"] = "1"
    sb = spec()

    async def body(backend: KnativeBackend) -> None:
        started = await backend.create(sb)
        ks = cluster.knative.services[sb.id]
        del ks.obj["spec"]["template"]["spec"]["responseStartTimeoutSeconds"]
        apply_defaults(ks.obj["spec"]["template"]["spec"], cluster.knative.config["config-defaults"])
        status, text = await _exec(cluster, started.endpoint.url, started.endpoint.token, {"command": "sleep 2"})
        assert status == 504 and text == "request timeout"
        await backend.delete(sb.id, {})

    run(cluster, body, request_timeout_s=4)
    assert cluster.knative.timeouts == 1


def test_probe_semantics_follow_queue_proxy() -> None:
    assert probe_interval({"periodSeconds": 0}) == probe_interval({}) == 0.05  # aggressive
    assert probe_timeout({"periodSeconds": 0}) == 0.1
    assert probe_interval({"periodSeconds": 1}) == 1.0 and probe_timeout({"periodSeconds": 1}) == 1.0


def test_a_sandbox_is_probed_aggressively_so_a_cold_start_is_ready_at_once(cluster: Cluster) -> None:
    sb = spec()

    async def body(backend: KnativeBackend) -> None:
        await backend.create(sb)
        pod = cluster.knative.services[sb.id].pod
        assert pod is not None and pod.probe_interval == 0.05
        # Cold again, then woken by a call: ready within a few 50 ms probes of the executor listening.
        await asyncio.to_thread(cluster.knative.scale_to_zero, sb.id)
        started = await backend.resume(sb, {})
        status, result = await _exec(cluster, started.endpoint.url, started.endpoint.token, {"command": "echo warm"})
        assert status == 200 and result["stdout"] == "warm\n"
        woken = cluster.knative.services[sb.id].pod
        assert woken is not None and woken is not pod and woken.probe_interval == 0.05
        await backend.delete(sb.id, {})

    run(cluster, body)


def test_commands_run_under_groves_seccomp_filter(cluster: Cluster) -> None:
    """The executor installs the same filter the local backend's PID 1 does: a user namespace is refused."""
    sb = spec()

    async def body(backend: KnativeBackend) -> None:
        started = await backend.create(sb)
        url, token = started.endpoint.url, started.endpoint.token
        status, result = await _exec(cluster, url, token, {"command": "grep '^Seccomp:' /proc/self/status"})
        assert status == 200 and result["stdout"].split() == ["Seccomp:", "2"], result
        unshare = ("import ctypes; c = ctypes.CDLL(None, use_errno=True); "
                   "print(c.unshare(0x10000000), ctypes.get_errno())")
        status, result = await _exec(cluster, url, token, {"command": f'python3 -c "{unshare}"'})
        assert status == 200 and result["stdout"] == "-1 1\n", result  # CLONE_NEWUSER: EPERM
        await backend.delete(sb.id, {})

    run(cluster, body)
