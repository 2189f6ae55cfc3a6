"""Heartbeats as traffic, for backends whose sandboxes stay up only while requests reach them.

Knative's autoscaler scales a revision to zero after its window without requests; it never sees the
router's records. A client that only heartbeats (a long think between commands) would lose its pod and
its background processes although the router promises "no API call and no heartbeat this long: scale to
zero". So each heartbeat of a ready sandbox on such a backend also makes one small request through the
sandbox's endpoint (the activator or queue-proxy counts it), at most one at a time per sandbox.
"""

from __future__ import annotations

import logging

import aiohttp

from grove.core.errors import BadGateway
from router.lifecycle.service import SandboxService
from router.records.registry import SandboxRecord

log = logging.getLogger("grove.router")
_TIMEOUT_S = 10.0


def keep_warm(service: SandboxService, record: SandboxRecord) -> None:
    """After a heartbeat: if only traffic keeps this sandbox up, send some (in the background)."""
    if not service.backend.warm_by_traffic or record.status != "ready" or record.id in service.warming:
        return
    endpoint = record.endpoint()
    if endpoint is None:
        return
    service.warming.add(record.id)

    async def ping() -> None:
        try:
            async with service.upstreams.call(endpoint, "GET", "/healthz", timeout_s=_TIMEOUT_S) as resp:
                await resp.read()
        except (BadGateway, TimeoutError, aiohttp.ClientError) as exc:  # the next call finds out what is wrong
            log.info("keep-warm request to %s failed: %s", record.id, exc)
        finally:
            service.warming.discard(record.id)

    service.background(ping(), f"keep-warm of {record.id}")
