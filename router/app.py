"""The router's aiohttp application: the route table, the middleware chain, the app's lifetime."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from grove import wire
from grove.api import ExecBody
from grove.errors import (
    BadRequest,
    GroveError,
    InternalError,
    MethodNotAllowed,
    NotFound,
    RequestTimeout,
    TooLarge,
)
from grove.schema import parse
from router.appkeys import SERVICE, service_of
from router.artifacts_api import get_artifact, list_artifacts, list_sandbox_artifacts
from router.auth import KeyRing
from router.backends.base import Backend
from router.batch import create_sandboxes
from router.datapath import exec_handler, read_capped, transfer
from router.journal import Journal
from router.keepwarm import keep_warm
from router.models import (
    ArtifactQuery,
    BatchCreateRequest,
    CreateRequest,
    Empty,
    EventsRequest,
    FetchQuery,
    PoolRequest,
    PoolResize,
    PushRequest,
    SandboxArtifactQuery,
)
from router.openapi import build_spec, canonical_path
from router.pools_api import create_pool, delete_pool, get_pool, list_pools, resize_pool
from router.proxy import StreamAborted, Upstreams
from router.recorder import Recorder
from router.records_api import get_live_trajectory, get_trajectory, list_trajectories, post_artifacts, post_events
from router.registry import SAFE_ID_RE, Registry, SandboxRecord
from router.replies import error_of, reply
from router.runs_api import get_run_file, list_run_files, put_run_file
from router.service import SandboxService
from router.settings import RouterSettings
from router.snapshot_api import snapshot_upload
from router.storage import open_storage
from router.swerex import swerex_handler
from router.ui import UI_ROUTES
from router.ui import install as install_viewer

KEYS = web.AppKey("keys", KeyRing)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Route:
    """One served endpoint; the OpenAPI document is generated from this table."""

    method: str
    path: str
    handler: Handler
    summary: str
    body: type | None = None
    public: bool = False
    raw_body: str | None = None
    """Content type of a raw (streamed) request body, for the spec."""
    key_header: str | None = None
    """A header that may carry the API key instead of ``Authorization`` (SWE-ReX's client sends ``X-API-Key``)."""
    query: type | None = None
    """The model of the query parameters, for the spec (the handler parses them with it)."""
    own_auth: bool = False
    """The handler checks a bearer credential of its own instead of an API key (an executor's upload token)."""


# -- helpers ---------------------------------------------------------------------------------------------


async def read_body(request: web.Request) -> Any:
    """Decode a lifecycle body (not yet validated)."""
    raw = await read_capped(request, request.app[SERVICE].settings.max_body_bytes)
    return wire.decode(raw, request.content_type)


async def read_model(request: web.Request, model: type[Any]) -> Any:
    """Decode and validate a lifecycle body."""
    return parse(model, await read_body(request))


def _record(request: web.Request) -> SandboxRecord:
    return service_of(request).registry.get(request.match_info["id"])


# -- lifecycle handlers ----------------------------------------------------------------------------------


async def create_sandbox(request: web.Request) -> web.Response:
    body = await read_body(request)
    req = parse(CreateRequest, body)
    # Which fields the body set: a create naming a pool may leave out (or repeat) the pool's own.
    record = await service_of(request).create(req, frozenset(body))
    return reply(request, record.public(), status=201)


async def list_sandboxes(request: web.Request) -> web.Response:
    labels: dict[str, str] = {}
    for raw in request.query.getall("label", []):
        key, sep, value = raw.partition("=")
        if not sep or not key:
            raise BadRequest(f"label filter {raw!r} must look like key=value")
        labels[key] = value
    status = request.query.get("status")
    live = service_of(request).registry.claimed()
    records = [r for r in live if r.matches(labels) and (not status or r.status == status)]
    return reply(request, {"sandboxes": [r.public() for r in sorted(records, key=lambda r: r.created_at)]})


async def get_sandbox(request: web.Request) -> web.Response:
    sandbox_id = request.match_info["id"]
    registry = service_of(request).registry
    record = registry.lookup(sandbox_id)
    if record is None:
        registry.get(sandbox_id)  # raises the right NotFound
        raise InternalError("unreachable")
    return reply(request, record.public())


async def delete_sandbox(request: web.Request) -> web.Response:
    record = await service_of(request).delete(request.match_info["id"])
    return reply(request, record.public())


async def heartbeat(request: web.Request) -> web.Response:
    await read_model(request, Empty)
    record = _record(request)
    service_of(request).touch(record)
    keep_warm(service_of(request), record)
    return reply(request, {"id": record.id, "status": record.status, "last_activity": record.last_activity})


async def healthz(request: web.Request) -> web.Response:
    service = service_of(request)
    return reply(request, {"ok": True, "backend": service.backend.name, "sandboxes": len(service.registry.claimed())})


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(build_spec(ROUTES))


ROUTES: list[Route] = [
    Route("GET", "/healthz", healthz, "Health of the router", public=True),
    Route("GET", "/v1/openapi.json", openapi, "This API's OpenAPI 3 document", public=True),
    Route("POST", "/v1/sandboxes", create_sandbox, "Create a sandbox", body=CreateRequest),
    Route("POST", "/v1/sandboxes/batch", create_sandboxes,
          "Create up to 1,000 sandboxes in one call; each item answered on its own, in order",
          body=BatchCreateRequest),
    Route("GET", "/v1/sandboxes", list_sandboxes, "List live sandboxes (?label=k=v, ?status=)"),
    Route("GET", "/v1/sandboxes/{id}", get_sandbox, "A sandbox's status"),
    Route("DELETE", "/v1/sandboxes/{id}", delete_sandbox, "Delete a sandbox and everything in it"),
    Route("POST", "/v1/pools", create_pool, "Define a warm pool of ready sandboxes", body=PoolRequest),
    Route("GET", "/v1/pools", list_pools, "List warm pools"),
    Route("GET", "/v1/pools/{name}", get_pool, "A warm pool: size, ready, starting, claims, misses"),
    Route("PATCH", "/v1/pools/{name}", resize_pool, "Resize a warm pool", body=PoolResize),
    Route("DELETE", "/v1/pools/{name}", delete_pool, "Delete a warm pool and its unclaimed sandboxes"),
    Route("POST", "/v1/sandboxes/{id}/heartbeat", heartbeat, "Keep a sandbox alive", body=Empty),
    Route("POST", "/v1/sandboxes/{id}/exec", exec_handler, "Run a command (?stream=1 streams)", body=ExecBody),
    Route("GET", "/v1/sandboxes/{id}/files", transfer("/v1/files", "file"), "Read a file (?path=)"),
    Route("PUT", "/v1/sandboxes/{id}/files", transfer("/v1/files", "file"), "Write a file atomically (?path=&mode=)",
          raw_body="application/octet-stream"),
    Route("DELETE", "/v1/sandboxes/{id}/files", transfer("/v1/files", "file"), "Delete a file (?path=&recursive=1)"),
    Route("GET", "/v1/sandboxes/{id}/files/list", transfer("/v1/files/list", "file"), "List a directory (?path=)"),
    Route("GET", "/v1/sandboxes/{id}/archive", transfer("/v1/archive", "archive"), "Tar of a directory (?path=)"),
    Route("PUT", "/v1/sandboxes/{id}/archive", transfer("/v1/archive", "archive"),
          "Extract a tar into a directory (?path=)", raw_body="application/x-tar"),
    Route("POST", "/v1/sandboxes/{id}/artifacts", post_artifacts,
          "Push files to S3 and index them; keys, sha256 and presigned GET URLs", body=PushRequest),
    Route("GET", "/v1/sandboxes/{id}/artifacts", list_sandbox_artifacts,
          "A sandbox's stored artifacts, live or deleted (paginated)", query=SandboxArtifactQuery),
    Route("GET", "/v1/artifacts", list_artifacts, "Stored artifacts by sandbox, task or run (paginated)",
          query=ArtifactQuery),
    Route("GET", "/v1/artifacts/{sandbox_id}/{path:.+}", get_artifact,
          "One artifact's bytes (Range: 206/416; X-Grove-Sha256), or ?redirect=1: 307 to a fresh presigned URL",
          query=FetchQuery),
    Route("POST", "/v1/sandboxes/{id}/events", post_events, "Append harness events to the trajectory",
          body=EventsRequest),
    Route("GET", "/v1/sandboxes/{id}/trajectory", get_live_trajectory, "The trajectory so far"),
    Route("GET", "/v1/trajectories", list_trajectories, "Stored trajectories (?task_id=&model=&harness=)"),
    Route("GET", "/v1/trajectories/{sandbox_id}", get_trajectory, "One trajectory, alive or stored"),
    Route("PUT", "/v1/runs/{run_id}/files/{name}", put_run_file,
          "Store a rollout run's file in S3 under runs/<run_id>/<name>", raw_body="application/octet-stream"),
    Route("GET", "/v1/runs/{run_id}/files", list_run_files, "A rollout run's stored files"),
    Route("GET", "/v1/runs/{run_id}/files/{name}", get_run_file, "One stored file of a rollout run"),
    # The executor's, not the users': it authenticates with its sandbox's upload token, not an API key.
    Route("POST", "/v1/sandboxes/{id}/snapshot-upload", snapshot_upload,
          "Executors only (Knative): start, extend, complete or abort a workspace snapshot's multipart upload",
          raw_body="application/json", own_auth=True),
    Route("GET", "/v1/sandboxes/{id}/swerex/{tail:.*}", swerex_handler, "SWE-ReX remote runtime: is_alive",
          key_header="X-API-Key"),
    Route("POST", "/v1/sandboxes/{id}/swerex/{tail:.*}", swerex_handler,
          "SWE-ReX remote runtime: create_session, run_in_session, close_session, execute, read_file, write_file, "
          "upload, close", raw_body="application/json", key_header="X-API-Key"),
]


# -- middleware chain ------------------------------------------------------------------------------------


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The one place an exception becomes the error body."""
    try:
        return await handler(request)
    except StreamAborted:
        raise  # the answer had started: cutting the connection is the error signal
    except GroveError as exc:
        err: GroveError = exc
    except web.HTTPException as exc:
        if exc.status == 404:
            err = NotFound(f"no such endpoint: {request.method} {request.path}")
        elif exc.status == 405:
            err = MethodNotAllowed(f"{request.method} is not allowed on {request.path}")
        elif exc.status == 413:
            err = TooLarge(f"request body too large: {exc.text}")
        elif exc.status < 500:
            err = BadRequest(exc.text or exc.reason)
        else:
            err = InternalError(exc.text or exc.reason)
    except Exception as exc:
        err = error_of(exc, request.app[SERVICE].settings.state_dir, f"{request.method} {request.path}")
    response = reply(request, err.to_body(), status=err.status)
    if isinstance(err, RequestTimeout):
        response.force_close()  # the rest of a stalled body must not hold the connection (or a place) open
    if err.retry_after is not None:
        response.headers["Retry-After"] = str(max(1, round(err.retry_after)))
    return response


_PUBLIC = {(r.method, canonical_path(r.path)) for r in ROUTES if r.public}
_OWN_AUTH = {(r.method, canonical_path(r.path)) for r in ROUTES if r.own_auth}
_NO_KEY = _PUBLIC | _OWN_AUTH
_KEY_HEADERS = {(r.method, canonical_path(r.path)): r.key_header for r in ROUTES if r.key_header}
# The viewer's routes check its session cookie themselves (router/ui/guard.py); only matched ones skip here.
_VIEWER = {(method, path) for method, path, _ in UI_ROUTES}


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every call but the public ones needs a valid API key, loopback included (on routes that name a
    ``key_header``, the key may come in that header instead of ``Authorization: Bearer``). The viewer's
    routes take a session cookie instead, and check it themselves."""
    route = request.match_info.route.resource
    canonical = route.canonical if route is not None else request.path
    if (request.method, canonical) not in _NO_KEY and \
            (route is None or (request.method, canonical) not in _VIEWER):
        header = request.headers.get("Authorization")
        alternative = _KEY_HEADERS.get((request.method, canonical))
        if header is None and alternative and alternative in request.headers:
            header = f"Bearer {request.headers[alternative]}"
        request.app[KEYS].check(header)
    return await handler(request)


_ID_PARTS = ("id", "sandbox_id")


@web.middleware
async def ids_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The one check of a sandbox id in a route: anything but ``sb-`` and lowercase letters and digits is a
    404 before a handler sees it, so no id ever reaches a file name or an object key (``..%2F..`` decodes to
    a path)."""
    # The viewer's HTML pages only carry the id to their script, whose API call is checked here.
    for part in _ID_PARTS if not request.path.startswith("/ui/") or request.path.startswith("/ui/api/") else ():
        if (value := request.match_info.get(part)) is not None and not SAFE_ID_RE.fullmatch(value):
            raise NotFound(f"{value[:80]!r} is not a sandbox id (they look like sb-0123456789abcdef)")
    return await handler(request)


MIDDLEWARES = [errors_middleware, auth_middleware, ids_middleware]


# -- the app ---------------------------------------------------------------------------------------------


def make_backend(settings: RouterSettings) -> Backend:
    """The configured backend (the only place that knows the names)."""
    if settings.backend == "local":
        from router.backends.local import LocalBackend
        from router.local.registry_pull import PullPolicy

        pull = PullPolicy(settings.insecure_registries) if settings.pull_missing else None
        return LocalBackend(settings.state_dir, pull=pull, image_limits=settings.image_limits)
    if settings.backend == "knative":
        from router.backends.knative import KnativeBackend
        from router.knative.options import KnativeOptions

        return KnativeBackend(settings.knative or KnativeOptions())
    raise BadRequest(f"unknown backend {settings.backend!r}; available: local, knative")


def create_app(settings: RouterSettings, backend: Backend | None = None) -> web.Application:
    """Build the router; the backend is opened (and sandboxes re-adopted) when the app starts."""
    app = web.Application(middlewares=MIDDLEWARES, client_max_size=settings.max_body_bytes)
    backend = backend or make_backend(settings)
    app[KEYS] = KeyRing(list(settings.api_keys), settings.layout.api_keys)
    for route in ROUTES:
        app.router.add_route(route.method, route.path, route.handler)
    install_viewer(app, app[KEYS])

    async def lifetime(_: web.Application) -> AsyncIterator[None]:
        # The service is made once its storage is open: every collaborator in its constructor.
        async with open_storage(settings) as storage:
            recorder = Recorder(Journal(settings.state_dir), backend.name)
            service = SandboxService(settings, backend, Registry(settings.state_dir), Upstreams(), recorder, storage)
            app[SERVICE] = service
            await service.start()
            yield
            await service.close()

    app.cleanup_ctx.append(lifetime)
    return app
