"""Knative Serving's part in the stand-in cluster: webhook, controller, pods, activator and autoscaler.

* **webhook**: a Service must pass the CRD's structural schema (``fieldValidation=Strict``: unknown
  fields are a 400) and Knative's own checks — features used (init containers, ``runtimeClassName``)
  must not be disabled in ``config-features``, which starts as the repository's
  ``knative/knative-serving-config.yaml`` (so the test proves that patch covers the template) and lives
  in the API as a ConfigMap in ``knative-serving``, read on every request like Knative's watched config;
  ``timeoutSeconds`` within ``max-revision-timeout-seconds``, autoscaling windows in bounds (422).
* **RuntimeClass admission**: a revision whose ``runtimeClassName`` names no RuntimeClass in the API
  fails with the API server's ``pod rejected: RuntimeClass "…" not found``.
* **controller**: a Revision ``<name>-00001``, then a pod; the Service reports ``Ready=True`` with
  ``observedGeneration``, ``latestReadyRevisionName`` and an address, or ``Ready=False`` with the
  Revision's message (an image it cannot fetch, a container that exits).
* **pod**: the task container's real command — the runtime bundle's loader and Python running the
  executor — with ``/.grove`` pointing at a built bundle (the init container's copy), a fresh root
  directory per start (a new container's filesystem: files survive only through the snapshot), and
  the env resolved from the Secret, snapshot URLs included.
* **Service network** (:mod:`tests.support.cluster_network`): each revision's Service
  ``<revision>.<ns>.svc.cluster.local`` has a ClusterIP on port 80 and a DNS record (a router subprocess run
  under :meth:`ServiceNetwork.wrap` resolves it). As with ``target-burst-capacity: 0``, a connection goes
  to the pod's queue-proxy while the revision has a ready pod, and to the activator while it has none
  (``revision`` endpoint mode). ``gateway`` is the same network for in-process clients: an HTTP proxy
  passing a request on to the ClusterIP its Host names.
* **activator** (one, on an address of its own, port 8012): finds the revision as Knative's context handler
  does — the ``Knative-Serving-Revision``/``-Namespace`` headers, else a Host ``<revision>.<ns>.svc.cluster.local``
  (404 for any other) — holds the request while the autoscaler starts a pod, then proxies it to the pod's
  queue-proxy, all under the revision's timeouts counted from its arrival (a cold start included).
* **cluster-local gateway**: ``status.address.url`` is a loopback proxy per Service that passes requests on to
  its revision's ClusterIP with the revision headers, as an ingress does (``address`` endpoint mode).
* **autoscaler**: counts traffic; after the annotations' window and retention (times ``time_scale``) without
  any, the pod gets SIGTERM (it snapshots) and is gone.
* **queue-proxy**: each pod has a loopback address of its own (its "pod IP") with queue-proxy on 8012,
  which its EndpointSlice ``<revision>-private-…`` lists while it runs, among queue-proxy's other ports
  (``pod`` endpoint mode). Every path to the executor goes through queue-proxy's timeouts.
* **kubelet**: readiness probing as queue-proxy does it, and eviction of a pod whose files outgrow its
  ephemeral-storage limit.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import functools
import hashlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import yaml
from aiohttp import web

from sandbox_image.bundle import DEFAULT_MOUNT_POINT, Bundle
from tests.conftest import loopback_listener
from tests.support.cluster_network import ServiceNetwork, on_own_address
from tests.support.crd_schema import load_schema, validate
from tests.support.k8s_standin import KubeStandin, Obj
from tests.support.knative_proxies import relay, timed_proxy

REPO = Path(__file__).resolve().parent.parent.parent
QUEUE_PORT = 8012
"""queue-proxy's port (``networking.BackendHTTPPort``), the one a revision's private EndpointSlice names ``http``;
the activator serves on it too."""
SYSTEM_NS = "knative-serving"
"""Where Knative's ConfigMaps live."""
_QUEUE_PORTS = (("https", 8112), ("http", QUEUE_PORT), ("http-autometric", 9090), ("http-usermetric", 9091),
                ("http-queueadm", 8022))
"""The private Service's ports as its EndpointSlice lists them (``pkg/reconciler/serverlessservice/resources``)."""
_REVISION_HEADERS = frozenset({"knative-serving-revision", "knative-serving-namespace"})
CLUSTER_DOMAIN = "cluster.local"


def serving_config() -> dict[str, dict[str, str]]:
    """ConfigMap name → data, from the repository's Knative Serving patch."""
    docs = yaml.safe_load_all((REPO / "knative" / "knative-serving-config.yaml").read_text())
    return {d["metadata"]["name"]: dict(d.get("data") or {}) for d in docs if d}


@dataclass
class Pod:
    """One running task container."""

    proc: subprocess.Popen[bytes]
    port: int
    root: str
    probes: int = 0
    """Readiness probes sent before it was ready."""
    address: str = "127.0.0.1"
    """The pod's IP (a loopback address of its own): its queue-proxy listens there on 8012."""
    queue: web.AppRunner | None = None
    serving: bool = False
    """queue-proxy listens and the pod is a ready endpoint (the revision's Service then sends connections here)."""
    probe_interval: float = 0.0
    """Seconds between them."""


@dataclass
class KService:
    """What the controller keeps per Knative Service."""

    obj: Obj
    revision: str
    proxy: web.AppRunner | None = None
    address: str = ""
    pod: Pod | None = None
    inflight: int = 0
    last: float = field(default_factory=time.monotonic)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    starts: int = 0
    deleted: bool = False


class KnativeStandin:
    """Knative on top of a :class:`KubeStandin` (install with :meth:`install`)."""

    def __init__(self, api: KubeStandin, bundle: Bundle, scratch: Path, *, time_scale: float = 1.0) -> None:
        self.api = api
        self.bundle = bundle
        self.scratch = scratch
        self.time_scale = time_scale
        self.schema = load_schema()
        self.bad_images: dict[str, str] = {}
        """image → the registry's error: such a revision fails."""
        self.services: dict[str, KService] = {}
        self.procs: set[subprocess.Popen[bytes]] = set()
        """Every pod process not yet reaped (killed at close, whatever state its pod is in)."""
        self._session: aiohttp.ClientSession | None = None
        self.gateway = ""
        """``http://127.0.0.1:port``: the cluster network, routing by Host (use as the HTTP proxy of revision URLs)."""
        self._gateway: web.AppRunner | None = None
        self.pull_s = 0.0
        """Seconds each pod start waits before its container runs (an image pull on a cold node)."""
        self.slice_lag_s = 0.0
        """Seconds before a pod's removal reaches its EndpointSlice (the controller batches updates, the watch
        carries them): meanwhile a client that read the slice can still dial the pod's address."""
        self.new_template_defaults: dict[str, str] = {}
        """Template annotations the webhook adds on every write from now on: a default a newer Knative (or a changed
        config) sets that the Services made before it do not have."""
        self.evictions = 0
        """Pods the kubelet evicted for outgrowing their ephemeral-storage limit."""
        self.timeouts = 0
        """Calls the activator or queue-proxy ended with its timeout (a 504, or a cut response)."""
        self.network = ServiceNetwork(scratch)
        self.activator = ""
        """The activator's address (port 8012)."""
        self._activator: web.AppRunner | None = None
        self.hops: collections.Counter[str] = collections.Counter()
        """Requests each hop served: ``activator``, ``queue-proxy``, ``gateway`` (the cluster-local one); and the
        upgrade requests the first two passed on their upgrade path (whatever the answer): ``activator-upgrade``,
        ``queue-proxy-upgrade``."""

    @property
    def config(self) -> dict[str, dict[str, str]]:
        """ConfigMap name → its live ``data`` in the API's ``knative-serving`` namespace: what the webhook reads
        on every request (Knative's watches them), and what a test changes in place to reconfigure it."""
        return {name: obj.setdefault("data", {}) for name, obj in self.api.objects[("configmaps", SYSTEM_NS)].items()}

    def set_feature(self, flag: str, value: str | None) -> None:
        """Set (or, with None, remove) one key of ``config-features``, as ``kubectl patch`` would."""
        current = self.api.objects[("configmaps", SYSTEM_NS)]["config-features"]
        data = {k: v for k, v in (current.get("data") or {}).items() if k != flag}
        self.api.put("configmaps", SYSTEM_NS, {**current, "data": data | ({flag: value} if value else {})})

    def install(self) -> KnativeStandin:
        """Hook into the API server's services; Knative's ConfigMaps with the repository's patch applied."""
        for name, data in serving_config().items():
            self.api.put("configmaps", SYSTEM_NS, {"apiVersion": "v1", "kind": "ConfigMap",
                                                   "metadata": {"name": name, "namespace": SYSTEM_NS}, "data": data},
                         "ADDED")
        # The activator's Deployment, with its grace period raised to the revisions' timeout as the README's step
        # (or the Operator manifest's spec.deployments) does.
        self.api.put("deployments", SYSTEM_NS, activator_deployment(3600), "ADDED")
        self.api.validators["services"] = self.webhook
        self.api.mutators["services"] = self.default_template
        self.api.on_create["services"] = self.created
        self.api.on_delete["services"] = self.deleted
        self.api.run(self._start_gateway())
        self.api.run(self._start_activator())
        return self

    # -- the webhook -----------------------------------------------------------------------------------

    def webhook(self, body: Obj, field_validation: str) -> tuple[int, str] | None:
        """None, or (status, message) as the API server would answer the create; defaults ``body`` in place
        (the mutating webhook runs first)."""
        name = body.get("metadata", {}).get("name", "")
        if isinstance(body.get("spec", {}).get("template", {}).get("spec"), dict):
            self.default_template(body)
        problems = validate(body, self.schema)
        unknown = [p for p in problems if "unknown field" in p]
        if unknown and field_validation == "Strict":
            return 400, 'Service in version "v1" cannot be handled as a Service: strict decoding error: ' + \
                ", ".join(p.split(": ", 1)[1] for p in unknown)
        if rest := [p for p in problems if "unknown field" not in p]:
            return 422, f'Service.serving.knative.dev "{name}" is invalid: ' + "; ".join(rest)
        denied = self._knative_checks(body)
        if denied:
            return 422, ('admission webhook "validation.webhook.serving.knative.dev" denied the request: '
                         "validation failed: " + "; ".join(denied))
        return None

    def default_template(self, body: Obj) -> None:
        """The mutating webhook, on a create and on every update: the template is defaulted with today's defaults."""
        template = body.get("spec", {}).get("template", {})
        template.setdefault("metadata", {}).setdefault("annotations", {}).update(self.new_template_defaults)
        if isinstance(template.get("spec"), dict):
            apply_defaults(template["spec"], self.config.get("config-defaults", {}))
            secure_defaults(template["spec"], self.config.get("config-features", {}))

    def _knative_checks(self, body: Obj) -> list[str]:
        template = body["spec"]["template"]
        spec, notes = template["spec"], template.get("metadata", {}).get("annotations", {})
        features = self.config.get("config-features", {})
        # PodSpecMask: a feature's field passes unless its flag is disabled (Knative's default for these).
        flags = {"initContainers": "kubernetes.podspec-init-containers",
                 "runtimeClassName": "kubernetes.podspec-runtimeclassname"}
        denied = [f"must not set the field(s): spec.template.spec.{k}" for k, flag in flags.items()
                  if k in spec and not _flag_on(features, flag, default=False)]
        if any("emptyDir" in v for v in spec.get("volumes", [])) and \
                not _flag_on(features, "kubernetes.podspec-volumes-emptydir", default=True):
            denied.append("must not set the field(s): spec.template.spec.volumes[0].emptyDir")
        limit = int(self.config.get("config-defaults", {}).get("max-revision-timeout-seconds", "600"))
        if not 0 <= spec.get("timeoutSeconds", 300) <= limit:
            denied.append(f"expected 0 <= {spec['timeoutSeconds']} <= {limit}: spec.template.spec.timeoutSeconds")
        window = _seconds(notes.get("autoscaling.knative.dev/window", "60s"))
        if not 6 <= window <= 3600:
            denied.append(f"expected 6s <= {window}s <= 1h: autoscaling.knative.dev/window")
        return denied

    # -- the controller --------------------------------------------------------------------------------

    async def created(self, obj: Obj) -> None:
        """Make the revision and the pod; report Ready or the revision's failure."""
        name, ns = obj["metadata"]["name"], obj["metadata"]["namespace"]
        ks = self.services[name] = KService(obj=obj, revision=f"{name}-00001")
        self._status(ks, "Unknown", "Deploying", None)
        image = obj["spec"]["template"]["spec"]["containers"][0]["image"]
        resolved = "sha256:" + hashlib.sha256(image.encode()).hexdigest()  # what a registry would answer
        digest = image if "@" in image else f"{image.rsplit(':', 1)[0]}@{resolved}"
        revision = {"apiVersion": "serving.knative.dev/v1", "kind": "Revision",
                    "metadata": {"name": ks.revision, "namespace": ns, "generation": 1,
                                 "labels": {"serving.knative.dev/service": name}},
                    "status": {"observedGeneration": 1,
                               "containerStatuses": [{"name": "sandbox", "imageDigest": digest}]}}
        self.api.put("revisions", ns, revision, "ADDED")
        # The revision's Service and its DNS record exist from here (its endpoints: the activator, for now).
        await self.network.expose(self.revision_host(ks), functools.partial(self._endpoint_of, ks))
        if image in self.bad_images:
            return self._fail(ks, "ContainerMissing", f'Unable to fetch image "{image}": {self.bad_images[image]}')
        runtime_class = obj["spec"]["template"]["spec"].get("runtimeClassName")
        if runtime_class and runtime_class not in self.api.objects[("runtimeclasses", "")]:
            # The API server's RuntimeClass admission refuses the ReplicaSet's pods; the revision reports it.
            return self._fail(ks, "FailedCreate", f'pods "{ks.revision}-deployment-7c9d8b5f4-" is forbidden: '
                                                  f'pod rejected: RuntimeClass "{runtime_class}" not found')
        try:
            await self._start_pod(ks)
        except RuntimeError as exc:
            return self._fail(ks, "ExitCode1", str(exc))
        await self._start_proxy(ks)
        self._status(ks, "True", None, None)
        asyncio.get_running_loop().create_task(self._autoscale(ks))

    def _fail(self, ks: KService, reason: str, message: str) -> None:
        ns = ks.obj["metadata"]["namespace"]
        revision = dict(self.api.objects[("revisions", ns)][ks.revision])
        revision["status"] = {**revision["status"], "conditions": [
            {"type": "ContainerHealthy", "status": "False", "reason": reason, "message": message},
            {"type": "Ready", "status": "False", "reason": reason, "message": message}]}
        self.api.put("revisions", ns, revision)
        self._status(ks, "False", "RevisionFailed", f'Revision "{ks.revision}" failed with message: {message}.')

    def _status(self, ks: KService, ready: str, reason: str | None, message: str | None) -> None:
        name, ns = ks.obj["metadata"]["name"], ks.obj["metadata"]["namespace"]
        current = self.api.objects[("services", ns)].get(name)
        if current is None or ks.deleted:
            return
        cond = {"type": "Ready", "status": ready, **({"reason": reason} if reason else {}),
                **({"message": message} if message else {})}
        status: Obj = {"observedGeneration": 1, "conditions": [cond], "latestCreatedRevisionName": ks.revision,
                       "url": f"http://{name}.{ns}.svc.cluster.local"}
        if ready == "True":
            status.update(latestReadyRevisionName=ks.revision, address={"url": ks.address},
                          traffic=[{"revisionName": ks.revision, "latestRevision": True, "percent": 100}])
        self.api.put("services", ns, {**current, "status": status})

    async def deleted(self, obj: Obj) -> None:
        """Terminate the pod (it snapshots), stop the activator, drop the revision and its endpoints."""
        ks = self.services.get(obj["metadata"]["name"])
        if ks is None:
            return
        ks.deleted = True
        await self._stop_pod(ks)
        if ks.proxy is not None:
            await ks.proxy.cleanup()
        await self.network.withdraw(self.revision_host(ks))
        self.services.pop(obj["metadata"]["name"], None)
        ns = obj["metadata"]["namespace"]
        self.api.remove("revisions", ns, ks.revision)
        self.api.remove("endpointslices", ns, f"{ks.revision}-private-x7k2p")

    # -- pods ------------------------------------------------------------------------------------------

    async def _start_pod(self, ks: KService) -> None:
        await asyncio.sleep(self.pull_s)
        container = ks.obj["spec"]["template"]["spec"]["containers"][0]
        ns = ks.obj["metadata"]["namespace"]
        root = tempfile.mkdtemp(prefix="pod-", dir=self.scratch)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GROVE_EXECUTOR_ROOT": root, "PORT": "8080",
               "K_SERVICE": ks.obj["metadata"]["name"], "K_REVISION": ks.revision}
        for item in container.get("env", []):
            if "value" in item:
                env[item["name"]] = item["value"]
                continue
            ref = item["valueFrom"]["secretKeyRef"]
            secret = self.api.objects[("secrets", ns)].get(ref["name"])
            value = (secret or {}).get("data", {}).get(ref["key"])
            if value is None and not ref.get("optional"):
                raise RuntimeError(f'CreateContainerConfigError: secret "{ref["name"]}" not found')
            if value is not None:
                env[item["name"]] = base64.b64decode(value).decode()
        if (container.get("securityContext") or {}).get("runAsNonRoot"):  # every test image's user is root
            raise RuntimeError("CreateContainerConfigError: container has runAsNonRoot and image will run as root "
                               f"(pod: \"{ks.revision}-deployment-7c9d8b5f4-x2x9z_{ns}\", container: sandbox)")
        # The pod's executor serves on a socket bound here (gunicorn's fd://): a port picked here and bound by the
        # child a moment later could be taken in between by another test's process.
        listener = loopback_listener()
        port = listener.getsockname()[1]
        argv = [a.replace(DEFAULT_MOUNT_POINT, str(self.bundle.path), 1) if a.startswith(DEFAULT_MOUNT_POINT)
                else a.replace("0.0.0.0:8080", f"fd://{listener.fileno()}") for a in container["command"]]
        env["TMPDIR"] = os.path.join(root, "tmp")  # the container's /tmp is on its writable layer
        os.makedirs(env["TMPDIR"])
        log = open(os.path.join(root, ".pod.log"), "wb")  # noqa: SIM115 - the child owns it
        with listener:  # the child keeps its own copy
            proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                    start_new_session=True, pass_fds=(listener.fileno(),))
        log.close()
        self.procs.add(proc)
        ks.pod, ks.starts, ks.last = Pod(proc, port, root), ks.starts + 1, time.monotonic()
        limit = _bytes(container.get("resources", {}).get("limits", {}).get("ephemeral-storage", "0"))
        if limit:
            asyncio.get_running_loop().create_task(self._kubelet_storage(ks, ks.pod, limit))
        if not await self._ready(ks.pod, container.get("readinessProbe") or {}):
            tail = Path(root, ".pod.log").read_bytes()[-600:].decode(errors="replace")
            await self._stop_pod(ks)
            raise RuntimeError(f"Container failed with: {tail.strip()}")
        await self._start_queue_proxy(ks, ks.pod)
        self._endpoints(ks)

    async def _ready(self, pod: Pod, probe: Obj, timeout: float = 30.0) -> bool:
        """The readiness probe as queue-proxy runs it (``pkg/queue/readiness/probe.go``): with
        ``periodSeconds: 0`` every 50 ms until it passes; otherwise once per kubelet period."""
        session = self._client()
        pod.probe_interval = probe_interval(probe)
        path = probe.get("httpGet", {}).get("path", "/")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and pod.proc.poll() is None:
            pod.probes += 1
            with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                async with session.get(f"http://127.0.0.1:{pod.port}{path}",
                                       timeout=aiohttp.ClientTimeout(total=probe_timeout(probe))) as resp:
                    if 200 <= resp.status < 400:
                        return True
            await asyncio.sleep(pod.probe_interval)
        return False

    async def _stop_pod(self, ks: KService, grace: float = 30.0) -> None:
        pod, ks.pod = ks.pod, None
        if pod is None:
            return
        pod.serving = False
        self._endpoints(ks)
        if pod.queue is not None:
            await pod.queue.cleanup()
        with contextlib.suppress(ProcessLookupError):
            pod.proc.send_signal(signal.SIGTERM if grace else signal.SIGKILL)  # SIGTERM: it snapshots
        try:
            await asyncio.to_thread(pod.proc.wait, grace or None)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pod.proc.pid, signal.SIGKILL)
            await asyncio.to_thread(pod.proc.wait)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pod.proc.pid, signal.SIGKILL)  # whatever commands it left
        self.procs.discard(pod.proc)
        shutil.rmtree(pod.root, ignore_errors=True)  # the container's filesystem goes with it

    async def _kubelet_storage(self, ks: KService, pod: Pod, limit: int) -> None:
        """The kubelet's ephemeral-storage eviction: a pod whose writable layer (here: its root, /tmp
        included) outgrows the limit is evicted, with a 1 s grace, terminating or not."""
        while pod.proc.poll() is None:
            await asyncio.sleep(0.1)
            if await asyncio.to_thread(_disk_usage, pod.root, pod.proc.pid) <= limit:
                continue
            self.evictions += 1
            pod.serving = False
            if ks.pod is pod:
                ks.pod = None
                self._endpoints(ks)
            if pod.queue is not None:
                await pod.queue.cleanup()
            with contextlib.suppress(ProcessLookupError):
                pod.proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(1.0)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pod.proc.pid, signal.SIGKILL)
            return

    def _endpoints(self, ks: KService) -> None:
        """Publish the revision's private EndpointSlice; a removal after ``slice_lag_s`` (as it is then)."""
        if self.slice_lag_s and not (ks.pod and ks.pod.serving):
            async def later() -> None:
                await asyncio.sleep(self.slice_lag_s)
                self._publish_endpoints(ks)
            asyncio.get_running_loop().create_task(later())
            return
        self._publish_endpoints(ks)

    def _publish_endpoints(self, ks: KService) -> None:
        ns = ks.obj["metadata"]["namespace"]
        ready = [{"addresses": [ks.pod.address], "conditions": {"ready": True}}] if ks.pod and ks.pod.serving else []
        self.api.put("endpointslices", ns, {
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
            "metadata": {"name": f"{ks.revision}-private-x7k2p", "namespace": ns, "labels": {
                "kubernetes.io/service-name": f"{ks.revision}-private", "serving.knative.dev/revision": ks.revision,
                "networking.internal.knative.dev/serviceType": "Private"}},
            "endpoints": ready, "ports": [{"name": n, "port": p, "protocol": "TCP"} for n, p in _QUEUE_PORTS],
        })

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            # A connection per request: a hop never reuses one to a pod that has gone since (the race of a
            # pooled connection with a pod's shutdown is the caller's to meet, not the stand-in's own).
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True),
                                                  timeout=aiohttp.ClientTimeout(total=None))
        return self._session

    def scale_to_zero(self, name: str) -> None:
        """What the autoscaler does after the idle window, now (from the test's thread)."""
        self.api.run(self._stop_pod(self.services[name]))

    async def restart(self, name: str) -> None:
        """The container restarts (a crash, a node's eviction): a new pod reads its Secret again."""
        ks = self.services[name]
        await self._stop_pod(ks)
        await self._wake(ks)

    def pods(self) -> list[Pod]:
        """Running pods."""
        return [ks.pod for ks in self.services.values() if ks.pod is not None]

    def close(self) -> None:
        """Kill every pod and activator (cleanup at the end of a test)."""
        async def down() -> None:
            for ks in list(self.services.values()):
                ks.deleted = True
                await self._stop_pod(ks, grace=0)
                if ks.proxy is not None:
                    await ks.proxy.cleanup()
            await self.network.close()
            for runner in (self._gateway, self._activator):
                if runner is not None:
                    await runner.cleanup()
            if self._session is not None:
                await self._session.close()
        self.api.run(down())
        for proc in list(self.procs):  # pods whose termination was still under way
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        self.procs.clear()

    # -- the data path: Service network, activator, queue-proxy ----------------------------------------

    @staticmethod
    def revision_host(ks: KService) -> str:
        """The DNS name of a revision's Service (what ``revision`` endpoint mode dials)."""
        return f"{ks.revision}.{ks.obj['metadata']['namespace']}.svc.{CLUSTER_DOMAIN}"

    def _endpoint_of(self, ks: KService) -> tuple[str, int]:
        """Where a new connection to the revision's ClusterIP goes: its ready pod's queue-proxy; with none,
        the activator (the serverless service's proxy mode; ``target-burst-capacity: 0`` takes the activator
        out of the path as soon as a pod is ready)."""
        pod = ks.pod
        return (pod.address, QUEUE_PORT) if pod is not None and pod.serving else (self.activator, QUEUE_PORT)

    def _cut(self) -> None:
        self.timeouts += 1

    def _upgrades(self, hop: str) -> Callable[[], None]:
        """What counts an upgrade request ``hop`` passed on its upgrade path, as ``hops[f"{hop}-upgrade"]``."""
        def count() -> None:
            self.hops[f"{hop}-upgrade"] += 1
        return count

    async def _activate(self, request: web.Request) -> web.StreamResponse:
        """The activator (``pkg/activator/handler``): the revision from Knative's revision headers, else from a
        Host ``<revision>.<namespace>.svc.<cluster domain>[:port]`` (``context_handler.go``); then hold the
        request while the revision scales from zero and proxy it to the pod's queue-proxy, the revision
        headers pruned, under the revision's timeouts from the request's arrival."""
        self.hops["activator"] += 1
        name = request.headers.get("Knative-Serving-Revision", "")
        ns = request.headers.get("Knative-Serving-Namespace", "")
        if not name or not ns:
            parts = request.host.split(".", 3)
            if len(parts) == 4 and parts[2] == "svc" and parts[3].split(":", 1)[0] == CLUSTER_DOMAIN:
                name, ns = parts[0], parts[1]
        ks = next((k for k in self.services.values()
                   if k.revision == name and k.obj["metadata"]["namespace"] == ns and not k.deleted), None)
        if ks is None:
            missing = f'revision.serving.knative.dev "{name}" not found'
            return web.Response(status=404, text=f"Error getting active endpoint: {missing}\n")
        ks.inflight += 1  # the activator reports the waiting request: the autoscaler scales up for it
        try:
            woken = asyncio.ensure_future(self._wake(ks))
            woken.add_done_callback(lambda t: t.cancelled() or t.exception())  # a pod that failed: reported by the wait

            def target() -> str:
                if ks.pod is None:
                    raise RuntimeError(f"revision {ks.revision} has no pod")
                return f"http://{ks.pod.address}:{QUEUE_PORT}"
            return await timed_proxy(self._client(), request, target, ks.obj["spec"]["template"]["spec"],
                                     "activator request timeout", self._cut, before=asyncio.shield(woken),
                                     drop=_REVISION_HEADERS, on_upgrade=self._upgrades("activator"))
        finally:
            ks.inflight -= 1
            ks.last = time.monotonic()

    async def _wake(self, ks: KService) -> None:
        """Scale from zero (whether or not the request that asked still waits)."""
        async with ks.lock:
            if ks.pod is None and not ks.deleted:
                await self._start_pod(ks)

    async def _route(self, request: web.Request) -> web.StreamResponse:
        """``gateway``: the Service network for an in-process client, which cannot use the hosts file: the
        request goes on to the ClusterIP its Host names, and from there where a connection would."""
        ip = self.network.ip_of(request.host.split(":")[0])
        if ip is None:
            return web.Response(status=502, text=f"no Service answers to Host {request.host}")
        return await relay(self._client(), request, f"http://{ip}")

    async def _serve(self, runner: web.AppRunner, address: str, port: int) -> None:
        await runner.setup()
        await web.TCPSite(runner, address, port).start()

    def _app(self, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.AppRunner:
        app = web.Application(client_max_size=1 << 34)
        app.router.add_route("*", "/{tail:.*}", handler)
        return web.AppRunner(app, access_log=None, shutdown_timeout=1.0)

    async def _start_gateway(self) -> None:
        self._gateway = self._app(self._route)
        await self._serve(self._gateway, "127.0.0.1", 0)
        self.gateway = f"http://127.0.0.1:{self._gateway.addresses[0][1]}"

    async def _start_activator(self) -> None:
        self._activator = self._app(self._activate)
        await self._activator.setup()

        async def listen(address: str) -> None:
            assert self._activator is not None
            await web.TCPSite(self._activator, address, QUEUE_PORT).start()
        self.activator, _ = await on_own_address(listen)

    async def _start_queue_proxy(self, ks: KService, pod: Pod) -> None:
        """queue-proxy on the pod's own address and Knative's port 8012, as its EndpointSlice lists it."""
        async def serve(request: web.Request) -> web.StreamResponse:
            self.hops["queue-proxy"] += 1
            ks.inflight += 1  # queue-proxy reports its concurrency to the autoscaler
            try:
                return await timed_proxy(self._client(), request, lambda: f"http://127.0.0.1:{pod.port}",
                                         ks.obj["spec"]["template"]["spec"], "request timeout", self._cut,
                                         on_upgrade=self._upgrades("queue-proxy"))
            finally:
                ks.inflight -= 1
                ks.last = time.monotonic()

        pod.queue = self._app(serve)
        await pod.queue.setup()

        async def listen(address: str) -> None:
            assert pod.queue is not None
            await web.TCPSite(pod.queue, address, QUEUE_PORT).start()
        pod.address, _ = await on_own_address(listen)
        pod.serving = True

    async def _start_proxy(self, ks: KService) -> None:
        """The cluster-local gateway's route for this Service (``status.address.url``): on to the revision's
        ClusterIP with the revision headers an ingress adds, the Host left as the client sent it."""
        ns = ks.obj["metadata"]["namespace"]

        async def forward(request: web.Request) -> web.StreamResponse:
            self.hops["gateway"] += 1
            ip = self.network.ip_of(self.revision_host(ks))
            return await relay(self._client(), request, f"http://{ip}",
                               {"Knative-Serving-Revision": ks.revision, "Knative-Serving-Namespace": ns})

        ks.proxy = self._app(forward)
        await self._serve(ks.proxy, "127.0.0.1", 0)
        ks.address = f"http://127.0.0.1:{ks.proxy.addresses[0][1]}"

    async def _autoscale(self, ks: KService) -> None:
        notes = ks.obj["spec"]["template"]["metadata"]["annotations"]
        idle = (_seconds(notes.get("autoscaling.knative.dev/window", "60s"))
                + _seconds(notes.get("autoscaling.knative.dev/scale-to-zero-pod-retention-period", "0s")))
        while not ks.deleted:
            await asyncio.sleep(0.1)
            if ks.pod and not ks.inflight and time.monotonic() - ks.last > idle * self.time_scale:
                async with ks.lock:
                    await self._stop_pod(ks)


def probe_interval(probe: Obj) -> float:
    """Seconds between readiness probes: queue-proxy's aggressive 50 ms when ``periodSeconds`` is 0 (or unset,
    Knative's default), else the kubelet's period, during which a pod that is up waits unseen."""
    period = float(probe.get("periodSeconds") or 0)
    return 0.05 if period == 0 else period


def probe_timeout(probe: Obj) -> float:
    """One probe's timeout: 100 ms when aggressive, else ``timeoutSeconds`` (1 by default)."""
    return 0.1 if not probe.get("periodSeconds") else float(probe.get("timeoutSeconds") or 1)


def apply_defaults(spec: Obj, defaults: dict[str, str]) -> None:
    """Knative's defaulting of a revision's timeouts (``pkg/apis/serving/v1/revision_defaults.go``, config
    from ``pkg/apis/config/defaults.go``): ``timeoutSeconds`` from ``revision-timeout-seconds`` (300); the
    response-start timeout from ``revision-response-start-timeout-seconds`` (default: the revision timeout
    default, i.e. 300) and the idle timeout from ``revision-idle-timeout-seconds`` (0), each only when
    unset, non-zero and below the revision's timeout."""
    revision = int(defaults.get("revision-timeout-seconds", "300"))
    if not spec.get("timeoutSeconds"):
        spec["timeoutSeconds"] = revision
    start = int(defaults.get("revision-response-start-timeout-seconds", str(revision)))
    if "responseStartTimeoutSeconds" not in spec and 0 < start < spec["timeoutSeconds"]:
        spec["responseStartTimeoutSeconds"] = start
    idle = int(defaults.get("revision-idle-timeout-seconds", "0"))
    if "idleTimeoutSeconds" not in spec and 0 < idle < spec["timeoutSeconds"]:
        spec["idleTimeoutSeconds"] = idle


def secure_defaults(spec: Obj, features: dict[str, str]) -> None:
    """Knative's ``secure-pod-defaults: enabled`` (``revision_defaults.go``): each container's ``runAsNonRoot``
    becomes true where neither it nor the pod says otherwise (the other defaults it adds are beside the point)."""
    if features.get("secure-pod-defaults", "").lower() != "enabled":
        return
    if "runAsNonRoot" in (spec.get("securityContext") or {}):
        return
    for container in spec.get("containers", []):
        container.setdefault("securityContext", {}).setdefault("runAsNonRoot", True)


def activator_deployment(grace_s: int) -> Obj:
    """Knative's activator Deployment as the API holds it (what grove reads of it: the grace period)."""
    labels = {"app": "activator"}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "activator", "namespace": SYSTEM_NS},
            "spec": {"selector": {"matchLabels": labels}, "template": {
                "metadata": {"labels": labels},
                "spec": {"terminationGracePeriodSeconds": grace_s,
                         "containers": [{"name": "activator", "image": "gcr.io/knative-releases/activator"}]}}}}


def _bytes(quantity: str) -> int:
    """A Kubernetes quantity in bytes (the binary suffixes grove writes, or plain bytes)."""
    for suffix, factor in (("Ki", 1 << 10), ("Mi", 1 << 20), ("Gi", 1 << 30)):
        if quantity.endswith(suffix):
            return int(float(quantity[:-2]) * factor)
    return int(float(quantity or 0))


def _disk_usage(root: str, session: int) -> int:
    """Bytes allocated under ``root``, with files deleted but still open by the pod's processes (those of
    the executor's session): a filesystem quota on the writable layer counts them, as it would a
    spooled temporary file."""
    total = 0
    for top, _, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(top, name)).st_blocks * 512
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/stat", "rb") as fh:
                raw = fh.read()
            if int(raw[raw.rfind(b")") + 2:].split()[3]) != session:
                continue
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if target.startswith(root + "/") and target.endswith(" (deleted)"):
                        total += os.stat(f"/proc/{pid}/fd/{fd}").st_blocks * 512
    return total


def _seconds(duration: str) -> float:
    return float(duration.rstrip("s")) if duration.endswith("s") and not duration.endswith("ms") else 0.0


def _flag_on(features: dict[str, str], flag: str, *, default: bool) -> bool:
    """Knative's ``asFlag``: ``enabled``, ``allowed`` or ``disabled`` in any case; anything else keeps the default."""
    value = features.get(flag, "").lower()
    return value in ("enabled", "allowed") if value in ("enabled", "allowed", "disabled") else default
