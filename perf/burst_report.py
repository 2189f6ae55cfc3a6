"""The burst benchmark's README section: the issue's target table beside Orchard's figures, then the details."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from perf import floor_report
from perf.common import machine_line

SECTION = "## Burst: Orchard's 1,000 sandboxes on one machine"
ORCHARD_MACHINE = "8 nodes of 32 vCPU (256 vCPU), images pre-pulled"
EXEC_RATIO = 4.0
CREATE_MS = 50.0
POOLED_CREATE_MS = 10.0
COLD_MS = 100.0
IDLE_USS_MIB = 8.0
ORCHARD_SECONDS = 26.0
ORCHARD_CPS = 154.0


@dataclass(frozen=True)
class Row:
    """One line of the table: a figure, Orchard's value, grove's target, what was measured, and whether it is met."""

    figure: str
    orchard: str
    target: str
    measured: str
    met: bool | None


def _largest(report: dict[str, Any]) -> dict[str, Any]:
    largest: dict[str, Any] = report["bursts"][str(max(int(n) for n in report["bursts"]))]
    return largest


def targets(report: dict[str, Any]) -> list[Row]:
    """The issue's table, measured."""
    big = _largest(report)
    n = big["n"]
    quiet, seq, zero, idle = report["quiet_exec"], report["sequential"], report["scale_to_zero"], report["idle"]
    ratio = quiet["true"]["ratio_p50"]
    sdk, floor = quiet["true"]["sdk"]["p50_ms"], quiet["true"]["floor"]["p50_ms"]
    create = seq["create"]["p50_ms"]
    cold = zero["cold_start"]["p50_ms"]
    uss = idle["memory"]["uss_mib"]
    gone = zero["scaled_to_zero"]
    burst_create = big["create"]
    return [
        Row(f"{n:,}-sandbox burst success", "100 %", "100 %",
            f"{big['success_rate'] * 100:.1f} % ({big['succeeded']}/{n}; {big['errors']} errors)",
            big["success_rate"] == 1.0),
        Row("burst end to end", f"{ORCHARD_SECONDS:g} s", f"≤ {ORCHARD_SECONDS:g} s", f"{big['end_to_end_s']:.1f} s",
            big["end_to_end_s"] <= ORCHARD_SECONDS),
        Row("commands/s during the burst", f"~{ORCHARD_CPS:g}", f"≥ {ORCHARD_CPS:g}",
            f"{big['commands_per_s']:.0f} ({big['commands_ok']} commands)", big["commands_per_s"] >= ORCHARD_CPS),
        Row("create → ready p50", "11.75 s mean (in the burst)", f"≤ {CREATE_MS:g} ms",
            f"{create:.1f} ms one at a time; in the {n:,} burst p50 {burst_create['p50_ms'] / 1000:.2f} s, "
            f"mean {burst_create['mean_ms'] / 1000:.2f} s", create <= CREATE_MS),
        Row("exec p50 via the router", "280 ms mean", f"≤ {EXEC_RATIO:g}x the `subprocess.run` floor",
            f"`true` via the SDK {sdk:.2f} ms = {ratio:.2f}x floor ({floor:.2f} ms); in the {n:,} burst p50 "
            f"{big['exec']['p50_ms']:.0f} ms, mean {big['exec']['mean_ms']:.0f} ms", ratio <= EXEC_RATIO),
        Row("cold start from zero", "—", f"≤ {COLD_MS:g} ms p50", f"{cold:.1f} ms p50 ({zero['n']} sandboxes)",
            cold <= COLD_MS),
        Row("idle sandbox memory", "—", f"≤ {IDLE_USS_MIB:g} MiB USS",
            f"{uss:.2f} MiB USS (PSS {idle['memory']['pss_mib']:.2f}, {idle['memory']['sandboxes']} sandboxes)",
            uss <= IDLE_USS_MIB),
        Row("scaled-to-zero sandbox", "—", "0 processes, 0 memory",
            f"{gone['processes_total']} processes, {gone['uss_mib_total']:g} MiB over {zero['n']}; "
            f"{gone['disk_kib_mean']:.0f} KiB disk each", gone["processes_total"] == 0 and gone["uss_mib_total"] == 0),
        Row(f"leaks after the {n:,} burst", "—", "none",
            ", ".join(big["leak_check"]["leaked"]) or "none", not big["leak_check"]["leaked"]),
        *_pooled_rows(report),
    ]


def _pooled_rows(report: dict[str, Any]) -> list[Row]:
    """Create p50 of the bursts on a warm pool filled to their size: a request per claim, and one batch."""
    rows = []
    for key, how in (("pooled", "a request per create"), ("pooled_batch", "one batch create")):
        if run := report.get(key):
            create = run["create"]
            rows.append(Row(f"create p50, warm pool pre-filled to {run['n']:,}, {how}", "—",
                            f"≤ {POOLED_CREATE_MS:g} ms",
                            f"{create['p50_ms']:.1f} ms (p99 {create['p99_ms']:.1f}); {run['success_rate'] * 100:.1f} "
                            f"% ok, {run['end_to_end_s']:.1f} s end to end",
                            create["p50_ms"] <= POOLED_CREATE_MS))
    return rows


def _met(value: bool | None) -> str:
    return "—" if value is None else ("**yes**" if value else "**no**")


def _pct(s: dict[str, Any]) -> str:
    if not s.get("n"):
        return "—"
    return f"{s['p50_ms']:.0f} / {s['p90_ms']:.0f} / {s['p99_ms']:.0f}"


def markdown(report: dict[str, Any], rows: list[Row]) -> str:
    """The README section."""
    code = report["code"]
    dirty = f", plus uncommitted changes to {len(code['uncommitted'])} source files" if code["uncommitted"] else ""
    m = report["machine"]
    lines = [
        SECTION,
        "",
        f"`python -m perf.bench_burst --sizes {report['sizes']}` — {report['date']}, commit `{code['commit']}`"
        f"{dirty}. {machine_line(m)} Orchard: {ORCHARD_MACHINE}.",
        "",
        "Each sandbox, as in Orchard's benchmark: create and wait for ready, `python3 -c \"print('ok')\"`, `ls /`, "
        "`cat /etc/os-release | head -1`, `bash -lc 'cat /etc/os-release | head -1'`, delete — every sandbox "
        "launched at once through the SDK (`AsyncGrove`, one client process on the same machine), against one "
        "router (`grove up`, local backend, default resources). Every output is checked; every error is counted "
        "by kind. Raw figures: `perf/results/burst.json`.",
        "",
        f"| figure | Orchard (256 vCPU) | grove target ({m['nproc']} CPUs) | measured | met? |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(f"| {row.figure} | {row.orchard} | {row.target} | {row.measured} | {_met(row.met)} |")
    lines += [
        "",
        "### Every burst",
        "",
        "| sandboxes | client concurrency | success | end to end (s) | commands/s | create p50/p90/p99 (ms) "
        "| exec p50/p90/p99 (ms) | delete p50/p90/p99 (ms) | peak alive | errors |",
        "|---:|---:|---:|---:|---:|---|---|---|---:|---|",
    ]
    for key in sorted(report["bursts"], key=int):
        b = report["bursts"][key]
        errors = ", ".join(f"{k}: {v}" for k, v in b["errors_by_kind"].items()) or "0"
        lines.append(
            f"| {b['n']} | {b['client_concurrency']} | {b['success_rate'] * 100:.1f} % | {b['end_to_end_s']:.1f} | "
            f"{b['commands_per_s']:.0f} | {_pct(b['create'])} | {_pct(b['exec'])} | {_pct(b['delete'])} | "
            f"{b['peak_alive']} | {errors} |"
        )
    lines += ["", "![sandboxes alive over time](results/burst_timeline.png)", "",
              "![latency CDFs of the largest burst](results/burst_cdf.png)", ""]
    lines += _cpu_lines(report)
    lines += floor_report.lines(report)
    lines += _quiet_lines(report)
    lines += _leak_lines(report)
    return "\n".join(lines) + "\n"


def _cpu_lines(report: dict[str, Any]) -> list[str]:
    big = _largest(report)
    cpu = big["cpu"]
    if not cpu.get("accounted"):
        return ["CPU by role was not measured (no cgroup v1 `cpuacct` hierarchy on this machine).", ""]
    per, share = cpu["cpu_ms_per_sandbox"], cpu["share_of_capacity"]
    roles = [
        ("grove_router", "router (one process: API, proxy, records, journals, S3 client)"),
        ("grove_sandboxes", "sandboxes: zygote, executors and the commands they ran"),
        ("grove_s3", "embedded S3 server (trajectories)"),
        ("client", "the benchmark's SDK client"),
        ("others", "everything else: kernel threads (namespace teardown, ...) and other tenants"),
    ]
    lines = [
        f"### Where the CPU of the {big['n']:,} burst went",
        "",
        "From the cgroup v1 `cpuacct` hierarchy (grove does not use it, so every process the router starts — "
        "zygote, sandboxes, commands, S3 server — stays in the benchmark's group), the client's own CPU time, and "
        f"`/proc/stat` for the machine. The burst had {cpu['wall_s']:.1f} s of {report['machine']['nproc']} CPUs.",
        "",
        "| who | CPU per sandbox (ms) | share of the machine |",
        "|---|---:|---:|",
    ]
    for key, label in roles:
        if key in per:
            lines.append(f"| {label} | {per[key]:.1f} | {share[key] * 100:.0f} % |")
    lines.append(f"| the whole machine | {per['machine']:.1f} | {share['machine'] * 100:.0f} % |")
    lines += ["", *limits(report), ""]
    return lines


def limits(report: dict[str, Any]) -> list[str]:
    """What bounds the burst, as arithmetic on the measured parts."""
    big = _largest(report)
    per, nproc, n = big["cpu"]["cpu_ms_per_sandbox"], report["machine"]["nproc"], big["n"]
    commands = sum(c.get("floor_cpu_ms", 0.0) for c in report["quiet_exec"]["commands"].values())
    ours = per["grove_total"] + per["client"]
    budget = ORCHARD_SECONDS * nproc * 1000 / n
    return [
        f"**What limits it: CPU.** The machine was {big['cpu']['share_of_capacity']['machine'] * 100:.0f} % busy "
        f"for the whole burst. grove and its client spent {ours:.0f} ms of CPU per sandbox; of that, the four "
        f"commands themselves need {commands:.0f} ms (their CPU when run here by `/bin/sh -c`, measured quietly: "
        f"`python3`'s start-up is most of it), the executors (start, exec handling, exit; the zygote's forks) "
        f"{per['grove_sandboxes'] - commands:.0f} ms, the router {per['grove_router']:.0f} ms, the S3 server "
        f"{per['grove_s3']:.0f} ms and the SDK client {per['client']:.0f} ms. {n:,} sandboxes at {ours:.0f} ms are "
        f"{ours * n / 1000:.0f} CPU-seconds: {ours * n / 1000 / nproc:.0f} s on {nproc} CPUs with nothing else "
        f"running (other work on this shared machine took {per['others']:.0f} ms per sandbox of this run). "
        f"{ORCHARD_SECONDS:g} s on {nproc} CPUs allows {budget:.0f} ms per sandbox in all; the commands leave "
        f"{budget - commands:.0f} ms of it for creating a sandbox, four HTTP round trips through the router and "
        "executor, deleting it, storing its trajectory and the client.",
    ]


def _quiet_lines(report: dict[str, Any]) -> list[str]:
    quiet, seq, zero, idle = report["quiet_exec"], report["sequential"], report["scale_to_zero"], report["idle"]
    t = quiet["true"]
    lines = [
        "### Quiet figures (nothing else of grove running)",
        "",
        "| call | p50 (ms) | p90 (ms) | p99 (ms) | p50 vs floor |",
        "|---|---:|---:|---:|---:|",
        f"| `subprocess.run([\"true\"])` (floor) | {t['floor']['p50_ms']:.2f} | {t['floor']['p90_ms']:.2f} | "
        f"{t['floor']['p99_ms']:.2f} | 1.00x |",
        f"| SDK `exec([\"true\"])` | {t['sdk']['p50_ms']:.2f} | {t['sdk']['p90_ms']:.2f} | {t['sdk']['p99_ms']:.2f} | "
        f"{t['ratio_p50']:.2f}x |",
    ]
    for name, c in quiet["commands"].items():
        lines.append(
            f"| `{name}`: floor (`/bin/sh -c` here) | {c['floor']['p50_ms']:.2f} | {c['floor']['p90_ms']:.2f} | "
            f"{c['floor']['p99_ms']:.2f} | 1.00x |"
        )
        lines.append(
            f"| `{name}`: SDK exec in a sandbox | {c['sdk']['p50_ms']:.2f} | {c['sdk']['p90_ms']:.2f} | "
            f"{c['sdk']['p99_ms']:.2f} | {c['ratio_p50']:.2f}x |"
        )
    cpu = idle.get("cpu") or {}
    lines += [
        "",
        f"Create → ready one at a time ({seq['create']['n']}, raw API): p50 {seq['create']['p50_ms']:.1f} ms, p99 "
        f"{seq['create']['p99_ms']:.1f} ms; delete p50 {seq['delete']['p50_ms']:.1f} ms. Cold start (first exec to a "
        f"sandbox scaled to zero, {zero['n']}): p50 {zero['cold_start']['p50_ms']:.1f} ms, p90 "
        f"{zero['cold_start']['p90_ms']:.1f} ms. Scaled to zero: "
        f"{zero['scaled_to_zero']['processes_total']} processes, {zero['scaled_to_zero']['uss_mib_total']:g} MiB. "
        f"Idle ({idle['memory']['sandboxes']} sandboxes): USS "
        f"{idle['memory']['uss_mib']:.2f} MiB, PSS {idle['memory']['pss_mib']:.2f} MiB, RSS "
        f"{idle['memory']['rss_mib']:.2f} MiB per sandbox"
        + (f"; CPU {cpu['ms_per_sandbox_per_s']:.3f} ms per second each." if cpu else "."),
        "",
    ]
    return lines


def _leak_lines(report: dict[str, Any]) -> list[str]:
    big = _largest(report)
    rows = big["leak_check"]["figures"]
    names = {
        "router_fds": "router open file descriptors",
        "router_threads": "router threads",
        "router_rss_mib": "router RSS (MiB)",
        "helper_processes": "router's helper processes (zygote, S3 server)",
        "helper_fds": "their open file descriptors",
        "host_mounts": "lines of the host's `/proc/mounts`",
        "sandbox_cgroups": "the router's sandbox cgroups (all controllers)",
        "kernel_memory_cgroups": "kernel memory cgroups (`/proc/cgroups`, dying ones included, machine-wide)",
        "sandbox_dirs": "sandbox directories in the state dir",
        "records": "sandbox records",
        "journals": "trajectory journals not yet stored",
    }
    lines = [
        f"### Leak check around the {big['n']:,} burst",
        "",
        "| figure | before | after | change |",
        "|---|---:|---:|---:|",
    ]
    for key, row in rows.items():
        lines.append(f"| {names.get(key, key)} | {row['before']} | {row['after']} | {row['delta']:+g} |")
    cleanup = report["cleanup"]
    lines += [
        "",
        "Router RSS is the allocator's high-water mark plus the tombstones of deleted sandboxes (~1.2 KB each; up "
        "to 10,000 are kept so their ids answer 409): on one router, three 1,000-bursts in a row grew it by 19.3, "
        "1.7 and 3.7 MiB (2026-11-29). The kernel's memory-cgroup count includes cgroups that are removed but "
        "still pinned by page cache they were charged for; it is machine-wide and other tenants change it too.",
        "",
        f"Left behind when the router stopped: {len(cleanup.get('deleted_via_api', []))} sandboxes, "
        f"{len(cleanup.get('removed_by_force', []))} cgroups. A run interrupted by SIGINT or SIGTERM deletes its "
        "sandboxes and removes everything it made; if the benchmark is killed outright, its router gets SIGTERM "
        "and the next run removes what was left (`perf.common.sweep_stale`).",
        "",
        *HISTORY,
    ]
    return lines


HISTORY = [
    "### What this benchmark changed (2026-11-29, 1,000 burst on this machine)",
    "",
    "| change | effect measured |",
    "|---|---|",
    "| seccomp: load libc once in the zygote instead of `find_library` (it runs `ldconfig`/`gcc`) at every "
    "sandbox start | 31 ms less CPU and two processes fewer per start; sequential create+delete 96 → 63 ms of CPU |",
    "| local backend: at most 2 sandbox starts in flight per CPU, the rest queue (first come, first served) | "
    "1,000 at once: 96.7 % → 100 % success (starts had timed out), peak sandboxes alive 593 → ~14, exec p50 in "
    "the burst 6.6 s → ~65 ms |",
    "| executor: no idle wake-ups (gthread's 1 s tick → 15 s; the orphan reaper sleeps until a spawn) | idle "
    "sandbox 0.62 → ~0.08 ms CPU per second once settled |",
    "| zygote: werkzeug URL builders compiled on first use; gunicorn's config built once and re-targeted per "
    "sandbox | executor start 30 → 18 ms of CPU; idle USS 9.8 → 8.8 MiB |",
    "| router: records serialized field by field in one write; request type hints resolved once per model | "
    "a fraction of a millisecond of router CPU per state change |",
    "| all of it | 1,000 burst 136 s (96.7 %) → ~50 s (100 %); grove's CPU per sandbox 198 → ~90 ms |",
    "",
]
