"""The burst report's "Against the floor" part: the largest burst, with and without a warm pool (its claims a
request each, or all in one batch create), as a multiple of the same work in bare isolated shells
(:mod:`perf.floor`), and the CPU per sandbox by role."""

from __future__ import annotations

from typing import Any

_ROLES = ("grove_router", "grove_sandboxes", "grove_s3", "client", "others", "machine")


def lines(report: dict[str, Any]) -> list[str]:
    """Markdown lines; nothing when the run had no floor."""
    bare = report.get("floor")
    if not bare:
        return []
    big = report["bursts"].get(str(bare["n"]))
    pooled = report.get("pooled")
    runs = (("grove burst", big), ("grove burst, warm pool (a request per create)", pooled),
            ("grove burst, warm pool (one batch create)", report.get("pooled_batch")))
    out = [
        f"### Against the floor ({bare['n']:,} sandboxes)",
        "",
        f"The floor: {bare['n']:,} bare shells, each in fresh mount, PID, net, IPC and UTS namespaces "
        f"(`unshare --mount --pid --net --ipc --uts --fork`, `env -i` with a plain PATH), each running the four "
        f"commands, {bare['concurrency']} at once; in the same run, the router idle meanwhile (`perf/floor.py`).",
        "",
        "| run | success | wall (s) | x floor | create p50 (ms) | CPU per sandbox (ms) |",
        "|---|---:|---:|---:|---:|---:|",
        f"| floor (no grove) | {bare['success_rate'] * 100:.1f} % | {bare['wall_s']:.1f} | 1.00 | - | "
        f"{bare['cpu_ms_per_shell']:.1f} |",
    ]
    for name, run in runs:
        if run:
            cpu = run["cpu"]["cpu_ms_per_sandbox"].get("machine", float("nan"))
            out.append(f"| {name} | {run['success_rate'] * 100:.1f} % | {run['end_to_end_s']:.1f} | "
                       f"{run['end_to_end_s'] / bare['wall_s']:.2f} | {run['create']['p50_ms']:.1f} | {cpu:.1f} |")
    out += ["", "CPU per sandbox by role (ms; `machine` is everything the machine did, divided by the sandboxes):", "",
            "| run | " + " | ".join(r.removeprefix("grove_") for r in _ROLES) + " |",
            "|---|" + "---:|" * len(_ROLES)]
    for name, run in runs:
        if run:
            per = run["cpu"]["cpu_ms_per_sandbox"]
            out.append(f"| {name} | " + " | ".join(f"{per[r]:.1f}" if r in per else "-" for r in _ROLES) + " |")
    if pooled:
        memory = pooled["idle_memory_per_pooled_sandbox"]
        out += ["", f"The warm pool filled in {pooled['fill_s']:.1f} s ({pooled['claims']} claims, "
                    f"{pooled['misses']} misses in the burst); idle memory per pooled sandbox: "
                    f"{_memory(memory)}. The pool's fill is not in the burst's wall time or CPU: it is made "
                    "ahead, during a training step."]
    return [*out, ""]


def _memory(memory: dict[str, Any]) -> str:
    if not memory.get("sandboxes"):
        return "not measured"
    charged = memory.get("cgroup_charged_mib")
    return (f"USS {memory['uss_mib']:.1f} MiB, PSS {memory['pss_mib']:.1f} MiB, RSS {memory['rss_mib']:.1f} MiB"
            + (f", {charged:.1f} MiB charged to its memory cgroup" if charged is not None else ""))
