"""The async client: :class:`AsyncGrove` and :class:`AsyncSandbox` (aiohttp)."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import io
import os
import tarfile
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import aiohttp
import msgpack

from grove.client.artifacts import AsyncArtifacts, sandbox_artifacts
from grove.client.batch import batch_ask, stream_batch
from grove.client.computer import AsyncComputer
from grove.client.processes import AsyncProcesses
from grove.client.results import ExecResult
from grove.client.shards import ShardRoutes, split_urls
from grove.client.upload import UPLOAD_MAX_BYTES, spool_tar
from grove.core import wire
from grove.core.api import FrameReader, exec_body
from grove.core.artifact import Artifact
from grove.core.errors import (
    BatchFailed,
    Conflict,
    GroveError,
    Invalid,
    NotFound,
    Unauthorized,
    Unavailable,
    Unreachable,
    error_from_body,
)

T = TypeVar("T")
DEFAULT_URL = "http://127.0.0.1:8470"
_RETRIES = 4



def _retry_after(header: str | None) -> float | None:
    """A ``Retry-After`` header's seconds (grove sends whole seconds), or None."""
    try:
        return max(0.0, float(header)) if header is not None else None
    except ValueError:
        return None


def _resolve(url: str | None, api_key: str | None) -> tuple[list[str], str]:
    urls = split_urls(url or os.environ.get("GROVE_URL") or DEFAULT_URL)
    key = api_key or os.environ.get("GROVE_API_KEY")
    if not key:
        raise Invalid("no API key: pass api_key= or set GROVE_API_KEY (`grove up` prints it; it is in the state dir)")
    if not urls:
        raise Invalid("no router URL: pass url= or set GROVE_URL (several, one per shard, comma-separated)")
    return urls, key


class AsyncGrove:
    """Async client of a grove router."""

    def __init__(self, url: str | None = None, api_key: str | None = None, *, timeout_s: float = 3600.0,
                 project: str | None = None) -> None:
        """``url``: the router's, or several routers' comma-separated (one per shard: each sandbox's calls then go
        to the router its id names, creates to each in turn). ``project``: for an admin key, the project to act in
        (``"*"``: listings of every project); a project's own key needs none (its project is the key's)."""
        urls, self._key = _resolve(url, api_key)
        self.url = urls[0]
        """The (first) router's URL: calls that name no sandbox go there."""
        self.routes = ShardRoutes(urls)
        self.project = project or os.environ.get("GROVE_PROJECT") or None
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self._heartbeats: set[asyncio.TimerHandle | asyncio.Task[None]] = set()
        """Each heart-beating sandbox's next beat: a timer until it is due, then the call's task."""
        self.artifacts = AsyncArtifacts(self)
        """Stored artifacts of every sandbox: ``list``, ``get``, ``url``, ``pull``."""

    def auth_headers(self) -> dict[str, str]:
        """The headers that authenticate this client's calls, for a tool that calls the router itself (an MCP
        client of a published server)."""
        return {"Authorization": f"Bearer {self._key}", **({"X-Grove-Project": self.project} if self.project else {})}

    async def base_url(self, method: str, path: str) -> str:
        """The router a call goes to: the owner of the sandbox it names, given several (:mod:`grove.client.shards`)."""
        return await self.routes.base(self._http(), method, path)

    async def __aenter__(self) -> AsyncGrove:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30),
                timeout=self._timeout,
                headers={"Authorization": f"Bearer {self._key}",
                         **({"X-Grove-Project": self.project} if self.project else {})},
            )
        return self._session

    async def close(self) -> None:
        """Close connections and stop background heartbeats (sandboxes stay; close them first if you own them)."""
        beats = list(self._heartbeats)
        for beat in beats:
            beat.cancel()
        await asyncio.gather(*(b for b in beats if isinstance(b, asyncio.Task)), return_exceptions=True)
        self._heartbeats.clear()
        if self._session is not None:
            await self._session.close()

    async def request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        params: dict[str, str] | list[tuple[str, str]] | None = None,
        data: Any = None,
        msgpack_body: Any = None,
        raw: bool = False,
        retry: bool = False,
    ) -> Any:
        """One API call; returns the decoded body (or bytes with ``raw``); raises GroveError subclasses."""
        headers = {"Accept": wire.MSGPACK}
        if msgpack_body is not None:
            data = msgpack.packb(msgpack_body, use_bin_type=True)
            headers["Content-Type"] = wire.MSGPACK
        attempts = _RETRIES if retry else 1
        base = await self.base_url(method, path)
        for attempt in range(attempts):
            try:
                async with self._http().request(
                    method, base + path, json=json_body, params=params, data=data, headers=headers
                ) as resp:
                    body = await resp.read()
                    if resp.status >= 400:
                        err = error_from_body(resp.status, _decode(body, resp.content_type))
                        if (wait := _retry_after(resp.headers.get("Retry-After"))) is not None:
                            err.retry_after = wait
                        if retry and isinstance(err, Unavailable) and attempt + 1 < attempts:
                            await asyncio.sleep(err.retry_after or 1.0)
                            continue
                        raise err
                    if raw:
                        return body
                    return _decode(body, resp.content_type)
            except (TimeoutError, aiohttp.ClientConnectionError) as exc:
                refused = isinstance(exc, aiohttp.ClientConnectorError)  # nothing was sent
                if refused and attempt + 1 < attempts and (other := self.routes.instead(method, path, base)):
                    base = other  # a create another shard can take
                    continue
                if attempt + 1 >= attempts:
                    raise Unreachable(f"cannot reach the grove router at {base}: {exc}") from exc
                await asyncio.sleep(0.2 * 2**attempt)
        raise Unavailable(f"the grove router at {base} kept answering 503")

    @contextlib.asynccontextmanager
    async def stream(
        self, path: str, *, params: dict[str, str] | builtins.list[tuple[str, str]] | None = None,
        headers: dict[str, str] | None = None, allow_redirects: bool = True, method: str = "GET",
        msgpack_body: Any = None, data: Any = None,
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """A call (a GET unless ``method`` says) whose answer the caller reads as it comes (an error answer
        is raised as its GroveError first; a connection lost while reading becomes Unavailable). ``data``: a
        raw body (bytes or a file, streamed). Not retried."""
        headers = dict(headers or {})
        if msgpack_body is not None:
            data = msgpack.packb(msgpack_body, use_bin_type=True)
            headers["Content-Type"] = wire.MSGPACK
        base = await self.base_url(method, path)
        try:
            async with self._http().request(method, base + path, params=params, data=data, headers=headers,
                                            allow_redirects=allow_redirects) as resp:
                if resp.status >= 400:
                    err = error_from_body(resp.status, _decode(await resp.read(), resp.content_type))
                    if (wait := resp.headers.get("Retry-After")) is not None:
                        with contextlib.suppress(ValueError):
                            err.retry_after = float(wait)
                    raise err
                yield resp
        except (TimeoutError, aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            raise Unavailable(f"lost the grove router at {base} while reading {path}: {exc}") from exc

    async def create(self, image: str = "default", *, heartbeat: bool = True, **options: Any) -> AsyncSandbox:
        """Create a sandbox (options: the create fields of the API: ``cpu``, ``memory_mb``, ``disk_mb``, ...)."""
        body = {"image": image, "request_id": options.pop("request_id", None) or uuid.uuid4().hex, **options}
        if options.get("pool") is not None and image == "default":
            del body["image"]  # a claim's image is its pool's
        info = await self.request("POST", "/v1/sandboxes", json_body=body, retry=True)
        sandbox = AsyncSandbox(self, info)
        if heartbeat:
            sandbox.start_heartbeat()
        return sandbox

    async def create_many(self, count_or_bodies: int | Sequence[Mapping[str, Any]], image: str = "default", *,
                          heartbeat: bool = True, **options: Any) -> builtins.list[AsyncSandbox]:
        """Create many sandboxes in one call per 1,000 (``POST /v1/sandboxes/batch``): ``count_or_bodies`` is
        how many (each with ``image`` and ``options``, the fields :meth:`create` takes), or one body per
        sandbox (its fields over ``image`` and ``options``). Returns them in order, heart-beating as
        :meth:`create`'s do. With ``request_id``, item ``i`` uses ``f"{request_id}-{i}"``: calling again
        with the same arguments returns the same sandboxes, never new ones. To start work on each sandbox
        as soon as it is made, rather than when the last one is, use :meth:`create_as_ready`.

        If any item fails (a bad body, the router's limit, a start that failed), raises
        :class:`grove.core.errors.BatchFailed` once all are answered: its ``created`` holds the sandboxes that
        were made (by index; yours to use or close) and ``errors`` each failed item's error by index."""
        made: dict[int, AsyncSandbox] = {}
        errors: dict[int, GroveError] = {}
        async for part in self.create_in_parts(count_or_bodies, image, heartbeat=heartbeat, **options):
            for i, outcome in part:
                if isinstance(outcome, GroveError):
                    errors[i] = outcome
                else:
                    made[i] = outcome
        if errors:
            raise BatchFailed(dict(sorted(made.items())), errors, len(made) + len(errors))
        return [made[i] for i in range(len(made))]

    async def create_as_ready(self, count_or_bodies: int | Sequence[Mapping[str, Any]], image: str = "default", *,
                              heartbeat: bool = True, **options: Any
                              ) -> AsyncGenerator[tuple[int, AsyncSandbox | GroveError], None]:
        """:meth:`create_many`, each sandbox given as soon as the router has made it: ``(index, sandbox)``,
        or ``(index, error)`` for an item that failed, in the order they come (a burst's first rollouts
        start while the rest are still being claimed)::

            async for i, sandbox in grove.create_as_ready(1000, pool="swe"):
                if isinstance(sandbox, GroveError):
                    ...  # item i failed: sandbox says why
                else:
                    rollouts.append(asyncio.create_task(run(tasks[i], sandbox)))

        A connection lost mid-answer is resent for the items not yet given (their request ids find the
        same sandboxes); a call that fails as a whole gives every item it did not answer that error. Stop
        iterating early and the sandboxes made but not given are still made, without heartbeats (the router
        reaps them once their heartbeat timeout passes; a ``create_many`` with the same ``request_id``
        finds them before that)."""
        async for answered in stream_batch(self, batch_ask(count_or_bodies, image, options)):
            for i, answer in answered:  # one handle at a time: one not given yet has no heartbeat
                yield i, self._handle(answer, heartbeat)

    async def create_in_parts(self, count_or_bodies: int | Sequence[Mapping[str, Any]], image: str = "default", *,
                              heartbeat: bool = True, **options: Any
                              ) -> AsyncGenerator[builtins.list[tuple[int, AsyncSandbox | GroveError]], None]:
        """:meth:`create_as_ready`, a part of the router's answer at a time: each a list of ``(index, sandbox)``
        or ``(index, error)``, given as it arrives. Claims from a full pool come first more than half of
        them at once (the batch's median sandbox in the first part), then 250 at a time::

            async for part in grove.create_in_parts(1000, pool="swe"):
                for i, sandbox in part:
                    ...

        The whole part is yours at once: for a burst that starts a rollout per sandbox, the batch's median
        sandbox is in hand without waiting for the loop to step through the sandboxes before it."""
        async for answered in stream_batch(self, batch_ask(count_or_bodies, image, options)):
            part = [(i, self._handle(answer, False)) for i, answer in answered]
            if heartbeat:
                FirstBeats.start(self, [sandbox for _, sandbox in part if isinstance(sandbox, AsyncSandbox)])
            yield part

    def _handle(self, answer: dict[str, Any] | GroveError, heartbeat: bool) -> AsyncSandbox | GroveError:
        """A batch item's sandbox handle (heart-beating if asked), or its error."""
        if isinstance(answer, GroveError):
            return answer
        sandbox = AsyncSandbox(self, answer)
        if heartbeat:
            sandbox.start_heartbeat()
        return sandbox

    async def attach(self, sandbox_id: str) -> AsyncSandbox:
        """A handle on an existing sandbox (no automatic heartbeat)."""
        return AsyncSandbox(self, await self.request("GET", f"/v1/sandboxes/{sandbox_id}"))

    async def list(self, labels: dict[str, str] | None = None) -> list[dict[str, Any]]:
        """Live sandboxes, optionally filtered by metadata/labels; given several routers, every shard's (a shard
        that does not answer is left out: ``GET /v1/sandboxes?shards=all`` names it)."""
        params = [("label", f"{k}={v}") for k, v in (labels or {}).items()]
        if len(self.routes.urls) > 1:
            params.append(("shards", "all"))
        body = await self.request("GET", "/v1/sandboxes", params=params)
        return list(body["sandboxes"])

    async def create_pool(self, name: str, image: str = "default", *, size: int = 1, **options: Any) -> dict[str, Any]:
        """Define a warm pool (options: ``resources`` {cpu, memory_mb, pids_max, disk_mb}, ``network``,
        ``workdir``); ``create(pool=name)`` then claims a ready sandbox from it."""
        body = {"name": name, "image": image, "size": size, **options}
        return dict(await self.request("POST", "/v1/pools", json_body=body))

    async def pools(self) -> builtins.list[dict[str, Any]]:
        """Every warm pool with its counts (``size``, ``ready``, ``starting``, ``claims``, ``misses``)."""
        return list((await self.request("GET", "/v1/pools"))["pools"])

    async def pool(self, name: str) -> dict[str, Any]:
        """One warm pool."""
        return dict(await self.request("GET", f"/v1/pools/{name}"))

    async def resize_pool(self, name: str, size: int) -> dict[str, Any]:
        """Change how many ready sandboxes a pool keeps."""
        return dict(await self.request("PATCH", f"/v1/pools/{name}", json_body={"size": size}))

    async def delete_pool(self, name: str) -> dict[str, Any]:
        """Delete a pool and its unclaimed sandboxes (claimed ones stay their users')."""
        return dict(await self.request("DELETE", f"/v1/pools/{name}"))


class FirstBeats:
    """The first heartbeat of many sandboxes made together (a part of a batch's answer), on one timer: a
    thousand timers made before the sandboxes are handed over cost ~1 ms of the batch's answer. When due,
    each member that still beats goes on with timers of its own (:meth:`AsyncSandbox.start_heartbeat`)."""

    def __init__(self, client: AsyncGrove, members: builtins.list[AsyncSandbox], every: float) -> None:
        self.client = client
        self.members = dict.fromkeys(members)
        self.timer = asyncio.get_running_loop().call_later(every, self._due)
        client._heartbeats.add(self.timer)
        for sandbox in members:
            sandbox._beat_every, sandbox._heartbeat = every, self

    @classmethod
    def start(cls, client: AsyncGrove, sandboxes: builtins.list[AsyncSandbox]) -> None:
        """Heartbeats started for these sandboxes (not yet heart-beating): one timer per interval."""
        by_interval: dict[float, builtins.list[AsyncSandbox]] = {}
        for sandbox in sandboxes:
            by_interval.setdefault(sandbox._default_beat(), []).append(sandbox)
        for every, members in by_interval.items():
            cls(client, members, every)

    def leave(self, sandbox: AsyncSandbox) -> None:
        """One member stops beating (closed, or its heartbeat restarted); the timer goes with the last."""
        self.members.pop(sandbox, None)
        if not self.members:
            self.timer.cancel()
            self.client._heartbeats.discard(self.timer)

    def _due(self) -> None:
        self.client._heartbeats.discard(self.timer)
        for sandbox in self.members:
            sandbox._beat_due()


class AsyncSandbox:
    """A handle on one sandbox."""

    def __init__(self, client: AsyncGrove, info: dict[str, Any]) -> None:
        self.client = client
        self.info = info
        self.id: str = info["id"]
        self._heartbeat: asyncio.TimerHandle | asyncio.Task[None] | FirstBeats | None = None
        self._beat_every = 0.0
        self.computer = AsyncComputer(self)
        """The sandbox's screen, mouse and keyboard (:mod:`grove.client.computer`)."""
        self.processes = AsyncProcesses(self)
        """The sandbox's background processes (:mod:`grove.client.processes`)."""

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _path(self, suffix: str = "") -> str:
        return f"/v1/sandboxes/{self.id}{suffix}"

    def start_heartbeat(self, interval_s: float | None = None) -> None:
        """Heart-beat in the background so a live client's sandbox is never reaped.

        A timer waits for each beat, not a task sleeping (a thousand sandboxes, a thousand timers, not a
        thousand coroutines); the sandboxes of one part of a batch share the timer of their first beat
        (:class:`FirstBeats`)."""
        self._stop_heartbeat()
        self._beat_every = interval_s or self._default_beat()
        self._next_beat()

    def _default_beat(self) -> float:
        """A third of the sandbox's heartbeat timeout, within 1 to 30 s."""
        timeout = float(self.info.get("timeouts", {}).get("heartbeat_timeout_s", 900))
        return max(1.0, min(30.0, timeout / 3))

    def _next_beat(self) -> None:
        self._heartbeat = asyncio.get_running_loop().call_later(self._beat_every, self._beat_due)
        self.client._heartbeats.add(self._heartbeat)

    def _beat_due(self) -> None:
        if self._heartbeat is not None:
            self.client._heartbeats.discard(self._heartbeat)
        task = asyncio.ensure_future(self._beat())
        self._heartbeat = task
        self.client._heartbeats.add(task)
        task.add_done_callback(self.client._heartbeats.discard)

    async def _beat(self) -> None:
        try:
            await self.heartbeat()
        except (NotFound, Conflict, Unauthorized):
            self._heartbeat = None
            return  # deleted (or no longer ours): nothing left to keep alive
        except GroveError:
            pass  # e.g. the router restarting: keep beating, it re-adopts the sandbox
        self._next_beat()

    def stop_heartbeat(self) -> None:
        """Stop heart-beating (the sandbox stays, idle, until its own timeouts or a delete)."""
        self._stop_heartbeat()

    def _stop_heartbeat(self) -> None:
        if isinstance(self._heartbeat, FirstBeats):
            self._heartbeat.leave(self)
        elif self._heartbeat is not None:
            self._heartbeat.cancel()
            self.client._heartbeats.discard(self._heartbeat)
        self._heartbeat = None

    async def heartbeat(self) -> None:
        """Keep the sandbox alive."""
        await self.client.request("POST", self._path("/heartbeat"), json_body={})

    async def port_url(self, port: int, *, expires_s: float = 3600.0) -> str:
        """A signed URL reaching ``port`` in the sandbox on the router's host-named listener (for a browser or
        a tool that cannot set headers), acting as this client's key until it expires."""
        answer = await self.client.request("POST", self._path(f"/ports/{port}/url"), json_body={"expires_s": expires_s})
        return str(answer["url"])

    async def mcp_server(self, name: str, port: int | None = None, *, path: str = "/mcp",
                         command: str | list[str] | None = None, cwd: str | None = None,
                         env: dict[str, str] | None = None) -> dict[str, Any]:
        """Publish an MCP server of the sandbox as ``name``: the one serving streamable HTTP on ``port`` (at
        ``path``), or a stdio server grove starts from ``command`` (in ``cwd``, with ``env``) and serves as
        streamable HTTP. Returns the configuration an MCP client outside needs (``url``, ``headers``,
        ``transport``); either form is reached the same way."""
        if (port is None) == (command is None):
            raise Invalid("give either the port of a server serving streamable HTTP or the command of a stdio one")
        body: dict[str, Any] = {"port": port, "path": path} if command is None else \
            {"command": command, "cwd": cwd, "env": env or {}}
        answer = await self.client.request("PUT", self._path(f"/mcp/{name}"), json_body=body)
        owner = await self.client.base_url("PUT", self._path(f"/mcp/{name}"))
        return {"url": f"{owner}{self._path(f'/mcp/{name}')}", "transport": answer["transport"],
                "headers": self.client.auth_headers()}

    async def remove_mcp_server(self, name: str) -> None:
        """Remove a publication (a stdio server's process ends)."""
        await self.client.request("DELETE", self._path(f"/mcp/{name}/publication"))

    async def status(self) -> dict[str, Any]:
        """The sandbox's current record."""
        self.info = await self.client.request("GET", self._path())
        return self.info

    async def exec(
        self,
        command: str | list[str],
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        stdin: bytes | str | None = None,
        timeout_s: float | None = None,
        max_output_bytes: int | None = None,
        user: str | None = None,
    ) -> ExecResult:
        """Run a command (a string runs under /bin/sh -c) as the sandbox's root, or as ``user`` (``name``,
        ``uid``, ``name:group``, ``uid:gid``); safe to retry: it carries a request id."""
        body = exec_body(command, cwd=cwd, env=env, stdin=stdin, timeout_s=timeout_s,
                         max_output_bytes=max_output_bytes, user=user)
        data = await self.client.request("POST", self._path("/exec"), msgpack_body=body, retry=True)
        return ExecResult.from_wire(data)

    async def exec_stream(self, command: str | list[str], **options: Any) -> AsyncIterator[tuple[str, Any]]:
        """Yield ``("stdout"|"stderr", bytes)`` as output comes, then ``("result", ExecResult)``."""
        body = exec_body(command, **options)
        http = self.client._http()
        headers = {"Accept": wire.MSGPACK, "Content-Type": wire.MSGPACK}
        base = await self.client.base_url("POST", self._path("/exec"))
        try:
            async with http.post(
                base + self._path("/exec"),
                params={"stream": "1"},
                data=msgpack.packb(body, use_bin_type=True),
                headers=headers,
            ) as resp:
                if resp.status >= 400:
                    raise error_from_body(resp.status, _decode(await resp.read(), resp.content_type))
                reader = FrameReader(resp.content_type)
                async for chunk in resp.content.iter_any():
                    for frame in reader.feed(chunk):
                        if frame["type"] == "result":
                            yield "result", ExecResult.from_wire(frame["result"])
                        elif frame["type"] == "error":
                            raise error_from_body(500, frame)
                        else:
                            yield frame["type"], frame["data"]
        except (TimeoutError, aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            # Not retried: the command may have run. The SDK raises only grove's own errors.
            raise Unavailable(f"lost the grove router at {base} during a streamed exec: {exc}") from exc

    async def read_file(self, path: str) -> bytes:
        """The bytes of a file."""
        data: bytes = await self.client.request("GET", self._path("/files"), params={"path": path}, raw=True)
        return data

    async def write_file(self, path: str, data: bytes | str, *, mode: int | None = None) -> None:
        """Write a file atomically (parents created)."""
        params = {"path": path}
        if mode is not None:
            params["mode"] = f"{mode:o}"
        payload = data.encode() if isinstance(data, str) else data
        await self.client.request("PUT", self._path("/files"), params=params, data=payload)

    async def delete_file(self, path: str, *, recursive: bool = False) -> None:
        """Delete a file (or a directory tree with ``recursive``)."""
        params = {"path": path, **({"recursive": "1"} if recursive else {})}
        await self.client.request("DELETE", self._path("/files"), params=params)

    async def list_files(self, path: str = ".") -> list[dict[str, Any]]:
        """Entries of a directory: name, type, size, mode, mtime."""
        body = await self.client.request("GET", self._path("/files/list"), params={"path": path})
        return list(body["entries"])

    async def manifest(self, path: str = ".", *, skip: Sequence[str] = ()) -> list[dict[str, Any]]:
        """Every entry under a directory (its path relative to it): ``path``, ``type``, ``mode``, ``size``, ``sha256``
        of a regular file, ``target`` of a symlink; entries named in ``skip`` are left out with all under them."""
        params = [("path", path), *(("skip", name) for name in skip)]
        body = await self.client.request("GET", self._path("/files/manifest"), params=params)
        return list(body["entries"])

    async def upload(self, local_dir: str | Path, remote_dir: str, *, max_bytes: int = UPLOAD_MAX_BYTES) -> int:
        """Copy a local directory into the sandbox (as one tar, spooled to disk and streamed; symlinks kept as
        links); returns the member count. ``Invalid`` past ``max_bytes`` of tar."""
        with await asyncio.to_thread(spool_tar, local_dir, max_bytes) as spool:
            return await self.upload_tar(spool, remote_dir)

    async def upload_tar(self, tar: Any, remote_dir: str) -> int:
        """Unpack a tar (bytes, or a binary file, streamed) into ``remote_dir``; returns the member count."""
        body = await self.client.request("PUT", self._path("/archive"), params={"path": remote_dir}, data=tar)
        return int(body["members"])

    async def download(self, remote_dir: str, local_dir: str | Path) -> None:
        """Copy a directory of the sandbox to a local directory (links kept inside it only)."""
        data = await self.client.request("GET", self._path("/archive"), params={"path": remote_dir}, raw=True)
        Path(local_dir).mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
            tar.extractall(str(local_dir), filter="data")

    async def post_event(self, kind: str, data: Any) -> dict[str, Any]:
        """Append a harness event (``message``, ``tool_call``, ``reward``, ``result``, ...) to the trajectory."""
        body = {"events": [{"kind": kind, "data": data}]}
        return dict(await self.client.request("POST", self._path("/events"), json_body=body))

    async def push_artifacts(self, paths: list[str], *, url_expires_s: float | None = None) -> list[dict[str, Any]]:
        """Store files of the sandbox in S3 as artifacts; per path its ``key``, ``size``, ``sha256`` and a
        presigned GET ``url`` (valid ``url_expires_s``, default the router's)."""
        body: dict[str, Any] = {"paths": paths, **({"url_expires_s": url_expires_s} if url_expires_s else {})}
        answer = await self.client.request("POST", self._path("/artifacts"), json_body=body)
        return list(answer["artifacts"])

    async def artifacts(self, *, page_size: int | None = None) -> list[Artifact]:
        """The sandbox's stored artifacts (pushed files and truncated commands' full outputs)."""
        return await sandbox_artifacts(self.client, self.id, page_size)

    async def checkpoint(self) -> dict[str, Any]:
        """Checkpoint the sandbox's files now (its processes frozen only for that instant): ``id``, ``step``,
        ``bytes``, ``frozen_ms``... Create from it with ``create(checkpoint=ID)``."""
        return dict(await self.client.request("POST", self._path("/checkpoints"), json_body={}))

    async def checkpoints(self) -> builtins.list[dict[str, Any]]:
        """The sandbox's checkpoints, oldest first."""
        return list((await self.client.request("GET", self._path("/checkpoints")))["checkpoints"])

    async def delete_checkpoint(self, checkpoint_id: str) -> dict[str, Any]:
        """Delete one of its checkpoints (sandboxes made from it keep their files)."""
        return dict(await self.client.request("DELETE", self._path(f"/checkpoints/{quote(checkpoint_id)}")))

    async def fork(self, count: int = 1, *, metadata: dict[str, Any] | None = None) -> builtins.list[AsyncSandbox]:
        """``count`` new sandboxes with this one's files as they are now (files only; this one keeps running)."""
        body: dict[str, Any] = {"count": count, **({"metadata": metadata} if metadata is not None else {})}
        reply = await self.client.request("POST", self._path("/fork"), json_body=body)
        return [AsyncSandbox(self.client, info) for info in reply["sandboxes"]]

    async def close(self) -> None:
        """Delete the sandbox (idempotent)."""
        self._stop_heartbeat()
        try:
            # Retried like a create: a delete is idempotent, and a host busy tearing down a thousand
            # sandboxes may answer 503 while this one's processes are still exiting (the router's reaper
            # finishes it either way; the retry tells the caller it is done).
            await self.client.request("DELETE", self._path(), retry=True)
        except GroveError as exc:
            if exc.status not in (404, 409):
                raise


def _decode(body: bytes, content_type: str) -> Any:
    try:
        return wire.decode(body, content_type)
    except GroveError:
        return {"error": {"code": "bad_gateway", "message": body[:500].decode(errors="replace")}}


# -- the synchronous client ------------------------------------------------------------------------------
