"""``grove trajectories ls|get|export``: stored trajectories, alive or not."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from grove.cli.common import client, texty


def cmd_trajectories(args: argparse.Namespace) -> int:
    """``ls`` (filtered), ``get ID`` (JSON), ``export`` (chat-messages JSONL for SFT)."""
    from artifacts.export import write_jsonl

    params = {k: v for k, v in (("task_id", args.task), ("model", args.model), ("harness", args.harness)) if v}
    with client(args) as grove:
        if args.traj_cmd == "get":
            print(json.dumps(texty(grove.request("GET", f"/v1/trajectories/{args.id}")), indent=2))
            return 0
        items = grove.request("GET", "/v1/trajectories", params=params)["trajectories"]
        if args.traj_cmd == "ls":
            print(f"{'SANDBOX':<20} {'TASK':<24} {'MODEL':<16} {'HARNESS':<14} {'RESULT':<11} STEPS")
            for it in items:
                print(
                    f"{it['sandbox_id']:<20} {it.get('task_id') or '-'!s:<24} {it.get('model') or '-'!s:<16} "
                    f"{it.get('harness') or '-'!s:<14} {it.get('result') or '-'!s:<11} {it.get('steps', '-')}"
                )
            return 0
        records = (grove.request("GET", f"/v1/trajectories/{it['sandbox_id']}") for it in items)
        out = open(args.output, "w", encoding="utf-8") if args.output != "-" else sys.stdout  # noqa: SIM115
        try:
            count = write_jsonl(records, out)
        finally:
            if out is not sys.stdout:
                out.close()
    print(f"exported {count} trajectories to {args.output}", file=sys.stderr)
    return 0


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``trajectories``."""
    traj = sub.add_parser("trajectories", parents=[common], help="stored trajectories: ls, get, export")
    tsub = traj.add_subparsers(dest="traj_cmd", required=True)
    for name in ("ls", "export"):
        p = tsub.add_parser(name, parents=[common],
                            help="list" if name == "ls" else "export chat-messages JSONL for SFT")
        p.add_argument("--task")
        p.add_argument("--model")
        p.add_argument("--harness")
        if name == "export":
            p.add_argument("-o", "--output", default="-", help="file to write (default stdout)")
    tget = tsub.add_parser("get", parents=[common], help="one trajectory as JSON")
    tget.add_argument("id")
    traj.set_defaults(func=cmd_trajectories)
