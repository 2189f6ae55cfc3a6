"""The API's port routes: the proxy for API-key clients, and signed URLs for the host-named listener."""

from __future__ import annotations

import time

from aiohttp import web

from router.api.appkeys import caller_of, sandbox_of
from router.api.port_proxy import TOKEN_PARAM, parse_port, proxy
from router.api.replies import reply
from router.api.sandboxes import read_model
from router.ports.models import PortUrlRequest
from router.ports.state import ports_of


def target_of(request: web.Request, prefix: str) -> str:
    """What follows ``prefix`` in the request's raw path, with its query: the path the sandbox's server sees."""
    rest = request.raw_path[len(prefix):] or "/"
    return rest if rest.startswith(("/", "?")) else "/" + rest


async def port_handler(request: web.Request) -> web.StreamResponse:
    """ANY /v1/sandboxes/{id}/ports/{port}/{path} — HTTP or WebSocket to that port on the sandbox's loopback."""
    sandbox_id = request.match_info["id"]
    port = parse_port(request.match_info["port"])
    record = sandbox_of(request, sandbox_id)
    target = target_of(request, f"/v1/sandboxes/{sandbox_id}/ports/{request.match_info['port']}")
    return await proxy(request, record, port, target, None)


async def port_url_handler(request: web.Request) -> web.Response:
    """POST /v1/sandboxes/{id}/ports/{port}/url {"expires_s"} — a URL on the host-named listener that reaches
    this port, acting as the calling key, until it expires."""
    body = await read_model(request, PortUrlRequest)
    sandbox_id = request.match_info["id"]
    port = parse_port(request.match_info["port"])
    sandbox_of(request, sandbox_id)  # a sandbox the caller may see, and live
    ports = ports_of(request)
    token = ports.signer.mint(sandbox_id, port, caller_of(request).key_id, body.expires_s)
    return reply(request, {"url": f"{ports.host_url(sandbox_id, port)}/?{TOKEN_PARAM}={token}",
                           "expires_at": time.time() + body.expires_s})
