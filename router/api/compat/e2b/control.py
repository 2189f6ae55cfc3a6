"""E2B's control plane at ``/e2b``: create, get, kill, set a timeout, connect. The API key comes in E2B's
``X-API-KEY`` header and acts as that grove key (its project); a sandbox is a grove sandbox, its id grove's.

Templates: ``base`` (E2B's default) is grove's ``default`` image; any other name is the caller's project's warm
pool of that name if there is one, else the image of that name (``grove image ls``): ``code-interpreter-v1``, the
code interpreter SDK's default, is the image ``grove image build-debian code-interpreter-v1 --preset
code-interpreter`` makes. An image that records a start command has it started, and its ports waited for, before
create answers (:mod:`.template_start`). E2B's ``timeout`` (seconds
until the sandbox is killed, reset by ``set_timeout`` and ``connect``) becomes the sandbox's lifetime; as an E2B
client sends no heartbeats, the heartbeat and idle timeouts follow it. The envd access token handed back is the
caller's key (the traffic access token too): the sandbox side accepts it in ``X-Access-Token``, for this
project's sandboxes only. The ``domain`` handed back is the host-named listener's (with its port), so that
``get_host(port)`` names the port there (:mod:`.ports`).
"""

from __future__ import annotations

import dataclasses
import datetime
import time
from typing import Any

from aiohttp import web

from grove.core.errors import BadRequest, Conflict, Invalid, NotFound
from router.api.appkeys import project_of, sandbox_of, service_of
from router.api.compat.e2b.template_start import start_template
from router.api.compat.e2b.wire import ENVD_VERSION
from router.api.sandboxes import read_body
from router.models import DAY, CreateRequest, Metadata, NetworkModel
from router.ports.state import ports_of
from router.records.registry import SandboxRecord

DEFAULT_TIMEOUT_S = 300
"""E2B's default sandbox timeout."""
MAX_TIMEOUT_S = int(7 * DAY)
_CREATE_FIELDS = frozenset({"templateID", "timeout", "metadata", "envVars", "autoPause", "autoPauseMemory",
                            "autoResume", "allow_internet_access", "secure", "network", "mcp", "iam",
                            "volumeMounts"})
_UNSUPPORTED = ("mcp", "iam", "volumeMounts", "network")


def _timeout(body: dict[str, Any]) -> float:
    value = body.get("timeout", DEFAULT_TIMEOUT_S)
    if not isinstance(value, int | float) or isinstance(value, bool) or not 1 <= value <= MAX_TIMEOUT_S:
        raise Invalid(f"timeout must be a number of seconds from 1 to {MAX_TIMEOUT_S}, not {value!r}")
    return float(value)


def _strings(body: dict[str, Any], name: str) -> dict[str, str]:
    value = body.get(name) or {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise BadRequest(f"{name} must be a map of strings to strings")
    return value


def _create_request(request: web.Request, body: dict[str, Any]) -> CreateRequest:
    unknown = sorted(set(body) - _CREATE_FIELDS)
    if unknown:
        raise BadRequest(f"unknown field(s) {', '.join(unknown)}")
    for name in _UNSUPPORTED:
        if body.get(name):
            raise Invalid(f"'{name}' is not supported by grove's E2B endpoint")
    template = body.get("templateID")
    if not isinstance(template, str) or not template:
        raise BadRequest("templateID is required")
    timeout = _timeout(body)
    metadata = _strings(body, "metadata")
    try:
        pool: str | None = service_of(request).pools.get(template, project_of(request)).definition.name
    except NotFound:
        pool = None
    image = "default" if template == "base" else template
    fields: dict[str, Any] = {
        "ttl_s": timeout, "heartbeat_timeout_s": max(timeout, 5.0), "idle_timeout_s": timeout,
        "env": _strings(body, "envVars"),
        "metadata": Metadata(harness="e2b", labels={"e2b_template": template, **metadata}),
        "request_id": request.headers.get("Idempotency-Key") or None,
    }
    if pool is not None:
        fields["pool"] = pool
    else:
        fields["image"] = image
        fields["network"] = NetworkModel(egress="allow" if body.get("allow_internet_access") is True else "deny")
    return CreateRequest(**fields)


def live_sandbox(request: web.Request, sandbox_id: str) -> SandboxRecord:
    """The caller's live sandbox; one killed already is not found, as E2B answers (grove says 409)."""
    try:
        return sandbox_of(request, sandbox_id)
    except Conflict:
        raise NotFound(f"sandbox {sandbox_id} not found (it was killed)") from None


def sandbox_body(request: web.Request, record: SandboxRecord) -> dict[str, Any]:
    """E2B's ``Sandbox``: what create and connect answer."""
    # The key this call was let in with (E2B's header, or a bearer token): the sandbox side takes it back.
    scheme, _, bearer = request.headers.get("Authorization", "").partition(" ")
    key = bearer.strip() if scheme.lower() == "bearer" else request.headers.get("X-API-KEY", "")
    return {"templateID": record.request.metadata.labels.get("e2b_template", record.request.image),
            "sandboxID": record.id, "clientID": "grove", "envdVersion": ENVD_VERSION,
            "envdAccessToken": key, "trafficAccessToken": key, "domain": _ports_domain(request)}


def _ports_domain(request: web.Request) -> str:
    """The domain the SDK's ``get_host(port)`` builds ``{port}-{id}.<domain>`` on: the host-named listener's,
    with its port, so ``http://{get_host(port)}`` reaches the port (its names resolving to the router's host)."""
    ports = ports_of(request)
    return f"{ports.domain}:{ports.listener.rpartition(':')[2]}"


async def create(request: web.Request) -> web.Response:
    """``POST /e2b/sandboxes`` and ``/e2b/v2/sandboxes``."""
    body = await read_body(request)
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    req = _create_request(request, body)
    given = frozenset({"pool", "metadata", "env", "ttl_s", "heartbeat_timeout_s", "idle_timeout_s", "request_id"})
    service = service_of(request)
    record = await service.create(req, given, project_of(request))
    try:
        await start_template(service, record)
    except BaseException:
        await service.delete(record.id, reason="its template's start command did not come up")
        raise
    return web.json_response(sandbox_body(request, record), status=201)


def _iso(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).isoformat().replace("+00:00", "Z")


async def get(request: web.Request) -> web.Response:
    """``GET /e2b/sandboxes/{id}``: E2B's ``SandboxDetail``."""
    record = live_sandbox(request, request.match_info["id"])
    req = record.request
    return web.json_response({
        **sandbox_body(request, record), "alias": None, "startedAt": _iso(record.created_at),
        "endAt": _iso(record.created_at + req.ttl_s), "cpuCount": max(1, round(req.cpu)), "memoryMB": req.memory_mb,
        "diskSizeMB": req.disk_mb, "state": "running", "metadata": {
            k: v for k, v in req.metadata.labels.items() if k != "e2b_template"}})


async def kill(request: web.Request) -> web.Response:
    """``DELETE /e2b/sandboxes/{id}``."""
    live_sandbox(request, request.match_info["id"])
    await service_of(request).delete(request.match_info["id"], reason="killed through the E2B API")
    return web.Response(status=204)


async def _extend(request: web.Request, *, required: bool) -> SandboxRecord:
    """Set the sandbox's timeout to the body's ``timeout`` seconds from now: always for ``set_timeout``
    (``required``), only to lengthen it for ``connect`` (as E2B does), and not at all when connect names none."""
    body = await read_body(request)
    if not isinstance(body, dict) or (required and "timeout" not in body):
        raise BadRequest("the body must be {\"timeout\": <seconds>}")
    record = live_sandbox(request, request.match_info["id"])
    service_of(request).touch(record)
    if "timeout" not in body:
        return record
    timeout = _timeout(body)
    lived = time.time() - record.created_at
    if not required and lived + timeout <= record.request.ttl_s:
        return record
    record.request = dataclasses.replace(record.request, ttl_s=lived + timeout,
                                         heartbeat_timeout_s=max(timeout, 5.0), idle_timeout_s=timeout)
    await service_of(request).registry.store(record)
    return record


async def set_timeout(request: web.Request) -> web.Response:
    """``POST /e2b/sandboxes/{id}/timeout``."""
    await _extend(request, required=True)
    return web.Response(status=204)


async def connect(request: web.Request) -> web.Response:
    """``POST /e2b/v2/sandboxes/{id}/connect`` (and ``/sandboxes/{id}/connect``): answers the sandbox, its
    timeout lengthened to the one asked for."""
    record = await _extend(request, required=False)
    return web.json_response(sandbox_body(request, record), status=200)


async def unsupported(request: web.Request) -> web.Response:
    """Anything else under ``/e2b``: a 404 in E2B's error body, as E2B's API answers a call it does not serve
    (the SDK raises ``NotFoundException`` with the message)."""
    raise NotFound(f"{request.method} {request.path} is not supported by grove's E2B endpoint")
