"""Fresh bursts through routers of several checkouts, alternated burst by burst in one sitting: the router's CPU.

``python perf/burst_ab.py --rounds 3 --n 100 OLD_CHECKOUT NEW_CHECKOUT [...]`` starts, for each checkout, a
driver process of its own (``PYTHONPATH`` that checkout, this file run by path, as ``perf/exec_ab.py`` does)
that starts that checkout's router (``perf.common.running_router``) and waits for orders. Each round runs one
Orchard-shaped fresh burst (``perf.burst``: create, four commands, delete, all at once) through every
checkout in turn, the order rotating round by round, and takes per sandbox the CPU of the router process
(with its waited-for children, from ``/proc/<pid>/stat``), the driver's (the SDK client's), and the wall.
``--profile DIR`` then runs one more burst of the last checkout, not counted, its router recorded by py-spy
(``DIR/router.folded``: folded stacks of the samples holding the GIL). Prints JSON: each figure's median over
the rounds with its spread, and each checkout's over the first's.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from perf.exec_ab import _Driver

FIGURES = ("router_ms", "client_ms", "wall_s", "ok")
RATIOS = ("router_ms", "client_ms", "wall_s")


async def _drive() -> None:
    sys.path.insert(0, os.getcwd())
    from perf.burst import burst
    from perf.common import running_router

    def reply(obj: object) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    with running_router() as router:
        reply({"ready": True, "pid": router.pid})
        for line in sys.stdin:
            kind, n = line.split()
            if kind == "quit":
                break
            count = int(n)
            c0 = time.process_time()
            result = await burst(router.url, router.key, count)
            ok = sum(1 for run in result.runs if not run.errors)
            reply({"client_ms": (time.process_time() - c0) * 1000.0 / count, "wall_s": result.wall_s,
                   "ok": ok / count})


def _spy(pid: int, out: Path) -> subprocess.Popen[bytes]:
    """py-spy recording ``pid`` (GIL-holding samples, folded) until it gets SIGINT."""
    return subprocess.Popen([str(Path(sys.executable).with_name("py-spy")), "record", "--pid", str(pid),
                             "--rate", "200", "--gil", "--format", "raw", "-o", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _burst(driver: _Driver, router_pid: int, n: int) -> dict[str, float]:
    from perf.exec_ab import TICK_S, _ticks

    r0 = _ticks(router_pid)
    got: dict[str, float] = driver.ask(f"burst {n}")
    got["router_ms"] = (_ticks(router_pid) - r0) * TICK_S * 1000.0 / n
    return got


def compare(checkouts: list[Path], rounds: int, n: int, profile: Path | None) -> dict[str, Any]:
    """Every round: one burst of ``n`` per checkout, the order rotated; then, with ``profile``, one more of the
    last checkout's, recorded by py-spy."""
    # Imported here, in the coordinator (this checkout's code): a driver runs in a checkout that may lack it.
    from perf.exec_ab import _Driver, _spread

    script = Path(__file__)
    drivers = [_Driver(c, script) for c in checkouts]
    names = [str(c) for c in checkouts]
    got: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    try:
        pids = [int(d.wait_ready()["pid"]) for d in drivers]
        for r in range(rounds):
            order = list(zip(drivers, pids, names, strict=True))
            shift = r % len(order)
            for d, pid, name in order[shift:] + order[:shift]:
                got[name].append(_burst(d, pid, n))
        if profile is not None:  # one more burst, not counted: py-spy's sampling costs the router CPU too
            spy = _spy(pids[-1], profile / "router.folded")
            try:
                _burst(drivers[-1], pids[-1], n)
            finally:
                spy.send_signal(signal.SIGINT)
                spy.wait(timeout=120)
    finally:
        for d in drivers:
            d.stop()
    first = names[0]
    out: dict[str, Any] = {"rounds": rounds, "n": n, "checkouts": {}}
    for name in names:
        out["checkouts"][name] = {
            **{f: _spread([g[f] for g in got[name]]) for f in FIGURES},
            **{f"{f}_over_first": _spread([a[f] / b[f] for a, b in zip(got[name], got[first], strict=True)])
               for f in RATIOS},
        }
    return out


def main(argv: list[str] | None = None) -> None:
    """Command line (of the coordinator; a driver is started with ``--drive`` alone)."""
    from perf.exec_ab import ab_checkouts, ab_parser

    parser = ab_parser("python perf/burst_ab.py", __doc__)
    parser.add_argument("--n", type=int, default=100, help="sandboxes per burst")
    parser.add_argument("--profile", type=Path, help="where py-spy writes the last checkout's router.folded")
    args = parser.parse_args(argv)
    report = compare(ab_checkouts(parser, args), args.rounds, args.n, args.profile)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    if sys.argv[1:] == ["--drive"]:  # a driver, in a checkout whose perf.exec_ab may lack what main() imports
        asyncio.run(_drive())
    else:
        main()
