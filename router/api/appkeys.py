"""The router app's typed state, and the one way a handler reaches the sandbox service."""

from __future__ import annotations

from aiohttp import web

from router.lifecycle.service import SandboxService

SERVICE = web.AppKey("service", SandboxService)
"""The sandbox service (made when the app starts, once object storage is open)."""


def service_of(request: web.Request) -> SandboxService:
    """The app's sandbox service."""
    return request.app[SERVICE]
