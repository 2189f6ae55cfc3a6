"""The router benchmark: exec latency, create and delete, memory per idle sandbox, scale-to-zero, cold start.

``python -m perf.bench_router [--calls 500]`` starts a real router (``grove up``, local backend) on a
private state dir and, in one run: ``["true"]`` through the router (raw keep-alive ``http.client`` with
JSON, msgpack and ``?stream=1``; the SDK's ``Grove``, ``AsyncGrove`` and ``exec_stream``; the executor's
own socket without the router) interleaved with the floor ``subprocess.run(["true"])``; sequential and
concurrent create/delete; USS/PSS/RSS of idle sandboxes; sandboxes scaled to zero and the first exec
that wakes them. Writes ``perf/results/router.json``, ``perf/results/router_exec_cdf.png`` and the
"Router: exec, create, memory" section of ``perf/README.md``. Everything it made is removed, also on failure.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from perf import router_phases
from perf.common import (
    RESULTS_DIR,
    Target,
    code_version,
    machine,
    machine_line,
    publish,
    running_router,
    sigterm_as_exit,
    target_table,
    utc_now,
)
from perf.memory import vm_rss
from perf.plots import latency_cdf

NAME = "router"
SECTION = "## Router: exec, create, memory"
PLOT = RESULTS_DIR / "router_exec_cdf.png"
# The first router targets and the tighter performance targets.
EXEC_RATIO_3, EXEC_RATIO_6 = 5.0, 4.0
CREATE_MS_3, CREATE_MS_6 = 100.0, 50.0
COLD_MS_6 = 100.0
IDLE_USS_MIB_6 = 8.0

LABELS = {
    "floor": '`subprocess.run(["true"])` — the floor',
    "executor_direct": "executor alone (its Unix socket, no router), JSON",
    "router_json": "router, raw keep-alive `http.client`, JSON",
    "router_msgpack": "router, raw keep-alive, msgpack",
    "router_stream": "router, raw keep-alive, `?stream=1` (ndjson)",
    "sdk": "SDK `Grove` (sync) `exec`",
    "sdk_async": "SDK `AsyncGrove` `exec`",
    "sdk_stream": "SDK `AsyncGrove` `exec_stream`",
}
PLOTTED = {
    "floor": 'subprocess.run(["true"]) (floor)',
    "executor_direct": "executor alone (no router)",
    "router_json": "router, raw http.client, JSON",
    "router_msgpack": "router, raw http.client, msgpack",
    "sdk": "SDK Grove.exec (sync)",
    "sdk_stream": "SDK AsyncGrove.exec_stream",
}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """All phases on one router; also draws the exec latency CDF."""
    with running_router() as router:
        rss_start = vm_rss(router.pid)
        exec_report, samples = asyncio.run(router_phases.exec_latency(router, args.calls, args.warmup))
        sequential = router_phases.sequential_lifecycle(router, args.creates)
        concurrent = asyncio.run(router_phases.concurrent_lifecycle(router, args.concurrent, args.settle))
        zero = router_phases.scale_to_zero(router, args.cold)
        rss_end = vm_rss(router.pid)
    floor_p50 = exec_report["stats"]["floor"]["p50_ms"] / 1000
    latency_cdf(
        {PLOTTED[k]: samples[k] for k in PLOTTED},
        PLOT,
        title=f'exec of ["true"], {args.calls} calls each, interleaved in one run — {machine()["nproc"]} CPUs',
        marks={"4x floor p50 (performance target)": 4 * floor_p50, "5x floor p50 (first router target)": 5 * floor_p50},
    )
    return {
        "exec": exec_report,
        "sequential": sequential,
        "concurrent": concurrent,
        "scale_to_zero": zero,
        "router_rss_mib": {
            "start": round((rss_start or 0) / 2**20, 1),
            "end": round((rss_end or 0) / 2**20, 1),
        },
        "cleanup": router.cleanup,
    }


def targets(report: dict[str, Any]) -> list[Target]:
    """Each figure against the first router targets and the performance targets."""
    ex, seq, conc, zero = report["exec"], report["sequential"], report["concurrent"], report["scale_to_zero"]
    floor = ex["stats"]["floor"]["p50_ms"]
    router_p50, ratio = ex["stats"]["router_json"]["p50_ms"], ex["ratio_p50"]["router_json"]
    sdk_p50, sdk_ratio = ex["stats"]["sdk"]["p50_ms"], ex["ratio_p50"]["sdk"]
    create = seq["create"]["p50_ms"]
    cold = zero["cold_start"]["p50_ms"]
    mem = conc["idle_memory"]
    gone = zero["scaled_to_zero"]
    exec_measured = f"{router_p50:.2f} ms = {ratio:.2f}x floor ({floor:.2f} ms)"
    return [
        Target(
            "exec p50 via the router (raw keep-alive, JSON)",
            exec_measured,
            f"≤ {EXEC_RATIO_3:g}x floor (first router target)",
            ratio <= EXEC_RATIO_3,
        ),
        Target(
            "exec p50 via the router (raw keep-alive, JSON)",
            exec_measured,
            f"≤ {EXEC_RATIO_6:g}x floor (performance target)",
            ratio <= EXEC_RATIO_6,
        ),
        Target(
            "exec p50 via the SDK (`Grove.exec`)",
            f"{sdk_p50:.2f} ms = {sdk_ratio:.2f}x floor",
            f"≤ {EXEC_RATIO_3:g}x floor (first router target)",
            sdk_ratio <= EXEC_RATIO_3,
        ),
        Target(
            "exec p99 via the router (raw, JSON)",
            f"{ex['stats']['router_json']['p99_ms']:.2f} ms (floor p99 {ex['stats']['floor']['p99_ms']:.2f} ms)",
            "—",
            None,
        ),
        Target(
            "create → ready p50 (sequential)",
            f"{create:.1f} ms",
            f"≤ {CREATE_MS_3:g} ms (first router target)",
            create <= CREATE_MS_3,
        ),
        Target(
            "create → ready p50 (sequential)",
            f"{create:.1f} ms",
            f"≤ {CREATE_MS_6:g} ms (performance target)",
            create <= CREATE_MS_6,
        ),
        Target(
            f"{conc['n']} concurrent creates",
            f"p50 {conc['create']['p50_ms']:.0f} ms, all ready in "
            f"{conc['create_wall_s']:.2f} s, {conc['errors']} errors",
            "—",
            None,
        ),
        Target(
            "cold start: first exec to a sandbox scaled to zero, p50",
            f"{cold:.1f} ms",
            f"≤ {COLD_MS_6:g} ms (performance target)",
            cold <= COLD_MS_6,
        ),
        Target(
            "idle sandbox memory, USS per sandbox (mean)",
            f"{mem['uss_mib']:.2f} MiB (PSS {mem['pss_mib']:.2f}, RSS {mem['rss_mib']:.2f})",
            f"≤ {IDLE_USS_MIB_6:g} MiB (performance target)",
            mem["uss_mib"] <= IDLE_USS_MIB_6,
        ),
        Target(
            "scaled-to-zero sandbox",
            f"{gone['processes_total']} processes, {gone['uss_mib_total']:g} MiB "
            f"over {zero['n']}; {gone['disk_kib_mean']:.0f} KiB disk each",
            "0 processes, 0 memory (design goal)",
            gone["processes_total"] == 0 and gone["uss_mib_total"] == 0,
        ),
    ]


def _row(label: str, s: dict[str, Any], extra: str = "") -> str:
    return f"| {label} | {s['p50_ms']:.2f} | {s['p90_ms']:.2f} | {s['p99_ms']:.2f} | {s['mean_ms']:.2f} |{extra}"


def markdown(report: dict[str, Any], rows: list[Target]) -> str:
    """The README section."""
    ex, seq, conc, zero = report["exec"], report["sequential"], report["concurrent"], report["scale_to_zero"]
    code = report["code"]
    changed = [f"`{f}`" for f in code["uncommitted"][:4]]
    if len(code["uncommitted"]) > 4:
        changed.append(f"{len(code['uncommitted']) - 4} more files")
    dirty = f" plus uncommitted changes to {', '.join(changed)}" if changed else ""
    lines = [
        SECTION,
        "",
        f"`python -m perf.bench_router --calls {report['calls']}` — {report['date']}, commit `{code['commit']}`"
        f"{dirty}. {machine_line(report['machine'])}",
        "",
        "One router (`grove up`, local backend) on loopback; sandboxes of the `default` image with the default "
        "resources (1 CPU, 1024 MiB, 512 pids). Every figure comes from the same run, and every ratio is against "
        "the floor measured in that run, interleaved with the calls it is compared with (the machine is shared "
        "and noisy). Raw figures: `perf/results/router.json`.",
        "",
        *target_table(rows),
        "",
        f'### Exec latency of `["true"]` ({report["calls"]} calls of each kind, interleaved, order rotated '
        f"every round, after {report['warmup']} warm-up rounds; one sandbox)",
        "",
        "| call | p50 (ms) | p90 (ms) | p99 (ms) | mean (ms) | p50 vs floor |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for key, label in LABELS.items():
        lines.append(_row(label, ex["stats"][key], f" {ex['ratio_p50'][key]:.2f}x |"))
    cpu_r, cpu_d = ex["cpu_per_call"]["router_json"], ex["cpu_per_call"]["executor_direct"]
    cpc = seq["cpu_per_create_ms"]
    throttled = ex["sandbox_cpu_throttling"].get("nr_throttled", "?")
    lines += [
        "",
        "![exec latency CDF](results/router_exec_cdf.png)",
        "",
        f"Where an exec's time goes ({cpu_r['n']} back-to-back calls of each, CPU from `/proc/<pid>/stat`): through "
        f"the router a call takes {cpu_r['wall_ms']:.2f} ms of wall time and costs {cpu_r['router_cpu_ms']:.2f} ms "
        f"of router CPU, {cpu_r['sandbox_cpu_ms']:.2f} ms in the sandbox (executor plus the `true` it starts) and "
        f"{cpu_r['client_cpu_ms']:.2f} ms in the client; straight to the executor, {cpu_d['wall_ms']:.2f} ms wall, "
        f"{cpu_d['sandbox_cpu_ms']:.2f} ms sandbox CPU. The command itself (the executor's `duration_s`, spawn to "
        f"exit) takes p50 {ex['command_duration_s']['p50_ms']:.2f} ms. The sandbox's CFS quota throttled it "
        f"{throttled} times during the run.",
        "",
        "### Create and delete",
        "",
        "| call | p50 (ms) | p90 (ms) | p99 (ms) | mean (ms) |",
        "|---|---:|---:|---:|---:|",
        _row(f"create → ready, sequential ({seq['create']['n']}; raw API, `wait` true)", seq["create"]),
        _row("the same, router-side (`ready_at - created_at`)", seq["create_server_side"]),
        _row("delete, sequential", seq["delete"]),
        _row(f"create → ready, {conc['n']} at once (SDK); all in {conc['create_wall_s']:.2f} s", conc["create"]),
        _row(f"delete, {conc['n']} at once; all in {conc['delete_wall_s']:.2f} s", conc["delete"]),
        "",
        f"CPU per sequential create: router {cpc['router']:.1f} ms, its zygote {cpc['router_helpers']:.1f} ms, the "
        f"new sandbox's own processes {cpc['sandbox_processes']:.1f} ms; the whole machine was busy "
        f"{cpc['whole_machine']:.1f} ms per create (all CPUs, other tenants included), and "
        f"{conc['machine_cpu_per_create_ms']:.1f} ms per create during the {conc['n']} concurrent ones — on "
        f"{report['machine']['nproc']} CPUs that bounds creates at about "
        f"{report['machine']['nproc'] * 1000 / max(conc['machine_cpu_per_create_ms'], 1):.0f}/s.",
        "",
    ]
    lines += _memory_lines(report)
    lines += [
        "",
        f"Scale to zero: {zero['n']} sandboxes with `idle_timeout_s` {zero['idle_timeout_s']:g}, left alone until "
        f"`idle`: {zero['scaled_to_zero']['processes_total']} processes and "
        f"{zero['scaled_to_zero']['uss_mib_total']:g} MiB between them; each keeps "
        f"{zero['scaled_to_zero']['disk_kib_mean']:.0f} KiB on disk (its writable layer and overlay dirs). The "
        f"first exec to each (cold start) p50 {zero['cold_start']['p50_ms']:.1f} ms, p90 "
        f"{zero['cold_start']['p90_ms']:.1f} ms; the exec right after it "
        f"p50 {zero['warm_exec_after']['p50_ms']:.2f} ms.",
        "",
        f"Router RSS {report['router_rss_mib']['start']} MiB after start, {report['router_rss_mib']['end']} MiB at the "
        f"end. Left behind after the run: {len(report['cleanup'].get('deleted_via_api', []))} sandboxes, "
        f"{len(report['cleanup'].get('removed_by_force', []))} cgroups.",
        "",
    ]
    return "\n".join(lines)


def _memory_lines(report: dict[str, Any]) -> list[str]:
    mem = report["concurrent"]["idle_memory"]
    lo, hi = mem["uss_mib_min_max"]
    lines = [
        f"### Memory of an idle sandbox ({mem['sandboxes']} sandboxes, {report['settle_s']:g} s after creation, "
        "every process of each sandbox's memory cgroup)",
        "",
        f"Per sandbox: USS {mem['uss_mib']:.2f} MiB (min {lo:.2f}, max {hi:.2f}), PSS {mem['pss_mib']:.2f} MiB, "
        f"RSS {mem['rss_mib']:.2f} MiB, {mem['processes_per_sandbox']:g} processes; the memory cgroup is charged "
        f"{mem['cgroup_charged_mib']} MiB (page cache included). USS (`Private_Clean + Private_Dirty` of "
        "`smaps_rollup`) is what deleting the sandbox frees; PSS shares each shared page among its users.",
        "",
        "| process | count | USS (MiB) | PSS (MiB) | RSS (MiB) |",
        "|---|---:|---:|---:|---:|",
    ]
    names = {"pid1": "PID 1 (the gunicorn arbiter)", "child of pid1": "its child (the gunicorn worker)"}
    for role, r in mem["per_role"].items():
        name = names.get(role, f"`{role}`")
        lines.append(f"| {name} | {r['count']} | {r['uss_mib']:.2f} | {r['pss_mib']:.2f} | {r['rss_mib']:.2f} |")
    where = mem.get("private_mib_by_mapping_of_first_sandbox", {})
    if where:
        parts = [
            f"{names.get(role, role)}: " + ", ".join(f"`{k}` {v:g}" for k, v in maps.items())
            for role, maps in where.items()
        ]
        lines += ["", "Where the USS sits (MiB per mapping, one sandbox): " + "; ".join(parts) + "."]
    return lines


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark, print the section, write the JSON, the plot and the README section."""
    parser = argparse.ArgumentParser(prog="python -m perf.bench_router", description=__doc__)
    parser.add_argument("--calls", type=int, default=500, help="measured exec calls of each kind (default 500)")
    parser.add_argument("--warmup", type=int, default=30, help="warm-up rounds, not measured (default 30)")
    parser.add_argument("--creates", type=int, default=30, help="sequential create/delete pairs (default 30)")
    parser.add_argument("--concurrent", type=int, default=20, help="concurrent creates; their memory (default 20)")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds idle before memory is read (default 5)")
    parser.add_argument("--cold", type=int, default=10, help="sandboxes scaled to zero, then woken (default 10)")
    args = parser.parse_args(argv)
    sigterm_as_exit()
    report: dict[str, Any] = {
        "benchmark": "router: exec vs subprocess.run(['true']), create/delete, idle memory, scale to zero, cold start",
        "date": utc_now(),
        "calls": args.calls,
        "warmup": args.warmup,
        "settle_s": args.settle,
        "machine": machine(),
        "code": code_version(),
    }
    report.update(measure(args))
    rows = targets(report)
    publish(NAME, report, rows, markdown)


if __name__ == "__main__":
    main()
