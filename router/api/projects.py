"""``/v1/projects``: a project's quotas and retention beside what it holds now. A key sees its own project; an
admin key every project (``X-Grove-Project: *``). Projects are defined on the state dir (``grove project``),
as keys are: the API only shows them."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from grove.core.errors import NotFound
from router.api.appkeys import caller_of, service_of, visible_projects
from router.api.replies import reply
from router.auth import key_projects
from router.projects.model import DEFAULT, check_name


def known_projects(request: web.Request) -> list[str]:
    """Every project this router knows of: defined, named by a key, or holding a sandbox."""
    service = service_of(request)
    names = {DEFAULT, *service.projects.all(), *key_projects(service.settings.state_dir)}
    names.update(record.project for record in service.registry.live())
    return sorted(names)


def _shown(request: web.Request, name: str) -> dict[str, Any]:
    service = service_of(request)
    project = service.projects.get(name)
    return {**project.to_dict(), "usage": service.admission.usage(name)}


async def list_projects(request: web.Request) -> web.Response:
    """GET /v1/projects — the caller's project (an admin's ``*``: every one), quotas against use."""
    shown = visible_projects(request)
    names = [n for n in known_projects(request) if shown is None or n in shown]
    return reply(request, {"projects": [_shown(request, name) for name in names]})


async def get_project(request: web.Request) -> web.Response:
    """GET /v1/projects/{name} — one project (a key of another project gets 404, as for one that does not exist)."""
    name = check_name(request.match_info["name"])
    if not caller_of(request).may_see(name) or name not in known_projects(request):
        raise NotFound(f"no project {name!r}")
    return reply(request, _shown(request, name))
