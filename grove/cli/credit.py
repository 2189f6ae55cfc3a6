"""``grove rollouts progress RUN`` (per-step success estimates of a run's attempts) and ``grove rollouts export RUN
--sft credit|plain`` (training sets of a run's trajectories)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from grove.cli.common import client, router_and_key


def cmd_progress(args: argparse.Namespace) -> int:
    """Estimate, write ``progress.jsonl``, print the rising spans."""
    from grove.rollouts.continuations import PROGRESS_FILE, ProgressConfig, aprogress

    url, key = router_and_key(args)
    config = ProgressConfig(run=Path(args.run), continuations=args.continuations, turns=args.steps,
                            include_resolved=args.include_resolved, teacher=args.teacher, min_rise=args.min_rise,
                            concurrency=args.concurrency, max_infra_retries=args.max_infra_retries,
                            release=args.release, url=url, api_key=key)
    lines = asyncio.run(aprogress(config))
    for line in lines:
        if line.get("rising"):
            print(f"rising: {line['task']} attempt {line['attempt']} turns {line['span'][0]}-{line['span'][1]}: "
                  f"{line['estimate'] - line['rise']:.2f} -> {line['estimate']:.2f}")
    print(f"{len(lines)} estimates of {len({line['trajectory_id'] for line in lines})} attempts in "
          f"{Path(args.run) / PROGRESS_FILE} ({sum(bool(line.get('rising')) for line in lines)} rising spans)")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """Write the run's training set: its rising spans (``credit``), or every trajectory as chat (``plain``)."""
    from artifacts.export import to_chat
    from grove.rollouts.continuations import PROGRESS_FILE
    from grove.rollouts.credit import write_credit

    run = Path(args.run)
    results = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines() if line]
    with client(args) as grove, _output(args.output) as out:
        if args.sft == "credit":
            path = run / PROGRESS_FILE
            if not path.exists():
                raise SystemExit(f"grove rollouts export: {path} does not exist: run `grove rollouts progress {run}` "
                                 "first (--sft credit trains on the spans it finds)")
            progress = [json.loads(line) for line in path.read_text().splitlines() if line]
            ids = sorted({str(line["trajectory_id"]) for line in progress})
            records = (grove.request("GET", f"/v1/trajectories/{sid}") for sid in ids)
            count = write_credit(records, progress, out)
        else:
            count = 0
            for row in results:
                if row.get("trajectory_id") and row.get("outcome") in ("pass", "fail"):
                    out.write(json.dumps(to_chat(grove.request("GET", f"/v1/trajectories/{row['trajectory_id']}")))
                              + "\n")
                    count += 1
    print(f"exported {count} {'rising spans' if args.sft == 'credit' else 'trajectories'} to {args.output}",
          file=sys.stderr)
    return 0


@contextlib.contextmanager
def _output(name: str) -> Iterator[IO[str]]:
    if name == "-":
        yield sys.stdout
        return
    with open(name, "w", encoding="utf-8") as out:
        yield out


def _turns(text: str) -> tuple[int, ...]:
    try:
        turns = tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--steps {text!r}: give turn numbers like 0,3,5") from None
    if not turns or min(turns) < 0:
        raise argparse.ArgumentTypeError(f"--steps {text!r}: give turn numbers >= 0, like 0,3,5")
    return turns


def register(rsub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``rollouts progress`` and ``rollouts export``."""
    p = rsub.add_parser("progress", parents=[common],
                        help="per-step success estimates of a run's attempts (N resumed continuations per step)")
    p.add_argument("run", help="the run directory")
    p.add_argument("--continuations", type=int, default=4, metavar="N", help="continuations per step (default 4)")
    p.add_argument("--steps", type=_turns, metavar="T,T,...",
                   help="the turns to estimate (0: right after setup; default: every turn, or the turns the run "
                        "kept checkpoints at)")
    p.add_argument("--include-resolved", action="store_true", help="the resolved attempts too (default: unresolved)")
    p.add_argument("--teacher", metavar="MODULE:FUNCTION",
                   help="function(trajectory, outcome) -> list[float] (one per turn) gives the estimates instead")
    p.add_argument("--min-rise", type=float, default=0.0, help="a rise above this makes a rising span (default 0)")
    p.add_argument("--concurrency", type=int, default=4, help="continuations in flight (default 4)")
    p.add_argument("--max-infra-retries", type=int, default=2,
                   help="fresh-sandbox retries of a continuation after infrastructure faults (default 2)")
    p.add_argument("--release", action="store_true",
                   help="then delete the sandboxes (and checkpoints) the run kept with --checkpoint-every (else the "
                        "router deletes them 24 h after their attempt)")
    p.set_defaults(func=cmd_progress)
    e = rsub.add_parser("export", parents=[common], help="a run's training set as JSONL")
    e.add_argument("run", help="the run directory")
    e.add_argument("--sft", choices=("credit", "plain"), required=True,
                   help="credit: rising spans as targets, earlier turns as context, tool answers masked (needs "
                        "`rollouts progress` first); plain: every scored trajectory as chat messages")
    e.add_argument("-o", "--output", default="-", help="file to write (default stdout)")
    e.set_defaults(func=cmd_export)
