"""``grove rollouts run|status|report``: a task set through harnesses and models, in groups, with reports
(``progress|export``: :mod:`grove.cli.credit`)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

from grove.cli.common import router_and_key
from grove.cli.credit import register as register_credit

INTERRUPTED = 130
"""The exit code of a run stopped with Ctrl-C (128 + SIGINT, as a shell reports it)."""
STOP_GRACE_S = 10.0
"""How long a Ctrl-C'd run may take to stop its attempts in flight (deleting their sandboxes) before it just exits:
the run directory's journal is written durably as it goes, and a resume cleans up whatever was left."""


def cmd_run(args: argparse.Namespace) -> int:
    """Run (or resume) a rollout run and print its report."""
    from grove.rollouts import Policy, RunConfig

    if args.bar == (args.attempts is not None):
        raise SystemExit("grove rollouts run: give either --attempts N or --bar --max-attempts M")
    if args.checkpoint_every < 0:
        raise SystemExit("grove rollouts run: --checkpoint-every K needs K >= 1 (0: keep none)")
    if args.bar and not args.max_attempts:
        raise SystemExit("grove rollouts run: --bar needs --max-attempts M (the per-task budget)")
    try:
        policy = Policy(attempts=args.attempts or 0, bar_max=(args.max_attempts or 0) if args.bar else 0,
                        bar_step=args.step, bar_patience=args.patience or 0, target_groups=args.target_groups)
    except ValueError as exc:
        raise SystemExit(f"grove rollouts run: {exc}") from exc
    models: list[str | None] = list(args.model) if args.model else [None]
    variants = [(h, m) for h in args.harness for m in models]
    url, key = router_and_key(args)
    config = RunConfig(tasks=Path(args.tasks), out=Path(args.out), variants=variants, policy=policy,
                       concurrency=args.concurrency, max_infra_retries=args.max_infra_retries,
                       url=url, api_key=key, upload=not args.no_upload, quiet=args.quiet,
                       tasks_root=Path(args.tasks_root) if args.tasks_root else None,
                       checkpoint_every=args.checkpoint_every)
    summary = _run_stoppably(config)
    if summary is None:
        print(f"\ngrove rollouts: interrupted; rerun the same command to resume ({args.out} keeps what is done)",
              file=sys.stderr, flush=True)
        return INTERRUPTED
    print((Path(args.out) / "report.md").read_text(), end="")
    print(f"\nresults in {args.out}/ (results.jsonl, groups.jsonl, summary.json, report.md)"
          + (f"; {len(summary.get('uploaded', []))} files in S3 under runs/{summary['run_id']}/"
             if summary.get("uploaded") else ""))
    return 0


def _run_stoppably(config: Any) -> dict[str, Any] | None:
    """Run the rollouts; the summary, or None if Ctrl-C stopped them.

    The first Ctrl-C cancels the run (each attempt in flight deletes its sandbox on the way out) and gives it
    :data:`STOP_GRACE_S` to stop; a second one, or the grace running out, ends the process at once. The signal
    is handled here, not by asyncio (which would raise KeyboardInterrupt out of the loop and leave aiohttp's
    sessions to be reported unclosed), and in the main thread, so that it is heard even while the loop waits.
    """
    from grove.rollouts import arun_rollouts

    main: list[asyncio.Task[Any]] = []
    stopping = threading.Event()

    async def run() -> dict[str, Any]:
        me = asyncio.current_task()
        assert me is not None
        main.append(me)
        try:
            return await arun_rollouts(config)
        finally:
            if stopping.is_set():  # the attempts cancelled with the run are deleting their sandboxes: let them
                others = asyncio.all_tasks() - {me}
                if others:
                    await asyncio.wait(others, timeout=STOP_GRACE_S)

    def quit_now() -> None:
        print("\ngrove rollouts: interrupted; rerun the same command to resume", file=sys.stderr, flush=True)
        os._exit(INTERRUPTED)

    with asyncio.Runner() as runner:
        loop = runner.get_loop()

        def on_sigint(signum: int, frame: object) -> None:
            if stopping.is_set():
                quit_now()
            stopping.set()
            print("\ngrove rollouts: stopping the attempts in flight (Ctrl-C again to quit at once) ...",
                  file=sys.stderr, flush=True)
            loop.set_exception_handler(lambda _loop, _context: None)  # what a stopped run leaves unclosed goes with it
            if not main:
                quit_now()  # nothing started yet: nothing to stop
            loop.call_soon_threadsafe(_cancel, loop, main[0])
            watchdog = threading.Timer(STOP_GRACE_S, quit_now)
            watchdog.daemon = True
            watchdog.start()

        previous = signal.signal(signal.SIGINT, on_sigint)
        try:
            return runner.run(run())
        except BaseException:
            if stopping.is_set():
                return None  # cancelled, or whatever the attempts raised on the way out: the journal has the rest
            raise
        finally:
            signal.signal(signal.SIGINT, previous)


def _cancel(loop: asyncio.AbstractEventLoop, main: asyncio.Task[Any]) -> None:
    """Cancel the attempts in flight, and the run once they are done: each attempt stops its harness thread and
    deletes its sandbox on the way out. The run, which waits for the harness threads as it unwinds (a blocking
    join on the loop), must not get there before every attempt has told its thread to stop: cancelled first, it
    would wait on threads that wait on the loop."""
    attempts = asyncio.all_tasks(loop) - {main}
    for task in attempts:
        task.cancel()
    if attempts:
        loop.create_task(_cancel_after(attempts, main))
    else:
        main.cancel()


async def _cancel_after(attempts: set[asyncio.Task[Any]], main: asyncio.Task[Any]) -> None:
    await asyncio.wait(attempts)
    main.cancel()  # a no-op if the run ended with its attempts, as it does when it was waiting on them


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
    print(f"harness errors: {outcomes['harness_error']}" + ("  (never scored; see report.md's \"Harness errors\")"
                                                          if outcomes["harness_error"] else ""))
    print(f"tries under way or left by a stopped runner: {len(state.open_tries)}")
    print("infra faults: " + (", ".join(f"{k} {v}" for k, v in sorted(faults.items())) or "none"))
    if state.unreachable:
        print(f"router unreachable: {state.unreachable} time(s); the runner waited for it and went on")
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
    run.add_argument("--checkpoint-every", type=int, default=0, metavar="K",
                     help="checkpoint each attempt after setup and every K agent turns for `rollouts progress` "
                          "(their ids in results.jsonl as `checkpoints`; the attempt's sandbox is kept, idle, for "
                          "24 h or until `rollouts progress --release`)")
    run.set_defaults(func=cmd_run)
    status = rsub.add_parser("status", parents=[common], help="where a run directory stands")
    status.add_argument("dir")
    status.set_defaults(func=cmd_status)
    report = rsub.add_parser("report", parents=[common], help="rebuild and print a run's report")
    report.add_argument("dir")
    report.set_defaults(func=cmd_report)
    register_credit(rsub, common)
