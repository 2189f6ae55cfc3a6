"""The rollout engine: tasks, times variants (harness, model), times attempts, driven through a grove router.

Concurrency is a cap on tries in flight; a 503 with ``Retry-After`` on create pauses every new create
that long (back-pressure) and retries the same ``request_id``. Each try's create carries a request id
derived from (run, group, attempt, try), and every try is journaled before it acts, so a rerun on the
same run directory skips finished attempts, deletes the sandboxes of tries a dead runner left, and runs
each remaining attempt once more — never an attempt twice, never a duplicate sandbox.

Before the first attempt every image the tasks name is asked for (a missing one stops the run at once, with
the router's list of images). A router that cannot be reached is not back-pressure: creates wait for it (and
say so), and the sandboxes of tries it cut short are deleted once it answers again. A harness that raises
(its own bug) makes the attempt ``harness_error``: said on stderr at once, never scored; after
``max_harness_errors`` of them in a row the run stops with the reason.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from grove.client import AsyncGrove
from grove.core.errors import GroveError, Invalid, NotFound, Unavailable, Unreachable
from grove.rollouts.attempt import TryIds, reason_of, run_try
from grove.rollouts.browser import judge
from grove.rollouts.harnesses import Harness, InfraFault, resolve
from grove.rollouts.journal import UNSCORED, AttemptKey, Journal, open_run, read_journal
from grove.rollouts.progress import Progress
from grove.rollouts.sampling import GroupKey, Policy, Sampler
from grove.rollouts.tasks import Task, TaskFileError, load_tasks

CREATE_PATIENCE_S = 600.0
UNREACHABLE_PATIENCE_S = 900.0
"""How long creates wait for a router that cannot be reached before the run gives up."""


class FailedStart(InfraFault):
    """The sandbox did not start."""

    code = "failed_start"


class HarnessBroken(Invalid):
    """The harness failed (raised) on too many attempts in a row: the run stopped early, with its last error."""


@dataclass
class RunConfig:
    """One ``grove rollouts run``."""

    tasks: Path
    out: Path
    variants: list[tuple[str, str | None]]
    """(harness, model) pairs; reports compare them side by side."""
    policy: Policy
    concurrency: int = 8
    max_infra_retries: int = 2
    """Fresh-sandbox retries of an attempt after infrastructure faults; then it is reported lost."""
    url: str | None = None
    api_key: str | None = field(default=None, repr=False)
    upload: bool = True
    """Copy the run's files to S3 (``runs/<run_id>/``) through the router."""
    quiet: bool = False
    tasks_root: Path | None = None
    """Where task ``files`` paths may point (default: the task set's own directory)."""
    max_harness_errors: int = 5
    """Stop the run after this many attempts in a row whose harness raised (``harness_error``)."""
    checkpoint_every: int = 0
    """Checkpoint each attempt after setup and every this many agent turns (0: none), for progress runs: each
    attempt's result lists them (``checkpoints``) and its sandbox is kept for them (:mod:`grove.rollouts.keeping`)."""

    def spec(self) -> dict[str, Any]:
        """What must match when a run directory is resumed."""
        return {"tasks": str(self.tasks.resolve()), "variants": [list(v) for v in self.variants],
                "policy": asdict(self.policy), "max_infra_retries": self.max_infra_retries}


def group_id(task_id: str, variant: int) -> str:
    """The group of a task under a variant."""
    return f"{task_id}/{variant}"


class Runner:
    """Runs a :class:`RunConfig` to completion (or resumes it)."""

    def __init__(self, config: RunConfig, client: AsyncGrove) -> None:
        self.config, self.client = config, client
        self.tasks: dict[str, Task] = {t.id: t for t in load_tasks(config.tasks, files_root=config.tasks_root)}
        self.harnesses: list[Harness] = [resolve(h, m) for h, m in config.variants]
        for task in self.tasks.values():
            if task.check.judge:  # a judge that cannot be imported fails now, not at the first grade
                try:
                    judge.resolve(task.check.judge)
                except Invalid as exc:
                    raise TaskFileError(f"task {task.id}: field 'check.judge': {exc.message}") from exc
        # Resuming with edited tasks would mix two task sets in one run's groups: the digest must match.
        digest = hashlib.sha256(json.dumps([t.raw for t in self.tasks.values()], sort_keys=True).encode())
        self.run = open_run(config.out, {**config.spec(), "tasks_sha256": digest.hexdigest()})
        self.run_id: str = self.run["run_id"]
        self.state = read_journal(config.out)
        groups: list[GroupKey] = [(v, t) for t in self.tasks for v in range(len(self.harnesses))]
        self.sampler = Sampler(config.policy, groups)
        self.progress = Progress(quiet=config.quiet)
        self._resume_at = 0.0
        self._journal: Journal | None = None
        self._harness_errors_in_a_row = 0
        self.concurrency = config.concurrency
        """Attempts in flight: ``config.concurrency``, unless the router cannot hold their sandboxes."""
        self._orphans: list[dict[str, str]] = []
        """Labels of tries whose sandboxes could not be deleted (the router was away): deleted when it is back."""

    async def execute(self) -> None:
        """Resume what a previous runner left, then sample until the policy is satisfied."""
        await self.client.list({"run_id": self.run_id})  # the router answers and takes the key, or a clear error now
        await self._check_images()
        await self._fit_concurrency()
        self._journal = Journal(self.config.out)
        try:
            await self._clean_up_interrupted()
            rerun: list[AttemptKey] = []
            for (variant, task, attempt), result in self.state.done.items():
                self.sampler.launched((variant, task), attempt)
                self.sampler.finished((variant, task), attempt, _reward(result))
                self.progress.finished(str(result["outcome"]))
            for key in self.state.tries:
                if key not in self.state.done:
                    self.sampler.launched((key[0], key[1]), key[2])
                    rerun.append(key)
            self.progress.resumed = len(self.state.done)
            self.progress.infra = len(self.state.infra)
            with ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="harness") as pool:
                await self._loop(rerun, pool)
            await self._delete_orphans(wait_s=UNREACHABLE_PATIENCE_S)
        finally:
            self.progress.close()
            self._journal.close()

    async def _fit_concurrency(self) -> None:
        """Attempts in flight hold a sandbox each, two while an isolated grade runs: more than the router's
        ``max_sandboxes`` could leave every attempt holding its agent's sandbox and waiting for a grader."""
        per_attempt = 2 if any(t.check.grading == "isolated" for t in self.tasks.values()) else 1
        health = await self.client.request("GET", "/healthz")
        most = health.get("max_sandboxes") if isinstance(health, dict) else None
        holder = "the router holds"
        quota = await self._sandbox_quota()
        if quota is not None and (not isinstance(most, int) or quota < most):
            most, holder = quota, "the key's project may hold"
        if isinstance(most, int) and self.concurrency * per_attempt > most:
            self.concurrency = max(1, most // per_attempt)
            self.progress.say(f"{holder} at most {most} sandboxes and each attempt needs {per_attempt} "
                              f"(its own and, while it grades, a grader's): running {self.concurrency} at a time")

    async def _sandbox_quota(self) -> int | None:
        """The ``sandboxes`` quota of the key's project, if it has one (a router from before projects: None)."""
        try:
            body = await self.client.request("GET", "/v1/projects")
        except GroveError:
            return None
        projects = body.get("projects") if isinstance(body, dict) else None
        if not isinstance(projects, list) or len(projects) != 1:
            return None
        quota = (projects[0].get("quotas") or {}).get("sandboxes")
        return quota if isinstance(quota, int) else None

    async def _check_images(self) -> None:
        """Every image the tasks name exists, or can be pulled, before anything runs (a missing one is the task
        set's fault: no attempt would ever start)."""
        users: dict[str, list[str]] = {}
        for task in self.tasks.values():
            users.setdefault(task.image, []).append(task.id)
        for image, ids in sorted(users.items()):
            try:
                await self.client.request("GET", f"/v1/images/{image}")
            except NotFound as exc:
                named = ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
                raise Invalid(f"task(s) {named} need the image {image!r}, which the router cannot provide: "
                              f"{exc.message}") from None

    async def _loop(self, rerun: list[AttemptKey], pool: ThreadPoolExecutor) -> None:
        running: set[asyncio.Task[None]] = set()
        try:
            await self._fill(rerun, pool, running)
        finally:
            # A stop (Ctrl-C, HarnessBroken, a runner bug) ends the attempts in flight here, on the loop: each one
            # deletes its sandbox as it is cancelled. Left alone, they would wait on harness threads that in turn
            # wait on this loop, and the stop would hang.
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)

    async def _fill(self, rerun: list[AttemptKey], pool: ThreadPoolExecutor, running: set[asyncio.Task[None]]) -> None:
        """Keep ``concurrency`` attempts running until the sampler is done; ``running`` is the caller's, to stop."""
        while True:
            room = self.concurrency - len(running)
            starts = [rerun.pop(0) for _ in range(min(room, len(rerun)))]
            starts += [(g[0], g[1], a) for g, a in self.sampler.next(room - len(starts))]
            for key in starts:
                running.add(asyncio.create_task(self._attempt(key, pool)))
            self.progress.running = len(running)
            self.progress.remaining = self._remaining()
            self.progress.draw()
            if not running:
                if self.sampler.done():
                    return
                raise RuntimeError("the sampler is neither done nor starting anything")  # a sampler bug
            finished, _ = await asyncio.wait(running, timeout=0.5, return_when=asyncio.FIRST_COMPLETED)
            running -= finished
            for task in finished:
                task.result()  # a bug in the runner itself (or a stop: HarnessBroken) must not pass silently
            if self._orphans:
                await self._delete_orphans(wait_s=0.0)

    def _remaining(self) -> int:
        left = 0
        for state in self.sampler.groups.values():
            left += max(0, (state.stage_end or (self.config.policy.attempts or self.config.policy.bar_step))
                        - len(state.rewards))
        return left

    async def _attempt(self, key: AttemptKey, pool: ThreadPoolExecutor) -> None:
        variant, task_id, attempt = key
        task, harness = self.tasks[task_id], self.harnesses[variant]
        gid = group_id(task_id, variant)
        entry = {"variant": variant, "task": task_id, "attempt": attempt}
        faults = [e["reason"] for e in self.state.infra if (e["variant"], e["task"], e["attempt"]) == key]
        try_no = self.state.tries.get(key, 0)
        sandbox_s = 0.0
        while True:
            request_id = "ro-" + hashlib.sha256(f"{self.run_id}/{gid}/{attempt}/{try_no}".encode()).hexdigest()[:40]
            ids = TryIds(self.run_id, gid, attempt, try_no, request_id)
            self._write({**entry, "e": "try", "try": try_no, "request_id": request_id})
            started = time.monotonic()
            try:
                out = await run_try(self.client, task, harness, ids, pool=pool,
                                    create=lambda body: self._create(body, entry),
                                    checkpoint_every=self.config.checkpoint_every,
                                    on_sandbox=lambda sid: self._write({**entry, "e": "sandbox", "sandbox_id": sid}))
            except (GroveError, OSError) as exc:
                if isinstance(exc, GroveError) and exc.status == 401:
                    raise  # a wrong API key fails every attempt alike: stop the run
                reason = reason_of(exc)
                await self._discard(gid, attempt, try_no)
                faults.append(reason)
                sandbox_s += time.monotonic() - started
                self._write({**entry, "e": "infra", "try": try_no, "reason": reason, "message": str(exc)[:500]})
                self.progress.infra += 1
                if len(faults) > self.config.max_infra_retries:
                    out = {"outcome": "infra_error", "reward": None, "sandbox_s": 0.0}
                    break
                try_no += 1
                continue
            break
        result = {"run_id": self.run_id, "task": task_id, "group_id": gid, "attempt": attempt, "variant": variant,
                  "harness": harness.name, "harness_version": harness.version, "model": harness.model,
                  **out, "infra_errors": faults, "tries": try_no + 1,
                  "sandbox_s": round(sandbox_s + float(out.get("sandbox_s") or 0), 3)}
        self._write({**entry, "e": "done", "result": result})
        self.state.done[key] = result
        self.sampler.finished((variant, task_id), attempt, _reward(result))
        self.progress.finished(str(result["outcome"]))
        if result["outcome"] == "harness_error":
            self._harness_errors_in_a_row += 1
            self.progress.say(f"harness error in {task_id} attempt {attempt} ({harness.label}): "
                              f"{result['harness_error']['error']} (traceback in results.jsonl and the trajectory)")
            if self._harness_errors_in_a_row >= self.config.max_harness_errors:
                raise HarnessBroken(f"the harness {harness.label!r} raised on {self._harness_errors_in_a_row} attempts "
                                    f"in a row; the run stopped (rerun the same command to resume once it is fixed). "
                                    f"The last: {result['harness_error']['error']}")
        else:
            self._harness_errors_in_a_row = 0

    async def _create(self, body: dict[str, Any], entry: dict[str, Any]) -> Any:
        """Create with back-pressure: a busy router (503 + Retry-After) pauses every create, then the same
        request id is retried; a sandbox that failed to start is an infrastructure fault."""
        deadline = time.monotonic() + CREATE_PATIENCE_S
        while True:
            if (wait := self._resume_at - time.monotonic()) > 0:
                await asyncio.sleep(wait)
            try:
                return await self.client.request("POST", "/v1/sandboxes", json_body=body)
            except Unreachable as exc:
                # The router is down or away, not busy: wait for it (the same request id finds what it made).
                if time.monotonic() > deadline + UNREACHABLE_PATIENCE_S:
                    raise
                self._write({**entry, "e": "unreachable", "message": exc.message[:300]})
                self.progress.say(f"router unreachable ({exc.message[:120]}); waiting for it")
                self._resume_at = max(self._resume_at, time.monotonic() + 5.0)
            except Unavailable as exc:
                if "failed to start" in exc.message:
                    raise FailedStart(exc.message) from exc
                if time.monotonic() > deadline:
                    raise
                wait_s = exc.retry_after or 1.0
                self._write({**entry, "e": "throttled", "retry_after": wait_s})
                self._resume_at = max(self._resume_at, time.monotonic() + wait_s)

    async def _discard(self, gid: str, attempt: int, try_no: int) -> None:
        """Delete what a faulted try may have left (a sandbox that failed to start, its grader, one whose create
        the client gave up on), found by its labels; if the router cannot be reached, once it can."""
        labels = {"run_id": self.run_id, "group_id": gid, "attempt": str(attempt), "try": str(try_no)}
        try:
            await self._delete_labelled(labels)
        except Unreachable:
            self._orphans.append(labels)

    async def _delete_labelled(self, labels: dict[str, str]) -> None:
        for sandbox in await self.client.list(labels):
            try:
                await self.client.request("DELETE", f"/v1/sandboxes/{sandbox['id']}")
            except Unreachable:
                raise
            except GroveError:
                continue  # deleted meanwhile, or failing: its TTL reaps it

    async def _delete_orphans(self, *, wait_s: float) -> None:
        """Delete the sandboxes of tries the router cut short (it was away), waiting up to ``wait_s`` for it."""
        deadline = time.monotonic() + wait_s
        while self._orphans:
            try:
                await self._delete_labelled(self._orphans[0])
            except Unreachable:
                if time.monotonic() > deadline:
                    return
                await asyncio.sleep(2.0)
                continue
            self._orphans.pop(0)

    async def _clean_up_interrupted(self) -> None:
        """Delete what tries of a dead runner left (found by their labels) and mark them interrupted."""
        for key, entry in self.state.open_tries.items():
            labels = {"run_id": self.run_id, "group_id": group_id(key[1], key[0]), "attempt": str(key[2]),
                      "try": str(entry["try"])}
            for sandbox in await self.client.list(labels):
                try:
                    await self.client.request("DELETE", f"/v1/sandboxes/{sandbox['id']}")
                except GroveError as exc:
                    if exc.status not in (404, 409):
                        raise
            self._write({"variant": key[0], "task": key[1], "attempt": key[2], "e": "interrupted",
                         "try": entry["try"], "sandbox_id": entry.get("sandbox_id")})
        self.state.open_tries.clear()

    def _write(self, entry: dict[str, Any]) -> None:
        assert self._journal is not None
        self._journal.write(entry)


def _reward(result: dict[str, Any]) -> float | None:
    """An attempt's reward for the sampler; None for one never scored (infrastructure or harness error)."""
    if result.get("outcome") in UNSCORED:
        return None
    return float(result.get("reward") or 0.0)
