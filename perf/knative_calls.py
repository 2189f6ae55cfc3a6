"""Kubernetes API calls per sandbox lifecycle of the Knative backend, counted by the stand-in API server.

``python -m perf.knative_calls [--sandboxes 20]`` starts the test suite's stand-in cluster (a real HTTP
server speaking the Kubernetes REST and watch protocol, with Knative's controller played on top, pods
running real executors) and drives :class:`router.backends.knative.backend.KnativeBackend` through it with the
real ``kubernetes`` client: sandboxes created (egress denied, and some with an allow-list), four
commands each through their endpoints, claimed as a pool member is (a new token and environment), left to
scale to zero, woken by a command, deleted. The stand-in counts every call by sandbox, verb and resource;
the shared list and watch are counted once for all. After each create it also counts the objects in the
API that belong to the sandbox, by resource: grove's own, and the part of Knative's the stand-in plays.
Writes ``perf/results/knative_calls.json`` (quoted by ``perf/SCALING.md``).

Only grove's own calls are counted: what Knative's controllers then write for each Service on a real
cluster (Configuration, Revision, Route, Deployment, Pods, ...) is not the stand-in's to say.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import importlib
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from perf.common import machine, utc_now, write_results
from router.backends.base import Network, SandboxSpec, Started
from router.backends.knative.backend import KnativeBackend
from router.records.registry import new_id
from sandbox_image.bundle import build_bundle

# The stand-in cluster is the test suite's; imported by name so that type-checking perf/ does not pull in
# the tests (they are not held to mypy --strict).
Cluster = Any

COMMANDS = ["echo ok", "ls /", "cat /etc/os-release | head -1", "true"]
IDLE_S = 6.0  # Knative's smallest autoscaling window; the stand-in runs its clock 20x fast


def sandbox_spec(egress: str) -> SandboxSpec:
    allow = ("10.0.0.0/8:443",) if egress == "allow" else ()
    return SandboxSpec(id=new_id(), image="python:3.11-slim", cpu=0.5, memory_mb=256, pids_max=128, env={},
                       workdir="/workspace", network=Network(egress, allow), token="tk-" + new_id(),
                       idle_timeout_s=IDLE_S)


async def _exec(session: aiohttp.ClientSession, started: Started, command: str, gateway: str) -> None:
    """``command`` through the sandbox's revision URL, which resolves inside the stand-in's cluster network
    (its ``gateway``, an HTTP proxy, for this process)."""
    async with session.post(started.endpoint.url + "/v1/exec", json={"command": command}, proxy=gateway,
                            headers={"Authorization": f"Bearer {started.endpoint.token}"}) as resp:
        if resp.status != 200:
            raise RuntimeError(f"exec {command!r}: {resp.status} {await resp.text()}")
        await resp.read()


def router_cpu_s() -> float:
    """CPU seconds of this process's router-side threads: the event loop (main thread), the backend's
    Kubernetes client pool (``grove-kube-*``) and its watch (``grove-watch-*``) — not the stand-in's."""
    total = 0
    main = os.getpid()
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm", encoding="utf-8") as fh:
                name = fh.read().strip()
            if int(tid) != main and not name.startswith("grove-"):
                continue
            with open(f"/proc/self/task/{tid}/schedstat", encoding="ascii") as fh:
                total += int(fh.read().split()[0])
        except OSError:
            continue
    return total / 1e9


def _objects(cluster: Cluster, sandbox_id: str) -> dict[str, int]:
    """The sandbox's objects in the API, by resource: named after it, or labelled with it."""
    found: collections.Counter[str] = collections.Counter()
    for (plural, _), objs in list(cluster.api.objects.items()):
        for name, obj in list(objs.items()):
            labels = obj.get("metadata", {}).get("labels") or {}
            if name.startswith(sandbox_id) or sandbox_id in labels.values():
                found[plural] += 1
    return dict(sorted(found.items()))


def _snapshot(cluster: Cluster) -> collections.Counter[tuple[str, str, str]]:
    return collections.Counter(cluster.api.calls)


def _phase(before: collections.Counter[tuple[str, str, str]], after: collections.Counter[tuple[str, str, str]],
           sandbox_id: str) -> dict[str, int]:
    return {f"{verb} {plural}": n - before[(owner, verb, plural)]
            for (owner, verb, plural), n in after.items()
            if owner == sandbox_id and n - before[(owner, verb, plural)] > 0}


async def _lifecycles(cluster: Cluster, n: int) -> dict[str, Any]:
    backend = KnativeBackend(cluster.options())
    await backend.open()
    phases: dict[str, list[dict[str, int]]] = collections.defaultdict(list)
    objects: dict[str, list[dict[str, int]]] = collections.defaultdict(list)
    times: dict[str, list[float]] = collections.defaultdict(list)
    cpu: dict[str, list[float]] = collections.defaultdict(list)
    try:
        async with aiohttp.ClientSession() as session:
            for i in range(n):
                spec = sandbox_spec("allow" if i % 5 == 4 else "deny")
                kind = f"egress {spec.network.egress}"
                c0 = _snapshot(cluster)
                t0, cpu0 = time.perf_counter(), router_cpu_s()
                started = await backend.create(spec)
                times["create (stand-in, loopback)"].append(time.perf_counter() - t0)
                cpu["create"].append(router_cpu_s() - cpu0)
                c1 = _snapshot(cluster)
                objects[kind].append(_objects(cluster, spec.id))
                for command in COMMANDS:
                    await _exec(session, started, command, cluster.knative.gateway)
                c2 = _snapshot(cluster)
                phases["4 commands"].append(_phase(c1, c2, spec.id))
                # Claimed as a pool member is: the claimant's token and environment.
                spec = dataclasses.replace(spec, token="tk-" + new_id(), env={"TASK": str(i)})
                await backend.claim(spec, started.handle)
                c_claimed = _snapshot(cluster)
                phases["claim (one patch of the Secret)"].append(_phase(c2, c_claimed, spec.id))
                c2 = c_claimed
                if i < 3:  # a few go through scale-to-zero and a cold start
                    await asyncio.sleep(IDLE_S * cluster.knative.time_scale + 1.0)
                    handle = await backend.stop(spec.id, started.handle)
                    t1 = time.perf_counter()
                    woken = await backend.resume(spec, handle)
                    await _exec(session, woken, "true", cluster.knative.gateway)
                    times["wake from zero (stand-in)"].append(time.perf_counter() - t1)
                c3 = _snapshot(cluster)
                cpu0 = router_cpu_s()
                await backend.delete(spec.id, started.handle)
                cpu["delete"].append(router_cpu_s() - cpu0)
                c4 = _snapshot(cluster)
                phases[f"create ({kind})"].append(_phase(c0, c1, spec.id))
                if i < 3:
                    phases["scale to zero + wake"].append(_phase(c2, c3, spec.id))
                phases[f"delete ({kind})"].append(_phase(c3, c4, spec.id))
    finally:
        await backend.close()
    shared = {f"{verb} {plural}": count for (owner, verb, plural), count in cluster.api.calls.items() if owner == "*"}
    return {"phases": {k: _typical(v) for k, v in phases.items()}, "shared_for_all": shared,
            "objects_after_create": {k: _typical(v, "objects") for k, v in objects.items()},
            "times_ms": {k: round(sorted(v)[len(v) // 2] * 1000, 1) for k, v in times.items()},
            "router_cpu_ms_mean": {k: round(sum(v) / len(v) * 1000, 2) for k, v in cpu.items()}, "sandboxes": n}


def _typical(samples: list[dict[str, int]], what: str = "calls") -> dict[str, Any]:
    """The counts (of calls, or of objects) of a phase when every sample agrees, else each variant with how
    often it came."""
    variants = collections.Counter(tuple(sorted(s.items())) for s in samples)
    if len(variants) == 1:
        counts = dict(next(iter(variants)))
        return {what: counts, "total": sum(counts.values()), "samples": len(samples)}
    return {"variants": [{what: dict(v), "count": c} for v, c in variants.most_common()], "samples": len(samples)}


def main(argv: list[str] | None = None) -> None:
    """Count, print, write the JSON."""
    parser = argparse.ArgumentParser(prog="python -m perf.knative_calls", description=__doc__)
    parser.add_argument("--sandboxes", type=int, default=20, help="lifecycles to count (default 20)")
    args = parser.parse_args(argv)
    fixtures = importlib.import_module("tests.support.knative_fixtures")
    with tempfile.TemporaryDirectory(prefix="gkb-") as scratch:
        bundle = build_bundle(Path(scratch) / "runtime")
        with fixtures.stand_in_cluster(bundle) as cluster:
            counted = asyncio.run(_lifecycles(cluster, args.sandboxes))
    report = {"benchmark": "Kubernetes API calls per sandbox, Knative backend, stand-in API server",
              "date": utc_now(), "machine": machine(), **counted}
    write_results("knative_calls", report)
    for phase, found in counted["phases"].items():
        print(f"{phase}: {found}")
    print(f"shared by all sandboxes: {counted['shared_for_all']}")
    print(f"objects in the API per sandbox after its create: {counted['objects_after_create']}")
    print(f"times (ms): {counted['times_ms']}")
    print(f"router-side CPU per call of the backend (ms): {counted['router_cpu_ms_mean']}")


if __name__ == "__main__":
    main()
