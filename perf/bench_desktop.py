"""Desktops for GUI agents: screenshot latency against the bare tool, action round trips, memory, first screenshots.

``python -m perf.bench_desktop [--shots 40 --desktops 6 --rounds 3]`` starts one router and measures, in one run:

- **Screenshot p50** at 1280x800 through the router (``sandbox.computer.screenshot()``: HTTP, the executor's
  framebuffer read and PNG, the step recorded, the image stored in the background, base64 in JSON) against
  ``scrot`` — the screenshot tool of Anthropic's reference computer-use container — run on the same display
  inside the sandbox, timed there (no HTTP at all). On a still page (grove re-uses the last PNG of an unchanged
  screen) and on a page that changes every 10 ms (every shot a new image).
- **Action round trip**: a click that recolours the page, answered with the screen after it; with the default
  settling (the screen unchanged for 250 ms) and with settling off (``quiet_ms`` 0: the action and the shot).
- **Idle memory per desktop** (Xvfb, the window manager, Chromium with one tab; the sandbox's whole cgroup,
  PSS and what the cgroup is charged), with ``--desktops`` of them up at once, each answering a screenshot;
  and how many would fit in this host's available memory at that size.
- **Time to the first screenshot**: a fresh sandbox whose screen starts at its first call, a fresh sandbox
  made with ``desktop.start`` (screen and browser up before it is ready), and a claim from a warm pool of
  desktops.

Writes ``perf/results/desktop.json`` and the "Desktops" section of ``perf/README.md``. Needs ``scrot`` on the
host (``apt-get install scrot``; the Makefile installs it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import urllib.parse
from pathlib import Path
from typing import Any

from grove.client import Grove, Sandbox
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
from perf.memory import group_memory
from router.lifecycle.admission import read_host

NAME = "desktop"
SECTION = "## Desktops: screenshots, actions, memory"
WIDTH, HEIGHT = 1280, 800
TEXT = " ".join(f"grove row {i}: the quick brown fox jumps over the lazy dog." for i in range(60))
STILL = f"<body style='font:15px sans-serif;margin:20px'><h1>A still page</h1><p>{TEXT}</p></body>"
TICKING = (f"<body style='font:15px sans-serif;margin:20px'><h1 id=n>0</h1><p>{TEXT}</p><script>let i=0;"
           "setInterval(()=>{document.getElementById('n').textContent=++i},10)</script></body>")
BUTTON = ("<body style='margin:0'><button id=b style='position:absolute;left:100px;top:60px;width:300px;"
          "height:120px' onclick=\"document.body.style.background="
          "document.body.style.background?'':'rgb(0,160,0)'\">go</button></body>")
DESKTOP = {"width": WIDTH, "height": HEIGHT}
MEMORY_MB = 2048


def page(html: str) -> str:
    """A data: URL of a page."""
    return "data:text/html," + urllib.parse.quote(html)


def _ms(samples: list[float]) -> dict[str, float]:
    return {"p50_ms": round(percentile(samples, 50) * 1000, 1), "p90_ms": round(percentile(samples, 90) * 1000, 1),
            "n": len(samples)}


def _timed(call: Any, count: int) -> list[float]:
    samples = []
    for _ in range(count):
        began = time.perf_counter()
        call()
        samples.append(time.perf_counter() - began)
    return samples


def _scrot(sandbox: Sandbox, count: int) -> list[float]:
    """``scrot`` on the sandbox's display, timed inside the sandbox."""
    script = (f"import json, subprocess, time\nts = []\nfor _ in range({count}):\n    t = time.perf_counter()\n"
              "    subprocess.run(['scrot', '-o', '/tmp/bench-scrot.png'], check=True)\n"
              "    ts.append(time.perf_counter() - t)\nprint(json.dumps(ts))\n")
    sandbox.write_file("/tmp/bench_scrot.py", script)
    done = sandbox.exec("python3 /tmp/bench_scrot.py", timeout_s=600)
    assert done.exit_code == 0, done.stderr[-500:]
    return [float(t) for t in json.loads(done.stdout)]


def screenshots(grove: Grove, shots: int) -> dict[str, Any]:
    """Router against scrot, on a still page and a ticking one."""
    sandbox = grove.create(memory_mb=MEMORY_MB, desktop=DESKTOP, heartbeat=False)
    try:
        result: dict[str, Any] = {}
        for name, html in (("still", STILL), ("changing", TICKING)):
            sandbox.computer.start(browser=page(html))
            _timed(sandbox.computer.screenshot, 5)  # warm-up
            via_router = _timed(sandbox.computer.screenshot, shots)
            bare = _scrot(sandbox, shots)
            size = len(sandbox.computer.screenshot().png)
            result[name] = {"router": _ms(via_router), "scrot": _ms(bare), "png_bytes": size,
                            "ratio": round(percentile(via_router, 50) / percentile(bare, 50), 2)}
        return result
    finally:
        sandbox.close()


def round_trips(grove: Grove, count: int) -> dict[str, Any]:
    """A click that recolours the page, with default settling and with settling off."""
    sandbox = grove.create(memory_mb=MEMORY_MB, desktop=DESKTOP, heartbeat=False)
    try:
        sandbox.computer.start(browser=page(BUTTON))
        click = {"action": "left_click", "coordinate": [250, 200]}  # the button, below Chromium's toolbar
        settled = _timed(lambda: sandbox.computer.act(click), count)
        waited = [sandbox.computer.act(click).settle["waited_ms"] for _ in range(5)]
        raw = _timed(lambda: sandbox.computer.act({**click, "settle": {"quiet_ms": 0, "cap_ms": 0}}), count)
        return {"default_settle": _ms(settled), "settle_off": _ms(raw),
                "settle_waited_ms_p50": statistics.median(waited)}
    finally:
        sandbox.close()


def memory(router: Router, grove: Grove, desktops: int) -> dict[str, Any]:
    """``desktops`` desktops up at once with one tab each; their idle memory."""
    made = [grove.create(memory_mb=MEMORY_MB, desktop={**DESKTOP, "start": True, "browser": page(STILL)},
                         heartbeat=False) for _ in range(desktops)]
    try:
        for sandbox in made:
            assert sandbox.computer.screenshot().width == WIDTH
        time.sleep(5)  # idle: the pages painted, nothing moving
        groups = [group_memory(router.cgroup(s.id)) for s in made]
        pss = [g.pss / 2**20 for g in groups]
        charged = [g.charged / 2**20 for g in groups if g.charged is not None]
        per_desktop = statistics.mean(charged) if charged else statistics.mean(pss)
        available = read_host(Path("/")).memory_available_mb
        return {"desktops": desktops, "pss_mb_mean": round(statistics.mean(pss), 1),
                "charged_mb_mean": round(statistics.mean(charged), 1) if charged else None,
                "host_available_mb_with_them": round(available), "more_would_fit": int(available // per_desktop)}
    finally:
        for sandbox in made:
            sandbox.close()


def first_screenshots(grove: Grove, rounds: int) -> dict[str, Any]:
    """Create (or claim) to first screenshot, three ways."""
    url = page(STILL)

    def lazy() -> None:
        with grove.create(memory_mb=MEMORY_MB, heartbeat=False) as sandbox:
            sandbox.computer.start(browser=url)
            sandbox.computer.screenshot()

    def started() -> None:
        with grove.create(memory_mb=MEMORY_MB, desktop={**DESKTOP, "start": True, "browser": url},
                          heartbeat=False) as sandbox:
            sandbox.computer.screenshot()

    result: dict[str, Any] = {"lazy": _ms(_timed(lazy, rounds)), "desktop_start": _ms(_timed(started, rounds))}
    grove.create_pool("bench-desktops", size=1, resources={"memory_mb": MEMORY_MB},
                      desktop={**DESKTOP, "start": True, "browser": url})
    try:
        claims = []
        for _ in range(rounds):
            _wait_ready(grove)
            began = time.perf_counter()
            with grove.create(pool="bench-desktops", heartbeat=False) as sandbox:
                sandbox.computer.screenshot()
                claims.append(time.perf_counter() - began)
        result["pool_claim"] = _ms(claims)
    finally:
        grove.delete_pool("bench-desktops")
    return result


def _wait_ready(grove: Grove, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while grove.pool("bench-desktops")["ready"] < 1:
        if time.monotonic() > deadline:
            raise TimeoutError("the pool of desktops did not fill")
        time.sleep(0.5)


def measure(shots: int, desktops: int, rounds: int) -> dict[str, Any]:
    """Everything, on one router."""
    with running_router() as router, Grove(router.url, router.key) as grove:
        return {"screenshots": screenshots(grove, shots), "round_trip": round_trips(grove, shots // 2),
                "memory": memory(router, grove, desktops), "first_screenshot": first_screenshots(grove, rounds)}


def _section(report: dict[str, Any], rows: list[Target]) -> str:
    shots, trip, mem, first = (report[k] for k in ("screenshots", "round_trip", "memory", "first_screenshot"))
    lines = [SECTION, "", machine_line(report["machine"]), "",
             f"One router, one run; {report['shots']} screenshots per figure at {WIDTH}x{HEIGHT}. Raw figures: "
             "`perf/results/desktop.json`.", "",
             "| screenshot | through the router p50 (ms) | scrot in the sandbox p50 (ms) | router / scrot | "
             "PNG bytes |",
             "|---|---|---|---|---|"]
    for name, s in shots.items():
        lines.append(f"| {name} page | {s['router']['p50_ms']} | {s['scrot']['p50_ms']} | {s['ratio']}x | "
                     f"{s['png_bytes']:,} |")
    lines += ["", f"A click answered with the screen after it: p50 {trip['default_settle']['p50_ms']} ms with the "
              f"default settling (the screen unchanged for 250 ms; it waited {trip['settle_waited_ms_p50']} ms of "
              f"that), {trip['settle_off']['p50_ms']} ms with settling off.", "",
              f"Idle memory per desktop (Xvfb, matchbox, Chromium with one tab), {mem['desktops']} up at once: "
              f"PSS {mem['pss_mb_mean']} MiB, cgroup charge {mem['charged_mb_mean']} MiB; with them up the host had "
              f"{mem['host_available_mb_with_them']:,} MiB available, room for about {mem['more_would_fit']} more.",
              "", "| first screenshot | p50 (s) |", "|---|---|"]
    for name, label in (("lazy", "fresh sandbox, screen started by its first calls"),
                        ("desktop_start", "fresh sandbox made with `desktop.start`"),
                        ("pool_claim", "claimed from a warm pool of desktops")):
        lines.append(f"| {label} | {first[name]['p50_ms'] / 1000:.2f} |")
    lines += ["", *target_table(rows)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    """Command line."""
    parser = argparse.ArgumentParser(prog="python -m perf.bench_desktop", description=__doc__)
    parser.add_argument("--shots", type=int, default=40)
    parser.add_argument("--desktops", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    report = {"name": NAME, "when": utc_now(), "code": code_version(), "machine": machine(), "shots": args.shots,
              **measure(args.shots, args.desktops, args.rounds)}
    changing = report["screenshots"]["changing"]
    rows = [Target("screenshot p50 through the router over scrot's, changing page", f"{changing['ratio']}x",
                   "<= 2x", changing["ratio"] <= 2),
            Target("screenshot p50 through the router, changing page", f"{changing['router']['p50_ms']} ms",
                   "<= 50 ms", changing["router"]["p50_ms"] <= 50)]
    publish(NAME, report, rows, _section)


if __name__ == "__main__":
    main()
