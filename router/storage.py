"""Object storage for the router: the configured S3 server, or an embedded one on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import signal
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from artifacts import retention, s3proc
from artifacts.archive import TrajectoryArchive
from artifacts.artifact_index import ArtifactIndex
from artifacts.retention import Retention
from artifacts.s3config import S3Config
from artifacts.s3server import EmbeddedS3
from artifacts.store import ObjectStore, ScopedStore
from grove.core.errors import Conflict, GroveError, Unavailable
from router.projects.model import DEFAULT, object_prefix
from router.settings import RouterSettings

log = logging.getLogger("grove.router")
_RETENTION_RETRY_S = 10.0


@dataclass(frozen=True)
class Storage:
    """The router's object storage, open: the bucket, its trajectory archive and its artifact index, as the
    default project sees them (:meth:`of` gives another project's part)."""

    objects: ObjectStore
    trajectories: TrajectoryArchive
    artifacts: ArtifactIndex
    spool_root: Path | None = None
    """The default project's spool; another project's is ``<spool_root>/projects/<name>``."""
    _views: dict[str, Storage] = field(default_factory=dict, repr=False, compare=False)

    def of(self, project: str) -> Storage:
        """What ``project`` keeps: its own part of the bucket (``projects/<name>/``, the default project's at the
        top), its own spool. Nothing reached through it is another project's."""
        if project == DEFAULT:
            return self
        view = self._views.get(project)
        if view is None:
            objects = ScopedStore(self.objects, object_prefix(project))
            spool = (self.spool_root or Path(tempfile.gettempdir())) / "projects" / project
            view = Storage(objects, TrajectoryArchive(objects, spool), ArtifactIndex(objects), None)
            self._views[project] = view
        return view

    def spooled_projects(self) -> list[str]:
        """Projects other than the default with a spool folder (whose records may wait for S3)."""
        if self.spool_root is None or not (self.spool_root / "projects").is_dir():
            return []
        return sorted(p.name for p in (self.spool_root / "projects").iterdir() if p.is_dir())


@contextlib.asynccontextmanager
async def open_storage(settings: RouterSettings) -> AsyncIterator[Storage]:
    """Yield the object store and trajectory archive; an embedded server lives exactly as long."""
    embedded: EmbeddedS3 | None = None
    config = settings.s3
    owner: int | None = None
    if config is None:
        embedded = EmbeddedS3(settings.layout.s3)
        owner = _own(embedded.data_dir)
        try:
            await asyncio.to_thread(_stop_leftover, embedded.data_dir)
            await asyncio.to_thread(embedded.start)
        except BaseException:
            os.close(owner)
            raise
        config = S3Config(endpoint=embedded.endpoint, access_key=embedded.access_key, secret_key=embedded.secret_key)
        log.info("embedded S3 server on %s (data in %s)", config.endpoint, embedded.data_dir)
    store = ObjectStore(config)
    archive = TrajectoryArchive(store, settings.layout.spool)
    wanted = Retention(settings.artifact_retention_days, settings.trajectory_retention_days)
    keeper = None
    try:
        if wanted.wanted() and not await _set_retention(store, wanted):
            keeper = asyncio.create_task(_keep_trying(store, wanted))
        yield Storage(store, archive, ArtifactIndex(store), settings.layout.spool)
    finally:
        if keeper is not None:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper
        # Whatever is still spooled stays on disk and goes up after the next start.
        with contextlib.suppress(Exception):
            await asyncio.to_thread(archive.flush_spool)
        store.close()
        if embedded is not None:
            await asyncio.to_thread(embedded.stop)
        if owner is not None:
            os.close(owner)


async def _set_retention(store: ObjectStore, wanted: Retention) -> bool:
    """Set the lifecycle rules of the retention settings; False if S3 could not be reached (try later)."""
    try:
        changed = await asyncio.to_thread(retention.apply, store, wanted)
    except Unavailable as exc:
        log.warning("could not set the retention rules yet (retrying in %.0fs): %s", _RETENTION_RETRY_S, exc.message)
        return False
    except GroveError as exc:  # refused for good (e.g. a server without lifecycle support): say so loudly
        log.error("S3 refused the retention rules (%s): %s; nothing expires", wanted, exc.message)
        return True
    log.info("retention rules %s: %s", "set" if changed else "already in place", wanted)
    return True


async def _keep_trying(store: ObjectStore, wanted: Retention) -> None:
    """The router serves (and spools) while S3 is down; the rules go in once it answers."""
    while True:
        await asyncio.sleep(_RETENTION_RETRY_S)
        if await _set_retention(store, wanted):
            return


def _own(data_dir: Path) -> int:
    """Lock the embedded server's data dir for this router's life (the kernel drops the lock when the
    router dies, however it dies); Conflict if another live router holds it."""
    data_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(data_dir / "grove-owner.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise Conflict(f"another grove router is using {data_dir.parent}; stop it first") from None
    return fd


def _stop_leftover(data_dir: Path) -> None:
    """Stop a weed left serving ``data_dir`` by a router that was killed (holding the lock, it is no one else's)."""
    pid = s3proc.live_weed_pid(data_dir)
    if pid is None:
        return
    log.warning("stopping the embedded S3 server (PID %d) a killed router left running", pid)
    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while s3proc.live_weed_pid(data_dir) == pid and time.monotonic() < deadline:
            time.sleep(0.05)
        if s3proc.live_weed_pid(data_dir) != pid:
            return
