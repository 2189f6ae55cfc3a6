"""``grove proc`` (``start``, ``ls``, ``get``, ``logs``, ``kill``, ``wait``) and ``grove ps``: background processes."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from grove.cli.common import age, client, key_values
from grove.client.processes import ProcessInfo


def cmd_start(args: argparse.Namespace) -> int:
    """Start a background process; print its pid."""
    command: str | list[str] = args.command if len(args.command) > 1 else args.command[0]
    env = key_values(args.env, "--env") if args.env else None
    with client(args) as grove:
        started = grove.attach(args.id).processes.start(command, env=env, cwd=args.cwd, user=args.user)
    print(started.pid)
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    """List a sandbox's background processes."""
    with client(args) as grove:
        rows = grove.attach(args.id).processes.list()
    if args.json:
        print(json.dumps([row.raw for row in rows], indent=2))
        return 0
    now = time.time()
    print(f"{'PID':>7} {'STATUS':<8} {'EXIT':>4} {'AGE':>7}  COMMAND")
    for row in rows:
        print(_line(row, now))
    return 0


def cmd_get(args: argparse.Namespace) -> int:
    """One background process, as JSON."""
    with client(args) as grove:
        print(json.dumps(grove.attach(args.id).processes.get(args.pid).raw, indent=2))
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    """A background process's output (``-f``: as it comes, until it ends)."""
    with client(args) as grove:
        processes = grove.attach(args.id).processes
        if not args.follow:
            sys.stdout.buffer.write(processes.logs(args.pid))
            return 0
        for chunk in processes.follow(args.pid):
            sys.stdout.buffer.write(chunk)
            sys.stdout.buffer.flush()
    return 0


def cmd_kill(args: argparse.Namespace) -> int:
    """Signal a background process's group."""
    with client(args) as grove:
        grove.attach(args.id).processes.signal(args.pid, args.signal)
    return 0


def cmd_wait(args: argparse.Namespace) -> int:
    """Wait for a background process; exit with its exit code (124 if it still runs at ``--timeout``)."""
    deadline = time.monotonic() + args.timeout
    with client(args) as grove:
        processes = grove.attach(args.id).processes
        while True:
            left = deadline - time.monotonic()
            state = processes.wait(args.pid, timeout_s=max(0.0, min(left, 280.0)))
            if not state.running:
                return int(state.exit_code or 0)
            if left <= 280.0:
                print(f"grove: process {args.pid} still runs after {args.timeout:g}s", file=sys.stderr)
                return 124


def _line(row: ProcessInfo, now: float) -> str:
    exit_code = "-" if row.exit_code is None else str(row.exit_code)
    command = " ".join(row.command[2:] if row.command[:2] == ["/bin/sh", "-c"] else row.command)
    return f"{row.pid:>7} {row.status:<8} {exit_code:>4} {age(now - row.started_at):>7}  {command[:80]}"


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``proc`` and its subcommands, and ``ps`` (``proc ls``)."""
    ps = sub.add_parser("ps", parents=[common], help="list a sandbox's background processes (proc ls)")
    ps.add_argument("id")
    ps.add_argument("--json", action="store_true")
    ps.set_defaults(func=cmd_ls)

    proc = sub.add_parser("proc", parents=[common], help="background processes: start, ls, get, logs, kill, wait")
    verbs = proc.add_subparsers(dest="proc_cmd", required=True)
    start = verbs.add_parser("start", parents=[common], help="start one, print its pid: proc start ID -- CMD...")
    start.add_argument("id")
    start.add_argument("--cwd")
    start.add_argument("--user", help="run as this user of the sandbox (name, uid, name:group, uid:gid)")
    start.add_argument("--env", action="append", default=[], help="K=V (repeatable)")
    start.add_argument("command", nargs="+")
    start.set_defaults(func=cmd_start)
    ls = verbs.add_parser("ls", parents=[common], help="list them")
    ls.add_argument("id")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_ls)
    for name, func, text in (("get", cmd_get, "one process as JSON"), ("logs", cmd_logs, "its output"),
                             ("kill", cmd_kill, "signal its process group"),
                             ("wait", cmd_wait, "wait for it; exit with its exit code")):
        verb = verbs.add_parser(name, parents=[common], help=text)
        verb.add_argument("id")
        verb.add_argument("pid", type=int)
        verb.set_defaults(func=func)
        if name == "logs":
            verb.add_argument("-f", "--follow", action="store_true", help="stream it until the process ends")
        elif name == "kill":
            verb.add_argument("-s", "--signal", default="SIGTERM", help="signal name (default SIGTERM)")
        elif name == "wait":
            verb.add_argument("--timeout", type=float, default=600.0, help="seconds (default 600)")
