"""``grove trajectories replay ID``: re-run a stored trajectory in a fresh sandbox and say which steps matched."""

from __future__ import annotations

import argparse
import json
from typing import Any

from grove.cli.common import client


def cmd_replay(args: argparse.Namespace) -> int:
    """Replay; a line per step (``--json``: the whole report). Exit 0 when every non-volatile step matched, else 1."""
    body: dict[str, Any] = {"keep": args.keep}
    if args.until is not None:
        body["until"] = args.until
    if args.env:
        body["env"] = dict(_pair(e) for e in args.env)
    if args.volatile:
        body["volatile"] = args.volatile
    with client(args) as grove:
        report: dict[str, Any] = grove.request("POST", f"/v1/trajectories/{args.id}/replay", json_body=body)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for step in report["steps"]:
            what = step.get("command") or step.get("path")
            mark = "ok  " if step["match"] else "DIFF"
            why = step.get("reason") or ", ".join(step.get("differs") or [])
            print(f"{mark} #{step['index']:<4} {step['type']:<11} {str(what)[:70]}{'  (' + why + ')' if why else ''}")
        for step in report["volatile"]:
            print(f"vol  #{step['index']:<4} {step['type']:<11} {str(step.get('command'))[:70]}")
        kept = f"; sandbox {report['sandbox_id']} holds the state" if report["kept"] else ""
        print(f"{report['matched']}/{report['total']} steps matched ({len(report['volatile'])} volatile){kept}")
    return 0 if report["matched"] == report["total"] else 1


def _pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--env {text!r}: use KEY=VALUE")
    return key, value


def register(tsub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``trajectories replay``."""
    p = tsub.add_parser("replay", parents=[common],
                        help="re-run a trajectory's commands and file writes in a fresh sandbox; compare each step")
    p.add_argument("id")
    p.add_argument("--until", type=int, metavar="STEP", help="replay up to this step index (inclusive)")
    p.add_argument("--env", action="append", metavar="KEY=VALUE",
                   help="a value of the env the trajectory ran with (the record keeps only keys); repeatable")
    p.add_argument("--volatile", action="append", metavar="REGEX",
                   help="commands whose output may differ: run, reported apart; repeatable")
    p.add_argument("--keep", action=argparse.BooleanOptionalAction, default=False,
                   help="keep the replayed sandbox (the rebuilt state) instead of deleting it (default: delete)")
    p.add_argument("--json", action="store_true", help="print the whole report as JSON")
    p.set_defaults(func=cmd_replay)
