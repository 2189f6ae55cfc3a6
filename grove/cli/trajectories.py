"""``grove trajectories ls|get|export`` (and ``replay``, :mod:`grove.cli.replay`): stored trajectories, alive or not."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from grove.cli.common import client, texty, utc
from grove.cli.replay import register as register_replay

OUTCOMES = ("pass", "fail", "infra_error")
IMAGE_FORMATS = ("openai", "trl")
"""As :data:`artifacts.export_screens.IMAGE_FORMATS` (not imported here: the CLI loads the exporter only to export)."""


def cmd_trajectories(args: argparse.Namespace) -> int:
    """``ls`` (filtered), ``get ID`` (JSON), ``export`` (chat-messages JSONL for SFT)."""
    with client(args) as grove:
        if args.traj_cmd == "get":
            print(json.dumps(texty(grove.request("GET", f"/v1/trajectories/{args.id}")), indent=2))
            return 0
        items = _listed(grove, args)
        if args.traj_cmd == "ls":
            _print_table(items)
            return 0
        return _export(grove, items, args)


def _listed(grove: Any, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The stored trajectories' summaries the filters pick: task, model and harness by the router (its index),
    run and outcome here (``GET /v1/trajectories`` filters on neither; the summaries carry both)."""
    params = {k: v for k, v in (("task_id", args.task), ("model", args.model), ("harness", args.harness)) if v}
    items: list[dict[str, Any]] = grove.request("GET", "/v1/trajectories", params=params)["trajectories"]
    return [it for it in items
            if (args.run is None or it.get("run_id") == args.run)
            and (args.outcome is None or it.get("result") == args.outcome)]


def _print_table(items: list[dict[str, Any]]) -> None:
    print(f"{'SANDBOX':<20} {'CREATED (UTC)':<19} {'TASK':<24} {'MODEL':<16} {'HARNESS':<14} {'RESULT':<11} STEPS")
    for it in items:
        print(
            f"{it['sandbox_id']:<20} {utc(it.get('created_at')):<19} {it.get('task_id') or '-'!s:<24} "
            f"{it.get('model') or '-'!s:<16} {it.get('harness') or '-'!s:<14} {it.get('result') or '-'!s:<11} "
            f"{it.get('steps', '-')}"
        )


def _export(grove: Any, items: list[dict[str, Any]], args: argparse.Namespace) -> int:
    from artifacts.export import write_jsonl
    from artifacts.export_screens import ScreenOptions

    def screenshot(sha: str) -> bytes:
        # The listed trajectories are the client's project's, and so are their screenshots.
        return bytes(grove.request("GET", f"/v1/screenshots/{sha}", raw=True))

    screens = ScreenOptions(screenshot, args.keep_screenshots, args.image_format)
    records = (grove.request("GET", f"/v1/trajectories/{it['sandbox_id']}") for it in items)
    output = args.output
    out = open(output, "w", encoding="utf-8") if output != "-" else sys.stdout  # noqa: SIM115
    try:
        count = write_jsonl(records, out, screens)
    finally:
        if out is not sys.stdout:
            out.close()
    print(f"exported {count} trajectories to {output}", file=sys.stderr)
    return 0


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {value}")
    return value


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``trajectories``."""
    traj = sub.add_parser("trajectories", parents=[common], help="stored trajectories: ls, get, export")
    tsub = traj.add_subparsers(dest="traj_cmd", required=True)
    for name in ("ls", "export"):
        p = tsub.add_parser(name, parents=[common],
                            help="list" if name == "ls" else "export chat-messages JSONL for SFT")
        p.add_argument("--task", help="only this task_id's")
        p.add_argument("--model", help="only this model's")
        p.add_argument("--harness", help="only this harness's")
        p.add_argument("--run", metavar="RUN_ID",
                       help="only this rollout run's (the sandboxes' labels.run_id; filtered here, not by the router)")
        p.add_argument("--outcome", choices=OUTCOMES,
                       help="only those with this result (filtered here, not by the router)")
        if name == "export":
            p.add_argument("-o", "--output", default="-", help="file to write (default stdout)")
            p.add_argument("--keep-screenshots", type=_count, default=3, metavar="N",
                           help="computer steps: the last N screenshots stay images, older ones a text "
                                "placeholder (default 3; 0: none)")
            p.add_argument("--image-format", choices=IMAGE_FORMATS, default="openai",
                           help="openai: image_url parts with data URLs (default); trl: {\"type\": \"image\"} "
                                "placeholders and the images in the line's 'images', as TRL's vision SFT reads")
    tget = tsub.add_parser("get", parents=[common], help="one trajectory as JSON")
    tget.add_argument("id")
    traj.set_defaults(func=cmd_trajectories)
    register_replay(tsub, common)
