"""A trajectory's lineage tree for the viewer: its ancestors through ``sandbox.lineage.parent``, then every branch
under the oldest one (forks, restores, replays), each a link to open.

A node's parent comes from its live record (the create's ``lineage``) or its stored summary (``index/by-id``); its
children from the ``index/by-parent/<id>/`` listing and the live sandboxes naming it. Both walks are bounded
(:data:`MAX_DEPTH`, :data:`MAX_NODES`): a record's lineage is the creator's word, and a cycle or a huge family must
not hang the page.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from artifacts import trajectory as tj
from artifacts.store import ObjectStore
from grove.core.errors import GroveError
from router.api.appkeys import caller_of, service_of, storage_of
from router.records.registry import SandboxRecord
from router.ui.api import record_of

MAX_DEPTH = 32
"""Ancestors followed at most."""
MAX_NODES = 200
"""Nodes of a tree shown at most (the reply says when some were left out)."""


async def lineage(request: web.Request) -> web.StreamResponse:
    """GET /ui/api/trajectories/{sandbox_id}/lineage — ``{"root", "nodes": [{"id", "parent", "step", "kind",
    "checkpoint", "result", "live"}], "truncated"}``, parents before their children."""
    sandbox_id = request.match_info["sandbox_id"]
    await record_of(request, sandbox_id)  # whose it is, checked
    caller = caller_of(request)
    live = {r.id: r for r in service_of(request).registry.claimed() if caller.may_see(r.project)}
    objects = storage_of(request).objects
    return web.json_response(await asyncio.to_thread(_tree, objects, live, sandbox_id))


def _tree(objects: ObjectStore, live: dict[str, SandboxRecord], start: str) -> dict[str, Any]:
    nodes: dict[str, dict[str, Any]] = {}
    root = start
    for _ in range(MAX_DEPTH):
        node = _node(objects, live, root)
        nodes[root] = node
        parent = node["parent"]
        if not isinstance(parent, str) or parent in nodes:
            break
        root = parent
    order = [root]
    queue = [root]
    truncated = False
    while queue:
        current = queue.pop(0)
        for child in _children(objects, live, current):
            if child in order:
                continue
            if len(order) >= MAX_NODES:
                truncated = True
                break
            order.append(child)
            queue.append(child)
            nodes.setdefault(child, _node(objects, live, child))
    shown = [nodes.get(i) or _node(objects, live, i) for i in order]
    return {"root": root, "current": start, "nodes": shown, "truncated": truncated}


def _node(objects: ObjectStore, live: dict[str, SandboxRecord], sandbox_id: str) -> dict[str, Any]:
    """One node: its lineage and result, from its live record or stored summary (nothing known: a bare node)."""
    node: dict[str, Any] = {"id": sandbox_id, "parent": None, "step": None, "kind": None, "checkpoint": None,
                            "result": None, "live": sandbox_id in live, "task_id": None}
    record = live.get(sandbox_id)
    if record is not None:
        origin = record.request.lineage
        node["task_id"] = record.request.metadata.task_id
        if origin is not None:
            node.update(parent=origin.parent, step=origin.step, kind=origin.kind, checkpoint=origin.checkpoint)
        return node
    try:
        summary = json.loads(objects.get_bytes(tj.by_id_key(sandbox_id)))
    except (GroveError, ValueError):
        return node
    if not isinstance(summary, dict):
        return node
    origin = summary.get("lineage")
    node.update(result=_text(summary.get("result")), task_id=_text(summary.get("task_id")))
    if isinstance(origin, dict):
        node.update(parent=_text(origin.get("parent")), kind=_text(origin.get("kind")),
                    checkpoint=_text(origin.get("checkpoint")),
                    step=origin.get("step") if isinstance(origin.get("step"), int) else None)
    return node


def _children(objects: ObjectStore, live: dict[str, SandboxRecord], parent: str) -> list[str]:
    found = [r.id for r in live.values() if r.request.lineage is not None and r.request.lineage.parent == parent]
    try:
        listed = objects.list(tj.index_prefix("by-parent", parent))
    except GroveError:
        listed = []
    for info in listed:
        try:
            child = json.loads(objects.get_bytes(info.key)).get("sandbox_id")
        except (GroveError, ValueError, AttributeError):
            continue
        if isinstance(child, str) and child not in found:
            found.append(child)
    return found


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None
