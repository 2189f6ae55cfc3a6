"""Kept states of a ``--checkpoint-every K`` run: a checkpoint of the attempt's sandbox right after setup (turn 0)
and after every K of the agent's turns, for ``grove rollouts progress`` to restore instead of replaying.

The lifetime. A checkpoint belongs to its sandbox (deleting the sandbox deletes its checkpoints,
:mod:`router.checkpoints.service`), so an attempt that kept checkpoints keeps its sandbox instead of deleting it:
its heartbeat stops, it scales to zero when idle (no processes, no memory: its disk and checkpoints only, counted
toward the project's ``disk_mb``; on the local backend its disk shares most blocks with its last checkpoint) and
the router deletes it, with its checkpoints, :data:`KEEP_S` past its attempt's own time (``ttl_s``; its
``heartbeat_timeout_s`` is as long, so a run that ends does not take it along). ``grove rollouts progress
--release`` deletes them once the estimates are written (:func:`release`). A state whose checkpoint is gone by
then is rebuilt by replay.

When: after each of the harness's calls (before the harness goes on, so nothing changes the state meanwhile) the
agent's turns are counted from the trajectory (one ``GET`` of it per call: the price of ``--checkpoint-every``);
a call that brought them to the next kept state is followed by a checkpoint (``POST
/v1/sandboxes/{id}/checkpoints``; its processes frozen only for that instant).

Taking a checkpoint is the checkpointing's business only: one that fails is recorded (``"checkpoint": null`` and
its ``error``) and the attempt goes on; that state is rebuilt by replay later.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from grove.client import AsyncGrove, AsyncSandbox
from grove.core.errors import GroveError
from grove.rollouts.resume import state_step, turns

KEEP_S = 24 * 3600.0
"""How long an attempt's sandbox and its checkpoints are kept for progress runs (past the attempt's own time)."""


def keeping(body: dict[str, Any]) -> dict[str, Any]:
    """An attempt's create body, its sandbox kept :data:`KEEP_S` past the attempt's own time, whoever leaves."""
    ttl = float(body.get("ttl_s", 0)) + KEEP_S
    return {**body, "ttl_s": ttl, "heartbeat_timeout_s": ttl}


class Keeper:
    """Takes an attempt's checkpoints: at turn 0, then each time the agent's turns reach another multiple of K."""

    def __init__(self, sandbox: AsyncSandbox, every: int) -> None:
        self.sandbox, self.every = sandbox, every
        self.kept: list[dict[str, Any]] = []
        """``{"turn", "step", "checkpoint"}`` each (and ``error`` where the checkpoint failed)."""
        self._next = 0

    @property
    def holds(self) -> bool:
        """Whether any checkpoint was taken (then the sandbox is kept)."""
        return any(k["checkpoint"] for k in self.kept)

    async def after_call(self) -> None:
        """After each of the harness's calls: a checkpoint if the agent's turns reached the next kept state."""
        try:
            record = await self.sandbox.client.request("GET", f"/v1/sandboxes/{self.sandbox.id}/trajectory")
            steps = record.get("steps") or []
            count = len(turns(steps))
        except GroveError:
            return  # the attempt itself meets this fault if it is one
        if count >= self._next:
            await self._take(count, state_step(steps, count))

    async def _take(self, turn: int, step: int) -> None:
        self._next = (turn // self.every + 1) * self.every
        kept: dict[str, Any] = {"turn": turn, "step": step, "checkpoint": None}
        try:
            kept["checkpoint"] = (await self.sandbox.checkpoint())["id"]
        except GroveError as exc:
            kept["error"] = f"{exc.code}: {exc.message}"[:500]
        self.kept.append(kept)


def kept_sandboxes(run: Path) -> list[str]:
    """The sandboxes a run's attempts kept for their checkpoints (``results.jsonl``)."""
    rows = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines() if line]
    return [r["sandbox_id"] for r in rows if r.get("kept_sandbox") and r.get("sandbox_id")]


async def release(client: AsyncGrove, run: Path) -> int:
    """Delete the sandboxes (and so the checkpoints) a run kept; how many were still there."""
    released = 0
    for sandbox_id in kept_sandboxes(run):
        with contextlib.suppress(GroveError):  # already gone (its TTL, or released before)
            info = await client.request("GET", f"/v1/sandboxes/{sandbox_id}")
            if info.get("status") not in ("deleted", "deleting"):
                await client.request("DELETE", f"/v1/sandboxes/{sandbox_id}", retry=True)
                released += 1
    return released
