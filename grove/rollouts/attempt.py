"""One try of one attempt: a fresh sandbox, the task's setup, the harness, grading, delete.

Anything the environment got wrong — the sandbox did not start, the executor was lost, a 5xx, S3, a
broken setup or check, a fault the router noted in the trajectory while the harness swallowed it — ends
the try with :class:`InfraFault` and a short reason; the runner retries the attempt in a new sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from grove.client import AsyncGrove, AsyncSandbox, Sandbox
from grove.client.sync import _Loop
from grove.client.upload import open_tarball
from grove.core.errors import BadGateway, GroveError, InsufficientStorage, Unavailable, UpstreamTimeout
from grove.rollouts.grading import BrokenCheck, grade
from grove.rollouts.harnesses import Harness, InfraFault
from grove.rollouts.tasks import Task

T = TypeVar("T")


class AgentStopped(Exception):
    """The attempt is over (its time ran out): the harness's further calls are refused."""


class _Bridge(_Loop):
    """Runs a harness thread's SDK calls on the runner's own event loop (no second loop per attempt)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.closed = False

    def run(self, coro: Any) -> Any:
        if self.closed:
            coro.close()
            raise AgentStopped("this attempt's time is up; the sandbox no longer takes its calls")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        while True:  # polled, so a harness thread never outlives a stopped runner waiting on a dead loop
            try:
                return future.result(timeout=0.5)
            except TimeoutError:
                if self.closed or self.loop.is_closed():
                    future.cancel()
                    raise AgentStopped("this attempt is over; the sandbox no longer takes its calls") from None

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
    if isinstance(exc, Unavailable):
        return "unavailable"
    if isinstance(exc, GroveError) and exc.status < 500:
        return f"task_error:{exc.code}"  # the task's setup or check asked for something impossible
    return "router_error" if isinstance(exc, GroveError) else type(exc).__name__


async def run_try(client: AsyncGrove, task: Task, harness: Harness, ids: TryIds, *, pool: Executor,
                  on_sandbox: Callable[[str], None], create: Callable[[dict[str, Any]], Coroutine[Any, Any, Any]],
                  ) -> dict[str, Any]:
    """Run one try; the result fields of ``results.jsonl`` (outcome ``pass``/``fail``), or raise InfraFault."""
    t0 = time.monotonic()
    labels = {"run_id": ids.run_id, "group_id": ids.group_id, "attempt": str(ids.attempt), "try": str(ids.try_no)}
    body = {"image": task.image, "request_id": ids.request_id, "workdir": task.workdir, "env": task.env,
            **task.resources, "ttl_s": task.timeout_s + task.check.timeout_s + 3600,
            "metadata": {"task_id": task.id, "model": harness.model, "harness": harness.name,
                         "harness_version": harness.version, "labels": {**task.labels, **labels}}}
    if task.network:
        body["network"] = task.network
    info = await create(body)
    on_sandbox(info["id"])
    sandbox = AsyncSandbox(client, info)
    sandbox.start_heartbeat()
    out: dict[str, Any] = {"sandbox_id": sandbox.id, "trajectory_id": sandbox.id}
    try:
        t_setup = time.monotonic()
        await _setup(sandbox, task)
        out["setup_s"] = round(time.monotonic() - t_setup, 3)
        t_agent = time.monotonic()
        out["agent_error"] = await _agent(sandbox, task, harness, ids, pool)
        out["agent_s"] = round(time.monotonic() - t_agent, 3)
        record = await client.request("GET", f"/v1/sandboxes/{sandbox.id}/trajectory")
        noted = ((record.get("outcome") or {}).get("infra_errors")) or []
        if noted:
            text = str(noted[-1].get("reason"))
            kind = "executor_lost" if "executor" in text else "s3" if "artifact" in text else "router_noted"
            raise InfraFault(f"the router noted: {text}", reason=kind)
        out["commands"] = _agent_commands(record.get("steps") or [])
        t_grade = time.monotonic()
        verdict = await grade(sandbox, task)
        out.update(outcome="pass" if verdict.passed else "fail", reward=verdict.reward, cpu_s=verdict.cpu_s,
                   grading_s=round(time.monotonic() - t_grade, 3), check=verdict.detail)
    finally:
        with contextlib.suppress(GroveError):  # else reaped by its TTL; the result stands
            await sandbox.close()
        out["wall_s"] = out["sandbox_s"] = round(time.monotonic() - t0, 3)
    return out


async def _setup(sandbox: AsyncSandbox, task: Task) -> None:
    await sandbox.post_event("setup", {"status": "started"})
    if isinstance(task.files, dict):
        for path, content in task.files.items():
            await sandbox.write_file(path if path.startswith("/") else f"{task.workdir}/{path}", content)
    elif task.files:
        source = Path(task.files)
        if source.is_dir():
            await sandbox.upload(source, task.workdir)
        else:
            with open_tarball(source) as tarball:
                await sandbox.upload_tar(tarball, task.workdir)
    for command in task.setup:
        result = await sandbox.exec(command, cwd=task.workdir, timeout_s=task.timeout_s)
        if not result.ok:
            tail = (result.stderr or result.stdout)[-300:].decode("utf-8", "replace")
            raise InfraFault(f"setup command {command!r} failed (exit {result.exit_code}): {tail}",
                             reason="setup_failed")
    # One call: the end of setup, then the task as the agent's first message.
    events = [{"kind": "setup", "data": {"status": "finished"}},
              {"kind": "message", "data": {"role": "user", "content": task.prompt}}]
    await sandbox.client.request("POST", f"/v1/sandboxes/{sandbox.id}/events", json_body={"events": events})


async def _agent(sandbox: AsyncSandbox, task: Task, harness: Harness, ids: TryIds, pool: Executor) -> str | None:
    """Run the harness in a worker thread; None, or why the agent's turn ended early (the policy's doing)."""
    bridge = _Bridge(asyncio.get_running_loop())
    view = {**task.raw, "id": task.id, "prompt": task.prompt, "workdir": task.workdir, "scripted": task.scripted,
            "attempt": ids.attempt, "group_id": ids.group_id, "run_id": ids.run_id, "model": harness.model}
    work = asyncio.get_running_loop().run_in_executor(pool, harness.run, view, Sandbox(bridge, sandbox))
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
        return f"{type(exc).__name__}: {exc.message}"
    except Exception as exc:  # the harness's own bug or the policy's dead end: the check still decides
        return f"{type(exc).__name__}: {exc}"
    finally:
        bridge.stop()
    return None


def _agent_commands(steps: list[dict[str, Any]]) -> int:
    """Exec steps between the end of setup and grading: the agent's commands."""
    count, acting = 0, True
    for step in steps:
        if step.get("type") == "event" and step.get("kind") == "setup":
            acting = (step.get("data") or {}).get("status") == "finished"
        elif step.get("type") == "exec" and acting:
            count += 1
    return count
