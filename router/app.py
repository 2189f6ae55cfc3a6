"""The router's aiohttp application, assembled: the backend, the route table, the middleware chain, the viewer
and the app's lifetime (the service made once its storage is open)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web

from grove.core.errors import BadRequest
from router.api.appkeys import SERVICE
from router.api.middleware import KEYS, MIDDLEWARES, SESSION_ROUTES
from router.api.port_hosts import ports_context
from router.api.routes import ROUTES
from router.api.shards import PEERS
from router.auth import KeyRing
from router.backends.base import Backend
from router.lifecycle.service import SandboxService
from router.records.registry import Registry
from router.settings import RouterSettings
from router.shards.peers import Peers
from router.storage import open_storage
from router.trajectory.journal import Journal
from router.trajectory.recorder import Recorder
from router.ui import UI_ROUTES
from router.ui import install as install_viewer
from router.upstream.proxy import Upstreams


def make_backend(settings: RouterSettings) -> Backend:
    """The configured backend (the only place that knows the names)."""
    if settings.backend == "local":
        from router.backends.local.backend import LocalBackend
        from router.backends.local.registry_pull import PullPolicy

        pull = PullPolicy(settings.insecure_registries) if settings.pull_missing else None
        return LocalBackend(settings.state_dir, pull=pull, image_limits=settings.image_limits)
    if settings.backend == "knative":
        from router.backends.knative.backend import KnativeBackend
        from router.backends.knative.options import KnativeOptions

        return KnativeBackend(settings.knative or KnativeOptions())
    raise BadRequest(f"unknown backend {settings.backend!r}; available: local, knative")


def create_app(settings: RouterSettings, backend: Backend | None = None) -> web.Application:
    """Build the router; the backend is opened (and sandboxes re-adopted) when the app starts."""
    app = web.Application(middlewares=MIDDLEWARES, client_max_size=settings.max_body_bytes)
    backend = backend or make_backend(settings)
    app[KEYS] = KeyRing(list(settings.api_keys), settings.layout.api_keys)
    app[PEERS] = Peers(settings.shards)
    for route in ROUTES:
        app.router.add_route(route.method, route.path, route.handler)
    install_viewer(app, app[KEYS])
    app[SESSION_ROUTES] = frozenset((method, path) for method, path, _ in UI_ROUTES)

    async def lifetime(_: web.Application) -> AsyncIterator[None]:
        # The service is made once its storage is open: every collaborator in its constructor.
        async with open_storage(settings) as storage:
            recorder = Recorder(Journal(settings.state_dir), backend.name)
            registry = Registry(settings.state_dir, settings.shards.name)
            service = SandboxService(settings, backend, registry, Upstreams(), recorder, storage)
            app[SERVICE] = service
            await service.start()
            yield
            await service.close()
            await app[PEERS].close()

    app.cleanup_ctx.append(lifetime)
    app.cleanup_ctx.append(ports_context)  # after the service: its recorder counts the ports' traffic
    return app
