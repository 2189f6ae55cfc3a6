"""The Kubernetes API as the Knative backend uses it: one client, retries, rate limits, grove's errors.

The official client is synchronous; its calls run on a small thread pool of their own (the default
executor is sized for CPUs, not for waiting on an API server). Every call goes through :meth:`Kube.call`,
which retries what is worth retrying (429, 5xx, a dropped connection) with exponential backoff and
jitter — honouring ``Retry-After`` — and turns whatever is left into a :class:`grove.core.errors.GroveError`
that says what happened: 409 → ``Conflict``, 403 → ``Forbidden`` with the RBAC fix, 422 → ``Invalid``
with the admission webhook's message.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import functools
import json
import logging
import os
import random
from collections.abc import Callable
from typing import Any

import urllib3
from kubernetes import client, config

from grove.core.errors import Conflict, Forbidden, GroveError, InternalError, Invalid, NotFound, Unavailable
from router.backends.knative.options import KnativeOptions
from router.backends.knative.ratelimit import TokenBucket

log = logging.getLogger("grove.knative")
_TRANSIENT = {429, 500, 502, 503, 504}
_MAX_BACKOFF_S = 10.0


def client_configuration(options: KnativeOptions) -> client.Configuration:
    """The client configuration: the kubeconfig named, else in-cluster, else the default kubeconfig."""
    cfg = client.Configuration()
    try:
        if options.kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        else:
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=options.kubeconfig, context=options.context, client_configuration=cfg,
                persist_config=False,
            )
    except (config.ConfigException, OSError, TypeError, KeyError) as exc:
        where = options.kubeconfig or "the in-cluster service account or ~/.kube/config"
        raise Invalid(f"cannot load Kubernetes credentials from {where}: {exc}") from exc
    cfg.retries = False  # retries are ours: counted, with backoff, and rate limited
    # TCP keep-alive with client-go's timings: a connection a NAT or load balancer dropped silently is found
    # dead in about two minutes instead of never.
    cfg.keep_alive = True
    cfg.connection_pool_maxsize = options.api_threads + 2  # +2: the informers' watch streams
    return cfg


class Kube:
    """The typed API objects, the thread pool, and the one place a call is made."""

    def __init__(self, options: KnativeOptions, cfg: client.Configuration) -> None:
        self.options = options
        self.api_client = client.ApiClient(cfg)
        self.custom = client.CustomObjectsApi(self.api_client)
        """serving.knative.dev Services and Revisions."""
        self.core = client.CoreV1Api(self.api_client)
        """Secrets, and Knative's ConfigMaps (read once, at start)."""
        self.networking = client.NetworkingV1Api(self.api_client)
        """NetworkPolicies."""
        self.discovery = client.DiscoveryV1Api(self.api_client)
        """EndpointSlices (pod endpoints)."""
        self.node = client.NodeV1Api(self.api_client)
        """RuntimeClasses (read once, at start)."""
        self.apps = client.AppsV1Api(self.api_client)
        """Knative's activator Deployment (read once, at start: its grace period)."""
        self.create_limit = TokenBucket(options.create_qps, options.create_burst)
        """Bounds create calls."""
        self.delete_limit = TokenBucket(options.delete_qps, options.delete_burst)
        """Bounds delete calls."""
        self.calls: collections.Counter[str] = collections.Counter()
        """Calls made, by ``verb resource`` (retries included)."""
        self._pool = concurrent.futures.ThreadPoolExecutor(options.api_threads, thread_name_prefix="grove-kube")

    async def call(
        self,
        verb: str,
        resource: str,
        name: str,
        fn: Callable[..., Any],
        *args: Any,
        limit: TokenBucket | None = None,
        namespace: str | None = None,
        **kwargs: Any,
    ) -> Any:
        """Run ``fn(*args, **kwargs)`` on the pool; retry transient failures; map the rest to grove's errors, which
        name ``namespace`` (None: the options' first sandbox namespace)."""
        loop = asyncio.get_running_loop()
        attempt = 0
        while True:
            if limit is not None:
                await limit.acquire()  # every attempt is a write the API server has to take
            self.calls[f"{verb} {resource}"] += 1
            try:
                # A call that hangs (a half-open connection) is cut and retried like a dropped one.
                kwargs.setdefault("_request_timeout", (5, self.options.api_timeout_s))
                return await loop.run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))
            except client.ApiException as exc:
                if exc.status in _TRANSIENT and attempt < self.options.retries:
                    delay = _retry_after(exc) or self._backoff(attempt)
                    log.info("%s %s %s: HTTP %s, retrying in %.2fs", verb, resource, name, exc.status, delay)
                    await asyncio.sleep(delay)
                    attempt += 1
                    continue
                raise api_error(exc, verb, resource, name, namespace or self.options.spread[0]) from exc
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                if attempt < self.options.retries:
                    await asyncio.sleep(self._backoff(attempt))
                    attempt += 1
                    continue
                raise Unavailable(
                    f"the Kubernetes API server is unreachable ({verb} {resource} {name}): {exc}", retry_after=5
                ) from exc

    def _backoff(self, attempt: int) -> float:
        base = min(_MAX_BACKOFF_S, self.options.backoff_s * float(2**attempt))
        return base * (0.5 + random.random() / 2)  # jitter: a burst of failures must not retry in lockstep

    def close(self) -> None:
        """Stop the pool and drop the client's connections."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.api_client.close()  # type: ignore[no-untyped-call]


def _retry_after(exc: client.ApiException) -> float | None:
    raw = (exc.headers or {}).get("Retry-After") if exc.headers else None
    try:
        return min(_MAX_BACKOFF_S, float(str(raw))) if raw else None
    except ValueError:
        return None


def status_message(exc: client.ApiException) -> str:
    """The ``message`` of the API server's Status body, or the reason when there is none."""
    try:
        body = json.loads(exc.body) if exc.body else {}
    except (TypeError, ValueError):
        body = {}
    message = body.get("message") if isinstance(body, dict) else None
    return str(message or exc.reason or f"HTTP {exc.status}")


def api_error(exc: client.ApiException, verb: str, resource: str, name: str, namespace: str) -> GroveError:
    """The grove error for a failed API call: it names the object and says what to do."""
    what = f"{verb} {resource} {name!r} in namespace {namespace!r}"
    message = status_message(exc)
    status = exc.status
    if status == 409:
        return Conflict(f"{what}: it already exists ({message})")
    if status == 403:
        return Forbidden(
            f"{what} was refused: {message}. The router's ServiceAccount needs the Role 'grove-router' of "
            f"knative/rbac.yaml in {namespace!r}; check with `kubectl auth can-i {verb} {resource} -n {namespace} "
            f"--as system:serviceaccount:<router namespace>:grove-router`"
        )
    if status == 401:
        return Forbidden(f"{what}: the API server did not accept the router's credentials ({message})")
    if status in (400, 422):
        return Invalid(f"{what} was rejected: {message}")
    if status == 404:
        return NotFound(f"{what}: not found ({message})")
    if status in _TRANSIENT:
        return Unavailable(f"{what}: the API server kept failing (HTTP {status}: {message})", retry_after=5)
    return InternalError(f"{what}: HTTP {status}: {message}")
