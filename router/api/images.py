"""``GET /v1/images/{name}``: whether the backend has an image (or can pull it), before anything is made of it.

A rollout run asks for every image its tasks name before its first attempt: a missing one is refused at once,
with the message that names the images there are, instead of failing every attempt three times.
"""

from __future__ import annotations

from aiohttp import web

from router.api.appkeys import service_of
from router.api.replies import reply
from router.records.image_config import ImageConfigs


async def get_image(request: web.Request) -> web.Response:
    """The image's digest as the backend knows it (a local store's, or a pull's with ``--pull-missing``; ``""``
    where the backend learns it only when a sandbox starts: Knative); 404 naming the known images if it has none.
    A backend that keeps image configs adds the image's recorded OCI ``config`` (what a build on it inherits)."""
    name = request.match_info["name"]
    backend = service_of(request).backend
    digest = await backend.image_digest(name)
    config = {"config": await backend.image_config(name)} if isinstance(backend, ImageConfigs) else {}
    return reply(request, {"name": name, "digest": digest, "known": bool(digest), **config})
