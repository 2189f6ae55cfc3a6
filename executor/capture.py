"""Bounded capture of one output stream: head and tail in memory, the full text spilled to a file."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass

from executor.outputs import KeptOutput


@dataclass(frozen=True)
class Captured:
    """What one stream produced, ready for the response."""

    data: bytes
    """All of it, or head + marker + tail when truncated."""
    truncated: bool
    """Whether anything was cut from ``data``."""
    total_bytes: int
    """How many bytes the command wrote in all."""
    sha256: str
    """Hash of the full output, truncated or not."""
    full_path: str | None
    """API path of the file holding the full output (only when truncated)."""


class OutputCapture:
    """Keeps at most ``limit`` bytes in memory whatever the command writes.

    Up to ``limit`` everything is kept. Past it the first half stays as the head, a ring keeps the last
    half as the tail, and every byte goes to a spill file so nothing is lost — an agent needs the start
    (the command's banner, the first error) and the end (the summary) far more than the middle.
    """

    def __init__(
        self, limit: int, spill_path: str, api_spill_path: str, keep: Callable[[str, KeptOutput], None] | None = None
    ) -> None:
        self._limit = limit
        self._buf = bytearray()
        self._tail = bytearray()
        self._head_len = limit // 2
        self._tail_len = limit - self._head_len
        self._total = 0
        self._hash = hashlib.sha256()
        self._spill_path = spill_path
        self._api_spill_path = api_spill_path
        self._spill: int | None = None
        self._spill_error: str | None = None
        self._overflowed = False
        self._keep = keep

    def feed(self, chunk: bytes) -> None:
        """Take the next chunk the command wrote."""
        self._total += len(chunk)
        self._hash.update(chunk)
        if not self._overflowed:
            if len(self._buf) + len(chunk) <= self._limit:
                self._buf += chunk
                return
            self._overflowed = True
            combined = bytes(self._buf) + chunk
            self._open_spill()
            self._write_spill(combined)
            self._buf = bytearray(combined[: self._head_len])
            self._tail = bytearray(combined[self._head_len :])
        else:
            self._write_spill(chunk)
            self._tail += chunk
        # Trim lazily so a flood of small chunks does not copy the ring on every write.
        if len(self._tail) > 2 * self._tail_len:
            del self._tail[: len(self._tail) - self._tail_len]

    def _open_spill(self) -> None:
        try:
            os.makedirs(os.path.dirname(self._spill_path), exist_ok=True)
            # A fresh name (the exec id is random): never through a link or into a FIFO the sandbox put there.
            flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            self._spill = os.open(self._spill_path, flags, 0o600)
        except OSError as exc:
            self._spill_error = f"could not keep the full output: {exc.strerror}"

    def _write_spill(self, data: bytes) -> None:
        if self._spill is None:
            return
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._spill, view) :]
        except OSError as exc:
            self._spill_error = f"full output incomplete: {exc.strerror}"
            os.close(self._spill)
            self._spill = None

    def finish(self) -> Captured:
        """Close the spill file and return what the response carries."""
        if self._spill is not None:
            if self._keep is not None and self._overflowed:
                # The router stores the full output from this descriptor, not from the path (outputs.py).
                self._keep(self._api_spill_path, KeptOutput(self._spill, self._total, self._hash.hexdigest()))
            else:
                os.close(self._spill)
            self._spill = None
        if not self._overflowed:
            return Captured(bytes(self._buf), False, self._total, self._hash.hexdigest(), None)
        tail = bytes(self._tail[-self._tail_len :])
        cut = self._total - len(self._buf) - len(tail)
        where = self._spill_error or f"full output in {self._api_spill_path}"
        marker = f"\n[... grove: {cut} bytes cut of {self._total}; {where} ...]\n".encode()
        full = None if self._spill_error else self._api_spill_path
        return Captured(bytes(self._buf) + marker + tail, True, self._total, self._hash.hexdigest(), full)
