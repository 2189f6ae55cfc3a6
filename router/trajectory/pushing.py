"""Moving sandbox files into object storage: presigned PUT URLs, uploaded by the executor or relayed."""

from __future__ import annotations

import asyncio
import hashlib
import posixpath
import time
from typing import Any

import aiohttp

from artifacts import catalog
from grove.core.artifact import Artifact, fetch_route
from grove.core.errors import BadGateway, GroveError, TooLarge, Unavailable, error_from_body
from router.backends.base import Endpoint
from router.records.registry import SandboxRecord
from router.storage import Storage
from router.trajectory.fulloutputs import EndpointOf
from router.upstream.proxy import Upstreams


class ArtifactPushes:
    """Pushes files of sandboxes into object storage and the artifact index (``POST …/artifacts``)."""

    def __init__(self, storage: Storage, upstreams: Upstreams, endpoint_of: EndpointOf, *,
                 executor_reaches_storage: bool, url_expires_s: float) -> None:
        """``executor_reaches_storage``: the backend's sandboxes can reach the store themselves (Knative);
        ``url_expires_s``: the lifetime of the GET URLs handed back."""
        self._storage = storage
        self._upstreams, self._endpoint_of = upstreams, endpoint_of
        self._executor_reaches_storage, self._url_expires_s = executor_reaches_storage, url_expires_s

    async def push(
        self, record: SandboxRecord, paths: list[str], *, kinds: dict[str, str] | None = None,
        url_expires_s: float | None = None,
    ) -> list[dict[str, Any]]:
        """Have the executor upload each path to a presigned PUT URL; relay through the router if it cannot;
        then record each artifact in the index (``kinds``: path → ``stdout``/``stderr`` for full outputs).

        A sandbox with egress denied has no route to the object store at all, so the router streams the
        file out of the executor and into the same presigned URL — the sandbox still never sees a credential.
        An upload the executor reports is believed only once the object is there with the reported size and
        sha256: whatever answered the executor's PUT may have been a process of the sandbox (issue 18, finding
        7). Where the store's address is the sandbox's own loopback (the local backend) the executor is not
        asked at all.
        """
        own = self._storage.of(record.project)  # the sandbox's project's part of the bucket
        store, index = own.objects, own.artifacts
        # Keys name the absolute path, so "out/x" and "/workspace/out/x" are one artifact, not two.
        full = {p: catalog.normalize_path(posixpath.join(record.request.workdir, p)) for p in paths}
        keys = {p: catalog.artifact_key(record.id, full[p]) for p in paths}
        urls = {p: await asyncio.to_thread(store.presign_put, keys[p]) for p in paths}
        endpoint = await self._endpoint_of(record)
        if self._executor_reaches_storage:
            answered = await self._executor_push(endpoint, [(p, urls[p]) for p in paths])
        else:
            answered = [{"path": p, "uploaded": False} for p in paths]
        # A real file is never larger than the sandbox's disk quota; a sparse one can claim any size.
        cap = record.request.disk_mb * 1024 * 1024
        expires = url_expires_s or self._url_expires_s
        meta = record.request.metadata
        results = []
        for path, item in zip(paths, answered, strict=True):
            if item.get("uploaded") and await asyncio.to_thread(_holds, store, keys[path], item):
                item = {**item, "via": "executor"}
            else:
                relayed = await self._relay(endpoint, path, urls[path], cap)
                item = {"path": item.get("path", path), **relayed, "via": "router"}
            # The size is S3's own; the sha256 is what the uploader hashed on the way (a later GET checks it).
            stored = await asyncio.to_thread(store.stat, keys[path])
            entry = Artifact(
                sandbox_id=record.id, path=full[path], key=keys[path], size=stored.size, sha256=str(item["sha256"]),
                created_at=time.time(), kind=(kinds or {}).get(path, "file"), task_id=meta.task_id,
                run_id=meta.labels.get(catalog.RUN_LABEL), etag=stored.etag,
            )
            await asyncio.to_thread(index.record, entry)
            get_url = await asyncio.to_thread(store.presign_get, keys[path], expires)
            results.append({**item, "path": item.get("path", path), "key": keys[path], "size": stored.size,
                            "url": get_url, "fetch": fetch_route(record.id, full[path])})
        return results

    async def _executor_push(self, endpoint: Endpoint, items: list[tuple[str, str]]) -> list[dict[str, Any]]:
        payload = {"items": [{"path": p, "url": u} for p, u in items]}
        async with self._upstreams.call(endpoint, "POST", "/v1/artifacts/push", json_body=payload) as resp:
            try:
                answer = await resp.json(content_type=None)
            except (aiohttp.ClientError, ValueError) as exc:
                raise BadGateway(f"the sandbox's executor went away answering the push: {exc}") from exc
            if resp.status >= 400:
                raise error_from_body(resp.status, answer)
        found = answer.get("items") if isinstance(answer, dict) else None
        if not isinstance(found, list) or len(found) != len(items) or not all(isinstance(i, dict) for i in found):
            raise BadGateway("the sandbox's executor answered the push with something else than one item per path")
        return found

    async def _relay(self, endpoint: Endpoint, path: str, url: str, cap: int) -> dict[str, Any]:
        digest = hashlib.sha256()
        size = 0

        async def chunks(src: aiohttp.StreamReader) -> Any:
            nonlocal size
            async for chunk in src.iter_chunked(1024 * 1024):
                digest.update(chunk)
                size += len(chunk)
                if size > cap:
                    raise TooLarge(f"{path} is larger than the sandbox's disk quota ({cap} bytes): not stored")
                yield chunk

        async with self._upstreams.call(endpoint, "GET", "/v1/files", params={"path": path}) as src:
            if src.status >= 400:
                raise error_from_body(src.status, await src.json(content_type=None))
            length = src.headers.get("Content-Length")
            if length is not None and length.isdigit() and int(length) > cap:
                raise TooLarge(f"{path} has {length} bytes, more than the sandbox's disk quota ({cap}): not stored")
            headers = {"Content-Length": length} if length else {}
            try:
                async with aiohttp.ClientSession() as out, out.put(url, data=chunks(src.content),
                                                                   headers=headers) as put:
                    detail = await put.text()
                    if put.status >= 300:
                        raise Unavailable(f"object storage refused {path}: {put.status} {detail[:300]}")
            except aiohttp.ClientError as exc:
                if size > cap:
                    raise TooLarge(f"{path} is larger than the sandbox's disk quota ({cap} bytes): not stored") \
                        from exc
                raise Unavailable(f"object storage unreachable while storing {path}: {exc}") from exc
        return {"uploaded": True, "size": size, "sha256": digest.hexdigest(), "status": 200}


def _holds(store: Any, key: str, item: dict[str, Any]) -> bool:
    """Whether the bucket has ``key`` with the size and sha256 the executor reported (read back)."""
    size, sha = item.get("size"), item.get("sha256")
    if not isinstance(size, int) or not isinstance(sha, str):
        return False
    digest = hashlib.sha256()
    seen = 0
    try:
        with store.get_stream(key) as reader:
            while block := reader.read(1024 * 1024):
                seen += len(block)
                digest.update(block)
                if seen > size:
                    return False
    except GroveError:
        return False
    return seen == size and digest.hexdigest() == sha
