"""What every benchmark in ``perf/`` shares: statistics, the machine, results files, README sections, a router.

A benchmark measures, then calls :func:`write_results` (``perf/results/<name>.json``) and
:func:`update_readme` (its own ``## Section`` of ``perf/README.md``; the other sections are kept).
:func:`running_router` starts a real ``grove up`` subprocess on a private state dir and, however the
benchmark ends, removes every trace of it: its sandboxes (through the API, then by cgroup), the
process, the state dir and the router instance's cgroup directories.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar
from urllib.parse import urlsplit

from grove.statedir import StateDir

HERE = Path(__file__).resolve().parent
RESULTS_DIR = HERE / "results"
README = HERE / "README.md"
REPO = HERE.parent
CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_CONTROLLERS = ("memory", "pids", "cpu", "unified")  # as router/backends/local/cgroups.py HIERARCHIES
MIB = 1024 * 1024

# -- statistics ------------------------------------------------------------------------------------------


def percentile(samples: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0 to 100), linear between closest ranks (numpy's default, ``statistics``' inclusive)."""
    if not samples:
        raise ValueError("percentile of no samples")
    ordered = sorted(samples)
    pos = (len(ordered) - 1) * q / 100.0
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def summarize(samples: Sequence[float], pcts: Sequence[int] = (50, 99), *, scale: float = 1000.0) -> dict[str, float]:
    """``p<q>_ms`` for each percentile, then ``mean_ms``, ``min_ms``, ``max_ms`` and ``n``, from seconds."""
    if not samples:
        return {"n": 0}
    out: dict[str, float] = {f"p{q}_ms": round(percentile(samples, q) * scale, 3) for q in pcts}
    out["mean_ms"] = round(sum(samples) / len(samples) * scale, 3)
    out["min_ms"] = round(min(samples) * scale, 3)
    out["max_ms"] = round(max(samples) * scale, 3)
    out["n"] = len(samples)
    return out


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, lowest and highest of a few runs' figures."""
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3), "runs": len(values)}


async def interleaved(calls: Mapping[str, Callable[[], Awaitable[object]]], rounds: int) -> dict[str, list[float]]:
    """Each call's durations (seconds) over ``rounds`` rounds in which every call runs once, their order rotating
    round by round so that none always goes first and a busy moment of the machine hits them all alike.

    A warm-up is one such run whose durations are dropped."""
    names = list(calls)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for i in range(rounds):
        for k in range(len(names)):
            name = names[(i + k) % len(names)]
            t0 = time.perf_counter()
            await calls[name]()
            samples[name].append(time.perf_counter() - t0)
    return samples


# -- the machine and the output files ---------------------------------------------------------------------


def machine() -> dict[str, Any]:
    """nproc, CPU model, kernel, Python and total RAM of this host."""
    model = "unknown"
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as fh:
        for line in fh:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    ram_kib = 0
    with contextlib.suppress(OSError), open("/proc/meminfo", encoding="utf-8") as fh:
        for line in fh:
            if line.startswith("MemTotal:"):
                ram_kib = int(line.split()[1])
                break
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_model": model,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "ram_gib": round(ram_kib / MIB, 1),
    }


def machine_line(m: dict[str, Any]) -> str:
    """The machine as one Markdown sentence."""
    ram = f", {m['ram_gib']} GiB RAM" if m.get("ram_gib") else ""
    return f"Machine: {m['nproc']} CPUs (`nproc`), {m['cpu_model']}, kernel {m['kernel']}, Python {m['python']}{ram}."


def utc_now() -> str:
    """The date line every report carries."""
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")


def write_results(name: str, report: dict[str, Any]) -> Path:
    """Write ``perf/results/<name>.json``."""
    path = RESULTS_DIR / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return path


def update_readme(section: str, readme: Path = README) -> None:
    """Replace (or append) the ``## ...`` section whose heading is ``section``'s first line; keep the others."""
    heading = section.split("\n", 1)[0]
    if not heading.startswith("## "):
        raise ValueError(f"a section starts with '## ', not {heading!r}")
    text = readme.read_text(encoding="utf-8") if readme.exists() else "# grove benchmarks\n\n"
    start = text.find(heading + "\n")
    body = section.rstrip("\n") + "\n"
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + body
    else:
        end = text.find("\n## ", start + len(heading))
        text = text[:start] + body + ("" if end < 0 else "\n" + text[end + 1 :])
    readme.write_text(text, encoding="utf-8")


_Row = TypeVar("_Row")


def publish(name: str, report: dict[str, Any], rows: list[_Row],
            section: Callable[[dict[str, Any], list[_Row]], str]) -> None:
    """A benchmark's last step: its target rows into the report, the JSON written, its README section
    (``section(report, rows)``) replaced and printed. ``rows`` are dataclasses."""
    report["targets"] = [asdict(row) for row in rows]  # type: ignore[call-overload]
    write_results(name, report)
    text = section(report, rows)
    update_readme(text)
    print(text)


@dataclass(frozen=True)
class Target:
    """One row of a benchmark's "target met?" table."""

    figure: str
    measured: str
    target: str
    met: bool | None
    """None: reported, no target."""


def target_table(rows: Sequence[Target]) -> list[str]:
    """The Markdown lines of a figure | measured | target | met? table."""
    lines = ["| figure | measured | target | met? |", "|---|---|---|---|"]
    for row in rows:
        met = "—" if row.met is None else ("**yes**" if row.met else "**no**")
        lines.append(f"| {row.figure} | {row.measured} | {row.target} | {met} |")
    return lines


def comparison_options(parser: argparse.ArgumentParser) -> None:
    """``--label`` and ``--out`` for a measurement run from two checkouts in turn (:func:`emit_comparison`)."""
    parser.add_argument("--label", default="", help="a name for this run in the output")
    parser.add_argument("--out", help="append the result as one JSON line to this file")


def emit_comparison(report: dict[str, Any], out: str | None) -> None:
    """Print the report as JSON, and append it as one line to ``out`` if given."""
    print(json.dumps(report, indent=1))
    if out:
        with open(out, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(report) + "\n")


def sigterm_as_exit() -> None:
    """Turn SIGTERM into SystemExit, so ``finally`` blocks (the cleanups below) also run when killed."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


# -- processes -------------------------------------------------------------------------------------------


def terminate(proc: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    """SIGTERM the process by its pid, wait, SIGKILL if it is still there."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


# -- the router -------------------------------------------------------------------------------------------


class Api:
    """A minimal JSON client of the router on one keep-alive ``http.client`` connection (no SDK involved)."""

    def __init__(self, url: str, key: str, *, timeout_s: float = 60.0) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.key = key
        self.timeout_s = timeout_s
        self.conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout_s)

    def call(self, method: str, path: str, body: Any = None, *, expect: Sequence[int] = (200, 201)) -> Any:
        """One call; the decoded JSON answer. Raises RuntimeError on a status not in ``expect``."""
        payload = None if body is None else json.dumps(body).encode()
        headers = {"Authorization": f"Bearer {self.key}", "Accept": "application/json"}
        if payload is not None:
            headers["Content-Type"] = "application/json"
        try:
            self.conn.request(method, path, body=payload, headers=headers)
            resp = self.conn.getresponse()
            data = resp.read()
        except (OSError, http.client.HTTPException):
            self.conn.close()  # the next call reconnects
            raise
        if resp.status not in expect:
            raise RuntimeError(f"{method} {path}: {resp.status} {data[:300]!r}")
        return json.loads(data) if data else None

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()


@dataclass
class Router:
    """A running ``grove up`` subprocess with the local backend, and what its cleanup found."""

    url: str
    key: str
    pid: int
    state_dir: Path
    instance: str
    """The local backend's instance id: its cgroups are ``/sys/fs/cgroup/<ctl>/grove-<instance>/<sandbox id>``."""
    log: Path
    cleanup: dict[str, Any] = field(default_factory=dict)
    """Filled when the context exits: sandboxes the API still listed, leftovers removed by force."""

    @property
    def layout(self) -> StateDir:
        """Paths inside the router's state dir."""
        return StateDir(self.state_dir)

    def api(self, timeout_s: float = 60.0) -> Api:
        """A fresh raw client."""
        return Api(self.url, self.key, timeout_s=timeout_s)

    def cgroup(self, sandbox_id: str, controller: str = "memory") -> Path:
        """A sandbox's cgroup directory."""
        return CGROUP_ROOT / controller / f"grove-{self.instance}" / sandbox_id

    def sandbox_dir(self, sandbox_id: str) -> Path:
        """A sandbox's files (writable layer, executor socket) in the state dir."""
        return self.layout.sandbox(sandbox_id)

    def record(self, sandbox_id: str) -> dict[str, Any]:
        """The router's on-disk record of a sandbox (holds its executor endpoint and token)."""
        data: dict[str, Any] = json.loads((self.layout.record(sandbox_id)).read_text())
        return data


@contextlib.contextmanager
def running_router(*, key: str = "bench-key", ready_timeout_s: float = 120.0) -> Iterator[Router]:
    """``grove up`` on a free port and a fresh short state dir; everything of it removed on exit, even on failure.

    The router is the tests' own harness (:class:`tests.support.router_fixtures.RouterProcess`, cleaned up
    by the same leak sweep), started so that it gets SIGTERM if this process dies without cleaning up
    (SIGKILL): it stops, and the next run's :func:`sweep_stale` removes what it left.
    """
    from tests.support.router_fixtures import RouterProcess, force_cleanup, instance_of, leaks

    swept = sweep_stale()
    if swept:
        print(f"removed what earlier, killed benchmark runs left: {', '.join(swept)}", file=sys.stderr)
    state = Path(tempfile.mkdtemp(prefix=STATE_PREFIX))  # short: sandbox Unix socket paths must stay < 108 bytes
    instance = instance_of(state)
    process = RouterProcess(state, key=key, die_with_parent=True)
    router: Router | None = None
    failed = True
    try:
        process.start(timeout=ready_timeout_s)
        router = Router(process.url, key, process.pid, state, instance, process.log_path)
        yield router
        failed = False
    finally:
        report: dict[str, Any] = {}
        if failed:
            print(f"router log (tail):\n{_tail(process.log_path)}", file=sys.stderr)
        if process.alive():
            try:
                report["deleted_via_api"] = sorted(process.delete_all())
            except Exception as exc:  # a hung or dead router: the sweep below still runs
                print(f"cleanup: could not delete sandboxes through the API: {exc}", file=sys.stderr)
        report["router_exit_code"] = process.stop()
        report["removed_by_force"] = leaks(state)
        if left := force_cleanup(state):
            report["could_not_remove"] = left
        if router is not None:
            router.cleanup = report
        if report.get("deleted_via_api") or report["removed_by_force"] or report.get("could_not_remove"):
            print(f"cleanup: {report}", file=sys.stderr)


STATE_PREFIX = "gb-"


def sweep_stale(tmp: Path | None = None) -> list[str]:
    """Remove benchmark routers' state dirs whose router no longer runs, with everything of them still running
    (sandboxes by their cgroups, then any process started from the dir: its zygote, its S3 server): what a
    benchmark killed outright (SIGKILL) leaves. A dir some live ``grove --state-dir DIR`` uses is left alone."""
    from tests.support.router_fixtures import force_cleanup

    root = tmp or Path(tempfile.gettempdir())
    stale = [d for d in root.glob(STATE_PREFIX + "*") if d.is_dir() and any(d.glob("ready-*"))]
    if not stale:
        return []
    routers = {args[i + 1] for args in _command_lines().values() for i, a in enumerate(args[:-1]) if a == "--state-dir"}
    removed = []
    for state in stale:
        if str(state) in routers:
            continue
        if left := force_cleanup(state):
            print(f"could not remove the cgroups of {state}: {', '.join(left)}", file=sys.stderr)
        removed.append(state.name)
    return removed


def _command_lines() -> dict[int, list[str]]:
    found: dict[int, list[str]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                raw = Path(entry.path, "cmdline").read_bytes()
                found[int(entry.name)] = [a.decode(errors="replace") for a in raw.split(b"\0")]
    return found


def _tail(path: Path, limit: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-limit:]
    except OSError:
        return "(no log)"


def code_version() -> dict[str, Any]:
    """The commit measured and which of its source files had uncommitted changes (the tree is shared)."""
    out: dict[str, Any] = {"commit": None, "uncommitted": []}
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out["commit"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--", "grove", "executor", "router", "sandbox_image", "artifacts"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        out["uncommitted"] = sorted(line[3:] for line in status.splitlines() if line.strip())
    return out
