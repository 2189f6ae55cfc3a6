"""The router's side of the zygote (:mod:`sandbox_image.zygote`): spawn requests over a pipe.

One zygote per router, started from the runtime bundle. Requests and replies are JSON lines matched by
a request id, so any number of sandboxes can be starting at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from typing import Any

from grove.core.errors import Unavailable

_READY_TIMEOUT_S = 60.0
_SPAWN_TIMEOUT_S = 60.0
_ZYGOTE_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}


class Zygote:
    """A running zygote process and the replies it owes."""

    def __init__(self, argv: list[str]) -> None:
        self._argv = argv
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._ids = itertools.count(1)
        self._lock = asyncio.Lock()

    async def _ensure(self) -> asyncio.subprocess.Process:
        async with self._lock:
            if self._proc is not None and self._proc.returncode is None:
                return self._proc
            proc = await asyncio.create_subprocess_exec(
                *self._argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=None,
                cwd="/",
                # Every sandbox is forked from the zygote and can read its PID 1's environment: hand
                # down nothing of the router's (its API key above all).
                env=_ZYGOTE_ENV,
                limit=1 << 20,
            )
            assert proc.stdout is not None
            try:
                first = await asyncio.wait_for(proc.stdout.readline(), _READY_TIMEOUT_S)
                json.loads(first)["ready"]
            except (TimeoutError, ValueError, KeyError) as exc:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                raise Unavailable(f"the sandbox zygote did not start: {first!r}") from exc
            self._proc = proc
            self._reader = asyncio.create_task(self._read(proc))
            return proc

    async def _read(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        while line := await proc.stdout.readline():
            try:
                reply = json.loads(line)
            except ValueError:
                continue
            future = self._pending.pop(reply.get("rid"), None)
            if future is not None and not future.done():
                future.set_result(reply)
        for future in self._pending.values():  # the zygote died: no reply will come
            if not future.done():
                future.set_result({"error": "the sandbox zygote exited"})
        self._pending.clear()

    async def spawn(self, config: dict[str, Any]) -> dict[str, Any]:
        """Start one sandbox; returns ``{"pid": ...}`` or ``{"error": ...}``."""
        proc = await self._ensure()
        rid = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[rid] = future
        assert proc.stdin is not None
        proc.stdin.write((json.dumps({"rid": rid, "config": config}) + "\n").encode())
        await proc.stdin.drain()
        try:
            return await asyncio.wait_for(future, _SPAWN_TIMEOUT_S)
        finally:
            self._pending.pop(rid, None)

    async def close(self) -> None:
        """Close its stdin (it exits by itself) and wait for it."""
        proc = self._proc
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 5)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        if self._reader is not None:
            await self._reader
        self._proc = None
