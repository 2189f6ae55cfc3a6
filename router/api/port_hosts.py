"""The host-named listener: ``http://{id}-{port}.<domain>:<its port>/...`` reaches that port in that sandbox.

It is an origin apart from the API and the viewer (another port, another host name per sandbox and port), so a
sandbox's page can read nothing of the viewer's, nor of another sandbox's port. It serves nothing but ports:
no API route exists here. Tools that build absolute URLs from the Host they were asked on (Chrome DevTools'
``webSocketDebuggerUrl``, Jupyter, noVNC) get back names of this listener, which reach them again.

A request here authenticates with the API key (``Authorization: Bearer``, or E2B's ``X-Access-Token`` or
``E2B-Traffic-Access-Token``) or a signed URL's token: as the query
parameter ``grove_token`` (a page's first visit, which a GET turns into a cookie of that host alone and a
redirect to the same URL without it) or as that cookie (the page's own requests after).
"""

from __future__ import annotations

import re
import socket
from collections.abc import AsyncIterator

from aiohttp import web

from grove.core.errors import NotFound, Unauthorized
from grove.core.sandbox_ids import ID_PATTERN
from router.api.appkeys import CALLER, SERVICE, sandbox_of
from router.api.middleware import KEYS, errors_middleware
from router.api.port_proxy import TOKEN_COOKIE, TOKEN_PARAM, key_credential, parse_port, proxy
from router.auth import KeyRing
from router.ports.signing import Signer
from router.ports.state import PORTS, Ports
from router.ports.traffic import Traffic
from router.ports.tunnels import PortClients
from router.projects.model import Caller

_NAME_RE = re.compile(rf"^({ID_PATTERN})-([0-9]{{1,5}})\.(.+)$")
_E2B_NAME_RE = re.compile(rf"^([0-9]{{1,5}})-({ID_PATTERN})\.(.+)$")
"""E2B's order, ``{port}-{id}.<domain>``: what its SDK's ``get_host(port)`` builds."""


def _address(request: web.Request, domain: str) -> tuple[str, int]:
    host = (request.host.rsplit(":", 1)[0] if request.host.count(":") == 1 else request.host).lower()
    if (match := _NAME_RE.match(host)) is not None and match.group(3) == domain:
        return match.group(1), parse_port(match.group(2))
    if (match := _E2B_NAME_RE.match(host)) is not None and match.group(3) == domain:
        return match.group(2), parse_port(match.group(1))
    raise NotFound(f"this listener serves sandboxes' ports only, as {{id}}-{{port}}.{domain} (or E2B's "
                   f"{{port}}-{{id}}.{domain}); {request.host[:100]!r} names none")


def _caller(request: web.Request, keys: KeyRing, signer: Signer, sandbox_id: str, port: int) -> Caller:
    """The API key's caller, or the caller of the key that minted the signed URL's token."""
    if (credential := key_credential(request.headers)) is not None:
        return keys.check(credential)
    token = request.query.get(TOKEN_PARAM) or request.cookies.get(TOKEN_COOKIE)
    if not token:
        return keys.check(None)  # the same 401 as the API's, naming what is missing
    grant = signer.check(token, sandbox_id, port)
    caller = keys.caller_by_id(grant.key_id)
    if caller is None:
        raise Unauthorized("the key that minted this signed URL was revoked: its URLs no longer work")
    return caller


def _without_token(request: web.Request) -> str:
    """The raw path and query, less the token parameter (the sandbox's server never sees it)."""
    path, _, query = request.raw_path.partition("?")
    kept = [p for p in query.split("&") if p and not p.startswith(f"{TOKEN_PARAM}=")]
    return path + (f"?{'&'.join(kept)}" if kept else "")


async def host_handler(request: web.Request) -> web.StreamResponse:
    """Any request on the listener: to the port its host name names."""
    ports = request.app[PORTS]
    sandbox_id, port = _address(request, ports.domain)
    request[CALLER] = _caller(request, request.app[KEYS], ports.signer, sandbox_id, port)
    record = sandbox_of(request, sandbox_id)  # another project's is unknown; a deleted one refused
    target = _without_token(request)
    if TOKEN_PARAM in request.query and request.method in ("GET", "HEAD") and \
            request.headers.get("Upgrade", "").lower() != "websocket":
        # A browser's first visit: the token moves into a cookie of this host alone, and out of the address bar.
        response = web.Response(status=303, headers={"Location": target})
        response.set_cookie(TOKEN_COOKIE, request.query[TOKEN_PARAM], httponly=True, samesite="Lax", path="/",
                            secure=request.secure)
        return response
    return await proxy(request, record, port, target, request.host)


def host_app(main: web.Application, ports: Ports) -> web.Application:
    """The listener's app: errors in grove's one shape, and one catch-all route."""
    app = web.Application(middlewares=[errors_middleware], client_max_size=main[SERVICE].settings.max_body_bytes)
    app[SERVICE], app[KEYS], app[PORTS] = main[SERVICE], main[KEYS], ports
    app.router.add_route("*", "/{tail:.*}", host_handler)
    return app


async def ports_context(app: web.Application) -> AsyncIterator[None]:
    """``cleanup_ctx`` (after the service's): the ports' state, the host-named listener, the traffic flusher."""
    service = app[SERVICE]
    settings = service.settings
    ports = Ports(PortClients(), Traffic(service.recorder), Signer(), settings.ports_domain)
    app[PORTS] = ports
    sock = socket.create_server((settings.host, settings.ports_port), reuse_port=False)
    ports.listener = f"{settings.host}:{sock.getsockname()[1]}"
    runner = web.AppRunner(host_app(app, ports), access_log=None, handle_signals=False)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    try:
        async with ports.traffic.flushing():
            yield
    finally:
        await runner.cleanup()
        await ports.close_mcp()
        await ports.clients.close()
