"""``POST /v1/sandboxes/{id}/commit`` and ``POST /v1/images/{name}``: images made from a sandbox's layer, and
new names (with their own config) for an image's layers. A backend that keeps images of its own implements
:class:`Committer`; one that does not (Knative: the cluster's registry holds the images) refuses both."""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, runtime_checkable

from aiohttp import web

from grove.core.errors import Invalid
from grove.core.schema import parse
from router.api.appkeys import sandbox_of, service_of
from router.api.image_models import BuildRecord, CommitRequest, DeriveRequest, ImageConfig
from router.api.replies import reply
from router.api.sandboxes import read_body


@runtime_checkable
class Committer(Protocol):
    """A backend that can make images from sandboxes and from other images."""

    async def commit(self, sandbox_id: str, image: str, name: str, meta: dict[str, Any]) -> Any:
        """Store the sandbox's (made from ``image``) writable layer as the image ``name``."""

    async def derive(self, source: str, name: str, meta: dict[str, Any]) -> Any:
        """Store ``source``'s layers as the image ``name`` with ``meta``."""


def _committer(backend: object) -> Committer:
    if not isinstance(backend, Committer):
        raise Invalid(f"the {getattr(backend, 'name', '?')} backend keeps no images of its own: commits and image "
                      "builds need the local backend (push images to the cluster's registry instead)")
    return backend


def _meta(config: ImageConfig | None, build: BuildRecord | None) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    if config is not None:
        meta["config"] = {k: v for k, v in dataclasses.asdict(config).items() if v not in (None, "", [], {})}
    if build is not None:
        meta["build"] = dataclasses.asdict(build)
    return meta


def _answer(image: Any) -> dict[str, Any]:
    return {"image": image.name, "digest": image.digest, "layers": [f"sha256:{p.name}" for p in image.layers]}


async def commit_sandbox(request: web.Request) -> web.Response:
    """The sandbox's writable layer, consistent at one instant (its processes frozen while it is read), as an
    image on top of the one it was made from; 201 with the image's name, digest and layers."""
    record = sandbox_of(request, request.match_info["id"])
    req = parse(CommitRequest, await read_body(request))
    service = service_of(request)
    committer = _committer(service.backend)
    with service.calling(record):
        await service.endpoint(record)  # one scaled to zero starts again: its disk is mounted while it runs
        image = await committer.commit(record.id, record.request.image, req.image, _meta(req.config, req.build))
    return reply(request, _answer(image), status=201)


async def derive_image(request: web.Request) -> web.Response:
    """A new image of ``source``'s layers with the config and build record given; 201 with its digest."""
    req = parse(DeriveRequest, await read_body(request))
    committer = _committer(service_of(request).backend)
    image = await committer.derive(req.source, request.match_info["name"], _meta(req.config, req.build))
    return reply(request, _answer(image), status=201)
