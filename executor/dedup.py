"""Idempotent exec: a retried ``request_id`` gets the first call's result and never runs twice."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from grove.core.errors import Conflict


class _Entry:
    __slots__ = ("done", "fingerprint", "result")

    def __init__(self, fingerprint: str) -> None:
        self.done = threading.Event()
        self.fingerprint = fingerprint
        self.result: dict[str, Any] | None = None


class Deduplicator:
    """Remembers in-flight and recent results by request id (bounded; oldest finished forgotten first).

    The executor runs one worker process with threads, so this in-process table sees every retry.
    """

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, _Entry] = OrderedDict()

    def claim(self, request_id: str, fingerprint: str) -> tuple[bool, _Entry]:
        """Return (True, entry) if the caller must run the command, else (False, the first call's entry).

        ``fingerprint`` names what the call runs: a retry must run the same thing, and another command under
        an id already used is refused (``Conflict``) rather than answered with the first command's result.
        """
        with self._lock:
            entry = self._entries.get(request_id)
            if entry is not None:
                if entry.fingerprint != fingerprint:
                    raise Conflict(f"request_id {request_id!r} was already used for another command; a retry must "
                                   "send the same command, a new command needs a new request_id")
                return False, entry
            entry = _Entry(fingerprint)
            self._entries[request_id] = entry
            self._evict()
            return True, entry

    def finish(self, request_id: str, entry: _Entry, result: dict[str, Any] | None) -> None:
        """Publish the result (None: the first call failed, so a retry may run it afresh)."""
        with self._lock:
            if result is None:
                self._entries.pop(request_id, None)
            entry.result = result
        entry.done.set()

    def wait(self, entry: _Entry, timeout: float) -> dict[str, Any] | None:
        """Wait for the first call to finish; None if it failed or did not finish in time."""
        entry.done.wait(timeout)
        return entry.result

    def _evict(self) -> None:
        while len(self._entries) > self._capacity:
            for key, old in self._entries.items():
                if old.done.is_set():
                    del self._entries[key]
                    break
            else:
                return  # everything is in flight: keep it all rather than forget a running call
