"""The router's own exec and file calls on a sandbox, made for a compatibility API (E2B, SandboxFusion), and
recorded in its trajectory exactly as grove's own ``/exec`` and ``/files`` calls are.

A compatibility handler translates its client's call into one of these; the executor sees the same request
grove's API would have forwarded, and the recorder writes the same step (via ``exec_step`` and
``Recorder.transfer``), tagged with ``via`` so a reader can tell which client made it.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp

from grove.core import wire
from grove.core.errors import BadGateway, GroveError, error_from_body
from router.lifecycle.service import SandboxService
from router.records.registry import SandboxRecord
from router.trajectory.recorder import Digest, exec_step

MAX_READ_BYTES = 256 * 1024 * 1024


class SandboxCalls:
    """Exec and file calls on one sandbox, each recorded as a step of its trajectory."""

    def __init__(self, service: SandboxService, record: SandboxRecord, via: str) -> None:
        self._service = service
        self._record = record
        self._via = via

    @property
    def record(self) -> SandboxRecord:
        """The sandbox the calls go to."""
        return self._record

    @asynccontextmanager
    async def open(self, method: str, path: str, *, params: dict[str, str] | None = None, data: bytes | None = None,
                   content_type: str = wire.MSGPACK) -> AsyncIterator[aiohttp.ClientResponse]:
        """One executor call, its response open for the block (the sandbox busy meanwhile); not recorded: the
        caller records what it made of it."""
        service, record = self._service, self._record
        with service.calling(record), service.recorder.faults(record, f"{method} {path} ({self._via})"):
            endpoint = await service.endpoint(record)
            session, base = service.upstreams.session(endpoint)
            headers = service.upstreams.headers(endpoint, {"Accept": wire.MSGPACK, "Content-Type": content_type})
            try:
                async with session.request(method, base + path, params=params, data=data, headers=headers) as resp:
                    yield resp
            except aiohttp.ClientError as exc:
                await service.lost(record)
                raise BadGateway(f"the sandbox's executor went away during {method} {path}: {exc}") from exc

    async def exec(self, body: dict[str, Any]) -> dict[str, Any]:
        """Run one command (an :class:`~grove.core.api.ExecBody` as a dict); its result, recorded. The
        executor's refusal (a bad cwd, a missing program) is raised as the error it answered."""
        raw = wire.encode(body, True)
        started = time.time()
        async with self.open("POST", "/v1/exec", data=raw) as resp:
            answer = await resp.read()
            status = resp.status
        step = exec_step(raw, wire.MSGPACK, answer, wire.MSGPACK, False, status, started)
        if step is not None:
            step["via"] = self._via
            self._service.recorder.exec(self._record, step)
        decoded = wire.decode(answer, wire.MSGPACK)
        if status != 200:
            raise _error(decoded, status)
        if not isinstance(decoded, dict):
            raise BadGateway("the executor answered an exec with something that is not a result")
        return decoded

    async def _file_call(self, op: str, method: str, path: str, *, params: dict[str, str] | None = None,
                         data: bytes | None = None, moved: Digest | None = None) -> Any:
        """One executor file call, recorded as grove's ``/files`` handler records it; its decoded answer."""
        started = time.time()
        async with self.open(method, "/v1/files/list" if op == "list" else "/v1/files",
                             params={"path": path, **(params or {})}, data=data,
                             content_type="application/octet-stream") as resp:
            answer = wire.decode(await resp.read(), resp.content_type)
            status = resp.status
        self._service.recorder.transfer(self._record, "file", op, path=path, status=status, started=started,
                                        moved=moved)
        if status >= 300:
            raise _error(answer, status)
        return answer

    async def write(self, path: str, data: bytes) -> None:
        """Write a file atomically (parents made), recorded with its size and sha256."""
        digest = Digest()
        digest(data)
        await self._file_call("write", "PUT", path, data=data, moved=digest)

    async def remove(self, path: str) -> None:
        """Delete a file or a directory tree, recorded."""
        await self._file_call("delete", "DELETE", path, params={"recursive": "1"})

    async def listing(self, path: str) -> list[dict[str, Any]]:
        """A directory's entries (``name``, ``type``, ``size``, ``mode``, ``mtime``), recorded."""
        answer = await self._file_call("list", "GET", path)
        entries = answer.get("entries") if isinstance(answer, dict) else None
        return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []

    def note(self, step: dict[str, Any]) -> None:
        """Record a step this caller built (a process it ran through other executor calls)."""
        step["via"] = self._via
        if step["type"] == "exec":
            self._service.recorder.exec(self._record, step)
        else:
            self._service.recorder.step(self._record, step)

    async def read(self, path: str, limit: int = MAX_READ_BYTES) -> bytes:
        """A file's bytes (``NotFound`` if there is none), recorded with its size and sha256."""
        digest = Digest()
        started = time.time()
        async with self.open("GET", "/v1/files", params={"path": path}) as resp:
            status = resp.status
            if status == 200:
                data = bytearray()
                async for chunk in resp.content.iter_chunked(256 * 1024):
                    data += chunk
                    digest(chunk)
                    if len(data) > limit:
                        raise BadGateway(f"{path} is larger than {limit} bytes")
            else:
                answer = await resp.read()
        self._service.recorder.transfer(self._record, "file", "read", path=path, status=status, started=started,
                                        moved=digest if status == 200 else None)
        if status != 200:
            raise _error(wire.decode(answer, resp.content_type), status)
        return bytes(data)


def _error(decoded: Any, status: int) -> GroveError:
    """The error an executor's error body stands for."""
    return error_from_body(status, decoded)
