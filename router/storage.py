"""Object storage for the router: the configured S3 server, or an embedded one on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from artifacts.archive import TrajectoryArchive
from artifacts.s3config import S3Config
from artifacts.s3server import EmbeddedS3
from artifacts.store import ObjectStore
from router.settings import RouterSettings

log = logging.getLogger("grove.router")


@contextlib.asynccontextmanager
async def open_storage(settings: RouterSettings) -> AsyncIterator[tuple[ObjectStore, TrajectoryArchive]]:
    """Yield the object store and trajectory archive; an embedded server lives exactly as long."""
    embedded: EmbeddedS3 | None = None
    config = settings.s3
    if config is None:
        embedded = EmbeddedS3(settings.state_dir / "s3")
        await asyncio.to_thread(embedded.start)
        config = S3Config(endpoint=embedded.endpoint, access_key=embedded.access_key, secret_key=embedded.secret_key)
        log.info("embedded S3 server on %s (data in %s)", config.endpoint, embedded.data_dir)
    store = ObjectStore(config)
    archive = TrajectoryArchive(store, settings.state_dir / "spool")
    try:
        yield store, archive
    finally:
        # Whatever is still spooled stays on disk and goes up after the next start.
        with contextlib.suppress(Exception):
            await asyncio.to_thread(archive.flush_spool)
        store.close()
        if embedded is not None:
            await asyncio.to_thread(embedded.stop)
