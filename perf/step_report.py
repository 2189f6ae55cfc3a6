"""The README section of :mod:`perf.bench_step`: issue 38's targets, then the rounds and the CPU by role."""

from __future__ import annotations

from typing import Any

from perf.common import Target, machine_line, target_table

SECTION = "## Burst against its floor: fresh, pooled as a trainer runs it, single exec"
FRESH_RATIO = 2.0
POOLED_RATIO = 1.5
CLAIM_MS = 50.0
EXEC_RATIO = 3.0


def _s(spread: dict[str, float], unit: str = "", digits: int = 2) -> str:
    """``median (min-max)``."""
    return f"{spread['median']:.{digits}f}{unit} ({spread['min']:.{digits}f}-{spread['max']:.{digits}f})"


def targets(report: dict[str, Any]) -> list[Target]:
    """Issue 38's "done when", measured: each a median of the rounds with its spread."""
    s, single = report["summary"], report["single_exec"]
    n = report["n"]
    whole = s["success_rate"] == 1.0  # a burst that lost sandboxes is not a shorter burst: its ratio is not met
    return [
        Target("success, every burst and floor", f"{s['success_rate'] * 100:.1f} %", "100 %", s["success_rate"] == 1.0),
        Target(f"fresh {n:,} burst / floor", f"{_s(s['fresh_over_floor'], 'x')}; {_s(s['fresh_s'], ' s', 1)} "
               f"against {_s(s['floor_s'], ' s', 1)}", f"≤ {FRESH_RATIO:g}x",
               whole and s["fresh_over_floor"]["median"] <= FRESH_RATIO),
        Target(f"pooled {n:,} burst (3rd of 3, {report['gap_s']:g} s gaps) / floor",
               f"{_s(s['pooled_over_floor'], 'x')}; {_s(s['pooled_s'], ' s', 1)}", f"≤ {POOLED_RATIO:g}x",
               whole and s["pooled_over_floor"]["median"] <= POOLED_RATIO),
        Target("claim p50 in the pooled burst", _s(s["claim_p50_ms"], " ms", 1), f"≤ {CLAIM_MS:g} ms",
               s["claim_p50_ms"]["median"] <= CLAIM_MS),
        Target("exec p50 through the router / `subprocess.run(true)`", _s(single["grove_over_subprocess"], "x"),
               f"≤ {EXEC_RATIO:g}x", single["grove_over_subprocess"]["median"] <= EXEC_RATIO),
        Target("exec p50 through the router / SWE-ReX's own server", _s(single["grove_over_swerex"], "x"), "≤ 1x",
               single["grove_over_swerex"]["median"] <= 1.0),
    ]


def _lifetimes(s: dict[str, Any]) -> list[str]:
    lines = ["| burst | lifetime p50 | lifetime p99 |", "|---|---|---|"]
    for kind in ("fresh", "pooled"):
        life = s["lifetime_ms"][kind]
        lines.append(f"| {kind} | {_s(life['p50_ms'], ' ms', 0)} | {_s(life['p99_ms'], ' ms', 0)} |")
    return lines


def _cpu(s: dict[str, Any]) -> list[str]:
    fresh, pooled = s["cpu_ms_per_sandbox"]["fresh"], s["cpu_ms_per_sandbox"]["pooled"]
    lines = ["| role | fresh burst, ms CPU per sandbox | pooled burst (3rd), ms CPU per sandbox |", "|---|---|---|"]
    for role in fresh:
        other = pooled.get(role)
        lines.append(f"| {role} | {_s(fresh[role], '', 1)} | {_s(other, '', 1) if other else '—'} |")
    lines.append(f"| the floor's shell (all of it) | {_s(s['floor_cpu_ms_per_shell'], '', 1)} | |")
    return lines


def _single(single: dict[str, Any]) -> list[str]:
    lines = ["| way | p50 | p99 |", "|---|---|---|"]
    ways = (("grove", "grove: SDK → router → executor (sandbox)"), ("subprocess", "`subprocess.run(['true'])`"),
            ("swerex", "SWE-ReX's server, its own client"))
    for way, label in ways:
        lines.append(f"| {label} | {_s(single['p50_ms'][way], ' ms')} | {_s(single['p99_ms'][way], ' ms')} |")
    return lines


def markdown(report: dict[str, Any], rows: list[Target]) -> str:
    """The section, figures as ``median (lowest-highest)`` over the rounds."""
    s, single = report["summary"], report["single_exec"]
    refills = ", ".join("not within 600 s" if r is None else f"{r:.1f} s" for r in s["refilled_after_last_s"])
    return "\n".join([
        SECTION,
        "",
        f"`make bench-burst` (`python -m perf.bench_step`), {report['date']}. {machine_line(report['machine'])} "
        f"{len(report['rounds'])} interleaved rounds of {report['n']:,}: each a floor, a fresh burst and a pooled "
        f"burst (a pool filled, then 3 bursts through `create_as_ready` with {report['gap_s']:g} s between them, "
        "the 3rd reported: refill and teardown of the first two count). Figures are `median (lowest-highest)` "
        "of the rounds.",
        "",
        *target_table(rows),
        "",
        "Each sandbox's lifetime in the burst (create sent → delete answered):",
        "",
        *_lifetimes(s),
        "",
        f"After the reported burst the pool was full again after {refills}.",
        "",
        "CPU per sandbox by role during the burst (cpuacct; `machine` is everything the host did, `others` what "
        "neither grove nor the client did):",
        "",
        *_cpu(s),
        "",
        f"Single exec of `true`, {single['rounds']} rounds of {single['calls_per_round']} calls each way, "
        "interleaved call by call:",
        "",
        *_single(single),
        "",
    ])
