"""The executor's own endpoint on the router: its snapshots' multipart uploads (Knative backend).

Not an API call of users: the caller is a sandbox's executor, and it proves which sandbox it is with
the upload token from its Secret instead of an API key (:mod:`router.backends.knative.uploads`).
"""

from __future__ import annotations

from aiohttp import web

from grove.core import wire
from grove.core.errors import Unauthorized
from router.api.appkeys import service_of
from router.api.datapath import read_capped
from router.api.replies import reply

_MAX_BODY = 1024 * 1024  # a completion lists at most 10000 ETags


async def snapshot_upload(request: web.Request) -> web.Response:
    """Start, extend, complete or abort one multipart upload of the sandbox's snapshot."""
    sandbox_id = request.match_info["id"]
    uploads = service_of(request).backend.snapshot_uploads
    if uploads is None:
        raise Unauthorized("this router keeps no workspace snapshots: no upload token is valid here")
    max_bytes = uploads.check(sandbox_id, request.headers.get("Authorization"))
    body = wire.decode(await read_capped(request, _MAX_BODY, "snapshot upload request"), request.content_type)
    return reply(request, await uploads.handle(sandbox_id, max_bytes, body))
