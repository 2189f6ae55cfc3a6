"""One try of one attempt: a fresh sandbox, the task's setup, the harness, its changes graded, delete — and what
its sandboxes cost (the agent's and its grader's, :mod:`grove.rollouts.costs`).

Anything the environment got wrong — the sandbox did not start, the executor was lost, a 5xx, S3, a
broken setup or check, a fault the router noted in the trajectory while the harness swallowed it — ends
the try with :class:`InfraFault` and a short reason; the runner retries the attempt in a new sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
import traceback
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, TypeVar

from grove.client import AsyncGrove, AsyncSandbox, Sandbox
from grove.client.sync import _Loop
from grove.core.errors import BadGateway, GroveError, InsufficientStorage, Unavailable, Unreachable, UpstreamTimeout
from grove.rollouts import isolated
from grove.rollouts.browser import judge
from grove.rollouts.changes import Manifest, capture, diff
from grove.rollouts.costs import Bill
from grove.rollouts.grading import BrokenCheck, Grade, cpu_seconds, run_check, stop_processes
from grove.rollouts.harnesses import Harness, InfraFault, PolicyError
from grove.rollouts.isolated import mark_dropped
from grove.rollouts.keeping import Keeper, keeping
from grove.rollouts.rebuild import Continuation, rebuild
from grove.rollouts.resume import Prefix
from grove.rollouts.services import Running
from grove.rollouts.setup import setup
from grove.rollouts.siblings import Create, Siblings, start_siblings
from grove.rollouts.tasks import Task

T = TypeVar("T")


class AgentStopped(Exception):
    """The attempt is over (its time ran out): the harness's further calls are refused."""


class _Bridge(_Loop):
    """Runs a harness thread's SDK calls on the runner's own event loop (no second loop per attempt)."""

    def __init__(self, loop: asyncio.AbstractEventLoop,
                 after: Callable[[], Coroutine[Any, Any, None]] | None = None) -> None:
        self.loop = loop
        self.closed = False
        self.after = after
        """Run after each call, before the harness goes on (a ``--checkpoint-every`` run's checkpoints)."""

    def run(self, coro: Any) -> Any:
        if self.closed:
            coro.close()
            raise AgentStopped("this attempt's time is up; the sandbox no longer takes its calls")
        future = asyncio.run_coroutine_threadsafe(self._then_after(coro) if self.after else coro, self.loop)
        while True:  # polled, so a harness thread never outlives a stopped runner waiting on a dead loop
            try:
                return future.result(timeout=0.5)
            except TimeoutError:
                if self.closed or self.loop.is_closed():
                    future.cancel()
                    raise AgentStopped("this attempt is over; the sandbox no longer takes its calls") from None

    async def _then_after(self, coro: Any) -> Any:
        try:
            return await coro
        finally:
            assert self.after is not None
            await self.after()

    def stop(self) -> None:
        self.closed = True


@dataclass(frozen=True)
class TryIds:
    """Who a try is, for labels and the create's idempotency key."""

    run_id: str
    group_id: str
    attempt: int
    try_no: int
    request_id: str


def reason_of(exc: BaseException) -> str:
    """A short, stable name for an infrastructure fault (reports count by it)."""
    if isinstance(exc, InfraFault):
        return exc.reason or (exc.code if exc.code != "infra_fault" else "harness_infra")
    if isinstance(exc, BadGateway):
        return "executor_lost"
    if isinstance(exc, UpstreamTimeout):
        return "timeout"
    if isinstance(exc, InsufficientStorage):
        return "storage_full"
    if isinstance(exc, Unreachable):
        return "router_unreachable"
    if isinstance(exc, Unavailable):
        return "unavailable"
    if isinstance(exc, GroveError) and exc.status < 500:
        return f"task_error:{exc.code}"  # the task's setup or check asked for something impossible
    return "router_error" if isinstance(exc, GroveError) else type(exc).__name__


class HarnessFailure(Exception):
    """The harness itself raised (its bug, not the policy's failure): the attempt is ``harness_error``."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(f"{type(exc).__name__}: {exc}")
        self.error = f"{type(exc).__name__}: {exc}"[:2000]
        self.traceback = "".join(traceback.format_exception(exc))[-20_000:]

    def record(self) -> dict[str, str]:
        """What results and the trajectory keep of it."""
        return {"error": self.error, "traceback": self.traceback}


async def run_try(client: AsyncGrove, task: Task, harness: Harness, ids: TryIds, *, pool: Executor,
                  on_sandbox: Callable[[str], None], create: Create,
                  resume: Continuation | None = None, checkpoint_every: int = 0) -> dict[str, Any]:
    """Run one try; the result fields of ``results.jsonl`` (outcome ``pass``/``fail``/``harness_error``), or raise
    InfraFault. With ``resume``: a continuation — the sandbox holds a recorded attempt's state after a step
    (:func:`grove.rollouts.rebuild.rebuild`, instead of create and setup) and the harness resumes from its prefix.
    With ``checkpoint_every``: checkpoints after setup and every that many turns (:mod:`grove.rollouts.keeping`),
    the sandbox kept if any was taken."""
    t0 = time.monotonic()
    labels = {"run_id": ids.run_id, "group_id": ids.group_id, "attempt": str(ids.attempt), "try": str(ids.try_no)}
    body = {"image": task.image, "request_id": ids.request_id, "workdir": task.workdir, "env": task.env,
            **task.resources, "ttl_s": task.timeout_s + task.check.timeout_s + 3600,
            "metadata": {"task_id": task.id, "model": harness.model, "harness": harness.name,
                         "harness_version": harness.version, "labels": {**task.labels, **labels}}}
    if task.network:
        body["network"] = task.network
    if task.desktop is not None:
        body["desktop"] = task.desktop
    siblings = await start_siblings(client, create, task, body)  # before the agent's sandbox, which joins them
    try:
        siblings.join(body)
        return await _run_in(client, task, harness, ids, pool, on_sandbox, create, body, siblings, t0,
                             resume, checkpoint_every)
    finally:
        await siblings.close()


async def _run_in(client: AsyncGrove, task: Task, harness: Harness, ids: TryIds, pool: Executor,
                  on_sandbox: Callable[[str], None], create: Create, body: dict[str, Any], siblings: Siblings,
                  t0: float, resume: Continuation | None, checkpoint_every: int) -> dict[str, Any]:
    """The try in the agent's sandbox made from ``body`` (its services' ``siblings`` running already)."""
    keep = bool(checkpoint_every) and resume is None
    info = await (create(keeping(body) if keep else body) if resume is None else rebuild(client, resume, body))
    on_sandbox(info["id"])
    sandbox = AsyncSandbox(client, info)
    sandbox.start_heartbeat()
    keeper = Keeper(sandbox, checkpoint_every) if keep else None
    out: dict[str, Any] = {"sandbox_id": sandbox.id, "trajectory_id": sandbox.id}
    if resume is not None:
        out["rebuilt_by"] = "checkpoint" if (info.get("lineage") or {}).get("kind") == "restore" else "replay"
    bill = Bill()
    try:
        t_setup = time.monotonic()
        services: list[Running] = []
        # The base of the agent's changes: the state after setup (a continuation's was taken from its parent's).
        base = (await setup(sandbox, task, prompt=True, site=True, services=services,
                            siblings=tuple(siblings.running)) if resume is None else resume.base)
        out["setup_s"] = round(time.monotonic() - t_setup, 3)
        if keeper is not None:
            await keeper.after_call()  # turn 0: the state right after setup
        t_agent = time.monotonic()
        try:
            out["agent_error"] = await _agent(sandbox, task, harness, ids, pool,
                                              resume.prefix if resume is not None else None,
                                              keeper.after_call if keeper is not None else None)
        except HarnessFailure as failure:
            await sandbox.post_event("harness_error", failure.record())
            out.update(outcome="harness_error", reward=None, harness_error=failure.record())
            return out
        out["agent_s"] = round(time.monotonic() - t_agent, 3)
        record = await client.request("GET", f"/v1/sandboxes/{sandbox.id}/trajectory")
        noted = ((record.get("outcome") or {}).get("infra_errors")) or []
        if noted:
            text = str(noted[-1].get("reason"))
            kind = "executor_lost" if "executor" in text else "s3" if "artifact" in text else "router_noted"
            raise InfraFault(f"the router noted: {text}", reason=kind)
        out["commands"] = _agent_steps(record.get("steps") or [], "exec")
        if keeper is not None:
            out["checkpoints"] = keeper.kept
        if task.desktop is not None:
            out["actions"] = _agent_steps(record.get("steps") or [], "computer")
        t_grade = time.monotonic()
        grader_body = {**body, "metadata": {**body["metadata"], "harness": "grove-grader",
                                            "labels": {**body["metadata"]["labels"], "role": "grader",
                                                       "graded_sandbox": sandbox.id}}}
        grader_body.pop("desktop", None)  # a grader reads files: it needs no screen
        verdict = await _grade(client, create, grader_body, sandbox, task, base, bill, record,
                               [s.pid for s in services if s.sandbox_id is None])
        out.update(outcome="pass" if verdict.passed else "fail", reward=verdict.reward, cpu_s=verdict.cpu_s,
                   grading_s=round(time.monotonic() - t_grade, 3), check=verdict.detail, grading=verdict.mode)
    finally:
        if keeper is not None and keeper.holds:  # its checkpoints live as long as it does
            sandbox.stop_heartbeat()
            out["kept_sandbox"] = True
        else:
            with contextlib.suppress(GroveError):  # else reaped by its TTL; the result stands
                await bill.close(sandbox)
        out["wall_s"] = out["sandbox_s"] = round(time.monotonic() - t0, 3)
        out.update(bill.fields())
    return out


async def _grade(client: AsyncGrove, create: Create,
                 grader_body: dict[str, Any], sandbox: AsyncSandbox, task: Task, base: Manifest, bill: Bill,
                 record: dict[str, Any], services: list[int]) -> Grade:
    """The agent is done: stop what it left running, take its changes, grade them (isolated, in place, or by the
    task's judge on ``record``, the agent's trajectory, and its final screen), and record the changes, the
    verdict and the grading in its trajectory."""
    mode = task.check.grading
    # From here on every step is grove's, not the agent's: bracketed as grading (the SFT export leaves it out).
    await sandbox.post_event("grading", {"status": "started", "mode": mode, "task_id": task.id})
    cpu = await cpu_seconds(sandbox)
    judged = await judge.grade(sandbox, task, record) if mode == "judge" else None  # its screen: before the stop
    await stop_processes(sandbox, services)  # the task's services answer the check
    changes = await capture(sandbox, task.workdir, base)
    grader: str | None = None
    if judged is not None:
        verdict = judged
        for change in changes:
            change.dropped = "a judge grades the trajectory and the final screen, not files"
    elif mode == "isolated":
        mark_dropped(task, changes)
        verdict, grader = await isolated.grade(client, create, grader_body, task, changes, base, bill=bill)
    else:
        verdict = await run_check(sandbox, task)  # what the agent left is what is graded
        for change in changes:
            change.applied = True
            if change.status == "added" and change.content is not None and not change.binary:
                # The base of a modified file is gone here; an added one's is empty (what a site wrote, say).
                change.diff, change.diff_truncated = diff(change.path, b"", change.content)
    verdict.cpu_s, verdict.mode = cpu, mode
    outcome = "pass" if verdict.passed else "fail"
    events = [{"kind": "changes", "data": {"grading": mode, "base": "after setup", "grader": grader,
                                           "files": [c.record() for c in changes]}},
              {"kind": "result", "data": {"result": outcome, "reward": verdict.reward}},
              {"kind": "grading", "data": {"status": "finished", "mode": mode, "result": outcome,
                                           "reward": verdict.reward, "grader": grader, **verdict.detail}}]
    await sandbox.client.request("POST", f"/v1/sandboxes/{sandbox.id}/events", json_body={"events": events})
    return verdict


async def _agent(sandbox: AsyncSandbox, task: Task, harness: Harness, ids: TryIds, pool: Executor,
                 prefix: Prefix | None = None,
                 after: Callable[[], Coroutine[Any, Any, None]] | None = None) -> str | None:
    """Run the harness in a worker thread (resumed from ``prefix`` if given; ``after`` each of its calls); None, or
    why the agent's turn ended early (the policy's doing)."""
    bridge = _Bridge(asyncio.get_running_loop(), after)
    view = {**task.raw, "id": task.id, "prompt": task.prompt, "workdir": task.workdir, "scripted": task.scripted,
            "attempt": ids.attempt, "group_id": ids.group_id, "run_id": ids.run_id, "model": harness.model}
    run = harness.run if prefix is None else functools.partial(harness.run, resume=prefix)
    work = asyncio.get_running_loop().run_in_executor(pool, run, view, Sandbox(bridge, sandbox))
    try:
        await asyncio.wait_for(asyncio.shield(work), task.timeout_s)
    except TimeoutError:
        bridge.stop()
        return f"timed out after {task.timeout_s:.0f}s"
    except (InfraFault, BrokenCheck):
        raise
    except GroveError as exc:
        if exc.status >= 500:
            raise
        return f"{type(exc).__name__}: {exc.message}"  # a call the policy got wrong (a path it made up): its own
    except (PolicyError, AgentStopped) as exc:  # the policy's dead end: the check still decides
        return f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # the harness's own bug: never scored as the policy's failure
        raise HarnessFailure(exc) from exc
    finally:
        bridge.stop()
    return None


def _agent_steps(steps: list[dict[str, Any]], kind: str) -> int:
    """Steps of a type (``exec``: the agent's commands; ``computer``: its screen actions) between the end of setup
    and grading."""
    count, acting = 0, True
    for step in steps:
        if step.get("type") == "event" and step.get("kind") == "setup":
            acting = (step.get("data") or {}).get("status") == "finished"
        elif step.get("type") == kind and acting:
            count += 1
    return count
