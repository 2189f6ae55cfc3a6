"""``grove checkpoint create|ls|rm`` and ``grove fork``: checkpoints of sandboxes, and sandboxes made from them
(``grove create --checkpoint ID`` restores one)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from grove.cli.common import client, utc

_HEADER = f"{'CHECKPOINT':<20} {'STEP':>5} {'TAKEN (UTC)':<19} {'MIB':>8} {'FROZEN MS':>10}  COPY-ON-WRITE"


def _row(made: dict[str, Any]) -> str:
    return (f"{made['id']:<20} {made['step']:>5} {utc(made['created_at']):<19} {made['bytes'] / (1 << 20):>8.1f} "
            f"{made['frozen_ms']:>10.1f}  {'yes' if made['copy_on_write'] else 'no (full copy)'}")


def cmd_checkpoint(args: argparse.Namespace) -> int:
    """Take, list and delete a sandbox's checkpoints."""
    with client(args) as grove:
        sandbox = grove.attach(args.sandbox)
        if args.checkpoint_cmd == "create":
            made = sandbox.checkpoint()
            print(json.dumps(made, indent=2) if args.json else made["id"])
        elif args.checkpoint_cmd == "ls":
            rows = sandbox.checkpoints()
            print(json.dumps(rows, indent=2) if args.json else "\n".join([_HEADER, *map(_row, rows)]))
        else:
            sandbox.delete_checkpoint(args.checkpoint)
            print(f"deleted checkpoint {args.checkpoint} of {args.sandbox}")
    return 0


def cmd_fork(args: argparse.Namespace) -> int:
    """Fork a sandbox into N; print the children's ids."""
    with client(args) as grove:
        children = grove.attach(args.sandbox).fork(args.count)
    for child in children:
        print(json.dumps(child.info, indent=2) if args.json else child.id)
    return 0


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``checkpoint`` and ``fork``."""
    checkpoint = sub.add_parser("checkpoint", parents=[common],
                                help="a sandbox's files kept at one instant (copy-on-write); "
                                     "`grove create --checkpoint ID` starts a sandbox from one")
    csub = checkpoint.add_subparsers(dest="checkpoint_cmd", required=True)
    for name, help_text in (("create", "checkpoint a sandbox now; prints the checkpoint's id"),
                            ("ls", "a sandbox's checkpoints"), ("rm", "delete one checkpoint")):
        cmd = csub.add_parser(name, parents=[common], help=help_text)
        cmd.add_argument("sandbox")
        if name == "rm":
            cmd.add_argument("checkpoint")
        cmd.add_argument("--json", action="store_true", help="print the API's JSON")
    checkpoint.set_defaults(func=cmd_checkpoint)
    fork = sub.add_parser("fork", parents=[common],
                          help="N new sandboxes with a sandbox's files as they are now (files only; it keeps running)")
    fork.add_argument("sandbox")
    fork.add_argument("-n", "--count", type=int, default=1, help="how many (1-64, default 1)")
    fork.add_argument("--json", action="store_true", help="print each child's record")
    fork.set_defaults(func=cmd_fork)
