"""Storing the full output of a truncated command: the bytes the command wrote, or nothing.

The spill file sits in the sandbox, where its processes can replace or rewrite it; relaying whatever the
path held let a sandbox fill the host's disk with a sparse file (issue 18, finding 1). So the router reads
the output from the descriptor the executor wrote it through (``GET /v1/outputs``), never more than the
size the exec reported, and holds the last chunk back until the sha256 of all of it matches the one the
exec reported: a mismatch aborts the upload (S3 keeps nothing of a PUT cut short) and is recorded as a
``full_output`` step with the reason, never stored as the output.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from artifacts import catalog
from grove.core.artifact import Artifact
from grove.core.errors import Unavailable
from router.backends.base import Endpoint
from router.records.registry import SandboxRecord
from router.storage import Storage
from router.trajectory.outflow import ByteBudget
from router.trajectory.recorder import Recorder
from router.upstream.proxy import Upstreams

log = logging.getLogger("grove.router")
_CHUNK = 1024 * 1024


@dataclass(frozen=True)
class FullOutput:
    """One truncated stream of an exec step: where the sandbox keeps it and what the command wrote."""

    path: str
    size: int
    sha256: str
    kind: str = "stdout"
    """``stdout`` or ``stderr``: its kind in the artifact index."""


class Mismatch(Exception):
    """What the executor served is not what the command wrote."""


def full_outputs_of(step: dict[str, Any]) -> list[FullOutput]:
    """The truncated streams of an exec step (each with a ``*_file``), as the executor reported them."""
    found = []
    for stream in ("stdout", "stderr"):
        path, size, sha = step.get(f"{stream}_file"), step.get(f"{stream}_bytes"), step.get(f"{stream}_sha256")
        if isinstance(path, str) and isinstance(size, int) and size >= 0 and isinstance(sha, str):
            found.append(FullOutput(path, size, sha, stream))
    return found


EndpointOf = Callable[[SandboxRecord], Awaitable[Endpoint]]
"""The executor of a sandbox, started first if it was scaled to zero (the lifecycle's; narrow on purpose)."""


class FullOutputs:
    """Stores truncated commands' full outputs in the background, at the pace of the router's byte budget."""

    def __init__(self, budget: ByteBudget, storage: Storage, upstreams: Upstreams, endpoint_of: EndpointOf,
                 recorder: Recorder) -> None:
        self.budget = budget
        self._storage = storage
        self._upstreams, self._endpoint_of, self._recorder = upstreams, endpoint_of, recorder

    async def store(self, record: SandboxRecord, outputs: list[FullOutput]) -> None:
        """Store each output at the pace of the budget; failures become ``full_output`` steps."""
        try:
            waited = await self.budget.spend(sum(o.size for o in outputs))
        except Unavailable:
            log.warning("full output of %s not stored, the router stopped first; it stays in the sandbox: %s",
                        record.id, ", ".join(o.path for o in outputs))
            return
        if waited and record.status == "deleted":
            return  # its files went with it while this waited its turn
        for output in outputs:
            try:
                await self._store(record, output)
            except Exception as exc:  # each reason is recorded; an aborted upload may come back wrapped
                reason = str(exc) or type(exc).__name__
                log.warning("full output %s of %s not stored: %s", output.path, record.id, reason)
                self._recorder.step(record, {"type": "full_output", "t": time.time(), "path": output.path,
                                             "stored": False, "error": reason})

    async def _store(self, record: SandboxRecord, output: FullOutput) -> None:
        own = self._storage.of(record.project)  # the sandbox's project's part of the bucket
        store, index = own.objects, own.artifacts
        path = catalog.normalize_path(output.path)
        key = catalog.artifact_key(record.id, path)
        url = await asyncio.to_thread(store.presign_put, key)
        endpoint = await self._endpoint_of(record)
        async with self._upstreams.call(endpoint, "GET", "/v1/outputs", params={"path": output.path}) as src:
            if src.status >= 400:
                raise Unavailable(f"the executor has no full output {output.path}: {(await src.text())[:300]}")
            headers = {"Content-Length": str(output.size)}
            try:
                async with aiohttp.ClientSession() as out, out.put(url, data=_verified(src.content, output),
                                                                   headers=headers) as put:
                    if put.status >= 300:
                        raise Unavailable(f"object storage refused {output.path}: {put.status}")
            except BaseException:
                # Belt and braces: whatever S3 made of an aborted PUT is not the output.
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(store.delete, key)
                raise
        # Indexed like a pushed file (kind stdout/stderr): listed and fetched by the same routes.
        stored = await asyncio.to_thread(store.stat, key)
        meta = record.request.metadata
        entry = Artifact(
            sandbox_id=record.id, path=path, key=key, size=stored.size, sha256=output.sha256,
            created_at=time.time(), kind=output.kind, task_id=meta.task_id, run_id=meta.labels.get(catalog.RUN_LABEL),
            etag=stored.etag,
        )
        await asyncio.to_thread(index.record, entry)


async def _verified(src: aiohttp.StreamReader, output: FullOutput) -> AsyncIterator[bytes]:
    """At most ``output.size`` bytes; the last chunk only once the whole matches ``output.sha256``."""
    digest = hashlib.sha256()
    seen = 0
    held = b""
    while seen < output.size:
        chunk = await src.read(min(_CHUNK, output.size - seen))
        if not chunk:
            raise Mismatch(f"the sandbox's copy of {output.path} ends after {seen} of {output.size} bytes")
        seen += len(chunk)
        digest.update(chunk)
        if held:
            yield held
        held = chunk
    if digest.hexdigest() != output.sha256:
        raise Mismatch(f"the sandbox's copy of {output.path} was changed (sha256 differs from the command's output)")
    if held:
        yield held
