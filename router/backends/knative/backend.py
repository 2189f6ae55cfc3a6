"""The Knative backend: each sandbox a scale-to-zero Knative Service on a cluster.

Per sandbox: a Secret (executor token, command environment, snapshot GET URL and upload token), the Knative
Service (:mod:`router.backends.knative.manifest`), and with ``egress: allow`` a NetworkPolicy. Readiness comes
from one shared watch of the namespace's grove Services (:mod:`router.backends.knative.informer`), never from
polling. Scale-to-zero is Knative's: with no traffic for the window set from ``idle_timeout_s`` its
autoscaler removes the pod (the executor snapshots its workspace on SIGTERM), and the next request
through the revision's URL wakes it (the activator holds the request; the executor restores at start).
So ``stop`` and ``resume`` make no API call while the Service exists; a Service deleted behind the
router's back is created again on resume, its files coming back from the snapshot.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
from typing import Any

import urllib3
from kubernetes import client

from grove.core.errors import Conflict, GroveError, Invalid, NotFound, Unavailable, UpstreamTimeout
from router.backends.base import CheckpointTaken, Endpoint, SandboxSpec, SnapshotUploads, Started
from router.backends.knative import capacity, manifest, requirements, runtimeclass, status
from router.backends.knative import egress as knative_egress
from router.backends.knative import labels as L
from router.backends.knative.informer import Informer, Obj
from router.backends.knative.kube import Kube, api_error, client_configuration
from router.backends.knative.options import KnativeOptions
from router.backends.knative.snapshots import Presigner, Snapshots, checkpoint_key

log = logging.getLogger("grove.knative")
_GROUP, _VERSION = "serving.knative.dev", "v1"
_PRIVATE = "networking.internal.knative.dev/serviceType=Private"


class KnativeBackend:
    """Sandboxes as Knative Services, spread over the configured namespaces."""

    name = "knative"
    exit_grace_s = 0.0  # is_running reads the watch cache: a pod that is gone is gone
    endpoints_move = True  # pod mode: a refused pod address is a pod gone with scale-to-zero
    executor_reaches_storage = True
    start_slots = 64  # Services created at once: each is a few API calls, the cluster starts the pods
    host_admission = False
    warm_by_traffic = True  # the autoscaler counts requests: a heartbeat must be one
    checkpoint_snapshots = True  # a checkpoint is the executor's workspace snapshot, kept under its own key
    # Baked into the revision template (working dir and snapshot dir, the autoscaling window, the presigned
    # snapshot URLs' lifetime): changing them would make a new revision, the wait a pool is there to avoid.
    claim_fixed: tuple[str, ...] = ("workdir", "idle_timeout_s", "ttl_s")

    def __init__(self, options: KnativeOptions, *, kube: Kube | None = None) -> None:
        self.options = options
        self.kube = kube
        """The API wrapper; made by :meth:`open` unless given."""
        self.snapshots: Snapshots | None = None
        """Snapshot storage, attached by the app once S3 is up; without it state does not survive scale-to-zero."""
        self._services: dict[str, Informer] = {}
        """The grove Services of this instance, one watch per namespace."""
        self._slices: dict[str, Informer] = {}
        """In pod mode, the revisions' private EndpointSlices, one watch per namespace."""
        self._placed: dict[str, str] = {}
        """The namespace of each sandbox this router placed (a sandbox made before is found by its watch)."""
        self._digests: dict[str, str] = {}
        if options.endpoint_mode == "pod":
            # A call can reach a pod's address after the pod went and before the EndpointSlice watch says so:
            # a lost call looks again for that long, so the sandbox goes idle and the call is sent again.
            self.exit_grace_s = 2.0

    @property
    def snapshot_uploads(self) -> SnapshotUploads | None:
        """The broker of the executors' snapshot uploads, once storage is attached."""
        return self.snapshots.uploads if self.snapshots is not None else None

    def attach_storage(self, storage: Presigner) -> None:
        """Use ``storage`` for workspace snapshots (called by the app before any create)."""
        self.snapshots = Snapshots(storage, self.options.instance, self.options.snapshot_part_bytes)

    # -- lifetime --------------------------------------------------------------------------------------

    async def open(self) -> None:
        """Connect, then list and watch each namespace's grove Services (and EndpointSlices in pod mode)."""
        if self.kube is None:
            self.kube = Kube(self.options, await asyncio.to_thread(client_configuration, self.options))
        await requirements.enforce(self.kube, self.options)
        for ns in self.options.spread:
            await self._watch(self.kube, ns)

    async def _watch(self, kube: Kube, ns: str) -> None:
        selector, o = self._selector, self.options
        lister = functools.partial(kube.custom.list_namespaced_custom_object, _GROUP, _VERSION, ns, "services")
        tuning = {"page_size": o.list_page_size, "idle_timeout_s": o.watch_idle_timeout_s,
                  "call_timeout_s": o.api_timeout_s}
        self._services[ns] = Informer("services.serving.knative.dev", lister, selector, keep=status.service_fields,
                                      **tuning)  # type: ignore[arg-type]
        informers = [self._services[ns]]
        if o.endpoint_mode == "pod":
            slices = functools.partial(kube.discovery.list_namespaced_endpoint_slice, ns)
            self._slices[ns] = Informer("endpointslices", slices, _PRIVATE, keep=status.slice_fields,
                                        **tuning)  # type: ignore[arg-type]
            informers.append(self._slices[ns])
        for informer in informers:
            try:
                await informer.start()
            except client.ApiException as exc:
                if exc.status == 404:
                    raise NotFound(f"the API server has no {informer.kind} in {ns!r}: is Knative Serving installed, "
                                   "and does the namespace exist?") from exc
                raise api_error(exc, "list", informer.kind, "*", ns) from exc
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                host = kube.api_client.configuration.host
                raise Unavailable(f"the Kubernetes API server at {host} is unreachable: {exc}", retry_after=5) from exc

    async def close(self) -> None:
        """Stop watching; the sandboxes keep running for the next router."""
        if self.snapshots is not None:
            await self.snapshots.close()
        for informer in [*self._services.values(), *self._slices.values()]:
            await asyncio.to_thread(informer.stop)
        if self.kube is not None:
            self.kube.close()

    @property
    def _selector(self) -> str:
        """The labels of this instance's objects: its watches and orphan collection see nothing else."""
        return f"{L.MANAGED_BY}=grove,{L.INSTANCE}={L.sanitize_value(self.options.instance)}"

    def _api(self, sandbox_id: str) -> tuple[Kube, str, Informer]:
        """The client, and the sandbox's namespace and its watch."""
        assert self.kube is not None and self._services, "open() first"
        ns = self._namespace_of(sandbox_id)
        return self.kube, ns, self._services[ns]

    def _namespace_of(self, sandbox_id: str) -> str:
        """Where the sandbox's objects are: where this router put it, else where a watch sees it, else the first."""
        if (placed := self._placed.get(sandbox_id)) is not None:
            return placed
        found = next((ns for ns, watch in self._services.items() if sandbox_id in watch.objects), None)
        return found or self.options.spread[0]

    def _counts(self) -> dict[str, int]:
        """Sandboxes per namespace: those the watches see and those placed there not yet seen."""
        ids = {ns: set(watch.objects) for ns, watch in self._services.items()}
        for sandbox_id, ns in self._placed.items():
            ids[ns].add(sandbox_id)
        return {ns: len(ids[ns]) for ns in self.options.spread}

    def _place(self, sandbox_id: str) -> str:
        """The namespace a new sandbox's objects go to (429 when none has room)."""
        if self._placed.get(sandbox_id) is None:
            o = self.options
            self._placed[sandbox_id] = capacity.place(self._counts(), o.namespace_capacity, o.cluster_capacity)
        return self._placed[sandbox_id]

    # -- the protocol ----------------------------------------------------------------------------------

    def check(self, spec: SandboxSpec) -> None:
        """Every option the API has maps onto the Service and its policies; only a malformed or link-local
        allow-list entry is refused (422 naming it), before anything is made; so is a private group, which this
        backend does not make yet (its equivalent: a NetworkPolicy admitting the pods labelled with the group); and
        a sandbox no namespace has room for (429 naming the limit)."""
        knative_egress.check(spec.network.allow)
        if spec.group is not None:
            raise Invalid("network.group (a private network between sandboxes) is not supported on the knative "
                          "backend yet; create the sandbox without 'group', or use a local router")
        if self._services:
            o = self.options
            capacity.place(self._counts(), o.namespace_capacity, o.cluster_capacity)

    async def image_digest(self, image: str) -> str:
        """The digest when the reference pins one or Knative resolved it before; "" until it is known."""
        if "@" in image:
            return image.rsplit("@", 1)[1]
        return self._digests.get(image, "")

    async def create(self, spec: SandboxSpec) -> Started:
        """Create the Secret, the Service and the policy; wait for Ready by watch; clean up on failure. From a
        checkpoint: the checkpoint is first copied to the new sandbox's snapshot, which its executor restores."""
        if spec.checkpoint is not None:
            storage = self._snapshots_for("checkpoints").storage
            source = checkpoint_key(self.options.instance, spec.checkpoint.sandbox_id, spec.checkpoint.checkpoint_id)
            await asyncio.to_thread(storage.copy, source, manifest.snapshot_key(self.options.instance, spec.id))
        return await self._create_all(spec, keep_snapshot=False)

    async def _create_all(self, spec: SandboxSpec, *, keep_snapshot: bool) -> Started:
        objects = manifest.build(
            spec, self.options, namespace=self._place(spec.id),
            image=status.pinned(self.options.image_for(spec.image), self._digests.get(spec.image)),
            snapshot_access=await self.snapshots.access(spec.id, spec.ttl_s, spec.disk_mb) if self.snapshots else None,
        )
        created: list[dict[str, Any]] = []
        try:
            for obj in objects.all():
                await self._create(obj)
                created.append(obj)
            return await self._started(spec)
        except BaseException:
            await asyncio.shield(self._remove(spec.id, cleanup=[o["kind"] for o in created],
                                              keep_snapshot=keep_snapshot))
            raise

    async def resume(self, spec: SandboxSpec, handle: dict[str, Any]) -> Started:
        """Knative wakes the pod on the next request; a Service that is gone is created again."""
        _, _, services = self._api(spec.id)
        if spec.id not in services.objects:
            log.warning("the Service of %s is gone; creating it again (its files come from the snapshot)", spec.id)
            await self._remove(spec.id, cleanup=["Secret", "NetworkPolicy"], keep_snapshot=True)
            return await self._create_all(spec, keep_snapshot=True)
        return await self._started(spec)

    async def stop(self, sandbox_id: str, handle: dict[str, Any]) -> dict[str, Any]:
        """Nothing to call: Knative's autoscaler removes the idle pod (window from ``idle_timeout_s``)."""
        return {k: v for k, v in handle.items() if k != "pod"}

    async def delete(self, sandbox_id: str, handle: dict[str, Any]) -> None:
        """Delete the Service (its pods first), Secret and NetworkPolicy; the snapshot once the pods are
        gone (the last one is written while the pod terminates). What is already gone is fine."""
        # An unknown handle (an orphan, an old record) may have a policy: only a known "no" skips it.
        kinds = ["Service", "Secret"] + ([] if handle.get("policy") is False else ["NetworkPolicy"])
        await self._remove(sandbox_id, cleanup=kinds)

    async def claim(self, spec: SandboxSpec, handle: dict[str, Any]) -> dict[str, str]:
        """One merge patch of the member's Secret: the claimant's token, env, a fresh snapshot URL a restarted
        pod reads, and the claim's metadata labels. The Service is not written (:func:`manifest.claim_patch`
        says why): no relabelling of its Configuration, Route and KIngress, and no revision, whatever Knative's
        defaults became since the member was made."""
        kube, ns, services = self._api(spec.id)
        secret_name = manifest.secret_name(spec.id)
        access = await self.snapshots.access(spec.id, spec.ttl_s, spec.disk_mb) if self.snapshots else None
        made_with = services.objects.get(spec.id, {}).get("metadata", {}).get("labels", {})
        patch = manifest.claim_patch(spec, made_with, access)
        await kube.call("patch", "secrets", secret_name, kube.core.patch_namespaced_secret, secret_name, ns,
                        patch, _content_type="application/merge-patch+json", namespace=ns)
        return dict(json.loads(manifest.executor_env(spec)))

    async def is_running(self, sandbox_id: str, handle: dict[str, Any]) -> bool:
        """From the watch cache (no API call): the Service exists and is not failed; in pod mode, the
        pod the handle points at is still a ready endpoint."""
        _, _, services = self._api(sandbox_id)
        obj = services.objects.get(sandbox_id)
        if obj is None or status.state(obj) == "failed":
            return False
        pod = handle.get("pod")
        return not pod or pod in self._pod_endpoints(str(handle.get("revision", "")))

    async def own_fault(self, sandbox_id: str, handle: dict[str, Any], *, rebase: bool = False) -> str | None:
        """Nothing tells here (a pod's OOMKilled is not told from a node's eviction): None, an infra error."""
        return None

    async def usage(self, sandbox_id: str, handle: dict[str, Any]) -> None:
        """None: the router reads no counters of a pod (the kubelet's cgroups are on its node, and the metrics API
        gives a rate now, not what a run used), so a Knative sandbox's cost has its running time, its reserved
        memory and its S3 bytes, and no CPU time, memory peak or disk figure."""
        return None

    async def checkpoint(self, sandbox_id: str, handle: dict[str, Any], checkpoint_id: str) -> CheckpointTaken:
        """Keep the sandbox's snapshot as it is now (the router had a running executor store a fresh one; an idle
        sandbox's last one is its files) under the checkpoint's own key: a server-side S3 copy."""
        snapshots = self._snapshots_for("checkpoints")
        source = manifest.snapshot_key(self.options.instance, sandbox_id)
        target = checkpoint_key(self.options.instance, sandbox_id, checkpoint_id)
        if not await asyncio.to_thread(snapshots.storage.exists, source):
            raise Conflict(f"sandbox {sandbox_id} has no snapshot yet to keep as a checkpoint; try again once it ran")
        await asyncio.to_thread(snapshots.storage.copy, source, target)
        size = (await asyncio.to_thread(snapshots.storage.stat, target)).size
        return CheckpointTaken(bytes=size, frozen_s=0.0, reflinked=False)

    async def delete_checkpoint(self, sandbox_id: str, checkpoint_id: str) -> None:
        """Remove the checkpoint's object."""
        await asyncio.to_thread(self._snapshots_for("checkpoints").storage.delete,
                                checkpoint_key(self.options.instance, sandbox_id, checkpoint_id))

    def _snapshots_for(self, what: str) -> Snapshots:
        if self.snapshots is None:
            raise Invalid(f"{what} need object storage on the knative backend (grove up --s3 ...)")
        return self.snapshots

    async def collect_orphans(self, known_ids: set[str]) -> list[str]:
        """Delete this instance's Services, Secrets and policies, in each of its namespaces, that belong to no
        known sandbox."""
        assert self.kube is not None, "open() first"
        kube, found = self.kube, set[str]()
        for ns, services in self._services.items():
            found |= set(services.objects)
            for resource, lister in (("secrets", kube.core.list_namespaced_secret),
                                     ("networkpolicies", kube.networking.list_namespaced_network_policy)):
                listed = await kube.call("list", resource, "*", lister, ns, label_selector=self._selector,
                                         namespace=ns)
                in_ns = {item.metadata.labels.get(L.SANDBOX) for item in listed.items} - {None}
                self._placed.update({sandbox_id: ns for sandbox_id in in_ns if sandbox_id not in found})
                found |= in_ns
        orphans = sorted(found - known_ids)
        for sandbox_id in orphans:
            await self.delete(sandbox_id, {})
        if self.snapshots is not None:
            await self.snapshots.sweep(known_ids | found)  # orphans' snapshots go once their pods are gone
        return orphans

    # -- the parts -------------------------------------------------------------------------------------

    async def _create(self, obj: dict[str, Any]) -> None:
        assert self.kube is not None, "open() first"
        kube, ns, name, kind = self.kube, obj["metadata"]["namespace"], obj["metadata"]["name"], obj["kind"]
        # Strict: a field the API does not know is an error, not silently dropped from the sandbox.
        common: dict[str, Any] = {"limit": kube.create_limit, "namespace": ns, "field_validation": "Strict"}
        if kind == "Service":
            try:
                await kube.call("create", "services.serving.knative.dev", name,
                                kube.custom.create_namespaced_custom_object, _GROUP, _VERSION, ns, "services", obj,
                                **common)
            except Invalid as exc:
                # runtimeClassName refused: the flag was turned off after the start-up check, or RBAC hid it.
                if hint := runtimeclass.webhook_hint(exc.message):
                    raise Invalid(exc.message + "." + hint) from exc
                raise
        elif kind == "Secret":
            await kube.call("create", "secrets", name, kube.core.create_namespaced_secret, ns, obj, **common)
        else:
            await kube.call("create", "networkpolicies.networking.k8s.io", name,
                            kube.networking.create_namespaced_network_policy, ns, obj, **common)

    async def _started(self, spec: SandboxSpec) -> Started:
        """Wait for Ready by watch; surface a failed revision's own message; work out the endpoint."""
        _, ns, services = self._api(spec.id)
        seen = False

        def settled(obj: Obj | None) -> Obj | None:
            nonlocal seen
            if obj is None:
                if seen:
                    raise NotFound(f"the Knative Service of sandbox {spec.id} was deleted while it started")
                return None
            seen = True
            return obj if status.state(obj) != "pending" else None

        try:
            obj = await services.wait_for(spec.id, settled, self.options.ready_timeout_s)
        except UpstreamTimeout as exc:
            last = status.describe(services.objects.get(spec.id))
            raise Unavailable(
                f"sandbox {spec.id} was not ready after {self.options.ready_timeout_s:g}s: {last}", retry_after=5
            ) from exc
        revision_name = str(obj.get("status", {}).get("latestCreatedRevisionName") or "")
        if status.state(obj) == "failed":
            revision = await self._revision(ns, revision_name) if revision_name else None
            why = (revision and status.revision_failure(revision)) or status.describe(obj)
            raise Unavailable(f"sandbox {spec.id}: revision {revision_name or '?'} failed: {why}", retry_after=5)
        ready_revision = str(obj["status"].get("latestReadyRevisionName") or revision_name)
        # The digest from the template when it is pinned, else from what Knative resolved (one read per image).
        running = str(obj["spec"]["template"]["spec"]["containers"][0].get("image", ""))
        digest = await self.image_digest(running) or await self.image_digest(spec.image)
        if not digest and ready_revision and (revision := await self._revision(ns, ready_revision)):
            digest = status.image_digest(revision, "sandbox") or ""
        if digest and "@" not in spec.image:
            self._digests[spec.image] = digest  # later sandboxes of this image run exactly this one
        url, pod = self._endpoint(obj, ns, ready_revision)
        # Whether a NetworkPolicy was made: delete then skips a call that could only answer 404.
        handle = {"revision": ready_revision, "policy": spec.network.egress != "deny", **({"pod": pod} if pod else {})}
        return Started(Endpoint(url, spec.token), digest, handle)

    async def _revision(self, ns: str, name: str) -> Obj | None:
        assert self.kube is not None, "open() first"
        kube = self.kube
        try:
            found = await kube.call("get", "revisions.serving.knative.dev", name,
                                    kube.custom.get_namespaced_custom_object, _GROUP, _VERSION, ns, "revisions", name,
                                    namespace=ns)
        except GroveError as exc:  # the Service's own message is still there to report
            log.warning("reading revision %s failed: %s", name, exc.message)
            return None
        return dict(found)

    def _endpoint(self, obj: Obj, ns: str, revision: str) -> tuple[str, str | None]:
        """(URL, pod endpoint or None) for the configured endpoint mode."""
        mode = self.options.endpoint_mode
        if mode == "address":
            url = obj.get("status", {}).get("address", {}).get("url") or obj.get("status", {}).get("url")
            if not url:
                raise Unavailable(f"the Knative Service {obj['metadata']['name']} reports no address", retry_after=1)
            return str(url), None
        if mode == "pod" and (pods := self._pod_endpoints(revision)):
            return f"http://{pods[0]}", pods[0]
        return f"http://{revision}.{ns}.svc.{self.options.cluster_domain}", None

    def _pod_endpoints(self, revision: str) -> list[str]:
        """``ip:port`` of the revision's ready pods on the queue-proxy's ``http`` port, from the watch cache."""
        found: list[str] = []
        if not revision:
            return found
        for piece in (p for watch in self._slices.values() for p in watch.objects.values()):
            if piece.get("metadata", {}).get("labels", {}).get("kubernetes.io/service-name") != f"{revision}-private":
                continue
            ports = [p.get("port") for p in piece.get("ports") or [] if p.get("name") == "http"]
            for endpoint in piece.get("endpoints") or []:
                if ports and endpoint.get("conditions", {}).get("ready") and endpoint.get("addresses"):
                    found.append(f"{endpoint['addresses'][0]}:{ports[0]}")
        return found

    async def _remove(self, sandbox_id: str, *, cleanup: list[str], keep_snapshot: bool = False) -> None:
        kube, ns, services = self._api(sandbox_id)
        limit = kube.delete_limit
        calls = {
            # Foreground: the Service stays (marked) until its pods are gone, so its disappearance from the
            # watch says the last snapshot has been written.
            "Service": ("services.serving.knative.dev", sandbox_id, functools.partial(
                kube.custom.delete_namespaced_custom_object, _GROUP, _VERSION, ns, "services", sandbox_id,
                propagation_policy="Foreground")),
            "Secret": ("secrets", manifest.secret_name(sandbox_id), functools.partial(
                kube.core.delete_namespaced_secret, manifest.secret_name(sandbox_id), ns)),
            "NetworkPolicy": ("networkpolicies.networking.k8s.io", manifest.policy_name(sandbox_id), functools.partial(
                kube.networking.delete_namespaced_network_policy, manifest.policy_name(sandbox_id), ns)),
        }
        for kind in cleanup:
            resource, name, call = calls[kind]
            with contextlib.suppress(NotFound):
                await kube.call("delete", resource, name, call, limit=limit, namespace=ns)
        if "Service" in cleanup and self.snapshots is not None:  # a deleted sandbox's checkpoints go with it
            await self.snapshots.remove_checkpoints(sandbox_id)
        if keep_snapshot:
            return  # made again next (a resume): in the same namespace
        self._placed.pop(sandbox_id, None)  # its watch still counts it until the Service is gone
        if self.snapshots is not None and "Service" in cleanup:
            gone = functools.partial(services.wait_for, sandbox_id, lambda obj: True if obj is None else None,
                                     self.options.request_timeout_s + 120.0)
            self.snapshots.forget_when(sandbox_id, gone)
