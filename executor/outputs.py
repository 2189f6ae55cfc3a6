"""Full outputs served from the descriptor the capture wrote them through, never from their path.

The spill file of a truncated output lives in the sandbox (``/tmp/grove-output/<id>.stdout``), where the
command's own processes can rename another file over it — a 2 GB sparse one, say. The router stores the
full output from ``GET /v1/outputs?path=``, which reads the inode the executor wrote, and at most the
bytes the command wrote (the router checks their sha256 too: the inode itself stays writable to root in
the sandbox). The executor keeps a bounded number of these descriptors; the router takes each once.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

from grove.core.errors import NotFound

_CHUNK = 1024 * 1024
MAX_KEPT = 64
"""Descriptors kept at most; the oldest is closed first (its output then cannot be stored)."""


@dataclass(frozen=True)
class KeptOutput:
    """One full output: the descriptor it was written through, how many bytes the command wrote, their hash."""

    fd: int
    size: int
    sha256: str


class KeptOutputs:
    """Descriptors of spill files by API path, for one executor (thread-safe: gunicorn runs threads)."""

    def __init__(self, limit: int = MAX_KEPT) -> None:
        self._limit = limit
        self._kept: OrderedDict[str, KeptOutput] = OrderedDict()
        self._lock = threading.Lock()

    def keep(self, api_path: str, output: KeptOutput) -> None:
        """Hold ``output`` until the router takes it (closing the oldest one past the limit)."""
        with self._lock:
            if (old := self._kept.pop(api_path, None)) is not None:
                os.close(old.fd)
            self._kept[api_path] = output
            while len(self._kept) > self._limit:
                os.close(self._kept.popitem(last=False)[1].fd)

    def take(self, api_path: str) -> KeptOutput:
        """The output kept for ``api_path``, no longer kept here (the caller closes its descriptor)."""
        with self._lock:
            output = self._kept.pop(api_path, None)
        if output is None:
            raise NotFound(f"no full output kept for {api_path} (already stored, or too many held at once)")
        return output


def read_kept(output: KeptOutput) -> Iterator[bytes]:
    """At most ``output.size`` bytes from offset 0 of the kept inode, then its descriptor closed."""
    try:
        offset = 0
        while offset < output.size:
            block = os.pread(output.fd, min(_CHUNK, output.size - offset), offset)
            if not block:
                return  # the file was cut short in the sandbox: the router sees fewer bytes than reported
            offset += len(block)
            yield block
    finally:
        os.close(output.fd)
