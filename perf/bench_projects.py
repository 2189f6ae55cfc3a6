"""Two projects bursting at once: each one's create p50 against bursting alone, in one run.

``python -m perf.bench_projects [--sandboxes 60 --rounds 3]`` starts one router with two projects' member keys.
Each round: project A bursts ``--sandboxes`` creates (all sent at once, each a ``POST /v1/sandboxes`` that
answers when its sandbox is ready) alone; then B alone; then both at the same moment. Reported per project:
the p50 and p90 of its creates' latency together and alone, and their ratio (medians over the rounds).

What fair sharing looks like: the host starts a few sandboxes at once (the backend's ``start_slots``), so two
bursts together take about twice as long as one; a fair router slows *both* by about 2x, and neither by much
more than the other (first come, first served would leave one burst at ~1x and put the other behind it, at
~3x). The report gives both ratios and their quotient. Writes ``perf/results/projects.json`` and the "Projects"
section of ``perf/README.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from typing import Any

from grove.client import AsyncGrove
from perf.common import (
    Router,
    Target,
    code_version,
    machine,
    machine_line,
    percentile,
    publish,
    running_router,
    target_table,
    utc_now,
)

NAME = "projects"
SECTION = "## Projects: two bursting at once"
BODY = {"cpu": 0.25, "memory_mb": 128, "disk_mb": 256}


def _member_key(router: Router, project: str) -> str:
    done = subprocess.run([sys.executable, "-m", "grove", "--state-dir", str(router.state_dir), "key", "add",
                           f"bench-{project}", "--project", project], capture_output=True, check=True, text=True)
    return done.stdout.strip()


async def _burst(url: str, key: str, count: int) -> list[float]:
    """``count`` creates sent at once; each one's latency (s). The sandboxes are deleted afterwards."""
    async with AsyncGrove(url, key) as grove:
        async def one() -> tuple[float, str]:
            began = time.monotonic()
            body = await grove.request("POST", "/v1/sandboxes", json_body=BODY, retry=True)
            return time.monotonic() - began, str(body["id"])

        done = await asyncio.gather(*(one() for _ in range(count)))
        await asyncio.gather(*(grove.request("DELETE", f"/v1/sandboxes/{sid}") for _, sid in done))
        return [latency for latency, _ in done]


async def _together(url: str, keys: dict[str, str], count: int) -> dict[str, list[float]]:
    results = await asyncio.gather(*(_burst(url, key, count) for key in keys.values()))
    return dict(zip(keys, results, strict=True))


def _stats(samples: list[float]) -> dict[str, float]:
    return {"p50_s": round(percentile(samples, 50), 3), "p90_s": round(percentile(samples, 90), 3)}


def measure(count: int, rounds: int) -> dict[str, Any]:
    """Alone and together, ``rounds`` times; per project the medians and their ratios."""
    with running_router() as router:
        keys = {"a": _member_key(router, "bench-a"), "b": _member_key(router, "bench-b")}
        time.sleep(1.5)  # the router takes new keys within a second
        asyncio.run(_burst(router.url, keys["a"], count))  # warm-up: the first burst of a router pays for caches
        runs: list[dict[str, Any]] = []
        for i in range(rounds):
            order = list(keys) if i % 2 == 0 else list(reversed(keys))
            alone = {name: asyncio.run(_burst(router.url, keys[name], count)) for name in order}
            together = asyncio.run(_together(router.url, keys, count))
            runs.append({name: {"alone": _stats(alone[name]), "together": _stats(together[name])} for name in keys})
    result: dict[str, Any] = {"runs": runs, "projects": {}}
    for name in ("a", "b"):
        alone = statistics.median(r[name]["alone"]["p50_s"] for r in runs)
        together = statistics.median(r[name]["together"]["p50_s"] for r in runs)
        result["projects"][name] = {"alone_p50_s": alone, "together_p50_s": together,
                                    "together_over_alone": round(together / alone, 2)}
    ratios = [p["together_over_alone"] for p in result["projects"].values()]
    result["unfairness"] = round(max(ratios) / min(ratios), 2)
    return result


def _section(report: dict[str, Any], rows: list[Target]) -> str:
    lines = [SECTION, "", machine_line(report["machine"]), "",
             f"Each project's burst: {report['sandboxes']} creates sent at once (cpu 0.25, 128 MiB), each answered "
             f"when its sandbox is ready; {report['rounds']} rounds of alone (A, then B) and together; medians of "
             "the rounds' p50. Raw figures: `perf/results/projects.json`.", "",
             "| project | p50 alone (s) | p50 together (s) | together / alone |", "|---|---|---|---|"]
    for name, p in report["projects"].items():
        lines.append(f"| {name.upper()} | {p['alone_p50_s']:.2f} | {p['together_p50_s']:.2f} | "
                     f"{p['together_over_alone']:.2f} |")
    lines += ["", "Two bursts on a host that starts a few sandboxes at once take about twice as long as one: sharing "
              "fairly, both slow by about 2x and neither much more than the other (the quotient of the two ratios "
              f"is {report['unfairness']:.2f}). First come, first served would leave one near 1x and the other "
              "near 3x.", "", *target_table(rows)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    """Command line."""
    parser = argparse.ArgumentParser(prog="python -m perf.bench_projects", description=__doc__)
    parser.add_argument("--sandboxes", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    report = {"name": NAME, "when": utc_now(), "code": code_version(), "machine": machine(),
              "sandboxes": args.sandboxes, "rounds": args.rounds, **measure(args.sandboxes, args.rounds)}
    worst = max(p["together_over_alone"] for p in report["projects"].values())
    rows = [Target("the two projects' slow-downs, larger over smaller", f"{report['unfairness']:.2f}", "<= 1.5",
                   report["unfairness"] <= 1.5),
            Target("either project's create p50, together over alone", f"{worst:.2f}x", "<= 2.5x", worst <= 2.5)]
    publish(NAME, report, rows, _section)


if __name__ == "__main__":
    main()
