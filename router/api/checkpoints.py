"""Handlers of checkpoints and forks; the rules are :mod:`router.checkpoints.service`'s."""

from __future__ import annotations

from aiohttp import web

from grove.core.errors import Invalid
from router.api.appkeys import sandbox_of, service_of
from router.api.replies import reply
from router.api.sandboxes import read_model
from router.checkpoints.models import ForkRequest
from router.models import Empty


async def create_checkpoint(request: web.Request) -> web.Response:
    await read_model(request, Empty)
    record = sandbox_of(request, request.match_info["id"])
    made = await service_of(request).checkpoints.take(record)
    return reply(request, made.public(), status=201)


async def list_checkpoints(request: web.Request) -> web.Response:
    record = sandbox_of(request, request.match_info["id"])
    found = service_of(request).checkpoints.of_sandbox(record.id)
    return reply(request, {"checkpoints": [c.public() for c in found]})


async def get_checkpoint(request: web.Request) -> web.Response:
    record = sandbox_of(request, request.match_info["id"])
    return reply(request, service_of(request).checkpoints.get(record, request.match_info["checkpoint"]).public())


async def delete_checkpoint(request: web.Request) -> web.Response:
    record = sandbox_of(request, request.match_info["id"])
    gone = await service_of(request).checkpoints.delete(record, request.match_info["checkpoint"])
    return reply(request, gone.public())


async def fork_sandbox(request: web.Request) -> web.Response:
    body: ForkRequest = await read_model(request, ForkRequest)
    if body.memory:
        raise Invalid("'memory': true (carrying processes with CRIU) is not available: CRIU cannot initialise on "
                      "this host's kernel. Forks carry files only; start a task's services again in each child")
    record = sandbox_of(request, request.match_info["id"])
    children = await service_of(request).checkpoints.fork(record, body.count, body.metadata)
    return reply(request, {"sandboxes": [c.public() for c in children]}, status=201)
