"""A compose task's sandboxes: one per service, on one private network group (``network.group``).

:meth:`ComposeGroup.up` goes through the services in dependency order. Before each, what it depends on is waited
for (``service_started``: nothing more; ``service_healthy``: its healthcheck passed; ``service_completed_successfully``:
its command exited 0). A sibling gets its image (built or mapped by the caller), the compose file's
``environment`` and ``working_dir`` over its image's, the group and the caller's egress, and runs its command (the
compose ``entrypoint``/``command`` over the image's ``ENTRYPOINT``/``CMD``, as Docker resolves them) as a
background process. The ``main`` service is the agent's sandbox, made by the caller; it runs a compose
``command`` only when the file gives one (Harbor's default for it is ``sleep infinity``). Every member's
``/etc/hosts`` names every other member by its service name. Once all are up, every healthcheck has passed
(Compose's ``up --wait``, which Harbor runs).

:meth:`ComposeGroup.down` deletes the siblings; a client killed outright stops heart-beating them, and the router
deletes them after their heartbeat timeout, as it does the agent's sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from grove.client.aio import AsyncGrove, AsyncSandbox
from grove.client.processes import ProcessInfo
from grove.core.errors import GroveError, Invalid
from grove.integrations.compose import MAIN, Compose, Service

ImageOf = Callable[[Service], Awaitable[str]]
"""The grove image of a sibling service (its ``build:`` built, its ``image:`` mapped)."""
MakeMain = Callable[[Service, str], Awaitable[AsyncSandbox]]
"""Create the agent's sandbox for the ``main`` service in the given group."""
_POLL_S = 0.2


class ServiceFailed(Invalid):
    """A compose service did not come up: its command exited, or its healthcheck kept failing."""


@dataclass
class Member:
    """One service's sandbox."""

    service: Service
    sandbox: AsyncSandbox
    address: str
    pid: int | None = None
    """Its command's process (None: it runs none)."""
    user: str | None = None
    """Its image's ``USER``, whom its command and healthcheck run as, as in Docker (None: root)."""


class ComposeGroup:
    """The sandboxes of one compose task environment."""

    def __init__(self, client: AsyncGrove, compose: Compose, group: str, sibling: dict[str, Any]) -> None:
        """``sibling``: what every sibling's create body carries (network egress, metadata, heartbeat timeout)."""
        self.client = client
        self.compose = compose
        self.group = group
        self._sibling = sibling
        self.members: dict[str, Member] = {}
        self._healthy: set[str] = set()

    async def up(self, image_of: ImageOf, make_main: MakeMain) -> AsyncSandbox:
        """Start every service; the agent's sandbox. On failure the siblings made so far are deleted."""
        try:
            for name in self.compose.order():
                service = self.compose.services.get(name) or Service(MAIN)
                for dep, condition in sorted(service.depends_on.items()):
                    await self._reached(dep, condition)
                if name == MAIN:
                    await self._main(service, make_main)
                else:
                    await self._sibling_up(service, await image_of(service))
            for name, member in self.members.items():
                if member.service.healthcheck is not None:
                    await self._wait_healthy(name)
            return self.members[MAIN].sandbox
        except BaseException:
            await self.down()
            raise

    def sibling(self, name: str) -> AsyncSandbox:
        """The sandbox of sibling service ``name``."""
        member = self.members.get(name)
        if member is None or name == MAIN:
            raise ServiceFailed(f"the task's compose file has no service {name!r} besides main (it has: "
                                f"{', '.join(sorted(set(self.members) - {MAIN})) or 'none'})")
        return member.sandbox

    async def down(self) -> None:
        """Delete every sibling (not the agent's sandbox: its owner records it first)."""
        for name, member in list(self.members.items()):
            if name != MAIN:
                with contextlib.suppress(GroveError):
                    await member.sandbox.close()

    async def _main(self, service: Service, make_main: MakeMain) -> None:
        sandbox = await make_main(service, self.group)
        member = await self._join(service, sandbox)
        argv = [*(service.entrypoint or []), *(service.command or [])]
        if argv:
            member.pid = (await sandbox.processes.start(argv)).pid

    async def _sibling_up(self, service: Service, image: str) -> None:
        config = (await self.client.request("GET", f"/v1/images/{image}")).get("config") or {}
        argv = _argv(service, config)
        if not argv:
            raise ServiceFailed(f"{self.compose.path}: services.{service.name}: neither `command`/`entrypoint` nor "
                                f"its image {image!r} (CMD/ENTRYPOINT) says what the service runs")
        body = dict(self._sibling)
        meta = body.get("metadata") or {}
        body["metadata"] = {**meta, "harness": "grove-service",
                            "labels": {**(meta.get("labels") or {}), "role": "service", "service": service.name}}
        body["network"] = {**(body.get("network") or {}), "group": self.group}
        body["env"] = dict(service.environment)
        if service.working_dir:
            body["workdir"] = service.working_dir
        sandbox = await self.client.create(image, **body)
        member = await self._join(service, sandbox)
        member.user = config.get("User") or None
        try:
            member.pid = (await sandbox.processes.start(argv, user=member.user)).pid
        except GroveError as exc:
            raise ServiceFailed(f"service {service.name!r} could not start {shlex.join(argv)!r}: {exc}") from exc

    async def _join(self, service: Service, sandbox: AsyncSandbox) -> Member:
        """Record the member; name it in every member's ``/etc/hosts`` and every other member in its own."""
        address = (sandbox.info.get("network") or {}).get("address")
        if not isinstance(address, str):
            with contextlib.suppress(GroveError):
                await sandbox.close()
            raise ServiceFailed(f"service {service.name!r}'s sandbox has no address on the private network (the "
                                "router's backend does not make private groups)")
        member = self.members[service.name] = Member(service, sandbox, address)
        for other in self.members.values():
            lines = ([f"{m.address} {m.service.name}" for m in self.members.values()] if other is member
                     else [f"{address} {service.name}"])
            named = await other.sandbox.exec(["/bin/sh", "-c", 'printf "%s\\n" "$@" >> /etc/hosts', "sh", *lines],
                                             timeout_s=30)
            if not named.ok:
                raise ServiceFailed(f"cannot name the task's services in {other.service.name!r}'s /etc/hosts: "
                                    f"{named.text[-300:]}")
        return member

    async def _reached(self, name: str, condition: str) -> None:
        if condition == "service_healthy":
            await self._wait_healthy(name)
        elif condition == "service_completed_successfully":
            member = self.members[name]
            info = await self._ended(member)
            if info is None or info.exit_code != 0:
                raise ServiceFailed(f"service {name!r} had to complete successfully first, but "
                                    f"{'runs no command' if info is None else f'exited with {info.exit_code}'}"
                                    f"{await self._output(member)}")

    async def _ended(self, member: Member) -> ProcessInfo | None:
        if member.pid is None:
            return None
        while (info := await member.sandbox.processes.get(member.pid)).running:
            await asyncio.sleep(_POLL_S)
        return info

    async def _wait_healthy(self, name: str) -> None:
        """Run ``name``'s healthcheck as Docker does until it passes; ServiceFailed once it is unhealthy."""
        member = self.members[name]
        check = member.service.healthcheck
        if check is None:
            raise ServiceFailed(f"{self.compose.path}: a service depends on {name!r} being healthy, but it has no "
                                "healthcheck")
        if name in self._healthy:
            return
        started, failures = time.monotonic(), 0
        while True:
            result = await member.sandbox.exec(check.argv, timeout_s=check.timeout_s, user=member.user)
            if result.ok:
                self._healthy.add(name)
                return
            starting = time.monotonic() - started < check.start_period_s
            failures += 0 if starting else 1
            if member.pid is not None and not (state := await member.sandbox.processes.get(member.pid)).running:
                raise ServiceFailed(f"service {name!r} exited with code {state.exit_code} before its healthcheck "
                                    f"passed{await self._output(member)}")
            if failures >= check.retries:
                raise ServiceFailed(f"service {name!r} is unhealthy: its healthcheck {shlex.join(check.argv)!r} "
                                    f"failed {failures} times (last: exit {result.exit_code}, "
                                    f"{result.text[-300:]!r}){await self._output(member)}")
            await asyncio.sleep(check.start_interval_s if starting else check.interval_s)

    async def _output(self, member: Member) -> str:
        if member.pid is None:
            return ""
        said = (await member.sandbox.processes.logs(member.pid))[-600:].decode("utf-8", "replace").strip()
        return f"; its output: {said or '(none)'}"


def _argv(service: Service, config: dict[str, Any]) -> list[str]:
    """What a sibling runs, as Docker resolves it: a compose ``entrypoint`` replaces the image's and drops its
    ``CMD``; a compose ``command`` replaces the ``CMD``."""
    entrypoint = service.entrypoint if service.entrypoint is not None else list(config.get("Entrypoint") or [])
    command = service.command if service.command is not None else (
        [] if service.entrypoint is not None else list(config.get("Cmd") or []))
    return [str(a) for a in (*entrypoint, *command)]
