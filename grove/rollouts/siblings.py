"""A task's services in sibling sandboxes: made before the agent's sandbox, on a private network with it.

Each service without ``in_agent_sandbox`` gets a sandbox of its own (its ``image``, else the task's; no egress),
created in the try's private group (``network.group``, a name made from the try's request id) and labelled with
the try's labels plus ``role: service`` and ``service: NAME``, so the runner's clean-up by labels finds it, and its
trajectory is linked to the attempt's. The service runs there as a background process, from the task's files
(written into the sibling too), and is checked ready there; its address in the group is what the agent's
``/etc/hosts`` names it by. The agent's sandbox joins the group and carries ``service_sandboxes`` (their ids) among
its labels. :meth:`Siblings.close` deletes them all, whatever became of the attempt.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from grove.client import AsyncGrove, AsyncSandbox
from grove.core.errors import GroveError
from grove.rollouts.harnesses import InfraFault
from grove.rollouts.services import Running, ready
from grove.rollouts.setup import put_files
from grove.rollouts.tasks import Task

Create = Callable[[dict[str, Any]], Coroutine[Any, Any, Any]]


@dataclass
class Siblings:
    """The sibling sandboxes of one try, and their services once ready."""

    group: str | None = None
    """The try's private network (None: the task has no sibling service)."""
    sandboxes: list[AsyncSandbox] = field(default_factory=list)
    running: list[Running] = field(default_factory=list)

    def join(self, body: dict[str, Any]) -> None:
        """Put the agent's create ``body`` in the group, its labels naming the siblings."""
        if self.group is None:
            return
        body["network"] = {**(body.get("network") or {}), "group": self.group}
        labels = body["metadata"]["labels"]
        labels["service_sandboxes"] = ",".join(s.id for s in self.sandboxes)

    async def close(self) -> None:
        """Delete every sibling (one the router lost already is fine: its TTL or the runner's clean-up has it)."""
        for sandbox in self.sandboxes:
            with contextlib.suppress(GroveError):
                await sandbox.close()


async def start_siblings(client: AsyncGrove, create: Create, task: Task, body: dict[str, Any]) -> Siblings:
    """Create the sibling of each of the task's sibling services (from the agent's create ``body``), start the
    service there and wait until it is ready; InfraFault if one is not (what was made is deleted first)."""
    wanted = [s for s in task.services if not s.in_agent_sandbox]
    if not wanted:
        return Siblings()
    siblings = Siblings(group="try-" + hashlib.sha256(str(body["request_id"]).encode()).hexdigest()[:24])
    try:
        for service in wanted:
            meta = body["metadata"]
            info = await create({
                "image": service.image or task.image, "request_id": f"{body['request_id']}-service-{service.name}",
                "network": {"group": siblings.group}, "ttl_s": body["ttl_s"], "workdir": body["workdir"],
                "metadata": {**meta, "harness": "grove-service",
                             "labels": {**meta["labels"], "role": "service", "service": service.name}}})
            sandbox = AsyncSandbox(client, info)
            sandbox.start_heartbeat()
            siblings.sandboxes.append(sandbox)
            await put_files(sandbox, task)  # what the service runs from (a task's files go to each of its sandboxes)
            try:
                process = await sandbox.processes.start(service.command, env=service.env or None, cwd=service.cwd)
            except GroveError as exc:
                raise InfraFault(f"service {service.name!r} could not be started in its sandbox "
                                 f"({service.command!r}): {exc.message}", reason="service_not_ready") from exc
            address = (info.get("network") or {}).get("address")
            if not isinstance(address, str):
                raise InfraFault(f"the sandbox of service {service.name!r} has no address on the private network "
                                 "(its router does not make them)", reason="service_not_ready")
            siblings.running.append(Running(service, process.pid, sandbox.id, address))
        for up in siblings.running:
            await ready(next(s for s in siblings.sandboxes if s.id == up.sandbox_id), up)
    except BaseException:
        await siblings.close()
        raise
    return siblings
