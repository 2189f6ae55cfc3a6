"""The Knative backend's watch side at 5,000 Services, against the stand-in API server (issue 37, item 7).

``python -m perf.knative_scale [--services 5000] [--namespaces 3]`` puts that many Knative Services into
the test suite's stand-in API server — built by grove's own manifest code, with the Ready status Knative
gives them, and no pods (they are at zero) — spread over the namespaces, then opens
:class:`router.backends.knative.backend.KnativeBackend` on them with the real ``kubernetes`` client and
measures: the list at start (pages, seconds, requirement checks included), the memory the watch caches
hold per Service (the cached objects' deep size), a watch the server ends (an API server restart): how soon a new
Service is seen again and whether anything was listed again, and every call it made. Writes
``perf/results/knative_scale.json`` (quoted by ``perf/SCALING.md``).

This measures grove's side only. Knative's own controllers, autoscaler and activator hold state per
revision too; that is theirs to report (``perf/SCALING.md`` cites it).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import importlib
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from perf.common import machine, utc_now, write_results
from perf.knative_calls import Cluster, sandbox_spec
from router.backends.knative import manifest
from router.backends.knative.backend import KnativeBackend
from router.backends.knative.options import KnativeOptions
from sandbox_image.bundle import build_bundle


def _ready(service: dict[str, Any]) -> dict[str, Any]:
    """``service`` as Knative leaves it once its first revision is ready."""
    name, ns = service["metadata"]["name"], service["metadata"]["namespace"]
    revision = f"{name}-00001"
    return {**service, "metadata": {**service["metadata"], "generation": 1},
            "status": {"observedGeneration": 1, "conditions": [{"type": "Ready", "status": "True"}],
                       "latestCreatedRevisionName": revision, "latestReadyRevisionName": revision,
                       "address": {"url": f"http://{name}.{ns}.svc.cluster.local"}}}


def _service(options: KnativeOptions, ns: str) -> dict[str, Any]:
    spec = sandbox_spec("deny")
    return _ready(manifest.build(spec, options, namespace=ns, image=spec.image).service)


async def measure(cluster: Cluster, options: KnativeOptions) -> dict[str, Any]:
    """Open a backend on the filled cluster, drop its watches, and report what it took (see the module)."""
    calls0, pages0 = collections.Counter(cluster.api.calls), cluster.api.pages
    backend = KnativeBackend(options)
    began = time.perf_counter()
    await backend.open()
    list_s = time.perf_counter() - began
    cached = _deep_size([w.objects for w in backend._services.values()])
    seen = sum(len(w.objects) for w in backend._services.values())
    try:
        relists = sum(w.relists for w in backend._services.values())
        cluster.api.drop_watches()  # as an API server restart ends them
        ns = options.spread[0]
        fresh = _service(options, ns)
        began = time.perf_counter()
        await asyncio.sleep(0)
        cluster.api.run(_put(cluster, ns, fresh))
        name = fresh["metadata"]["name"]
        await backend._services[ns].wait_for(name, lambda obj: obj, 60.0)
        reseen_s = time.perf_counter() - began
        relisted = sum(w.relists for w in backend._services.values()) - relists
        cluster.api.run(_remove(cluster, ns, name))
    finally:
        await backend.close()
    made = collections.Counter(cluster.api.calls)
    made.subtract(calls0)
    calls = {f"{verb} {plural}": n for (_, verb, plural), n in made.items() if n > 0}
    return {"services_seen": seen, "list_pages": cluster.api.pages - pages0, "list_s": round(list_s, 2),
            "cache_bytes_per_service": round(cached / max(seen, 1)), "cache_mib": round(cached / 2**20, 1),
            "after_watches_dropped": {"new_service_seen_s": round(reseen_s, 2), "relists": relisted},
            "calls": dict(sorted(calls.items()))}


def _deep_size(value: object, seen: set[int] | None = None) -> int:
    """Bytes of ``value`` and everything it holds (each object once)."""
    seen = set() if seen is None else seen
    if id(value) in seen:
        return 0
    seen.add(id(value))
    size = sys.getsizeof(value)
    if isinstance(value, dict):
        size += sum(_deep_size(k, seen) + _deep_size(v, seen) for k, v in value.items())
    elif isinstance(value, list | tuple | set):
        size += sum(_deep_size(item, seen) for item in value)
    return size


async def _put(cluster: Cluster, ns: str, obj: dict[str, Any]) -> None:
    cluster.api.put("services", ns, obj, "ADDED")


async def _remove(cluster: Cluster, ns: str, name: str) -> None:
    cluster.api.remove("services", ns, name)


def fill(cluster: Cluster, options: KnativeOptions, n: int) -> None:
    """``n`` ready Services of this router in the stand-in, round-robin over its namespaces."""
    async def put_all() -> None:
        for i in range(n):
            ns = options.spread[i % len(options.spread)]
            cluster.api.put("services", ns, _service(options, ns), "ADDED")

    cluster.api.run(put_all())


def clear(cluster: Cluster, options: KnativeOptions) -> None:
    """Remove every Service from the router's namespaces."""
    async def remove_all() -> None:
        for ns in options.spread:
            for name in list(cluster.api.objects[("services", ns)]):
                cluster.api.remove("services", ns, name)

    cluster.api.run(remove_all())


def main(argv: list[str] | None = None) -> None:
    """Fill, measure, print, write the JSON."""
    parser = argparse.ArgumentParser(prog="python -m perf.knative_scale", description=__doc__)
    parser.add_argument("--services", type=int, default=5000, help="Knative Services in the API (default 5000)")
    parser.add_argument("--namespaces", type=int, default=3, help="namespaces they are spread over (default 3)")
    args = parser.parse_args(argv)
    fixtures = importlib.import_module("tests.support.knative_fixtures")
    spread = tuple([fixtures.NAMESPACE] + [f"{fixtures.NAMESPACE}-{i}" for i in range(2, args.namespaces + 1)])
    with tempfile.TemporaryDirectory(prefix="gks-") as scratch:
        bundle = build_bundle(Path(scratch) / "runtime")
        with fixtures.stand_in_cluster(bundle) as cluster:
            cluster.api.allowed |= {(verb, res, ns) for verb, res in fixtures.role_rules() for ns in spread}
            options = cluster.options(namespaces=spread)
            fill(cluster, options, args.services)
            try:
                measured = asyncio.run(measure(cluster, options))
            finally:
                clear(cluster, options)
    report = {"benchmark": "Knative backend's watches over many Services, stand-in API server", "date": utc_now(),
              "machine": machine(), "services": args.services, "namespaces": len(spread),
              "page_size": KnativeOptions.list_page_size, **measured}
    write_results("knative_scale", report)
    for key, value in measured.items():
        print(f"{key}: {value}")


if __name__ == "__main__":
    main()
