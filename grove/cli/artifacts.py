"""``grove artifacts push|ls|get|pull``: files of a sandbox stored in S3, then listed by sandbox, task or run and
fetched verified and resumable."""

from __future__ import annotations

import argparse
import json
import posixpath
import sys
import urllib.parse
from pathlib import Path
from typing import Any

from grove.cli.common import client, utc
from grove.core.errors import Conflict, Invalid, NotFound

_MIB = 1024 * 1024


def cmd_artifacts(args: argparse.Namespace) -> int:
    """Dispatch to ``push``, ``ls``, ``get`` or ``pull``."""
    with client(args) as grove:
        return int({"push": _push, "ls": _ls, "get": _get, "pull": _pull}[args.art_cmd](grove, args))


def _push(grove: Any, args: argparse.Namespace) -> int:
    items = grove.attach(args.sandbox_id).push_artifacts(args.paths)
    prefix = f"/v1/artifacts/{args.sandbox_id}"
    for item in items:
        if args.json:
            print(json.dumps(item, sort_keys=True))
            continue
        # The path as stored: absolute, a relative one resolved against the sandbox's workdir by the router.
        stored = urllib.parse.unquote(str(item["fetch"]).removeprefix(prefix))
        print(f"stored {stored}  {item['size']} bytes  sha256 {item['sha256']}")
    if not args.json:
        print(f"fetch one with `grove artifacts get {args.sandbox_id} PATH`, all with "
              f"`grove artifacts pull DIR --sandbox {args.sandbox_id}`", file=sys.stderr)
    return 0


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
        print(f"{art.sandbox_id:<20} {art.kind:<6} {art.size:>12} {art.sha256[:12]:<12} {utc(art.created_at):<19} "
              f"{art.path}")
    return 0


def _get(grove: Any, args: argparse.Namespace) -> int:
    path = _stored_path(grove, args.sandbox_id, args.path)
    try:
        if args.output == "-":
            sys.stdout.buffer.write(grove.artifacts.get(args.sandbox_id, path))
            sys.stdout.buffer.flush()
            return 0
        dest = Path(args.output or posixpath.basename(path))
        grove.artifacts.get(args.sandbox_id, path, dest, progress=_printer())
    except NotFound as exc:
        if "no stored artifact" not in exc.message:  # e.g. indexed but expired from S3: that message says so
            raise
        raise NotFound(f"sandbox {args.sandbox_id} has no stored artifact {path}; `grove artifacts ls --sandbox "
                       f"{args.sandbox_id}` lists those it has") from None
    print(f"{dest} (sha256 verified)", file=sys.stderr)
    return 0


def _stored_path(grove: Any, sandbox_id: str, path: str) -> str:
    """``path`` as the push stored it: a relative path is resolved against the sandbox's workdir, as the push
    resolved it (the live sandbox's, else its trajectory's)."""
    if path.startswith("/"):
        return path
    try:
        workdir = grove.request("GET", f"/v1/sandboxes/{sandbox_id}")["workdir"]
    except (NotFound, Conflict):  # deleted: its trajectory remembers the workdir
        try:
            workdir = grove.request("GET", f"/v1/trajectories/{sandbox_id}")["sandbox"]["workdir"]
        except NotFound:
            raise NotFound(f"sandbox {sandbox_id} is not running and has no stored trajectory, so {path!r} cannot "
                           f"be resolved against its workdir; give the absolute path (`grove artifacts ls --sandbox "
                           f"{sandbox_id}` lists them)") from None
    return posixpath.normpath(posixpath.join(str(workdir), path))


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
                         help="stored artifacts: push, ls, get, pull (by run, task or sandbox; sha256 verified)")
    asub = art.add_subparsers(dest="art_cmd", required=True)
    push = asub.add_parser("push", parents=[common], help="store files of a live sandbox in S3 as artifacts")
    push.add_argument("sandbox_id")
    push.add_argument("paths", nargs="+", metavar="PATH",
                      help="a file in the sandbox, absolute or relative to its workdir")
    push.add_argument("--json", action="store_true",
                      help="one JSON object per file (with its key and a presigned GET url)")
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
    get.add_argument("path", help="its path in the sandbox, as `ls` shows it, or relative to the sandbox's workdir "
                                  "(as `push` takes it)")
    get.add_argument("-o", "--output", help="file to write, resumable (default: the path's file name; - for stdout)")
    art.set_defaults(func=cmd_artifacts)
