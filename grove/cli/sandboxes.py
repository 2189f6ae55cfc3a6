"""``grove ls``, ``create``, ``exec``, ``cp`` and ``rm``: sandboxes from the command line."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from grove.cli.common import age, client, key_values, utc
from grove.core.errors import GroveError


def cmd_ls(args: argparse.Namespace) -> int:
    """List live sandboxes."""
    labels = key_values(args.label, "--label")
    with client(args) as grove:
        rows = grove.list(labels)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    now = time.time()
    print(f"{'ID':<20} {'STATUS':<8} {'IMAGE':<16} {'TASK':<20} {'CREATED (UTC)':<19} {'AGE':>7} {'IDLE':>7}")
    for row in rows:
        task = row["metadata"].get("task_id") or "-"
        idle = age(now - row["last_activity"]) if row.get("last_activity") else "-"
        print(f"{row['id']:<20} {row['status']:<8} {row['image']:<16} {task:<20} {utc(row['created_at']):<19} "
              f"{age(now - row['created_at']):>7} {idle:>7}")
    return 0


def create_options(args: argparse.Namespace) -> dict[str, Any]:
    """The create options the user gave; everything left unset takes the API's own default."""
    given = {"cpu": args.cpu, "memory_mb": args.memory_mb, "pids_max": args.pids_max, "disk_mb": args.disk_mb,
             "ttl_s": args.ttl, "idle_timeout_s": args.idle_timeout}
    options: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
    if args.env:
        options["env"] = key_values(args.env, "--env")
    if args.pool:
        options["pool"] = args.pool
    if args.checkpoint:
        options["checkpoint"] = args.checkpoint
    meta: dict[str, Any] = {k: v for k, v in (("task_id", args.task), ("model", args.model),
                                              ("harness", args.harness)) if v}
    if args.label:
        meta["labels"] = key_values(args.label, "--label")
    if meta:
        options["metadata"] = meta
    return options


def cmd_create(args: argparse.Namespace) -> int:
    """Create a sandbox and print its id."""
    with client(args) as grove:
        sandbox = grove.create(args.image, heartbeat=False, **create_options(args))
    print(sandbox.id)
    return 0


def cmd_exec(args: argparse.Namespace) -> int:
    """Run a command in a sandbox; exits with the command's exit code."""
    command: str | list[str] = args.command if len(args.command) > 1 else args.command[0]
    with client(args) as grove:
        result = grove.attach(args.id).exec(command, timeout_s=args.timeout, cwd=args.cwd, user=args.user)
    sys.stdout.buffer.write(result.stdout)
    sys.stderr.buffer.write(result.stderr)
    if result.timed_out:
        print(f"grove: timed out after {args.timeout}s", file=sys.stderr)
    return int(result.exit_code)


def cmd_cp(args: argparse.Namespace) -> int:
    """Copy files: ``ID:/path LOCAL`` or ``LOCAL ID:/path`` (directories as archives)."""
    src, dst = args.src, args.dst
    with client(args) as grove:
        if ":" in src and src.startswith("sb-"):
            sandbox_id, path = src.split(":", 1)
            sandbox = grove.attach(sandbox_id)
            try:
                entries = sandbox.list_files(path)
            except GroveError:
                entries = None
            if entries is not None:
                sandbox.download(path, dst)
            else:
                Path(dst).write_bytes(sandbox.read_file(path))
        elif ":" in dst and dst.startswith("sb-"):
            sandbox_id, path = dst.split(":", 1)
            sandbox = grove.attach(sandbox_id)
            if Path(src).is_dir():
                sandbox.upload(src, path)
            else:
                sandbox.write_file(path, Path(src).read_bytes(), mode=Path(src).stat().st_mode & 0o777)
        else:
            print("grove cp: one side must be SANDBOX_ID:/path", file=sys.stderr)
            return 2
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    """Delete sandboxes."""
    with client(args) as grove:
        for sandbox_id in args.ids:
            grove.request("DELETE", f"/v1/sandboxes/{sandbox_id}")
            print(f"deleted {sandbox_id}")
    return 0


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``ls``, ``create``, ``exec``, ``cp`` and ``rm``."""
    ls = sub.add_parser("ls", parents=[common], help="list sandboxes")
    ls.add_argument("--label", action="append", default=[], help="filter k=v (repeatable)")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_ls)

    create = sub.add_parser("create", parents=[common], help="create a sandbox, print its id")
    create.add_argument("--image", default="default")
    create.add_argument("--pool", help="claim a ready sandbox from this warm pool (`grove pool ls`)")
    create.add_argument("--checkpoint", help="start with this checkpoint's files, image and disk size "
                                             "(`grove checkpoint ls SANDBOX`)")
    create.add_argument("--cpu", type=float, help="CPU limit in cores (default 1)")
    create.add_argument("--memory-mb", type=int, help="memory limit in MiB (default 1024)")
    create.add_argument("--pids-max", type=int, help="most processes and threads (default 512)")
    create.add_argument("--disk-mb", type=int, help="disk quota in MiB; writes past it: ENOSPC (default 10240)")
    create.add_argument("--ttl", type=float, help="lifetime in seconds (default 6 h)")
    create.add_argument("--idle-timeout", type=float, help="scale to zero after this many idle seconds (default 600)")
    create.add_argument("--env", action="append", default=[], help="K=V (repeatable)")
    create.add_argument("--task", help="metadata.task_id (recorded in the trajectory; `ls --label task_id=...`)")
    create.add_argument("--model", help="metadata.model")
    create.add_argument("--harness", help="metadata.harness")
    create.add_argument("--label", action="append", default=[], metavar="K=V",
                        help="a free label in metadata.labels (repeatable; `ls --label K=V` filters on it)")
    create.set_defaults(func=cmd_create)

    ex = sub.add_parser("exec", parents=[common], help="run a command: grove exec ID -- CMD...")
    ex.add_argument("id")
    ex.add_argument("--timeout", type=float, default=600.0)
    ex.add_argument("--cwd")
    ex.add_argument("--user", help="run as this user of the sandbox (name, uid, name:group, uid:gid; default root)")
    ex.add_argument("command", nargs="+")
    ex.set_defaults(func=cmd_exec)

    cp = sub.add_parser("cp", parents=[common], help="copy files in or out: ID:/path LOCAL | LOCAL ID:/path")
    cp.add_argument("src")
    cp.add_argument("dst")
    cp.set_defaults(func=cmd_cp)

    rm = sub.add_parser("rm", parents=[common], help="delete sandboxes")
    rm.add_argument("ids", nargs="+")
    rm.set_defaults(func=cmd_rm)
