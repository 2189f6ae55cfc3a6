"""``grove artifacts ls|get|pull``: stored artifacts by sandbox, task or run, fetched verified and resumable."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from grove.cli.common import client
from grove.core.errors import Invalid

_MIB = 1024 * 1024


def cmd_artifacts(args: argparse.Namespace) -> int:
    """Dispatch to ``ls``, ``get`` or ``pull``."""
    with client(args) as grove:
        return int({"ls": _ls, "get": _get, "pull": _pull}[args.art_cmd](grove, args))


def _filters(args: argparse.Namespace) -> dict[str, str | None]:
    return {"sandbox_id": args.sandbox, "task_id": args.task, "run_id": args.run}


def _ls(grove: Any, args: argparse.Namespace) -> int:
    items = grove.artifacts.list(**_filters(args))
    if args.json:
        for art in items:
            print(json.dumps(art.__dict__, sort_keys=True))
        return 0
    print(f"{'SANDBOX':<20} {'KIND':<6} {'SIZE':>12} {'SHA256':<12} {'STORED (UTC)':<19} PATH")
    for art in items:
        stored = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(art.created_at))
        print(f"{art.sandbox_id:<20} {art.kind:<6} {art.size:>12} {art.sha256[:12]:<12} {stored:<19} {art.path}")
    return 0


def _get(grove: Any, args: argparse.Namespace) -> int:
    if args.output == "-":
        sys.stdout.buffer.write(grove.artifacts.get(args.sandbox_id, args.path))
        sys.stdout.buffer.flush()
        return 0
    dest = Path(args.output or Path(args.path).name)
    grove.artifacts.get(args.sandbox_id, args.path, dest, progress=_printer())
    print(f"{dest} (sha256 verified)", file=sys.stderr)
    return 0


def _pull(grove: Any, args: argparse.Namespace) -> int:
    filters = _filters(args)
    if not any(filters.values()) and not args.all:
        raise Invalid("pull what? give --run, --task or --sandbox (or --all for every stored artifact)")
    report = grove.artifacts.pull(args.dest, jobs=args.jobs, progress=_printer(), **filters)
    print(f"pulled {len(report.fetched)} file(s), {report.bytes / _MIB:.1f} MiB received; "
          f"{len(report.skipped)} already in place and verified", file=sys.stderr)
    for err in report.rejected:
        print(f"grove: REFUSED {err.message}", file=sys.stderr)
    for failure in report.failed:
        print(f"grove: not fetched (run the pull again to resume): {failure.message}", file=sys.stderr)
    return 0 if report.ok else 1


def _printer() -> Any:
    """Progress on stderr: one line per file started, resumed, skipped and done, and every second or so."""

    def show(p: Any) -> None:
        total = f"{p.total / _MIB:.1f}" if p.total is not None else "?"
        name = p.route.removeprefix("/v1/artifacts/")
        if p.event == "start" and p.resumed_from:
            print(f"  resume {name} from {p.resumed_from / _MIB:.1f} of {total} MiB", file=sys.stderr)
        elif p.event in ("done", "skipped"):
            print(f"  {p.event:<7}{name} ({p.done / _MIB:.1f} MiB)", file=sys.stderr)
        elif p.event == "bytes":
            print(f"  ...    {name} {p.done / _MIB:.1f} of {total} MiB", file=sys.stderr)

    return show


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``artifacts``."""
    art = sub.add_parser("artifacts", parents=[common],
                         help="stored artifacts: ls, get, pull (by run, task or sandbox; sha256 verified)")
    asub = art.add_subparsers(dest="art_cmd", required=True)
    ls = asub.add_parser("ls", parents=[common], help="list stored artifacts")
    pull = asub.add_parser("pull", parents=[common],
                           help="fetch many into DEST/<sandbox_id>/<path>, resuming, verifying each sha256")
    for p in (ls, pull):
        p.add_argument("--sandbox", help="only this sandbox's")
        p.add_argument("--task", help="only those of sandboxes with this task_id")
        p.add_argument("--run", help="only those of this rollout run (the sandboxes' labels.run_id)")
    ls.add_argument("--json", action="store_true", help="one JSON object per line")
    pull.add_argument("dest", help="directory to fill")
    pull.add_argument("--jobs", type=int, default=4, help="downloads at once (default 4)")
    pull.add_argument("--all", action="store_true", help="every stored artifact (no filter)")
    get = asub.add_parser("get", parents=[common], help="fetch one artifact (sha256 verified)")
    get.add_argument("sandbox_id")
    get.add_argument("path", help="its path in the sandbox, as `ls` shows it")
    get.add_argument("-o", "--output", help="file to write, resumable (default: the path's file name; - for stdout)")
    art.set_defaults(func=cmd_artifacts)
