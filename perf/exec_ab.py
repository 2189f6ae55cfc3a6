"""Exec of ``true`` through routers of several checkouts, alternated call by call in one sitting.

``python perf/exec_ab.py --rounds 3 --calls 200 OLD_CHECKOUT NEW_CHECKOUT [...]`` starts, for each checkout, a
driver process of its own (``PYTHONPATH`` that checkout; this file run by path, so a checkout without it can
be measured) that starts that checkout's router (``perf.common.running_router``), creates one ``default``
sandbox with its SDK (heartbeat off) and then waits for orders. This process hands out the calls one at a
time, rotating the checkouts' order call by call, so that a busy moment of the shared machine hits all alike:

* ``sdk``: the checkout's own ``AsyncGrove`` ``exec(["true"])``;
* ``raw``: one keep-alive ``http.client`` connection, JSON, the same request for every checkout;
* ``floor``: ``subprocess.run(["true"])`` (in the first driver).

Then, per checkout in turn, the CPU of N back-to-back raw calls: router, sandbox (every process in its
memory cgroup, with their waited-for children) and client, from ``/proc/<pid>/stat``. Prints JSON: each
figure's median over the rounds with its spread, and each checkout's over the first's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
KINDS = ("sdk", "raw")


# -- the driver: runs inside one checkout's code ---------------------------------------------------------


def _ticks(pid: int) -> int:
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return 0
    fields = raw[raw.rfind(b")") + 2:].split()
    return int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])


def _group_ticks(cgroup: Path) -> int:
    try:
        pids = [int(p) for p in (cgroup / "cgroup.procs").read_text().split()]
    except OSError:
        return 0
    return sum(_ticks(pid) for pid in pids)


class _Raw:
    """A keep-alive JSON exec of ``["true"]`` on one connection."""

    def __init__(self, url: str, key: str, sandbox_id: str) -> None:
        host, port = url.split("//", 1)[1].rsplit(":", 1)
        self.conn = http.client.HTTPConnection(host, int(port), timeout=60)
        self.path = f"/v1/sandboxes/{sandbox_id}/exec"
        self.headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        self.body = json.dumps({"command": ["true"]}).encode()

    def call(self) -> None:
        self.conn.request("POST", self.path, body=self.body, headers=self.headers)
        response = self.conn.getresponse()
        data = response.read()
        if response.status != 200 or json.loads(data)["exit_code"] != 0:
            raise RuntimeError(f"exec failed: {response.status} {data[:200]!r}")


async def _drive() -> None:
    sys.path.insert(0, os.getcwd())
    try:
        from grove.client import AsyncGrove
    except ImportError:  # before the SDK moved to grove/ (issue 30)
        from router.client import AsyncGrove  # type: ignore[import-not-found,no-redef]
    from perf.common import running_router

    stack = contextlib.ExitStack()
    if not Path("grove/cli").is_dir():  # before issue 30 the CLI was router.cli, which the venv's script lacks
        shim = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="exec-ab-")))
        (shim / "grove").write_text(f"#!{sys.executable}\nimport sys\nfrom router.cli import main\nsys.exit(main())\n")
        (shim / "grove").chmod(0o755)
        sys.executable = str(shim / "python")  # running_router runs the grove beside sys.executable

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

    def reply(obj: object) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    with stack, running_router() as router:
        async with AsyncGrove(router.url, router.key) as grove:
            sandbox = await grove.create("default", heartbeat=False)
            raw = _Raw(router.url, router.key, sandbox.id)
            cgroup = router.cgroup(sandbox.id)
            try:
                reply({"ready": True})
                while line := (await reader.readline()).decode().strip():
                    kind, n = line.split()
                    if kind == "quit":
                        break
                    count = int(n)
                    if kind == "cpu":
                        r0, s0, c0 = _ticks(router.pid), _group_ticks(cgroup), time.process_time()
                        w0 = time.perf_counter()
                        for _ in range(count):
                            raw.call()
                        w1 = time.perf_counter()
                        r1, s1, c1 = _ticks(router.pid), _group_ticks(cgroup), time.process_time()
                        ms = 1000.0 / count
                        reply({"wall_ms": (w1 - w0) * ms, "router_ms": (r1 - r0) * TICK_S * ms,
                               "sandbox_ms": (s1 - s0) * TICK_S * ms, "client_ms": (c1 - c0) * ms})
                        continue
                    out = []
                    for _ in range(count):
                        t0 = time.perf_counter()
                        if kind == "sdk":
                            result = await sandbox.exec(["true"])
                            if result.exit_code != 0:
                                raise RuntimeError("true failed")
                        elif kind == "raw":
                            raw.call()
                        else:
                            subprocess.run(["true"], check=True)
                        out.append(time.perf_counter() - t0)
                    reply(out)
            finally:
                raw.conn.close()
                await sandbox.close()


# -- the coordinator -------------------------------------------------------------------------------------


class _Driver:
    """A driver process in ``checkout`` (``script`` run by path with ``--drive``): one order a line, one JSON
    answer a line."""

    def __init__(self, checkout: Path, script: Path = Path(__file__)) -> None:
        self.checkout = checkout
        env = {**os.environ, "PYTHONPATH": str(checkout)}
        self.proc = subprocess.Popen([sys.executable, str(script.resolve()), "--drive"], env=env,
                                     cwd=checkout, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ask(self, order: str) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(order + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the driver of {self.checkout} ended: {self.proc.wait()}")
        return json.loads(line)

    def wait_ready(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line or not (ready := json.loads(line)).get("ready"):
            raise RuntimeError(f"the driver of {self.checkout} did not start")
        return dict(ready)

    def stop(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            assert self.proc.stdin is not None
            self.proc.stdin.write("quit 0\n")
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            self.proc.wait(timeout=90)


def _p50(values: list[float]) -> float:
    return statistics.median(values) * 1000


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 3), "low": round(min(values), 3),
            "high": round(max(values), 3)}


def compare(checkouts: list[Path], rounds: int, calls: int, warmup: int, cpu_calls: int) -> dict[str, Any]:
    """Every round: ``calls`` of each kind per checkout (plus the floor), alternated; then the CPU phase."""
    drivers = [_Driver(c) for c in checkouts]
    try:
        for d in drivers:
            d.wait_ready()
        names = [str(c) for c in checkouts]
        p50: dict[str, dict[str, list[float]]] = {n: {k: [] for k in KINDS} for n in names}
        floor: list[float] = []
        cpu: dict[str, list[dict[str, float]]] = {n: [] for n in names}
        for r in range(-1, rounds):
            samples: dict[str, dict[str, list[float]]] = {n: {k: [] for k in KINDS} for n in names}
            got_floor: list[float] = []
            for i in range(warmup if r < 0 else calls):
                order = [(d, n, k) for d, n in zip(drivers, names, strict=True) for k in KINDS]
                shift = i % (len(order) + 1)
                jobs: list[tuple[_Driver, str, str] | None] = [*order, None]
                for job in jobs[shift:] + jobs[:shift]:
                    if job is None:
                        got_floor += drivers[0].ask("floor 1")
                    else:
                        d, n, k = job
                        samples[n][k] += d.ask(f"{k} 1")
            if r < 0:
                continue
            floor.append(_p50(got_floor))
            for n in names:
                for k in KINDS:
                    p50[n][k].append(_p50(samples[n][k]))
            for d, n in zip(drivers, names, strict=True):
                cpu[n].append(d.ask(f"cpu {cpu_calls}"))
    finally:
        for d in drivers:
            d.stop()
    first = names[0]
    out: dict[str, Any] = {"rounds": rounds, "calls": calls, "floor_p50_ms": _spread(floor), "checkouts": {}}
    for n in names:
        out["checkouts"][n] = {
            **{f"{k}_p50_ms": _spread(p50[n][k]) for k in KINDS},
            **{f"{k}_over_floor": _spread([a / f for a, f in zip(p50[n][k], floor, strict=True)]) for k in KINDS},
            **{f"{k}_over_first": _spread([a / b for a, b in zip(p50[n][k], p50[first][k], strict=True)])
               for k in KINDS},
            "cpu_ms_per_raw_call": {f: _spread([c[f] for c in cpu[n]]) for f in cpu[n][0]},
        }
    return out


def ab_parser(prog: str, doc: str | None) -> argparse.ArgumentParser:
    """The command line an A/B of checkouts starts from: the checkouts, ``--rounds``, the hidden ``--drive``."""
    parser = argparse.ArgumentParser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkouts", nargs="*", help="git worktrees to compare; the first is the reference")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--drive", action="store_true", help=argparse.SUPPRESS)
    return parser


def ab_checkouts(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[Path]:
    """The checkouts named on the command line, resolved; at least one."""
    if not args.checkouts:
        parser.error("name at least one checkout")
    return [Path(c).resolve() for c in args.checkouts]


def main(argv: list[str] | None = None) -> None:
    """Command line."""
    parser = ab_parser("python perf/exec_ab.py", __doc__)
    parser.add_argument("--calls", type=int, default=200, help="calls of each kind per checkout per round")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--cpu-calls", type=int, default=300, help="raw calls per CPU measurement")
    parser.add_argument("--json", action="store_true", help="print the whole report as JSON")
    args = parser.parse_args(argv)
    if args.drive:
        asyncio.run(_drive())
        return
    report = compare(ab_checkouts(parser, args), args.rounds, args.calls, args.warmup,
                     args.cpu_calls)
    print(json.dumps(report, indent=1) if args.json else _table(report))


def _table(report: dict[str, Any]) -> str:
    """One line per checkout and figure: median (low-high)."""
    floor = report["floor_p50_ms"]
    lines = [f"floor subprocess.run(true) p50 ms: {floor['median']} ({floor['low']}-{floor['high']})"]
    for name, figures in report["checkouts"].items():
        for figure, value in figures.items():
            if figure == "cpu_ms_per_raw_call":
                lines.append(f"{name} cpu per raw call ms: " + ", ".join(
                    f"{k} {v['median']:.2f} ({v['low']:.2f}-{v['high']:.2f})" for k, v in value.items()))
            else:
                lines.append(f"{name} {figure}: {value['median']} ({value['low']}-{value['high']})")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
