"""The compatibility APIs' cost over grove's own calls, ratios from one run.

``python -m perf.bench_compat [--execs 200 --runs 64 --concurrency 8]`` starts one router and measures:

- E2B: ``commands.run("true")`` through the real ``e2b`` SDK (a Connect stream through ``/e2b/sandbox``, the
  process started on the sandbox's one process table) against grove's own SDK ``exec("true")``, on one sandbox
  each, alternating, ``--execs`` calls each; p50 and p99 and their ratio.
- SandboxFusion: ``--runs`` ``run_code`` requests of ``print(1)`` (verl's request shape), ``--concurrency`` at a
  time, on a warm pool of that many sandboxes: throughput and p50 latency, against a bare
  ``subprocess.run(["/usr/bin/python3", "-c", "print(1)"])`` of the same code, as many, as many at a time.
- E2B's code interpreter: the image that carries grove's server of its protocol is built first (``grove image
  build-debian code-interpreter-v1 --preset code-interpreter``, timed), then the real ``e2b-code-interpreter``
  SDK's ``Sandbox.create()`` (its default template: the server started on create) and ``run_code("1+1")``
  (the port proxy to the server, an ``ipykernel`` behind it), ``--execs`` calls, alternating with grove's own
  ``exec("true")`` on the same sandbox; p50s and their ratio.

Writes ``perf/results/compat.json`` and the "Compatibility APIs" section of ``perf/README.md``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import requests

from grove import Grove
from perf.common import (
    Target,
    code_version,
    machine,
    machine_line,
    publish,
    running_router,
    summarize,
    target_table,
    utc_now,
)
from tests.support.router_fixtures import GROVE_BIN

NAME = "compat"
SECTION = "## Compatibility APIs: E2B and SandboxFusion against grove's own calls"
POOL = "sandbox-fusion"
BARE_PYTHON = "/usr/bin/python3"
"""The interpreter the sandbox runs (the default image binds the host's /usr), not a PATH shim's."""


def _e2b_vs_exec(url: str, key: str, count: int) -> dict[str, Any]:
    from e2b import Sandbox as E2bSandbox

    os.environ.update({"E2B_API_URL": f"{url}/e2b", "E2B_SANDBOX_URL": f"{url}/e2b/sandbox", "E2B_API_KEY": key,
                       "E2B_HTTP_VERSION": "1.1"})
    e2b_box = E2bSandbox.create("base", timeout=600)
    times: dict[str, list[float]] = {"e2b": [], "grove": []}
    with Grove(url, key) as grove:
        own = grove.create(heartbeat=False)
        try:
            for _ in range(5):  # warm both paths' connections
                e2b_box.commands.run("true")
                own.exec("true")
            for _ in range(count):
                started = time.perf_counter()
                e2b_box.commands.run("true")
                times["e2b"].append(time.perf_counter() - started)
                started = time.perf_counter()
                own.exec("true")
                times["grove"].append(time.perf_counter() - started)
        finally:
            own.close()
            e2b_box.kill()
    e2b, mine = summarize(times["e2b"]), summarize(times["grove"])
    return {"e2b_ms": e2b, "grove_exec_ms": mine, "p50_ratio": e2b["p50_ms"] / mine["p50_ms"]}


def _build_interpreter_image(url: str, key: str, state_dir: str) -> float:
    """Build the code interpreter's image with grove's CLI; the seconds it took."""
    started = time.monotonic()
    done = subprocess.run([GROVE_BIN, "--state-dir", state_dir, "--url", url, "image", "build-debian",
                           "code-interpreter-v1", "--preset", "code-interpreter"], capture_output=True, check=False,
                          env={**os.environ, "GROVE_API_KEY": key}, stdin=subprocess.DEVNULL, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"the interpreter image did not build: {done.stderr.decode()[-2000:]}")
    return time.monotonic() - started


def _interpreter(url: str, key: str, count: int) -> dict[str, Any]:
    """``run_code("1+1")`` against grove ``exec("true")`` on one sandbox of the SDK's default template, alternating
    (the E2B variables set by the E2B run)."""
    from e2b_code_interpreter import Sandbox as Interpreter

    started = time.monotonic()
    box = Interpreter.create(timeout=600)
    created_s = time.monotonic() - started
    times: dict[str, list[float]] = {"run_code": [], "exec": []}
    try:
        with Grove(url, key) as grove:
            own = grove.attach(box.sandbox_id)
            for _ in range(5):  # warm both paths' connections
                box.run_code("1+1")
                own.exec("true")
            for _ in range(count):
                started = time.perf_counter()
                if (text := box.run_code("1+1").text) != "2":
                    raise RuntimeError(f"run_code('1+1') answered {text!r}")
                times["run_code"].append(time.perf_counter() - started)
                started = time.perf_counter()
                own.exec("true")
                times["exec"].append(time.perf_counter() - started)
    finally:
        box.kill()
    run_code, own_exec = summarize(times["run_code"]), summarize(times["exec"])
    return {"create_s": round(created_s, 2), "run_code_ms": run_code, "grove_exec_ms": own_exec,
            "p50_ratio": run_code["p50_ms"] / own_exec["p50_ms"]}


def _run_code(url: str, key: str) -> float:
    started = time.perf_counter()
    body: dict[str, Any] = {"compile_timeout": 10, "run_timeout": 10, "code": "print(1)\n", "stdin": "",
                            "memory_limit_MB": 1024, "language": "python", "files": {}, "fetch_files": []}
    base = url.replace("http://", f"http://grove:{key}@")
    answer = requests.post(f"{base}/sandbox-fusion/run_code", json=body, timeout=120).json()
    assert answer["status"] == "Success" and answer["run_result"]["stdout"] == "1\n", answer
    return time.perf_counter() - started


def _bare() -> float:
    started = time.perf_counter()
    done = subprocess.run([BARE_PYTHON, "-c", "print(1)"], capture_output=True, check=True)
    assert done.stdout == b"1\n"
    return time.perf_counter() - started


def _throughput(work: Any, runs: int, concurrency: int) -> dict[str, Any]:
    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as workers:
        latencies = list(workers.map(lambda _: work(), range(runs)))
    wall = time.perf_counter() - started
    return {"per_s": runs / wall, "wall_s": wall, "latency_ms": summarize(latencies)}


def _fusion_vs_bare(url: str, key: str, runs: int, concurrency: int) -> dict[str, Any]:
    with Grove(url, key) as grove:
        grove.create_pool(POOL, size=concurrency, resources={"memory_mb": 512})
        try:
            deadline = time.monotonic() + 300
            while grove.pool(POOL)["ready"] < concurrency and time.monotonic() < deadline:
                time.sleep(0.2)
            fusion = _throughput(lambda: _run_code(url, key), runs, concurrency)
        finally:
            grove.delete_pool(POOL)
    bare = _throughput(_bare, runs, concurrency)
    return {"run_code": fusion, "bare_subprocess": bare,
            "throughput_ratio": fusion["per_s"] / bare["per_s"],
            "p50_ratio": fusion["latency_ms"]["p50_ms"] / bare["latency_ms"]["p50_ms"]}


def _section(report: dict[str, Any], rows: list[Target]) -> str:
    e, f, i = report["e2b"], report["fusion"], report["interpreter"]
    lines = [SECTION, "", machine_line(report["machine"]), "",
             f"E2B: {report['execs']} `commands.run(\"true\")` through the real `e2b` SDK against as many grove "
             "`exec(\"true\")`, alternating, one sandbox each. SandboxFusion: "
             f"{report['runs']} `run_code` of `print(1)` in verl's request shape, {report['concurrency']} at a "
             "time on a warm pool, against as many bare `subprocess.run` of `/usr/bin/python3 -c 'print(1)'`. "
             "Raw figures: `perf/results/compat.json`.", "",
             "| figure | compat | grove / bare | ratio |", "|---|---|---|---|",
             f"| E2B `commands.run` vs grove exec, p50 (ms) | {e['e2b_ms']['p50_ms']:.1f} | "
             f"{e['grove_exec_ms']['p50_ms']:.1f} | {e['p50_ratio']:.2f} |",
             f"| E2B vs grove exec, p99 (ms) | {e['e2b_ms']['p99_ms']:.1f} | {e['grove_exec_ms']['p99_ms']:.1f} | "
             f"{e['e2b_ms']['p99_ms'] / e['grove_exec_ms']['p99_ms']:.2f} |",
             f"| code interpreter `run_code(\"1+1\")` vs grove exec, p50 (ms) | {i['run_code_ms']['p50_ms']:.1f} | "
             f"{i['grove_exec_ms']['p50_ms']:.1f} | {i['p50_ratio']:.2f} |",
             f"| `run_code` vs bare subprocess, runs/s | {f['run_code']['per_s']:.1f} | "
             f"{f['bare_subprocess']['per_s']:.1f} | {f['throughput_ratio']:.3f} |",
             f"| `run_code` vs bare subprocess, p50 (ms) | {f['run_code']['latency_ms']['p50_ms']:.0f} | "
             f"{f['bare_subprocess']['latency_ms']['p50_ms']:.0f} | {f['p50_ratio']:.1f} |",
             "", "An E2B command is a Connect stream (start, data, end events) and a process the executor keeps in "
             "its table, where grove's exec is one request and one answer. A `run_code` claims a pool sandbox, "
             "writes the source, runs it, and deletes the sandbox (its trajectory flushed) before answering: the "
             "bare subprocess does none of that. The code interpreter's `run_code` is an HTTP stream through the "
             "port proxy to a server in the sandbox, which runs the cell in a kernel kept running (no process "
             "started). Its image (`grove image build-debian code-interpreter-v1 --preset code-interpreter`) built "
             f"in {i['image_build_s']:.0f} s; `Sandbox.create()` of it, server started and its port up, took "
             f"{i['create_s']:.1f} s; its `run_code` and grove's exec alternate on that one sandbox.", "",
             *target_table(rows)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    """Command line."""
    parser = argparse.ArgumentParser(prog="python -m perf.bench_compat", description=__doc__)
    parser.add_argument("--execs", type=int, default=200)
    parser.add_argument("--runs", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args(argv)
    with running_router() as router:
        e2b = _e2b_vs_exec(router.url, router.key, args.execs)
        built_s = _build_interpreter_image(router.url, router.key, str(router.state_dir))
        interpreter = {"image_build_s": round(built_s, 1), **_interpreter(router.url, router.key, args.execs)}
        fusion = _fusion_vs_bare(router.url, router.key, args.runs, args.concurrency)
    report = {"name": NAME, "when": utc_now(), "code": code_version(), "machine": machine(), "execs": args.execs,
              "runs": args.runs, "concurrency": args.concurrency, "e2b": e2b, "fusion": fusion,
              "interpreter": interpreter}
    rows = [Target("E2B commands.run p50 over grove exec p50", f"{e2b['p50_ratio']:.2f}x", "reported", None),
            Target("code interpreter run_code p50 over grove exec p50", f"{interpreter['p50_ratio']:.2f}x",
                   "reported", None),
            Target("run_code throughput over bare subprocess", f"{fusion['throughput_ratio']:.3f}x", "reported",
                   None),
            Target("every run_code answered Success", f"{args.runs}/{args.runs}", "all", True)]
    publish(NAME, report, rows, _section)


if __name__ == "__main__":
    main()
