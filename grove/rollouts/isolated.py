"""Isolated grading: an attempt's changes applied to a fresh sandbox made from the task, and graded there.

The grader is created like the agent's sandbox (same image, resources and network: a warm pool that matches
hands one over), gets the task's files and runs its setup again, so it holds the deterministic base the
changes were taken against. The changes go in — deletions first, then one tar of files, directories and
symlinks — except where the task protects a path (``check.protected``, the check's own files) or the reference
harness resets it (SWE-bench: the files the test patch touches); what was dropped, and why, is in the record.
Then :func:`grove.rollouts.grading.run_check` runs the check there.

Grove's own failures on the way (the grader does not start, its setup fails, the changes cannot be put in
place) are infrastructure faults: retried a few times with the same changes, then the attempt's try fails as
such — never scored.
"""

from __future__ import annotations

import asyncio
import contextlib
import posixpath
from collections.abc import Callable, Coroutine
from typing import Any

from grove.client import AsyncGrove, AsyncSandbox
from grove.core.errors import GroveError, NotFound
from grove.rollouts import swebench
from grove.rollouts.changes import FileChange, Manifest, as_tar, compare, diff, drop_protected
from grove.rollouts.costs import Bill
from grove.rollouts.grading import Grade, run_check
from grove.rollouts.harnesses import InfraFault
from grove.rollouts.setup import setup
from grove.rollouts.tasks import Task

Create = Callable[[dict[str, Any]], Coroutine[Any, Any, Any]]
TRIES = 3
"""Graders tried for one attempt before its try fails as an infrastructure fault."""


def protected_paths(task: Task) -> tuple[str, ...]:
    """What the agent's changes never reach at grading: the task's protected globs and the check's own files
    (relative to the workdir)."""
    own = tuple(posixpath.relpath(p, task.workdir) if p.startswith("/") else p for p in task.check.files)
    return (*task.check.protected, *(p for p in own if not p.startswith("..")))


def mark_dropped(task: Task, changes: list[FileChange]) -> None:
    """Mark what grading will not take: protected paths, and for SWE-bench the files the test patch resets."""
    drop_protected(changes, protected_paths(task))
    if task.check.swebench is not None:
        drop_protected(changes, tuple(swebench.patched_files(task.check.swebench["test_patch"])),
                       reason="reset by the test patch")


async def grade(client: AsyncGrove, create: Create, body: dict[str, Any], task: Task, changes: list[FileChange],
                base: Manifest, *, bill: Bill) -> tuple[Grade, str | None]:
    """Grade ``changes`` (taken against ``base``, the agent's state after setup) in a fresh sandbox; the grade
    and the grader's id. ``body`` is the create body of the grader (the agent's, relabelled); ``bill``: where
    each grader's cost goes once it is deleted (those that failed too)."""
    failures: list[str] = []
    for attempt in range(TRIES):
        try:
            return await _grade_once(client, create, {**body, "request_id": f"{body['request_id']}-g{attempt}"},
                                     task, changes, base, bill)
        except (GroveError, OSError) as exc:
            if isinstance(exc, InfraFault) and exc.code == "check_broken":
                raise  # the check itself gives no verdict: not the grader's doing, no use retrying it
            failures.append(f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(0.5 * (attempt + 1))
    raise InfraFault(f"isolated grading failed {TRIES} times: {'; '.join(failures)[-800:]}", reason="grading_failed")


async def _grade_once(client: AsyncGrove, create: Create, body: dict[str, Any], task: Task,
                      changes: list[FileChange], base: Manifest, bill: Bill) -> tuple[Grade, str]:
    info = await create(body)
    grader = AsyncSandbox(client, info)
    grader.start_heartbeat()
    try:
        await grader.post_event("grading", {"status": "started", "mode": "isolated", "task_id": task.id})
        detail: dict[str, Any] = {}
        drift = compare(base, await setup(grader, task, prompt=False))
        if drift:
            # The task's setup does not make the same files twice: the changes still apply (whole files), but the
            # base they are graded on is not exactly the one the agent had.
            detail["setup_differs"] = [c.path for c in drift][:50]
        await _diffs(grader, task.workdir, changes)
        await _apply(grader, task.workdir, changes)
        verdict = await run_check(grader, task)
        verdict.detail = {**verdict.detail, **detail}
        await grader.post_event("grading", {"status": "finished", "mode": "isolated", "result":
                                            "pass" if verdict.passed else "fail", "reward": verdict.reward})
        return verdict, grader.id
    finally:
        await bill.close(grader)


async def _diffs(grader: AsyncSandbox, workdir: str, changes: list[FileChange]) -> None:
    """Unified diffs of the text files changed, against the base the grader holds (before anything is applied)."""
    for change in changes:
        if change.kind != "file" or change.content is None or change.binary:
            continue
        before = b""
        if change.status in ("modified", "mode"):
            try:
                before = await grader.read_file(posixpath.join(workdir, change.path))
            except (NotFound, GroveError):
                before = b""  # a directory or link before: the whole file is new text
        change.diff, change.diff_truncated = diff(change.path, before, change.content)


async def _apply(grader: AsyncSandbox, workdir: str, changes: list[FileChange]) -> None:
    """Deletions first (the deepest paths go with their directory), then everything else as one tar."""
    for change in changes:
        if change.dropped is None and change.kind == "symlink" and (change.target or "").startswith("/"):
            # The archive API makes no link that leads out of its target: grading does not either.
            change.dropped = f"a symlink out of the workdir (to {change.target!r}) is not put in place"
        elif change.dropped is None and change.kind == "other":
            change.dropped = "a FIFO, socket or device is not put in place"
    taken = [c for c in changes if c.dropped is None]
    for change in taken:
        if change.status == "deleted" or (change.kind_before is not None and change.kind_before != change.kind):
            with contextlib.suppress(NotFound):  # its directory went first
                await grader.delete_file(posixpath.join(workdir, change.path), recursive=True)
    put = [c for c in taken if c.status != "deleted" and (c.kind != "file" or c.content is not None)]
    if put:
        await grader.upload_tar(as_tar(put), workdir)
    for change in taken:
        change.applied = change.status == "deleted" or change.kind != "file" or change.content is not None
