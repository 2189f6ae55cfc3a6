"""Stored artifacts from the SDK: list them (by sandbox, task or run), fetch one verified, pull many.

    async with AsyncGrove() as grove:
        for art in await grove.artifacts.list(run_id="run-7"):
            data = await grove.artifacts.get(art.sandbox_id, art.path)     # sha256 checked
        report = await grove.artifacts.pull("out/", run_id="run-7")        # <out>/<sandbox_id>/<path>

Every fetch goes through the router (it holds the S3 credentials) and is checked against the sha256
recorded when the artifact was stored: a mismatch raises :class:`grove.core.errors.ChecksumMismatch`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grove.client.download import Progress, fetch_bytes, fetch_file
from grove.core.artifact import Artifact, fetch_route

if TYPE_CHECKING:
    from grove.client.aio import AsyncGrove
    from grove.client.pull import PullReport


class AsyncArtifacts:
    """``grove.artifacts``: the stored artifacts of every sandbox of the router."""

    def __init__(self, client: AsyncGrove) -> None:
        self._client = client

    async def pages(
        self, *, sandbox_id: str | None = None, task_id: str | None = None, run_id: str | None = None,
        page_size: int | None = None,
    ) -> AsyncIterator[list[Artifact]]:
        """The listing one page at a time (every filter given must match)."""
        params = {k: v for k, v in (("sandbox_id", sandbox_id), ("task_id", task_id), ("run_id", run_id)) if v}
        if page_size is not None:
            params["limit"] = str(page_size)
        async for page in _pages(self._client, "/v1/artifacts", params):
            yield page

    async def list(
        self, *, sandbox_id: str | None = None, task_id: str | None = None, run_id: str | None = None,
        page_size: int | None = None,
    ) -> list[Artifact]:
        """Every stored artifact matching the filters, across all pages."""
        out: list[Artifact] = []
        async for page in self.pages(sandbox_id=sandbox_id, task_id=task_id, run_id=run_id, page_size=page_size):
            out.extend(page)
        return out

    async def get(
        self, sandbox_id: str, path: str, dest: str | Path | None = None, *,
        progress: Callable[[Progress], None] | None = None,
    ) -> Any:
        """The artifact's bytes (``dest`` None), or written to the file ``dest`` (returned as a Path):
        resumed from ``<dest>.part`` if an earlier fetch stopped, verified, then renamed into place. A
        mismatch raises :class:`grove.core.errors.ChecksumMismatch`; the bad file is kept at ``<dest>.rejected``."""
        route = fetch_route(sandbox_id, path)
        if dest is None:
            return await fetch_bytes(self._client, route)
        target = Path(dest)
        await fetch_file(self._client, route, target, target.with_name(target.name + ".rejected"), None, progress)
        return target

    async def url(self, sandbox_id: str, path: str, *, expires_s: float | None = None) -> str:
        """A fresh presigned GET URL of the artifact (for tools that fetch from S3 themselves)."""
        params = {"redirect": "1", **({"expires_s": str(expires_s)} if expires_s else {})}
        async with self._client.stream(fetch_route(sandbox_id, path), params=params, allow_redirects=False) as resp:
            return str(resp.headers["Location"])

    async def pull(
        self, dest_dir: str | Path, *, sandbox_id: str | None = None, task_id: str | None = None,
        run_id: str | None = None, jobs: int = 4, progress: Callable[[Progress], None] | None = None,
    ) -> PullReport:
        """Fetch every matching artifact into ``<dest_dir>/<sandbox_id>/<path>``; see :func:`grove.client.pull.pull`."""
        from grove.client.pull import pull

        listed = await self.list(sandbox_id=sandbox_id, task_id=task_id, run_id=run_id)
        return await pull(self._client, listed, Path(dest_dir), jobs=jobs, progress=progress)


async def _pages(client: AsyncGrove, route: str, params: dict[str, str]) -> AsyncIterator[list[Artifact]]:
    token: str | None = None
    while True:
        body = await client.request("GET", route, params={**params, **({"page_token": token} if token else {})})
        yield [Artifact.from_wire(item) for item in body["artifacts"]]
        token = body.get("next_page_token")
        if not token:
            return


async def sandbox_artifacts(client: AsyncGrove, sandbox_id: str, page_size: int | None = None) -> list[Artifact]:
    """Every stored artifact of one sandbox (live or deleted)."""
    params = {"limit": str(page_size)} if page_size else {}
    out: list[Artifact] = []
    async for page in _pages(client, f"/v1/sandboxes/{sandbox_id}/artifacts", params):
        out.extend(page)
    return out
