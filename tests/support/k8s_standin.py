"""A stand-in Kubernetes API server: a real HTTP server on loopback speaking the REST and watch protocol.

It serves the objects grove uses — ``serving.knative.dev/v1`` services and revisions, ``v1`` secrets and
configmaps, ``networking.k8s.io/v1`` networkpolicies, ``discovery.k8s.io/v1`` endpointslices, and the
cluster-scoped ``node.k8s.io/v1`` runtimeclasses (stored under namespace "") — to the real
``kubernetes`` client: create, get, list (label and field selectors), delete (background or foreground
propagation), and ``?watch=true`` streams of ``{"type", "object"}`` JSON lines from a resourceVersion,
with ``410 Gone`` for versions older than its history. Lists page with ``limit``/``continue``; watches
that ask for them get ``BOOKMARK`` events when idle; :meth:`KubeStandin.stall_watches` makes open watches go
silent without closing (a half-open connection). Errors are ``Status`` objects (404, 409, 422,
403 for RBAC, 401 without the kubeconfig's token). Faults can be queued per verb and resource, and
every call is counted per sandbox. :mod:`tests.support.knative_standin` plays Knative's controllers on top.
It runs on an event loop in a thread of its own, so synchronous tests and subprocess routers both use it.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import copy
import json
import re
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

Obj = dict[str, Any]
KINDS = {"services": "Service", "revisions": "Revision", "secrets": "Secret", "configmaps": "ConfigMap",
         "networkpolicies": "NetworkPolicy", "endpointslices": "EndpointSlice", "runtimeclasses": "RuntimeClass"}
_NAME = re.compile(r"^(sb-[0-9a-f]{16})")


@dataclass
class Fault:
    """A queued failure: the next ``count`` matching calls answer ``status`` with ``message``."""

    verb: str
    plural: str
    status: int
    message: str
    count: int = 1
    reason: str = "InternalError"
    retry_after: int | None = None


def status_body(code: int, reason: str, message: str, details: Obj | None = None) -> Obj:
    """A ``v1 Status`` failure object."""
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "details": details or {}, "code": code}


def matches(labels: dict[str, str], selector: str) -> bool:
    """Whether ``labels`` satisfy a label selector (``a=b``, ``a==b``, ``a!=b``, ``a``, ``!a``, comma-joined)."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


class KubeStandin:
    """The API server; ``url`` once started. Hooks: ``validators``, ``on_create``, ``on_patch``, ``on_delete`` per
    plural."""

    def __init__(self, token: str = "standin-token", history: int = 10_000) -> None:
        self.token = token
        self.objects: dict[tuple[str, str], dict[str, Obj]] = collections.defaultdict(dict)
        """(plural, namespace) → name → object."""
        self.events: dict[tuple[str, str], list[tuple[int, str, Obj]]] = collections.defaultdict(list)
        self.validators: dict[str, Callable[[Obj, str], tuple[int, str] | None]] = {}
        self.on_create: dict[str, Callable[[Obj], Awaitable[None]]] = {}
        self.on_delete: dict[str, Callable[[Obj], Awaitable[None]]] = {}
        self.mutators: dict[str, Callable[[Obj], None]] = {}
        """Mutating admission on an update, per plural (in place, before ``generation`` is worked out)."""
        self.on_patch: dict[str, Callable[[Obj], Awaitable[None]]] = {}
        """Awaited with the patched object before the patch is answered (what happened meanwhile in the cluster)."""
        self.faults: list[Fault] = []
        self.forbidden: set[tuple[str, str]] = set()
        """(verb, plural) pairs RBAC refuses."""
        self.allowed: set[tuple[str, str, str]] | None = None
        """If set, RBAC allows only these (verb, plural, namespace); namespace "" is a ClusterRole's grant, in
        every namespace and on cluster-scoped objects (e.g. from knative/rbac.yaml's roles)."""
        self.calls: collections.Counter[tuple[str, str, str]] = collections.Counter()
        """(sandbox id or '*', verb, plural) → count."""
        self._history = history
        self._oldest: dict[tuple[str, str], int] = collections.defaultdict(int)
        self._rv = 100
        self._watchers: list[tuple[str, str, str, str, asyncio.Queue[tuple[str, Obj] | None]]] = []
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="k8s-standin", daemon=True)
        self._runner: web.AppRunner | None = None
        self.url = ""
        self.bookmark_interval_s = 1.0
        """A watch that asked for bookmarks gets one after this long without events (the API server: ~1 min)."""
        self.pages = 0
        """List responses served (pages)."""
        self._unstall = asyncio.Event()

    # -- lifetime, from the test's thread --------------------------------------------------------------

    def start(self) -> KubeStandin:
        """Serve on a free loopback port."""
        self._thread.start()
        self.run(self._serve())
        return self

    def run(self, coro: Awaitable[Any], timeout: float = 60.0) -> Any:
        """Run a coroutine on the stand-in's loop and wait for it."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)  # type: ignore[arg-type]

    def stop(self) -> None:
        """End every watch and stop serving."""
        async def shutdown() -> None:
            self._unstall.set()
            for *_, queue in self._watchers:
                queue.put_nowait(None)
            if self._runner is not None:
                await self._runner.cleanup()
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in others:
                task.cancel()
            await asyncio.gather(*others, return_exceptions=True)
        self.run(shutdown())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)

    async def _serve(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/api/{version}/namespaces/{ns}/{plural}", self._collection)
        app.router.add_route("*", "/api/{version}/namespaces/{ns}/{plural}/{name}", self._item)
        app.router.add_route("*", "/apis/{group}/{version}/namespaces/{ns}/{plural}", self._collection)
        app.router.add_route("*", "/apis/{group}/{version}/namespaces/{ns}/{plural}/{name}", self._item)
        # Cluster-scoped objects (RuntimeClasses): a path two segments shorter, no namespace.
        app.router.add_route("*", "/apis/{group}/{version}/{plural}", self._collection)
        app.router.add_route("*", "/apis/{group}/{version}/{plural}/{name}", self._item)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"

    def kubeconfig(self, namespace: str = "default") -> Obj:
        """A kubeconfig that points the real client here."""
        return {
            "apiVersion": "v1", "kind": "Config", "current-context": "standin",
            "clusters": [{"name": "standin", "cluster": {"server": self.url}}],
            "users": [{"name": "grove", "user": {"token": self.token}}],
            "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "grove",
                                                         "namespace": namespace}}],
        }

    # -- state changes (on the loop) -------------------------------------------------------------------

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def put(self, plural: str, ns: str, obj: Obj, kind: str = "MODIFIED") -> Obj:
        """Store ``obj`` (a new resourceVersion) and tell the watchers."""
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = self._next_rv()
        self.objects[(plural, ns)][obj["metadata"]["name"]] = obj
        self._emit(plural, ns, kind, obj)
        return obj

    def remove(self, plural: str, ns: str, name: str) -> Obj | None:
        """Delete ``name`` now and tell the watchers."""
        obj = self.objects[(plural, ns)].pop(name, None)
        if obj is not None:
            obj = copy.deepcopy(obj)
            obj["metadata"]["resourceVersion"] = self._next_rv()
            self._emit(plural, ns, "DELETED", obj)
        return obj

    def expire_history(self) -> None:
        """Compact past every version handed out: a watch resuming from any of them gets 410 Gone."""
        for key, events in self.events.items():
            self._oldest[key] = self._rv + 1
            events.clear()

    def drop_watches(self) -> None:
        """End every open watch stream (an API server restart, a load balancer timeout)."""
        for *_, queue in self._watchers:
            queue.put_nowait(None)

    def stall_watches(self) -> None:
        """Open watch streams go silent without closing (a NAT or load balancer dropped them); new ones work."""
        for *_, queue in self._watchers:
            queue.put_nowait(("STALL", {}))

    def _emit(self, plural: str, ns: str, kind: str, obj: Obj) -> None:
        events = self.events[(plural, ns)]
        events.append((int(obj["metadata"]["resourceVersion"]), kind, obj))
        if len(events) > self._history:
            self._oldest[(plural, ns)] = events.pop(0)[0]
        for w_plural, w_ns, labels, fields, queue in self._watchers:
            if (w_plural, w_ns) == (plural, ns) and self._selected(obj, labels, fields):
                queue.put_nowait((kind, obj))

    @staticmethod
    def _selected(obj: Obj, labels: str, fields: str) -> bool:
        meta = obj["metadata"]
        if fields and fields.startswith("metadata.name=") and meta["name"] != fields.split("=", 1)[1]:
            return False
        return matches(meta.get("labels") or {}, labels)

    # -- HTTP ------------------------------------------------------------------------------------------

    def _gate(self, request: web.Request, verb: str, name: str | None) -> web.Response | None:
        plural, ns = request.match_info["plural"], request.match_info.get("ns", "")
        owner = _NAME.match(name or "")
        self.calls[(owner.group(1) if owner else "*", verb, plural)] += 1
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return web.json_response(status_body(401, "Unauthorized", "Unauthorized"), status=401)
        granted = self.allowed is None or bool({(verb, plural, ns), (verb, plural, "")} & self.allowed)
        if (verb, plural) in self.forbidden or not granted:
            group = request.match_info.get("group", "")
            scope = f' in the namespace "{ns}"' if ns else " at the cluster scope"
            message = (f'{plural}{"." + group if group else ""} is forbidden: User '
                       f'"system:serviceaccount:grove-system:grove-router" cannot {verb} resource "{plural}" in '
                       f'API group "{group}"{scope}')
            return web.json_response(status_body(403, "Forbidden", message), status=403)
        for fault in self.faults:
            if fault.count > 0 and fault.verb == verb and fault.plural == plural:
                fault.count -= 1
                headers = {"Retry-After": str(fault.retry_after)} if fault.retry_after is not None else None
                return web.json_response(status_body(fault.status, fault.reason, fault.message),
                                         status=fault.status, headers=headers)
        return None

    async def _collection(self, request: web.Request) -> web.StreamResponse:
        plural, ns = request.match_info["plural"], request.match_info.get("ns", "")
        if request.method == "POST":
            body = await request.json()
            if (denied := self._gate(request, "create", body.get("metadata", {}).get("name"))) is not None:
                return denied
            return await self._create(request, plural, ns, body)
        watching = request.query.get("watch") in ("true", "1")
        if (denied := self._gate(request, "watch" if watching else "list", None)) is not None:
            return denied
        labels, fields = request.query.get("labelSelector", ""), request.query.get("fieldSelector", "")
        if watching:
            return await self._watch(request, plural, ns, labels, fields)
        items = sorted((o for o in self.objects[(plural, ns)].values() if self._selected(o, labels, fields)),
                       key=lambda o: str(o["metadata"]["name"]))
        # Pagination: ``limit`` items a page, then a ``continue`` token naming where the next page starts and
        # the list's version (every page reports the first one's, as the API server's consistent lists do).
        version, start = str(self._rv), ""
        if token := request.query.get("continue"):
            version, start = json.loads(base64.b64decode(token))
        items = [o for o in items if str(o["metadata"]["name"]) > start] if start else items
        meta: Obj = {"resourceVersion": version}
        limit = int(request.query.get("limit") or 0)
        if limit and len(items) > limit:
            items = items[:limit]
            meta["continue"] = base64.b64encode(json.dumps([version, items[-1]["metadata"]["name"]]).encode()).decode()
        self.pages += 1
        return web.json_response({"kind": KINDS.get(plural, "Object") + "List", "apiVersion": "v1",
                                  "metadata": meta, "items": items})

    async def _create(self, request: web.Request, plural: str, ns: str, body: Obj) -> web.Response:
        name = body.get("metadata", {}).get("name", "")
        validator = self.validators.get(plural)
        if validator and (problem := validator(body, request.query.get("fieldValidation", ""))) is not None:
            code, message = problem
            reason = "BadRequest" if code == 400 else "Invalid"
            return web.json_response(status_body(code, reason, message, {"name": name}), status=code)
        if name in self.objects[(plural, ns)]:
            message = f'{plural} "{name}" already exists'
            return web.json_response(status_body(409, "AlreadyExists", message, {"name": name}), status=409)
        meta = body.setdefault("metadata", {})
        meta.update(uid=str(uuid.uuid4()), generation=1,
                    creationTimestamp=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        if ns:  # a cluster-scoped object has none
            meta["namespace"] = ns
        if plural == "secrets" and "stringData" in body:
            data = body.setdefault("data", {})
            for key, value in body.pop("stringData").items():
                data[key] = base64.b64encode(value.encode()).decode()
        stored = self.put(plural, ns, body, "ADDED")
        if hook := self.on_create.get(plural):
            asyncio.get_running_loop().create_task(hook(stored))
        return web.json_response(stored, status=201)

    async def _item(self, request: web.Request) -> web.Response:
        plural, ns, name = request.match_info["plural"], request.match_info.get("ns", ""), request.match_info["name"]
        verb = {"GET": "get", "DELETE": "delete"}.get(request.method, request.method.lower())
        if (denied := self._gate(request, verb, name)) is not None:
            return denied
        obj = self.objects[(plural, ns)].get(name)
        if obj is None or verb not in ("get", "delete", "patch"):
            message = f'{plural} "{name}" not found'
            return web.json_response(status_body(404, "NotFound", message, {"name": name}), status=404)
        if verb == "get":
            return web.json_response(obj)
        if verb == "patch":
            answer = self._patch(request, plural, ns, obj, await request.json())
            if answer.status == 200 and (patched_hook := self.on_patch.get(plural)):
                await patched_hook(self.objects[(plural, ns)][name])
            return answer
        raw = await request.read()
        options = json.loads(raw) if raw else {}
        policy = request.query.get("propagationPolicy") or options.get("propagationPolicy") or "Background"
        hook = self.on_delete.get(plural)
        if policy == "Foreground" and hook is not None:
            # The owner stays, marked, until its dependents (the pod) are gone.
            marked = copy.deepcopy(obj)
            marked["metadata"]["deletionTimestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            marked["metadata"]["finalizers"] = ["foregroundDeletion"]
            self.put(plural, ns, marked)

            async def finish() -> None:
                await hook(obj)
                self.remove(plural, ns, name)
            asyncio.get_running_loop().create_task(finish())
        else:
            self.remove(plural, ns, name)
            if hook is not None:
                asyncio.get_running_loop().create_task(hook(obj))
        return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Success",
                                  "details": {"name": name}})

    def _patch(self, request: web.Request, plural: str, ns: str, obj: Obj, patch: Obj) -> web.Response:
        """A JSON merge patch (RFC 7386), the only kind grove sends; like the API server, only a change of
        ``spec`` bumps ``metadata.generation`` (on a Knative Service: a new revision)."""
        if request.content_type != "application/merge-patch+json":
            message = f"the stand-in takes merge patches only, not {request.content_type}"
            return web.json_response(status_body(415, "UnsupportedMediaType", message), status=415)
        if plural == "secrets" and "stringData" in patch:
            patch = {**patch, "data": {k: base64.b64encode(v.encode()).decode()
                                       for k, v in patch.pop("stringData").items()}}
        patched = _merge(copy.deepcopy(obj), patch)
        if mutate := self.mutators.get(plural):
            mutate(patched)
        if patched.get("spec") != obj.get("spec"):
            patched["metadata"]["generation"] = obj["metadata"].get("generation", 1) + 1
        if request.query.get("dryRun") == "All":  # admitted and answered, not stored
            return web.json_response(patched)
        return web.json_response(self.put(plural, ns, patched))

    async def _watch(self, request: web.Request, plural: str, ns: str, labels: str,
                     fields: str) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        since = request.query.get("resourceVersion", "")
        timeout = float(request.query.get("timeoutSeconds", "1800"))
        queue: asyncio.Queue[tuple[str, Obj] | None] = asyncio.Queue()

        async def send(kind: str, obj: Obj) -> None:
            await response.write(json.dumps({"type": kind, "object": obj}).encode() + b"\n")

        if since not in ("", "0") and int(since) < self._oldest[(plural, ns)]:
            gone = status_body(410, "Expired", f"too old resource version: {since} ({self._oldest[(plural, ns)]})")
            await send("ERROR", gone)
            return response
        # Listen first, then replay: whatever happens while the replay is being written is queued, and
        # the queue skips what the replay already sent.
        watcher = (plural, ns, labels, fields, queue)
        self._watchers.append(watcher)
        if since in ("", "0"):  # "start at most recent": the current objects first, as ADDED
            replay = [("ADDED", o) for o in self.objects[(plural, ns)].values()]
        else:
            replay = [(kind, o) for rv, kind, o in self.events[(plural, ns)] if rv > int(since)]
        sent = int(since or 0)
        for kind, obj in replay:
            sent = max(sent, int(obj["metadata"]["resourceVersion"]))
            if self._selected(obj, labels, fields):
                await send(kind, obj)
        deadline = time.monotonic() + timeout
        bookmarks = request.query.get("allowWatchBookmarks") in ("true", "1")
        try:
            while (left := deadline - time.monotonic()) > 0:
                try:
                    item = await asyncio.wait_for(queue.get(), min(left, self.bookmark_interval_s))
                except TimeoutError:
                    if bookmarks and queue.empty():  # everything selected up to now was sent
                        await send("BOOKMARK", {"kind": KINDS.get(plural, "Object"), "apiVersion": "v1",
                                                "metadata": {"resourceVersion": str(self._rv)}})
                    continue
                if item is None:
                    break
                if item[0] == "STALL":  # a half-open connection: nothing more, and never closed
                    await self._unstall.wait()
                    break
                if int(item[1]["metadata"]["resourceVersion"]) > sent:
                    await send(*item)
        except ConnectionResetError:
            pass  # the client went away
        finally:
            self._watchers.remove(watcher)
        return response


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge key by key, ``null`` deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return patch
    if not isinstance(target, dict):
        target = {}
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        else:
            target[key] = _merge(target.get(key), value)
    return target
