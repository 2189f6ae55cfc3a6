"""HTTP byte ranges (RFC 9110 §14): which part of an object a ``Range`` header asks for.

One range is served (206); several, or a header that does not parse, are ignored and the whole object
is served (200), as the RFC allows. A range that starts at or past the end is refused (416).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from grove.core.errors import RangeNotSatisfiable

_ONE = re.compile(r"bytes=(\d*)-(\d*)")


@dataclass(frozen=True)
class ByteRange:
    """The bytes ``start`` to ``end`` (inclusive) of an object of ``size`` bytes."""

    start: int
    """First byte."""
    end: int
    """Last byte (inclusive)."""
    size: int
    """The whole object's size."""

    @property
    def length(self) -> int:
        """How many bytes the range holds."""
        return self.end - self.start + 1

    def content_range(self) -> str:
        """The ``Content-Range`` header of a 206 answer."""
        return f"bytes {self.start}-{self.end}/{self.size}"


def requested(header: str | None, size: int, if_range: str | None = None, etag: str | None = None) -> ByteRange | None:
    """The range to serve; None: the whole object. Raises RangeNotSatisfiable for a range past the end.

    ``if_range``: a ``If-Range`` validator; unless it is the object's current (strong) ``etag``, the
    object changed since the client's partial copy, and the whole object is served.
    """
    if header is None:
        return None
    if if_range is not None and (etag is None or if_range.strip() != _quoted(etag)):
        return None
    match = _ONE.fullmatch(header.strip().replace(" ", ""))
    if match is None or (not match[1] and not match[2]):
        return None  # several ranges, another unit, or garbage: ignored
    if not match[1]:  # the last N bytes
        suffix = int(match[2])
        if suffix == 0 or size == 0:
            raise RangeNotSatisfiable(f"range {header!r} selects no byte of an object of {size} bytes")
        return ByteRange(max(0, size - suffix), size - 1, size)
    start = int(match[1])
    if match[2] and int(match[2]) < start:
        return None  # invalid: ignored
    if start >= size:
        raise RangeNotSatisfiable(f"range {header!r} starts past the end of an object of {size} bytes")
    end = min(int(match[2]), size - 1) if match[2] else size - 1
    return ByteRange(start, end, size)


def _quoted(etag: str) -> str:
    return etag if etag.startswith('"') else f'"{etag}"'
