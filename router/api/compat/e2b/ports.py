"""Ports other than envd's on E2B's sandbox side: a request to ``/e2b/sandbox/...`` whose ``E2b-Sandbox-Port``
names another port than envd's goes, path and all (less ``/e2b/sandbox``), to that port in the sandbox through
grove's port proxy, HTTP or WebSocket. That is how E2B's SDKs reach a sandbox's servers when ``E2B_SANDBOX_URL``
is set (the code interpreter's ``run_code`` on port 49999, for one).

On every route of the sandbox side (envd's too) the key comes as E2B's SDKs send it: ``X-Access-Token``
(envd's access token), ``E2B-Traffic-Access-Token`` (the code interpreter's calls other than ``run_code``), or
``Authorization: Bearer``; none of them travels on to the sandbox.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable

from aiohttp import web

from grove.core.errors import NotFound
from router.api.appkeys import CALLER, KEYS
from router.api.compat.e2b.control import live_sandbox
from router.api.port_proxy import key_credential, parse_port, proxy
from router.records.registry import SAFE_ID_RE

ENVD_PORT = 49983
"""The port envd answers on in an E2B sandbox: grove's own E2B layer serves it."""
PORT_HEADER = "E2b-Sandbox-Port"
PREFIX = "/e2b/sandbox"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def other_port(request: web.Request) -> int | None:
    """The port ``E2b-Sandbox-Port`` names, if not envd's."""
    value = request.headers.get(PORT_HEADER)
    if value is None:
        return None
    port = parse_port(value.strip())
    return None if port == ENVD_PORT else port


async def to_port(request: web.Request, port: int) -> web.StreamResponse:
    """Send the request on to ``port`` in the sandbox ``E2b-Sandbox-Id`` names."""
    sandbox_id = request.headers.get("E2b-Sandbox-Id", "")
    if not SAFE_ID_RE.fullmatch(sandbox_id):
        raise NotFound(f"sandbox {sandbox_id[:80]!r} not found (E2b-Sandbox-Id must name a grove sandbox)")
    record = live_sandbox(request, sandbox_id)
    target = request.raw_path[len(PREFIX):] or "/"
    return await proxy(request, record, port, target if target.startswith("/") else f"/{target}", None)


def or_port(handler: Handler) -> Handler:
    """A route of the sandbox side: the key checked as E2B's SDKs send it, then ``handler`` (envd's side) for
    envd's port, the port proxy for any other."""

    @functools.wraps(handler)
    async def dispatch(request: web.Request) -> web.StreamResponse:
        request[CALLER] = request.app[KEYS].check(key_credential(request.headers))
        port = other_port(request)
        return await handler(request) if port is None else await to_port(request, port)

    return dispatch


async def not_envd(request: web.Request) -> web.StreamResponse:
    """A path envd does not serve, asked of envd's port: a 404 as E2B answers a call it does not serve."""
    raise NotFound(f"{request.method} {request.path} is not supported by grove's E2B endpoint (name a port other "
                   f"than envd's {ENVD_PORT} in {PORT_HEADER} to reach a server in the sandbox)")
