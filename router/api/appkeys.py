"""The router app's typed state, the one way a handler reaches the sandbox service, and who is calling."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from grove.core.errors import Forbidden, InternalError, NotFound
from router.auth import KeyRing
from router.lifecycle.service import SandboxService
from router.projects.model import ALL, DEFAULT, PROJECT_HEADER, Caller, check_name
from router.records.registry import SandboxRecord
from router.storage import Storage

SERVICE = web.AppKey("service", SandboxService)
"""The sandbox service (made when the app starts, once object storage is open)."""
KEYS = web.AppKey("keys", KeyRing)
"""The API keys (and the projects they act in)."""
CALLER = web.RequestKey("grove_caller", Caller)
"""The request's :class:`Caller`, set by the key check (the API's middleware, the viewer's guard)."""


def service_of(request: web.Request) -> SandboxService:
    """The app's sandbox service."""
    return request.app[SERVICE]


def caller_of(request: web.Request) -> Caller:
    """Who is calling (every route but the public ones has one)."""
    caller = request.get(CALLER)
    if not isinstance(caller, Caller):
        raise InternalError(f"{request.method} {request.path} has no caller: its route skipped the key check")
    return caller


def project_of(request: web.Request) -> str:
    """The project this call acts in: the key's own, or, for an admin key, the one ``X-Grove-Project`` names."""
    caller = caller_of(request)
    named = request.headers.get(PROJECT_HEADER)
    if named is None or named == caller.project:
        return caller.project
    if not caller.admin:
        raise Forbidden(f"{PROJECT_HEADER}: this key belongs to project {caller.project} and may act in no "
                        "other (only an admin key may name a project)")
    if named == ALL:
        return caller.project  # "*" widens listings only (visible_projects); anything made goes to the key's own
    return check_name(named)


def visible_projects(request: web.Request) -> set[str] | None:
    """The projects a listing covers: the call's project, or every project (None) for an admin's
    ``X-Grove-Project: *``."""
    caller = caller_of(request)
    if caller.admin and request.headers.get(PROJECT_HEADER) == ALL:
        return None
    return {project_of(request)}


def in_view(request: web.Request, project: str) -> bool:
    """Whether something of ``project`` is this call's to see (its project, or any for an admin's ``*``)."""
    shown = visible_projects(request)
    return shown is None or project in shown


def storage_of(request: web.Request) -> Storage:
    """The object storage of the call's project."""
    return service_of(request).storage.of(project_of(request))


def unknown_sandbox(sandbox_id: str) -> NotFound:
    """What every route answers for a sandbox that is not the caller's to see: one that never existed and one
    of another project alike, word for word (whether another project's id exists does not leak either)."""
    return NotFound(f"no sandbox {sandbox_id}")


def knows(request: web.Request, sandbox_id: str) -> bool:
    """Whether the router knows this sandbox (live, ended, or a pool's) as one the caller may see. A route
    whose lookup of something stored found nothing answers :func:`unknown_sandbox` unless this holds."""
    record = service_of(request).registry.lookup(sandbox_id, pooled=True)
    return record is not None and caller_of(request).may_see(record.project)


def project_of_record(record: dict[str, Any]) -> str:
    """The project a trajectory record (a journal's or a stored one) says it belongs to; records from before
    projects are the default project's."""
    sandbox = record.get("sandbox")
    project = sandbox.get("project") if isinstance(sandbox, dict) else None
    return project if isinstance(project, str) and project else DEFAULT


def sandbox_of(request: web.Request, sandbox_id: str) -> SandboxRecord:
    """A live sandbox of the call's project: ``NotFound`` for one of another project, exactly as for one that
    never existed (ids of other projects do not leak), ``Conflict`` for a deleted one of its own."""
    record = service_of(request).registry.lookup(sandbox_id)
    if record is not None and not caller_of(request).may_see(record.project):
        raise unknown_sandbox(sandbox_id)
    return service_of(request).registry.get(sandbox_id)


ID_PARTS = ("id", "sandbox_id")
"""The route parts that name a sandbox."""


def check_sandbox_ids(request: web.Request) -> None:
    """The one ownership check of a sandbox named in a route: a sandbox the router knows (live, ended, or an
    unclaimed pool member) that is another project's answers 404, as an unknown id does. What the router
    no longer knows is looked up in the caller's own project's storage only, so it cannot leak either."""
    caller = caller_of(request)
    if caller.admin:
        return
    registry = service_of(request).registry
    for part in ID_PARTS:
        if (value := request.match_info.get(part)) is not None:
            record = registry.lookup(value, pooled=True)
            if record is not None and record.project != caller.project:
                raise unknown_sandbox(value)


def project_of_sandbox(request: web.Request, sandbox_id: str) -> str:
    """The project whose storage holds a sandbox's things: its own, if the router still knows it as one the
    caller may see, else the call's project (what the router forgot is looked for only there)."""
    record = service_of(request).registry.lookup(sandbox_id, pooled=True)
    if record is not None and caller_of(request).may_see(record.project):
        return record.project
    return project_of(request)


def storage_of_sandbox(request: web.Request, sandbox_id: str) -> Storage:
    """The object storage a sandbox's things are in (:func:`project_of_sandbox`'s)."""
    return service_of(request).storage.of(project_of_sandbox(request, sandbox_id))
