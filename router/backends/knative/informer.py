"""A cache of one kind of object, kept current by one list and then one long watch (no polling).

One informer per kind serves every sandbox: a thousand creates wait on the same watch stream instead
of opening a thousand. The watch runs on a thread of its own (the client is synchronous); every change
is applied on the event loop's thread, which also runs every reader, so the cache needs no lock.
After an expired resourceVersion (410 Gone) or a broken stream it lists again and carries on.

At scale: the list is paginated (``limit``/``continue``, so 100k objects never arrive as one response);
the watch asks for bookmarks, which advance the resume version while nothing changes, so a restarted watch
resumes instead of relisting; a watch silent for longer than ``idle_timeout_s`` (bookmarks come about
once a minute) is presumed dropped by something between here and the API server that did not close the
connection, and is restarted from its version (creates waiting on it wait at most that long more); and
only the fields grove reads are cached (``keep``), not whole objects.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import urllib3
from kubernetes import client, watch

from grove.core.errors import UpstreamTimeout

log = logging.getLogger("grove.knative")
T = TypeVar("T")
Obj = dict[str, Any]
_WATCH_TIMEOUT_S = 240  # the server ends each watch after this; the next one resumes from the last version
_BACKOFF_S = (0.2, 0.5, 1.0, 2.0, 5.0)


class Informer:
    """Objects of one kind in one namespace, by name, matching a label selector."""

    def __init__(
        self,
        kind: str,
        list_fn: Callable[..., Any],
        label_selector: str,
        *,
        keep: Callable[[Obj], Obj] | None = None,
        page_size: int = 500,
        idle_timeout_s: float = 90.0,
        call_timeout_s: float = 30.0,
    ) -> None:
        self.kind = kind
        """What is watched, for logs and errors."""
        self.objects: dict[str, Obj] = {}
        """The current objects by name (read on the event loop's thread only)."""
        self._list = list_fn
        self._selector = label_selector
        self._keep = keep or (lambda obj: obj)
        self._page_size = page_size
        self._idle_timeout_s = idle_timeout_s
        self._call_timeout_s = call_timeout_s
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._watch: watch.Watch | None = None
        self._stopped = threading.Event()
        self.relists = 0
        """How many times the informer listed (1 + recoveries)."""
        self.bookmarks = 0
        """Bookmarks received (they only move the resume version)."""

    async def start(self) -> None:
        """List once (so the cache is complete when this returns), then watch on a thread."""
        self._loop = asyncio.get_running_loop()
        version = await asyncio.to_thread(self._relist)
        self._thread = threading.Thread(target=self._run, args=(version,), name=f"grove-watch-{self.kind}",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the watch (its socket is shut down, so the thread wakes at once)."""
        self._stopped.set()
        if self._watch is not None:
            self._watch.stop()  # type: ignore[no-untyped-call]
        if self._thread is not None:
            self._thread.join(timeout=2)

    async def wait_for(self, name: str, check: Callable[[Obj | None], T | None], timeout_s: float) -> T:
        """Wait until ``check(object or None)`` returns something other than None; return it.

        ``check`` runs now and after every change to ``name`` (it may raise to end the wait).
        """
        deadline = time.monotonic() + timeout_s
        while True:
            result = check(self.objects.get(name))
            if result is not None:
                return result
            left = deadline - time.monotonic()
            if left <= 0:
                raise UpstreamTimeout(f"{self.kind} {name} did not reach the expected state in {timeout_s:g}s")
            changed = asyncio.Event()
            self._waiters.setdefault(name, set()).add(changed)
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), left)
            finally:
                waiters = self._waiters.get(name)
                if waiters is not None:
                    waiters.discard(changed)
                    if not waiters:
                        self._waiters.pop(name, None)

    # -- the watch thread ------------------------------------------------------------------------------

    def _relist(self) -> str:
        """One consistent list, page by page; the version to watch from is the first page's."""
        items: dict[str, Obj] = {}
        token, version = "", ""
        while True:
            page = {"limit": self._page_size, **({"_continue": token} if token else {})}
            result = self._list(label_selector=self._selector, _preload_content=False,
                                _request_timeout=(5, self._call_timeout_s), **page)
            body = json.loads(result.data)
            items.update((item["metadata"]["name"], self._keep(item)) for item in body.get("items", []))
            version = version or str(body["metadata"]["resourceVersion"])
            token = body["metadata"].get("continue") or ""
            if not token:
                break
        self.relists += 1
        self._post(self._replace, items)
        return version

    def _run(self, version: str | None) -> None:
        failures = 0
        while not self._stopped.is_set():
            try:
                if version is None:
                    version = self._relist()
                self._watch = watch.Watch()  # type: ignore[no-untyped-call]
                events = self._watch.stream(  # type: ignore[no-untyped-call]
                    self._list, label_selector=self._selector, resource_version=version,
                    timeout_seconds=_WATCH_TIMEOUT_S, allow_watch_bookmarks=True,
                    # A read that waits longer than this: the connection is dead though nobody closed it.
                    _request_timeout=(5, self._idle_timeout_s),
                )
                for event in events:
                    obj = event["raw_object"]
                    version = obj.get("metadata", {}).get("resourceVersion", version)
                    if event["type"] == "BOOKMARK":
                        self.bookmarks += 1
                    elif event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                        self._post(self._apply, event["type"], self._keep(obj))
                    failures = 0
            except client.ApiException as exc:
                if exc.status == 410:  # our version is too old: start from a fresh list
                    version = None
                    continue
                failures += 1
                log.warning("watching %s failed (HTTP %s): %s", self.kind, exc.status, exc.reason)
            except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
                if self._stopped.is_set():
                    break
                failures += 1
                log.warning("watch of %s broke off: %s", self.kind, exc)
            if failures:
                self._stopped.wait(_BACKOFF_S[min(failures, len(_BACKOFF_S)) - 1])

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):  # the loop closed while we stop
            self._loop.call_soon_threadsafe(fn, *args)

    # -- on the event loop -----------------------------------------------------------------------------

    def _replace(self, items: dict[str, Obj]) -> None:
        changed = set(self.objects) | set(items)
        self.objects = items
        for name in changed:
            self._wake(name)

    def _apply(self, kind: str, obj: Obj) -> None:
        name = obj["metadata"]["name"]
        if kind == "DELETED":
            self.objects.pop(name, None)
        else:
            self.objects[name] = obj
        self._wake(name)

    def _wake(self, name: str) -> None:
        for waiter in self._waiters.get(name, ()):
            waiter.set()
