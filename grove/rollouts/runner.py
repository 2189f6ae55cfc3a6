"""The rollout engine: tasks, times variants (harness, model), times attempts, driven through a grove router.

Concurrency is a cap on tries in flight; a 503 with ``Retry-After`` on create pauses every new create
that long (back-pressure) and retries the same ``request_id``. Each try's create carries a request id
derived from (run, group, attempt, try), and every try is journaled before it acts, so a rerun on the
same run directory skips finished attempts, deletes the sandboxes of tries a dead runner left, and runs
each remaining attempt once more — never an attempt twice, never a duplicate sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from grove.client import AsyncGrove
from grove.core.errors import GroveError, Unavailable
from grove.rollouts.attempt import TryIds, reason_of, run_try
from grove.rollouts.harnesses import Harness, InfraFault, resolve
from grove.rollouts.journal import AttemptKey, Journal, open_run, read_journal
from grove.rollouts.progress import Progress
from grove.rollouts.sampling import GroupKey, Policy, Sampler
from grove.rollouts.tasks import Task, load_tasks

CREATE_PATIENCE_S = 600.0


class FailedStart(InfraFault):
    """The sandbox did not start."""

    code = "failed_start"


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

    async def execute(self) -> None:
        """Resume what a previous runner left, then sample until the policy is satisfied."""
        await self.client.list({"run_id": self.run_id})  # the router answers and takes the key, or a clear error now
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
            with ThreadPoolExecutor(max_workers=self.config.concurrency, thread_name_prefix="harness") as pool:
                await self._loop(rerun, pool)
        finally:
            self.progress.close()
            self._journal.close()

    async def _loop(self, rerun: list[AttemptKey], pool: ThreadPoolExecutor) -> None:
        running: set[asyncio.Task[None]] = set()
        while True:
            room = self.config.concurrency - len(running)
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
            finished, running = await asyncio.wait(running, timeout=0.5, return_when=asyncio.FIRST_COMPLETED)
            for task in finished:
                task.result()  # a bug in the runner itself must not pass silently

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

    async def _create(self, body: dict[str, Any], entry: dict[str, Any]) -> Any:
        """Create with back-pressure: a busy router (503 + Retry-After) pauses every create, then the same
        request id is retried; a sandbox that failed to start is an infrastructure fault."""
        deadline = time.monotonic() + CREATE_PATIENCE_S
        while True:
            if (wait := self._resume_at - time.monotonic()) > 0:
                await asyncio.sleep(wait)
            try:
                return await self.client.request("POST", "/v1/sandboxes", json_body=body)
            except Unavailable as exc:
                if "failed to start" in exc.message:
                    raise FailedStart(exc.message) from exc
                if time.monotonic() > deadline:
                    raise
                wait_s = exc.retry_after or 1.0
                self._write({**entry, "e": "throttled", "retry_after": wait_s})
                self._resume_at = max(self._resume_at, time.monotonic() + wait_s)

    async def _discard(self, gid: str, attempt: int, try_no: int) -> None:
        """Delete what a faulted try may have left (a sandbox that failed to start, or whose create the client
        gave up on), found by its labels; best effort: the router's TTL reaps anything missed."""
        labels = {"run_id": self.run_id, "group_id": gid, "attempt": str(attempt), "try": str(try_no)}
        with contextlib.suppress(GroveError):
            for sandbox in await self.client.list(labels):
                with contextlib.suppress(GroveError):
                    await self.client.request("DELETE", f"/v1/sandboxes/{sandbox['id']}")

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
    return None if result.get("outcome") == "infra_error" else float(result.get("reward") or 0.0)
