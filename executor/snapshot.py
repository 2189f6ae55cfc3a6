"""Workspace snapshots: how a sandbox's files survive a pod that Knative scaled to zero.

The executor holds a presigned GET URL of its snapshot and an upload token (no S3 credentials). It
restores the workspace from the GET URL before it listens — so it answers nothing until the files are
back — and packs the workspace when gunicorn's arbiter exits (SIGTERM: the pod is going away) and, in
the worker, after ``idle_snapshot_s`` without a request if anything ran since the last one. A snapshot
is a multipart upload the router starts and completes (:mod:`artifacts.multipart`): the tar + zstd
stream goes out one part at a time, so it costs one part of memory and nothing on the pod's disk, and
the object changes only when the upload completes — a snapshot cut off leaves the last good one.

The GET URL comes fresh from the router at every start (the ``download`` op of the upload broker, with the
upload token): the one in the Secret was presigned when the sandbox was made and expires under a sandbox that
lives and sleeps long. The Secret's is the fallback when the router cannot be reached.

A restore that fails for any reason but "there is no snapshot yet" leaves the executor *unrestored*: it
serves its health check (so the pod does not crash-loop, and a later wake tries again) and answers every
other call with a 409 that says what happened, and it never snapshots — an executor that came up with an
empty workspace would overwrite the good snapshot with it.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from flask import Flask

from artifacts.multipart import HttpBroker, upload_multipart
from artifacts.presigned import download_via_presigned
from artifacts.snapshot import pack_directory, unpack_into
from executor.paths import PathResolver
from executor.settings import ExecutorSettings
from grove.core.errors import Conflict, GroveError, NotFound, Unavailable

log = logging.getLogger("grove.executor")
_RESTORE_ATTEMPTS = (0.0, 1.0, 2.0, 4.0)


class Snapshots:
    """Restore one directory from a presigned GET URL; snapshot it as multipart uploads the router brokers."""

    def __init__(self, settings: ExecutorSettings) -> None:
        self.broker = (HttpBroker(settings.snapshot_upload_url, settings.snapshot_upload_token or "")
                       if settings.snapshot_upload_url else None)
        self.get_url = settings.snapshot_get_url
        # Without an upload token the router would refuse to sign a GET URL: only the Secret's is there to use.
        self._asks_router = self.broker is not None and bool(settings.snapshot_upload_token)
        api = settings.snapshot_dir or settings.workdir
        self.directory = PathResolver(settings.root, settings.workdir).resolve(api)
        """The directory on this filesystem that is kept."""
        self.failure: str | None = None
        """Why the last snapshot could not be restored (None: it was, or there was none)."""
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        """Whether there is anywhere to put a snapshot."""
        return self.broker is not None

    def restore_or_hold(self) -> int | None:
        """:meth:`restore`; a failure is kept in :attr:`failure` (and logged) instead of ending the start."""
        try:
            return self.restore()
        except Exception as exc:
            why = exc.message if isinstance(exc, GroveError) else f"{type(exc).__name__}: {exc}"
            self.failure = f"the workspace snapshot could not be restored: {why}"
            log.error("%s; serving nothing but errors, and taking no snapshot over the good one", self.failure)
            return None

    def restore(self) -> int | None:
        """Unpack the last snapshot into the directory; member count, or None if there was none."""
        os.makedirs(self.directory, exist_ok=True)
        if not self.get_url and not self._asks_router:
            return None
        for attempt, delay in enumerate(_RESTORE_ATTEMPTS):
            time.sleep(delay)
            try:
                with download_via_presigned(self._url()) as body:
                    # Links that point outside (a venv's absolute python link) were the workspace's own.
                    count = unpack_into(body, self.directory, allow_outside_links=True)
            except NotFound:
                log.info("no snapshot yet; starting with the image's %s", self.directory)
                return None
            except Unavailable as exc:  # S3 unreachable for a moment; a bad archive is not retried
                if attempt == len(_RESTORE_ATTEMPTS) - 1:
                    raise
                log.warning("restoring the snapshot failed (%s); trying again", exc.message)
            else:
                log.info("restored %d entries into %s", count, self.directory)
                return count
        return None  # unreachable: the last attempt returns or raises

    def _url(self) -> str:
        """A GET URL of the snapshot: a fresh one from the router, else (router unreachable) the Secret's."""
        if self.broker is not None and self._asks_router:
            try:
                return str(self.broker.call("download")["url"])
            except Unavailable as exc:
                if not self.get_url:
                    raise
                log.warning("no fresh snapshot URL from the router (%s); using the one made with the sandbox",
                            exc.message)
            except (GroveError, KeyError) as exc:  # a router without the op, or a token it refuses
                if not self.get_url:
                    raise
                log.warning("the router gave no snapshot URL (%s); using the one made with the sandbox", exc)
        assert self.get_url is not None
        return self.get_url

    def take(self, reason: str) -> dict[str, Any] | None:
        """Pack the directory and upload it (one at a time); None when snapshots are off or the workspace
        was never restored (its snapshot is the only copy of its files)."""
        if self.broker is None:
            return None
        if self.failure is not None:
            log.warning("no %s snapshot: %s", reason, self.failure)
            return None
        with self._lock:
            started = time.monotonic()
            # Never staged: a copy in /tmp would count against the ephemeral-storage limit a second time,
            # and the kubelet evicts a pod over it mid-snapshot.
            stats = upload_multipart(self.broker, pack_directory(self.directory))
            took = time.monotonic() - started
        peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        log.info("snapshot of %s (%s): %d bytes in %d parts of %d in %.2fs, at most %d bytes held, peak RSS %d KiB",
                 self.directory, reason, stats.size, stats.parts, stats.part_size, took, stats.largest_buffer,
                 peak_kib)
        return {"etag": stats.etag, "seconds": took, "reason": reason, "size": stats.size, "parts": stats.parts,
                "largest_buffer": stats.largest_buffer}


class IdleSnapshots:
    """In the worker: snapshot after ``idle_s`` without a request, once per period of activity."""

    def __init__(self, snapshots: Snapshots, idle_s: float) -> None:
        self.snapshots = snapshots
        self.idle_s = idle_s
        self.taken = 0
        """How many idle snapshots were uploaded."""
        self._last = time.monotonic()
        self._inflight = 0
        self._dirty = False
        self._cond = threading.Condition()

    def install(self, app: Flask) -> None:
        """Count the app's requests (health checks excepted) and start the timer thread. Counted around the
        whole WSGI app, so that routes served in front of Flask (``/v1/exec``, executor.exec_route) count too."""
        inner = app.wsgi_app

        def counted(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            if environ.get("PATH_INFO") == "/healthz":
                return inner(environ, start_response)
            with self._cond:
                self._inflight += 1
                self._dirty = True
            try:
                return inner(environ, start_response)
            finally:
                with self._cond:
                    self._inflight -= 1
                    self._last = time.monotonic()
                    self._cond.notify()

        app.wsgi_app = counted  # type: ignore[method-assign]
        threading.Thread(target=self._run, name="grove-idle-snapshot", daemon=True).start()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._dirty or self._inflight:
                    self._cond.wait()
                due = self._last + self.idle_s - time.monotonic()
                if due > 0:
                    self._cond.wait(due)
                    continue
                self._dirty = False
            try:
                self.snapshots.take("idle")
                self.taken += 1
            except Exception:  # the next activity arms the timer again; SIGTERM snapshots regardless
                log.exception("idle snapshot failed")
                with self._cond:
                    self._dirty = True
                time.sleep(self.idle_s)


def unrestored_app(failure: str) -> Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]:
    """The WSGI app of an executor whose workspace was not restored: ``/healthz`` answers (the pod is up, no
    crash loop), every other call a 409 naming the failure and what to do."""
    error = Conflict(f"{failure}. The sandbox's files are not here, so it runs nothing; its snapshot is kept. "
                     "The next wake tries again (let it scale to zero), or delete the sandbox and create another")
    body = json.dumps(error.to_body()).encode()

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == "/healthz":
            start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", "11")])
            return [b'{"ok":true}']
        start_response(f"{error.status} {error.code}", [("Content-Type", "application/json"),
                                                        ("Content-Length", str(len(body)))])
        return [body]

    return app
