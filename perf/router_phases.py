"""The measurements of ``perf.bench_router``, one function per phase, each against an already running router.

Every phase leaves the router as it found it (its sandboxes deleted), so phases can be run, reordered
or repeated on one router — the burst benchmark of the performance issue reuses them.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from grove.client import AsyncGrove, Grove
from perf.calls import (
    TICK_S,
    ExecCalls,
    KeepAlive,
    UnixHTTPConnection,
    child_pids,
    cpu_ticks,
    floor,
    system_busy_ticks,
)
from perf.common import MIB, Api, Router, interleaved, summarize
from perf.memory import GroupMemory, cgroup_pids, disk_usage, group_memory, private_by_mapping

Call = Callable[[], Awaitable[object]]
PCTS = (50, 90, 99)


def _sync(fn: Callable[[], object]) -> Call:
    async def call() -> object:
        return fn()

    return call


def _create(api: Api, **options: Any) -> str:
    info = api.call("POST", "/v1/sandboxes", {"image": "default", **options})
    if info.get("status") != "ready":
        raise RuntimeError(f"created sandbox is not ready: {info}")
    return str(info["id"])


# -- exec latency ----------------------------------------------------------------------------------------


async def exec_latency(router: Router, calls: int, warmup: int) -> tuple[dict[str, Any], dict[str, list[float]]]:
    """``["true"]`` by every route, interleaved with the floor (order rotated each round) on one sandbox.

    Returns the report and the raw samples (seconds) per kind.
    """
    api = router.api()
    sandbox_id = _create(api)
    record = router.record(sandbox_id)
    path = f"/v1/sandboxes/{sandbox_id}/exec"
    via_router = ExecCalls(KeepAlive(http.client.HTTPConnection(api.host, api.port, timeout=60), router.key), path)
    direct = ExecCalls(KeepAlive(UnixHTTPConnection(str(record["endpoint_url"])[5:]), str(record["token"])), "/v1/exec")
    grove = Grove(router.url, router.key)
    agrove = AsyncGrove(router.url, router.key)
    try:
        sandbox = grove.attach(sandbox_id)
        asandbox = await agrove.attach(sandbox_id)

        async def sdk_stream() -> object:
            result = None
            async for kind, value in asandbox.exec_stream(["true"]):
                if kind == "result":
                    result = value
            if result is None or result.exit_code != 0:
                raise RuntimeError(f"exec_stream did not succeed: {result}")
            return result

        async def sdk_async() -> object:
            result = await asandbox.exec(["true"])
            if result.exit_code != 0:
                raise RuntimeError(f"exec did not succeed: {result}")
            return result

        def sdk() -> object:
            result = sandbox.exec(["true"])
            if result.exit_code != 0:
                raise RuntimeError(f"exec did not succeed: {result}")
            return result

        kinds: dict[str, Call] = {
            "floor": _sync(floor),
            "executor_direct": _sync(direct.json),
            "router_json": _sync(via_router.json),
            "router_msgpack": _sync(via_router.msgpack),
            "router_stream": _sync(via_router.stream),
            "sdk": _sync(sdk),
            "sdk_async": sdk_async,
            "sdk_stream": sdk_stream,
        }
        await interleaved(kinds, warmup)  # the warm-up: its durations dropped
        via_router.durations_s.clear()
        started = time.monotonic()
        samples = await interleaved(kinds, calls)
        wall = time.monotonic() - started
        cpu = {
            "router_json": _cpu_per_call(router, sandbox_id, via_router.json, calls),
            "executor_direct": _cpu_per_call(router, sandbox_id, direct.json, calls),
        }
        throttling = _cpu_stat(router, sandbox_id)
    finally:
        await agrove.close()
        grove.close()
        via_router.link.close()
        direct.link.close()
        api.call("DELETE", f"/v1/sandboxes/{sandbox_id}")
        api.close()
    stats = {name: summarize(values, PCTS) for name, values in samples.items()}
    floor_p50 = stats["floor"]["p50_ms"]
    report = {
        "stats": stats,
        "ratio_p50": {name: round(s["p50_ms"] / floor_p50, 2) for name, s in stats.items()},
        "command_duration_s": summarize(via_router.durations_s, PCTS),
        "cpu_per_call": cpu,
        "sandbox_cpu_throttling": throttling,
        "reconnects": {"router": via_router.link.reconnects, "executor_direct": direct.link.reconnects},
        "wall_s": round(wall, 2),
    }
    return report, samples


def _cpu_per_call(router: Router, sandbox_id: str, call: Callable[[], object], n: int) -> dict[str, float]:
    """CPU spent per call by the router, by the sandbox (executor and the command), and by this client."""

    def sandbox_ticks() -> int:
        return sum(cpu_ticks(pid) for pid in cgroup_pids(router.cgroup(sandbox_id)))

    r0, s0, c0, w0 = cpu_ticks(router.pid, children=False), sandbox_ticks(), time.process_time(), time.perf_counter()
    for _ in range(n):
        call()
    r1, s1, c1, w1 = cpu_ticks(router.pid, children=False), sandbox_ticks(), time.process_time(), time.perf_counter()
    ms = 1000.0 / n
    return {
        "wall_ms": round((w1 - w0) * ms, 3),
        "router_cpu_ms": round((r1 - r0) * TICK_S * ms, 3),
        "sandbox_cpu_ms": round((s1 - s0) * TICK_S * ms, 3),
        "client_cpu_ms": round((c1 - c0) * ms, 3),
        "n": n,
    }


def _cpu_stat(router: Router, sandbox_id: str) -> dict[str, int]:
    """The sandbox's CFS throttling counters (cgroup v1 ``cpu.stat``)."""
    stat: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in (router.cgroup(sandbox_id, "cpu") / "cpu.stat").read_text().splitlines():
            name, value = line.split()
            stat[name] = int(value)
    return stat


# -- create and delete -----------------------------------------------------------------------------------


def sequential_lifecycle(router: Router, n: int, warmup: int = 2) -> dict[str, Any]:
    """``n`` times: create (wait for ready) then delete, one after the other; and the CPU a create costs."""
    api = router.api()
    create, server, delete = [], [], []
    router_ticks = helper_ticks = sandbox_ticks = system_ticks = 0
    try:
        for i in range(warmup + n):
            measured = i >= warmup
            r0, h0, s0 = cpu_ticks(router.pid, children=False), _helper_ticks(router), system_busy_ticks()
            t0 = time.perf_counter()
            info = api.call("POST", "/v1/sandboxes", {"image": "default"})
            t1 = time.perf_counter()
            if measured:
                router_ticks += cpu_ticks(router.pid, children=False) - r0
                helper_ticks += _helper_ticks(router) - h0
                system_ticks += system_busy_ticks() - s0
                # Every tick the sandbox's processes used so far went into starting them.
                sandbox_ticks += sum(cpu_ticks(pid) for pid in cgroup_pids(router.cgroup(info["id"])))
            api.call("DELETE", f"/v1/sandboxes/{info['id']}")
            t2 = time.perf_counter()
            if measured:
                create.append(t1 - t0)
                server.append(float(info["ready_at"]) - float(info["created_at"]))
                delete.append(t2 - t1)
    finally:
        api.close()
    ms = TICK_S * 1000 / max(n, 1)
    return {
        "create": summarize(create, PCTS),
        "create_server_side": summarize(server, PCTS),
        "delete": summarize(delete, PCTS),
        "cpu_per_create_ms": {
            "router": round(router_ticks * ms, 2),
            "router_helpers": round(helper_ticks * ms, 2),
            "sandbox_processes": round(sandbox_ticks * ms, 2),
            "whole_machine": round(system_ticks * ms, 2),
        },
    }


def _helper_ticks(router: Router) -> int:
    """CPU of the router's child processes that still run (the local backend's zygote)."""
    return sum(cpu_ticks(pid, children=False) for pid in child_pids(router.pid))


async def concurrent_lifecycle(router: Router, n: int, settle_s: float) -> dict[str, Any]:
    """``n`` creates at once through the SDK; after ``settle_s`` the idle sandboxes' memory; ``n`` deletes at once."""
    async with AsyncGrove(router.url, router.key) as grove:

        async def create_one() -> tuple[str, float]:
            t0 = time.perf_counter()
            body = {"image": "default", "request_id": uuid.uuid4().hex}
            info = await grove.request("POST", "/v1/sandboxes", json_body=body, retry=True)
            return str(info["id"]), time.perf_counter() - t0

        async def delete_one(sandbox_id: str) -> float:
            t0 = time.perf_counter()
            await grove.request("DELETE", f"/v1/sandboxes/{sandbox_id}")
            return time.perf_counter() - t0

        busy0, t0 = system_busy_ticks(), time.perf_counter()
        created = await asyncio.gather(*(create_one() for _ in range(n)), return_exceptions=True)
        create_wall = time.perf_counter() - t0
        busy = system_busy_ticks() - busy0
        ids = [c[0] for c in created if not isinstance(c, BaseException)]
        errors = [f"{type(c).__name__}: {c}" for c in created if isinstance(c, BaseException)]
        try:
            await asyncio.sleep(settle_s)
            memory = idle_memory(router, ids)
        finally:
            t0 = time.perf_counter()
            deleted = await asyncio.gather(*(delete_one(i) for i in ids), return_exceptions=True)
            delete_wall = time.perf_counter() - t0
    errors += [f"{type(d).__name__}: {d}" for d in deleted if isinstance(d, BaseException)]
    return {
        "n": n,
        "create": summarize([c[1] for c in created if not isinstance(c, BaseException)], PCTS),
        "create_wall_s": round(create_wall, 3),
        "machine_cpu_per_create_ms": round(busy * TICK_S * 1000 / max(n, 1), 2),
        "delete": summarize([d for d in deleted if not isinstance(d, BaseException)], PCTS),
        "delete_wall_s": round(delete_wall, 3),
        "errors": len(errors),
        "error_samples": errors[:5],
        "idle_memory": memory,
    }


def idle_memory(router: Router, ids: list[str]) -> dict[str, Any]:
    """USS/PSS/RSS of every process in each sandbox's memory cgroup; means per sandbox and per process role."""
    groups: list[GroupMemory] = [group_memory(router.cgroup(i)) for i in ids]
    if not groups:
        return {"sandboxes": 0}
    roles: dict[str, list[tuple[int, int, int]]] = {}
    for group in groups:
        for proc in group.processes:
            roles.setdefault(proc.role, []).append((proc.uss, proc.pss, proc.rss))

    def mib(values: list[int]) -> float:
        return round(sum(values) / len(values) / MIB, 2)

    charged = [g.charged for g in groups if g.charged is not None]
    return {
        "sandboxes": len(groups),
        "processes_per_sandbox": round(sum(len(g.processes) for g in groups) / len(groups), 2),
        "uss_mib": mib([g.uss for g in groups]),
        "pss_mib": mib([g.pss for g in groups]),
        "rss_mib": mib([g.rss for g in groups]),
        "uss_mib_min_max": [round(min(g.uss for g in groups) / MIB, 2), round(max(g.uss for g in groups) / MIB, 2)],
        "cgroup_charged_mib": mib(charged) if charged else None,
        "per_role": {
            role: {
                "count": len(v),
                "uss_mib": mib([x[0] for x in v]),
                "pss_mib": mib([x[1] for x in v]),
                "rss_mib": mib([x[2] for x in v]),
            }
            for role, v in sorted(roles.items())
        },
        "private_mib_by_mapping_of_first_sandbox": {p.role: private_by_mapping(p.pid) for p in groups[0].processes},
    }


# -- scale to zero and cold start ------------------------------------------------------------------------


def scale_to_zero(router: Router, n: int, idle_timeout_s: float = 1.0, wait_s: float = 3.0) -> dict[str, Any]:
    """``n`` sandboxes left idle until the router scales them to zero; what they cost then; the first exec."""
    api = router.api()
    ids: list[str] = []
    try:
        for _ in range(n):
            ids.append(_create(api, idle_timeout_s=idle_timeout_s))
        time.sleep(wait_s)
        deadline = time.monotonic() + 30
        while (statuses := [api.call("GET", f"/v1/sandboxes/{i}")["status"] for i in ids]).count("idle") < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"sandboxes did not scale to zero: {statuses}")
            time.sleep(0.25)
        groups = [group_memory(router.cgroup(i)) for i in ids]
        disk = [disk_usage(router.sandbox_dir(i)) for i in ids]
        link = KeepAlive(http.client.HTTPConnection(api.host, api.port, timeout=60), router.key)
        cold, warm = [], []
        try:
            for i in ids:
                calls = ExecCalls(link, f"/v1/sandboxes/{i}/exec")
                t0 = time.perf_counter()
                calls.json()
                t1 = time.perf_counter()
                calls.json()
                t2 = time.perf_counter()
                cold.append(t1 - t0)
                warm.append(t2 - t1)
        finally:
            link.close()
    finally:
        for i in ids:
            with contextlib.suppress(Exception):
                api.call("DELETE", f"/v1/sandboxes/{i}")
        api.close()
    return {
        "n": n,
        "idle_timeout_s": idle_timeout_s,
        "scaled_to_zero": {
            "processes_total": sum(len(g.processes) for g in groups),
            "uss_mib_total": round(sum(g.uss for g in groups) / MIB, 3),
            "disk_kib_mean": round(sum(disk) / len(disk) / 1024, 1),
        },
        "cold_start": summarize(cold, PCTS),
        "warm_exec_after": summarize(warm, PCTS),
    }
