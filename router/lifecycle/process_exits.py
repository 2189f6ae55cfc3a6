"""Background processes' exits recorded when they happen, and at the latest before a sandbox stops.

The executor queues each exit once (:mod:`executor.processes`); whoever takes it from the queue records it, so
no exit is recorded twice. Three takers:

- any answer of the process API (:mod:`router.api.processes`);
- a watch: once a sandbox has a background process, the router keeps one long poll on its executor
  (``POST /v1/processes/exits``) that answers as soon as a process exits, so the step's ``t`` is the exit's time
  and it lands then, not when somebody next asks. One poll per sandbox, not per process: a sandbox with 16
  processes costs one pooled connection and one executor thread. The poll is the router's own: it moves neither
  the idle nor the heartbeat clock, so a sandbox whose processes run on still scales to zero when its client
  goes quiet;
- the stop: before a sandbox is scaled to zero or deleted, :meth:`ProcessExits.drain` ends its processes
  (``POST /v1/processes/end``: SIGTERM, SIGKILL after a grace) and records their exits, signal included,
  before the record is closed (the stop would kill them anyway, unrecorded).

Why a poll from the router rather than pushes from the executor: the executor knows no router (it only
answers; on the local backend it has no route out at all with egress denied), and the router already holds a
pooled connection to it. Why not only at the stop: a long-lived sandbox's trajectory would show an exit hours
late, out of order with the steps around it.

On Knative (a backend kept up by traffic) the router does not watch: a request held open on the revision
counts as traffic, and the pod would never scale to zero while a process ran. There an exit is recorded by the
next process call or by the drain at delete; a process that Knative's own scale-to-zero ended has no exit
step (its pod is gone before the router hears of it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import aiohttp

from grove.core.errors import BadGateway
from router.records.registry import SandboxRecord
from router.trajectory.recorder import Recorder
from router.upstream.proxy import Upstreams

log = logging.getLogger("grove.router")
POLL_S = 60.0
"""How long one long poll waits on the executor before it is asked again."""
END_GRACE_S = 2.0
"""How long the processes of a stopping sandbox get after SIGTERM before SIGKILL."""
_DRAIN_TIMEOUT_S = 20.0


class ProcessExits:
    """Records the exits of the sandboxes' background processes as steps (one owner of that rule)."""

    def __init__(self, upstreams: Upstreams, recorder: Recorder, *, watch: bool) -> None:
        self._upstreams, self._recorder, self._watch = upstreams, recorder, watch
        self._watchers: dict[str, asyncio.Task[None]] = {}
        self._with_processes: set[str] = set()
        """Sandboxes that started a background process through this router (only they are drained)."""

    def record(self, record: SandboxRecord, exits: Any) -> None:
        """Each exit an executor handed out becomes an ``exit`` step."""
        for ended in exits if isinstance(exits, list) else []:
            if isinstance(ended, dict):
                self._recorder.step(record, {
                    "type": "process", "event": "exit", "t": ended.get("ended_at"), "pid": ended.get("pid"),
                    "command": ended.get("command"), "exit_code": ended.get("exit_code"),
                    "signalled": ended.get("signalled"), "duration_s": ended.get("duration_s")})

    def started(self, record: SandboxRecord) -> None:
        """A process was started in the sandbox: watch for its exit (if not watching already)."""
        self._with_processes.add(record.id)
        if not self._watch or record.id in self._watchers:
            return
        task = asyncio.create_task(self._poll(record), name=f"grove-exits-{record.id}")
        self._watchers[record.id] = task
        task.add_done_callback(lambda done: self._done(record.id, done))

    async def drain(self, record: SandboxRecord) -> None:
        """Before the sandbox stops (scale to zero, delete): end its processes and record their exits."""
        watcher = self._watchers.pop(record.id, None)
        if record.id not in self._with_processes:
            return
        self._with_processes.discard(record.id)
        endpoint = record.endpoint()
        if endpoint is not None:
            try:
                async with self._upstreams.call(endpoint, "POST", "/v1/processes/end",
                                                json_body={"grace_s": END_GRACE_S},
                                                timeout_s=_DRAIN_TIMEOUT_S) as resp:
                    answer = await resp.json() if resp.status == 200 else {}
                self.record(record, answer.get("exits"))
            except (BadGateway, aiohttp.ClientError, TimeoutError, ValueError) as exc:
                log.info("could not collect the process exits of %s before it stopped: %s", record.id, exc)
        if watcher is not None:
            # The end answered the poll too (with any exit it took, recorded by it): let it finish.
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(watcher), 5.0)
            watcher.cancel()

    async def close(self) -> None:
        """Stop every watch (the router is shutting down)."""
        for task in list(self._watchers.values()):
            task.cancel()
        for task in list(self._watchers.values()):
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _poll(self, record: SandboxRecord) -> None:
        """Long polls while the sandbox runs processes and nobody took the watch away (:meth:`drain`)."""
        me = asyncio.current_task()
        while self._watchers.get(record.id) is me and (endpoint := record.endpoint()) is not None:
            try:
                async with self._upstreams.call(endpoint, "POST", "/v1/processes/exits",
                                                json_body={"timeout_s": POLL_S}, timeout_s=POLL_S + 30) as resp:
                    answer = await resp.json() if resp.status == 200 else {}
            except (BadGateway, aiohttp.ClientError, TimeoutError, ValueError) as exc:
                # The executor went away (scaled to zero, lost): the next start watches again.
                log.info("stopped watching the processes of %s: %s", record.id, exc)
                return
            self.record(record, answer.get("exits"))
            if not answer.get("running"):
                return

    def _done(self, sandbox_id: str, task: asyncio.Task[None]) -> None:
        if self._watchers.get(sandbox_id) is task:
            del self._watchers[sandbox_id]
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("watching the processes of %s failed", sandbox_id, exc_info=exc)
