"""The synchronous client: the async one, driven from a private event loop in a daemon thread."""

from __future__ import annotations

import asyncio
import builtins
import threading
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from grove.client.aio import AsyncGrove, AsyncSandbox
from grove.client.artifacts import AsyncArtifacts
from grove.client.computer import AsyncComputer
from grove.client.download import Progress
from grove.client.processes import Processes
from grove.client.pull import PullReport
from grove.client.results import ExecResult
from grove.core.artifact import Artifact
from grove.core.errors import BatchFailed, GroveError

T = TypeVar("T")


class _Loop:
    """A private event loop in a daemon thread that runs the async client for sync callers."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="grove-client", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T] | Awaitable[T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()  # type: ignore[arg-type]

    def iterate(self, items: AsyncGenerator[T, None]) -> Iterator[T]:
        """An async generator of the client's, stepped from a sync caller; closed when the caller stops."""
        try:
            while True:
                try:
                    yield self.run(anext(items))
                except StopAsyncIteration:
                    return
        finally:
            self.run(items.aclose())

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)


class Grove:
    """Synchronous client: the same calls as :class:`AsyncGrove`, usable from any thread."""

    def __init__(self, url: str | None = None, api_key: str | None = None, *, timeout_s: float = 3600.0,
                 project: str | None = None) -> None:
        """``project``: for an admin key, the project to act in (``"*"``: listings of every project)."""
        self._loop = _Loop()
        self._async = self._loop.run(_make(url, api_key, timeout_s, project))
        self.url = self._async.url
        self.artifacts = Artifacts(self._loop, self._async.artifacts)
        """Stored artifacts of every sandbox: ``list``, ``get``, ``url``, ``pull``."""

    def __enter__(self) -> Grove:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close connections and the background loop."""
        self._loop.run(self._async.close())
        self._loop.stop()

    def create(self, image: str = "default", **options: Any) -> Sandbox:
        """Create a sandbox; see :meth:`AsyncGrove.create`."""
        return Sandbox(self._loop, self._loop.run(self._async.create(image, **options)))

    def create_many(self, count_or_bodies: int | Sequence[Mapping[str, Any]], image: str = "default",
                    **options: Any) -> builtins.list[Sandbox]:
        """Create many sandboxes in one call per 1,000; see :meth:`AsyncGrove.create_many`. A
        :class:`grove.core.errors.BatchFailed` carries these synchronous handles in ``created``."""
        try:
            made = self._loop.run(self._async.create_many(count_or_bodies, image, **options))
        except BatchFailed as exc:
            created = {i: Sandbox(self._loop, inner) for i, inner in exc.created.items()}
            raise BatchFailed(created, exc.errors, exc.total) from None
        return [Sandbox(self._loop, inner) for inner in made]

    def create_as_ready(self, count_or_bodies: int | Sequence[Mapping[str, Any]], image: str = "default",
                        **options: Any) -> Iterator[tuple[int, Sandbox | GroveError]]:
        """Each sandbox of a batch as soon as it is made: ``(index, sandbox)`` or ``(index, error)``, in the
        order they come; see :meth:`AsyncGrove.create_as_ready`."""
        for i, outcome in self._loop.iterate(self._async.create_as_ready(count_or_bodies, image, **options)):
            yield i, self._sandbox_or_error(outcome)

    def create_in_parts(self, count_or_bodies: int | Sequence[Mapping[str, Any]], image: str = "default",
                        **options: Any) -> Iterator[builtins.list[tuple[int, Sandbox | GroveError]]]:
        """The sandboxes of a batch a part of the router's answer at a time, each part a list of ``(index,
        sandbox)`` or ``(index, error)``; see :meth:`AsyncGrove.create_in_parts`."""
        for part in self._loop.iterate(self._async.create_in_parts(count_or_bodies, image, **options)):
            yield [(i, self._sandbox_or_error(outcome)) for i, outcome in part]

    def _sandbox_or_error(self, outcome: AsyncSandbox | GroveError) -> Sandbox | GroveError:
        return outcome if isinstance(outcome, GroveError) else Sandbox(self._loop, outcome)

    def attach(self, sandbox_id: str) -> Sandbox:
        """A handle on an existing sandbox."""
        return Sandbox(self._loop, self._loop.run(self._async.attach(sandbox_id)))

    def list(self, labels: dict[str, str] | None = None) -> list[dict[str, Any]]:
        """Live sandboxes."""
        return self._loop.run(self._async.list(labels))

    def create_pool(self, name: str, image: str = "default", *, size: int = 1, **options: Any) -> dict[str, Any]:
        """Define a warm pool; see :meth:`AsyncGrove.create_pool`."""
        return self._loop.run(self._async.create_pool(name, image, size=size, **options))

    def pools(self) -> builtins.list[dict[str, Any]]:
        """Every warm pool with its counts."""
        return self._loop.run(self._async.pools())

    def pool(self, name: str) -> dict[str, Any]:
        """One warm pool."""
        return self._loop.run(self._async.pool(name))

    def resize_pool(self, name: str, size: int) -> dict[str, Any]:
        """Change how many ready sandboxes a pool keeps."""
        return self._loop.run(self._async.resize_pool(name, size))

    def delete_pool(self, name: str) -> dict[str, Any]:
        """Delete a pool and its unclaimed sandboxes."""
        return self._loop.run(self._async.delete_pool(name))

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """A raw API call (decoded body)."""
        return self._loop.run(self._async.request(method, path, **kwargs))


async def _make(url: str | None, api_key: str | None, timeout_s: float, project: str | None) -> AsyncGrove:
    return AsyncGrove(url, api_key, timeout_s=timeout_s, project=project)


class Sandbox:
    """Synchronous handle on one sandbox; see :class:`AsyncSandbox` for each call."""

    def __init__(self, loop: _Loop, inner: AsyncSandbox) -> None:
        self._loop = loop
        self.inner = inner
        self.id = inner.id
        self.info = inner.info
        self.computer = Computer(loop, inner.computer)
        """The sandbox's screen, mouse and keyboard; see :class:`grove.client.computer.AsyncComputer`."""
        self.processes = Processes(loop, inner.processes)
        """The sandbox's background processes; see :class:`grove.client.processes.AsyncProcesses`."""

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def exec(self, command: str | list[str], **options: Any) -> ExecResult:
        """Run a command."""
        return self._loop.run(self.inner.exec(command, **options))

    def read_file(self, path: str) -> bytes:
        """The bytes of a file."""
        return self._loop.run(self.inner.read_file(path))

    def write_file(self, path: str, data: bytes | str, *, mode: int | None = None) -> None:
        """Write a file atomically."""
        self._loop.run(self.inner.write_file(path, data, mode=mode))

    def delete_file(self, path: str, *, recursive: bool = False) -> None:
        """Delete a file or tree."""
        self._loop.run(self.inner.delete_file(path, recursive=recursive))

    def list_files(self, path: str = ".") -> list[dict[str, Any]]:
        """Entries of a directory."""
        return self._loop.run(self.inner.list_files(path))

    def manifest(self, path: str = ".", *, skip: Sequence[str] = ()) -> list[dict[str, Any]]:
        """Every entry under a directory, with a file's sha256 (see :meth:`AsyncSandbox.manifest`)."""
        return self._loop.run(self.inner.manifest(path, skip=skip))

    def upload(self, local_dir: str | Path, remote_dir: str) -> int:
        """Copy a local directory in."""
        return self._loop.run(self.inner.upload(local_dir, remote_dir))

    def download(self, remote_dir: str, local_dir: str | Path) -> None:
        """Copy a directory out."""
        self._loop.run(self.inner.download(remote_dir, local_dir))

    def heartbeat(self) -> None:
        """Keep alive."""
        self._loop.run(self.inner.heartbeat())

    def port_url(self, port: int, *, expires_s: float = 3600.0) -> str:
        """A signed URL reaching ``port`` in the sandbox (see :meth:`AsyncSandbox.port_url`)."""
        return self._loop.run(self.inner.port_url(port, expires_s=expires_s))

    def mcp_server(self, name: str, port: int | None = None, *, path: str = "/mcp",
                   command: str | list[str] | None = None, cwd: str | None = None,
                   env: dict[str, str] | None = None) -> dict[str, Any]:
        """Publish an MCP server of the sandbox (HTTP on ``port``, or a stdio ``command``); its client
        configuration (see :meth:`AsyncSandbox.mcp_server`)."""
        return self._loop.run(self.inner.mcp_server(name, port, path=path, command=command, cwd=cwd, env=env))

    def remove_mcp_server(self, name: str) -> None:
        """Remove a publication (a stdio server's process ends)."""
        self._loop.run(self.inner.remove_mcp_server(name))

    def status(self) -> dict[str, Any]:
        """The current record."""
        self.info = self._loop.run(self.inner.status())
        return self.info

    def post_event(self, kind: str, data: Any) -> dict[str, Any]:
        """Append a harness event to the trajectory."""
        return self._loop.run(self.inner.post_event(kind, data))

    def push_artifacts(self, paths: list[str], *, url_expires_s: float | None = None) -> list[dict[str, Any]]:
        """Store files of the sandbox in S3 as artifacts; keys, sizes, sha256 and presigned GET URLs."""
        return self._loop.run(self.inner.push_artifacts(paths, url_expires_s=url_expires_s))

    def artifacts(self, *, page_size: int | None = None) -> list[Artifact]:
        """The sandbox's stored artifacts."""
        return self._loop.run(self.inner.artifacts(page_size=page_size))

    def checkpoint(self) -> dict[str, Any]:
        """Checkpoint the sandbox's files now (see :meth:`AsyncSandbox.checkpoint`)."""
        return self._loop.run(self.inner.checkpoint())

    def checkpoints(self) -> list[dict[str, Any]]:
        """The sandbox's checkpoints, oldest first."""
        return self._loop.run(self.inner.checkpoints())

    def delete_checkpoint(self, checkpoint_id: str) -> dict[str, Any]:
        """Delete one of its checkpoints."""
        return self._loop.run(self.inner.delete_checkpoint(checkpoint_id))

    def fork(self, count: int = 1, *, metadata: dict[str, Any] | None = None) -> list[Sandbox]:
        """``count`` new sandboxes with this one's files as they are now (see :meth:`AsyncSandbox.fork`)."""
        return [Sandbox(self._loop, child) for child in self._loop.run(self.inner.fork(count, metadata=metadata))]

    def close(self) -> None:
        """Delete the sandbox."""
        self._loop.run(self.inner.close())


class Computer:
    """``sandbox.computer`` of the synchronous client: every call of :class:`AsyncComputer`, blocking."""

    def __init__(self, loop: _Loop, inner: AsyncComputer) -> None:
        self._loop = loop
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        call = getattr(self.inner, name)
        if not callable(call) or name.startswith("_"):
            return call

        def blocking(*args: Any, **kwargs: Any) -> Any:
            return self._loop.run(call(*args, **kwargs))

        blocking.__name__ = name
        blocking.__doc__ = call.__doc__
        return blocking


class Artifacts:
    """``grove.artifacts`` of the synchronous client; see :class:`grove.client.artifacts.AsyncArtifacts`."""

    def __init__(self, loop: _Loop, inner: AsyncArtifacts) -> None:
        self._loop = loop
        self.inner = inner

    def list(self, *, sandbox_id: str | None = None, task_id: str | None = None, run_id: str | None = None,
             page_size: int | None = None) -> list[Artifact]:
        """Every stored artifact matching the filters, across all pages."""
        return self._loop.run(self.inner.list(sandbox_id=sandbox_id, task_id=task_id, run_id=run_id,
                                              page_size=page_size))

    def get(self, sandbox_id: str, path: str, dest: str | Path | None = None,
            *, progress: Callable[[Progress], None] | None = None) -> Any:
        """The artifact's verified bytes, or written to ``dest`` (resumable); see :meth:`AsyncArtifacts.get`."""
        return self._loop.run(self.inner.get(sandbox_id, path, dest, progress=progress))

    def url(self, sandbox_id: str, path: str, *, expires_s: float | None = None) -> str:
        """A fresh presigned GET URL of the artifact."""
        return self._loop.run(self.inner.url(sandbox_id, path, expires_s=expires_s))

    def pull(self, dest_dir: str | Path, *, sandbox_id: str | None = None, task_id: str | None = None,
             run_id: str | None = None, jobs: int = 4,
             progress: Callable[[Progress], None] | None = None) -> PullReport:
        """Fetch every matching artifact into ``<dest_dir>/<sandbox_id>/<path>``, verified and resumable."""
        return self._loop.run(self.inner.pull(dest_dir, sandbox_id=sandbox_id, task_id=task_id, run_id=run_id,
                                              jobs=jobs, progress=progress))
