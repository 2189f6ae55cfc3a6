"""``grove rollouts run|status|report``: a task set through harnesses and models, in groups, with reports."""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any

from grove.cli.common import api_key, router_url


def cmd_run(args: argparse.Namespace) -> int:
    """Run (or resume) a rollout run and print its report."""
    from grove.rollouts import Policy, RunConfig, run_rollouts

    if args.bar == (args.attempts is not None):
        raise SystemExit("grove rollouts run: give either --attempts N or --bar --max-attempts M")
    if args.bar and not args.max_attempts:
        raise SystemExit("grove rollouts run: --bar needs --max-attempts M (the per-task budget)")
    try:
        policy = Policy(attempts=args.attempts or 0, bar_max=(args.max_attempts or 0) if args.bar else 0,
                        bar_step=args.step, bar_patience=args.patience or 0, target_groups=args.target_groups)
    except ValueError as exc:
        raise SystemExit(f"grove rollouts run: {exc}") from exc
    models: list[str | None] = list(args.model) if args.model else [None]
    variants = [(h, m) for h in args.harness for m in models]
    config = RunConfig(tasks=Path(args.tasks), out=Path(args.out), variants=variants, policy=policy,
                       concurrency=args.concurrency, max_infra_retries=args.max_infra_retries,
                       url=router_url(args), api_key=api_key(args), upload=not args.no_upload, quiet=args.quiet,
                       tasks_root=Path(args.tasks_root) if args.tasks_root else None)
    summary = run_rollouts(config)
    print((Path(args.out) / "report.md").read_text(), end="")
    print(f"\nresults in {args.out}/ (results.jsonl, groups.jsonl, summary.json, report.md)"
          + (f"; {len(summary.get('uploaded', []))} files in S3 under runs/{summary['run_id']}/"
             if summary.get("uploaded") else ""))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    """Where a run directory stands (also while its runner works, or after it died)."""
    from grove.rollouts.journal import RUN_FILE, read_journal

    out = Path(args.dir)
    if not (out / RUN_FILE).exists():
        raise SystemExit(f"grove rollouts status: {out} is not a run directory (no {RUN_FILE})")
    run: dict[str, Any] = json.loads((out / RUN_FILE).read_text())
    state = read_journal(out)
    outcomes = Counter(str(r["outcome"]) for r in state.done.values())
    faults = Counter(str(e["reason"]) for e in state.infra)
    policy = run["spec"]["policy"]
    mode = (f"fixed, {policy['attempts']} attempts" if policy["attempts"]
            else f"BAR, up to {policy['bar_max']} in steps of {policy['bar_step']}")
    print(f"run {run['run_id']}  tasks {run['spec']['tasks']}  {mode}")
    print(f"variants: {', '.join(h + (' / ' + m if m else '') for h, m in run['spec']['variants'])}")
    print(f"attempts finished: {len(state.done)}  (pass {outcomes['pass']}, fail {outcomes['fail']}, "
          f"lost to infra faults {outcomes['infra_error']})")
    print(f"tries under way or left by a stopped runner: {len(state.open_tries)}")
    print("infra faults: " + (", ".join(f"{k} {v}" for k, v in sorted(faults.items())) or "none"))
    finished = (out / "summary.json").exists() and not state.open_tries
    print("state: " + ("finished (report.md written)" if finished else "incomplete: rerun the same command to resume"))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """(Re)build a run directory's results files and print the Markdown report."""
    from grove.rollouts.report import write_reports

    write_reports(Path(args.dir))
    print((Path(args.dir) / "report.md").read_text(), end="")
    return 0


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``rollouts``."""
    ro = sub.add_parser("rollouts", parents=[common], help="run a task set through harnesses: groups, pass@k")
    rsub = ro.add_subparsers(dest="rollouts_cmd", required=True)
    run = rsub.add_parser("run", parents=[common], help="run or resume a rollout run")
    run.add_argument("tasks", help="a JSONL task file, or a directory of *.jsonl and */task.json")
    run.add_argument("--tasks-root", metavar="DIR",
                     help="where tasks' `files` paths may point (default: the task set's own directory)")
    run.add_argument("--harness", action="append", required=True,
                     help="scripted, mini-swe-agent, or module:function (repeat to compare)")
    run.add_argument("--model", action="append",
                     help="the model (repeat to compare; each harness runs with each model)")
    run.add_argument("--attempts", type=int, help="fixed groups of N attempts per task")
    run.add_argument("--bar", action="store_true", help="Balanced Adaptive Rollout: sample until informative")
    run.add_argument("--max-attempts", type=int, help="with --bar: the per-task budget")
    run.add_argument("--step", type=int, default=2, help="with --bar: attempts per stage (default 2)")
    run.add_argument("--patience", type=int,
                     help="with --bar: a group whose first P attempts all agree is filtered (default 2 x step)")
    run.add_argument("--target-groups", type=int, help="stop once this many groups are informative")
    run.add_argument("--concurrency", type=int, default=8, help="attempts in flight (default 8)")
    run.add_argument("--max-infra-retries", type=int, default=2,
                     help="fresh-sandbox retries of an attempt after infrastructure faults (default 2)")
    run.add_argument("--out", required=True, help="the run directory (rerun with the same one to resume)")
    run.add_argument("--no-upload", action="store_true", help="keep the results files local (no S3 copy)")
    run.add_argument("--quiet", action="store_true", help="no progress line")
    run.set_defaults(func=cmd_run)
    status = rsub.add_parser("status", parents=[common], help="where a run directory stands")
    status.add_argument("dir")
    status.set_defaults(func=cmd_status)
    report = rsub.add_parser("report", parents=[common], help="rebuild and print a run's report")
    report.add_argument("dir")
    report.set_defaults(func=cmd_report)
