"""The state of a recorded attempt after its step k, in a fresh sandbox: where a continuation starts.

This is the one place that decides how state is rebuilt. A run made with ``--checkpoint-every`` names a checkpoint
per kept state in its results (``checkpoints``: ``{"turn", "step", "checkpoint"}``, :mod:`grove.rollouts.keeping`):
the state is a create from it (``"checkpoint": ID``; the sandbox's lineage kind is ``restore``). Where there is
none, or it cannot be used (gone with its sandbox, say: a 4xx), the state is rebuilt by replay (``POST
/v1/trajectories/{id}/replay`` with ``until``: the recorded commands and file writes run again, each compared;
lineage kind ``replay``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from grove.client import AsyncGrove
from grove.core.errors import GroveError
from grove.rollouts.changes import Manifest
from grove.rollouts.harnesses import InfraFault
from grove.rollouts.resume import Prefix


@dataclass(frozen=True)
class Continuation:
    """A try that continues a recorded attempt."""

    parent: str
    """The recorded attempt's trajectory (its sandbox id)."""
    prefix: Prefix
    """Its conversation up to the step the state is rebuilt after."""
    base: Manifest
    """Its workdir right after setup: the base the continuation's changes are graded against."""
    env: dict[str, str]
    """The task's env values (the record keeps only the keys)."""
    checkpoint: str | None = None
    """The checkpoint the recorded attempt kept of the state after ``prefix.step``, if any."""


async def restore(client: AsyncGrove, checkpoint: str | None, body: dict[str, Any]) -> dict[str, Any] | None:
    """A sandbox made from ``checkpoint`` as ``body`` asks (its info); None if there is no checkpoint or it cannot
    be used (the caller replays instead). A fault of the router's (5xx, unreachable) is raised."""
    if checkpoint is None:
        return None
    try:
        info: dict[str, Any] = await client.request("POST", "/v1/sandboxes",
                                                    json_body={**body, "checkpoint": checkpoint})
    except GroveError as exc:
        if exc.status in (400, 404, 409, 422):  # gone (with its sandbox), or not one this create can use
            return None
        raise
    return info


async def rebuild(client: AsyncGrove, resume: Continuation, body: dict[str, Any]) -> dict[str, Any]:
    """A sandbox holding the parent's state after ``resume.prefix.step``, labelled as ``body`` (the try's create):
    from the kept checkpoint, else by replay; its info. A replay whose steps did not all match rebuilt another
    state: an infrastructure fault (the try is retried), its sandbox deleted."""
    restored = await restore(client, resume.checkpoint, body)
    if restored is not None:
        return restored
    labels = body["metadata"]["labels"]
    report = await client.request("POST", f"/v1/trajectories/{resume.parent}/replay",
                                  json_body={"until": resume.prefix.step, "env": resume.env, "labels": labels})
    if report["matched"] != report["total"]:
        with contextlib.suppress(GroveError):  # else its labels find it: a faulted try's clean-up deletes it
            await client.request("DELETE", f"/v1/sandboxes/{report['sandbox_id']}")
        raise InfraFault(f"replaying {resume.parent} to step {resume.prefix.step} did not reproduce it: step "
                         f"{report['first_mismatch']} differs", reason="replay_mismatch")
    info: dict[str, Any] = await client.request("GET", f"/v1/sandboxes/{report['sandbox_id']}")
    return info
