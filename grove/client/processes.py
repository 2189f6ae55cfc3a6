"""``sandbox.processes``: background processes that outlive the call that started them.

``start`` returns at once with the process (its ``pid``); ``logs`` reads what it wrote so far, ``follow``
streams it until the process ends; ``signal`` and ``wait`` end it and see how it ended. They end with the
sandbox. Each start and each exit is a step of the sandbox's trajectory.
"""

from __future__ import annotations

import builtins
from collections.abc import AsyncGenerator, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from grove.client.aio import AsyncSandbox
    from grove.client.sync import _Loop


@dataclass(frozen=True)
class ProcessInfo:
    """What the sandbox knows of one background process."""

    pid: int
    command: list[str]
    status: str
    """``running`` or ``exited``."""
    exit_code: int | None
    """Its exit code once exited (128+N for a death by signal N)."""
    started_at: float
    ended_at: float | None
    signalled: str | None
    """The last signal sent to it through the API."""
    raw: dict[str, Any]

    @property
    def running(self) -> bool:
        """Whether it still runs."""
        return self.status == "running"

    @classmethod
    def of(cls, answer: dict[str, Any]) -> ProcessInfo:
        """From the router's answer."""
        return cls(int(answer["pid"]), list(answer.get("command") or []), str(answer["status"]),
                   answer.get("exit_code"), float(answer.get("started_at") or 0.0), answer.get("ended_at"),
                   answer.get("signalled"), answer)


class AsyncProcesses:
    """The background processes of one sandbox (``sandbox.processes``)."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sandbox = sandbox

    @property
    def _path(self) -> str:
        return f"/v1/sandboxes/{self._sandbox.id}/processes"

    async def start(self, command: str | builtins.list[str], *, env: dict[str, str] | None = None,
                    cwd: str | None = None, user: str | None = None) -> ProcessInfo:
        """Start ``command`` (a string runs under ``/bin/sh -c``) in the background; returns once it runs."""
        body: dict[str, Any] = {"command": command}
        for name, value in (("env", env), ("cwd", cwd), ("user", user)):
            if value is not None:
                body[name] = value
        return ProcessInfo.of(await self._sandbox.client.request("POST", self._path, json_body=body))

    async def list(self) -> builtins.list[ProcessInfo]:
        """Every process the sandbox remembers, running or ended, oldest first."""
        answer = await self._sandbox.client.request("GET", self._path)
        return [ProcessInfo.of(p) for p in answer["processes"]]

    async def get(self, pid: int) -> ProcessInfo:
        """One process's state."""
        return ProcessInfo.of(await self._sandbox.client.request("GET", f"{self._path}/{pid}"))

    async def signal(self, pid: int, signal: str = "SIGTERM") -> ProcessInfo:
        """Send a signal (by name) to the process's group; ``SIGKILL`` takes everything it started with it."""
        answer = await self._sandbox.client.request("POST", f"{self._path}/{pid}/signal", json_body={"signal": signal})
        return ProcessInfo.of(answer)

    async def wait(self, pid: int, timeout_s: float = 30.0) -> ProcessInfo:
        """Its state once it has ended, or after ``timeout_s`` (then ``running`` is still True)."""
        answer = await self._sandbox.client.request("POST", f"{self._path}/{pid}/wait",
                                                    json_body={"timeout_s": timeout_s})
        return ProcessInfo.of(answer)

    async def logs(self, pid: int, *, offset: int = 0) -> bytes:
        """What it has written so far (stdout and stderr together), from byte ``offset``."""
        data: bytes = await self._sandbox.client.request("GET", f"{self._path}/{pid}/logs",
                                                         params={"offset": str(offset)}, raw=True)
        return data

    async def follow(self, pid: int, *, offset: int = 0) -> AsyncGenerator[bytes, None]:
        """Its output as it comes, from byte ``offset``, until it ends. One call: a follow longer than the client's
        ``timeout_s`` (or, on Knative, the revision's timeout) is cut; follow again from the bytes already read."""
        async with self._sandbox.client.stream(f"{self._path}/{pid}/logs",
                                               params={"offset": str(offset), "follow": "1"}) as resp:
            async for chunk in resp.content.iter_any():
                yield chunk


class Processes:
    """``sandbox.processes`` of the synchronous client: every call of :class:`AsyncProcesses`, blocking."""

    def __init__(self, loop: _Loop, inner: AsyncProcesses) -> None:
        self._loop = loop
        self.inner = inner

    def start(self, command: str | builtins.list[str], *, env: dict[str, str] | None = None,
              cwd: str | None = None, user: str | None = None) -> ProcessInfo:
        """Start ``command`` in the background (see :meth:`AsyncProcesses.start`)."""
        return self._loop.run(self.inner.start(command, env=env, cwd=cwd, user=user))

    def list(self) -> builtins.list[ProcessInfo]:
        """Every process the sandbox remembers."""
        return self._loop.run(self.inner.list())

    def get(self, pid: int) -> ProcessInfo:
        """One process's state."""
        return self._loop.run(self.inner.get(pid))

    def signal(self, pid: int, signal: str = "SIGTERM") -> ProcessInfo:
        """Send a signal to the process's group."""
        return self._loop.run(self.inner.signal(pid, signal))

    def wait(self, pid: int, timeout_s: float = 30.0) -> ProcessInfo:
        """Its state once ended, or after ``timeout_s``."""
        return self._loop.run(self.inner.wait(pid, timeout_s))

    def logs(self, pid: int, *, offset: int = 0) -> bytes:
        """What it has written so far."""
        return self._loop.run(self.inner.logs(pid, offset=offset))

    def follow(self, pid: int, *, offset: int = 0) -> Iterator[bytes]:
        """Its output as it comes, until it ends."""
        return self._loop.iterate(self.inner.follow(pid, offset=offset))
