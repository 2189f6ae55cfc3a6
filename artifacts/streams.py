"""Small file-like adapters between byte iterators, HTTP responses and readers that want ``read(n)``."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol, runtime_checkable

from grove.core.errors import GroveError

CHUNK = 1024 * 1024


@runtime_checkable
class Readable(Protocol):
    """Anything with ``read(n)`` returning bytes (files, HTTP responses, zstd readers)."""

    def read(self, size: int = -1, /) -> bytes:
        """Up to ``size`` bytes (all when -1); empty at the end."""
        ...


class IterReader:
    """``read(n)`` over an iterable of byte chunks, holding at most one chunk beyond what was asked."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._buf = bytearray()
        self._done = False

    def read(self, size: int = -1, /) -> bytes:
        """Up to ``size`` bytes (all that remain when -1); empty at the end."""
        while not self._done and (size < 0 or len(self._buf) < size):
            try:
                self._buf += next(self._chunks)
            except StopIteration:
                self._done = True
        if size < 0 or size >= len(self._buf):
            out = bytes(self._buf)
            self._buf.clear()
        else:
            out = bytes(self._buf[:size])
            del self._buf[:size]
        return out

    def readable(self) -> bool:
        """Always true (some consumers check)."""
        return True


def as_reader(source: Readable | Iterable[bytes]) -> Readable:
    """``source`` itself if it has ``read``, else an :class:`IterReader` over it."""
    if isinstance(source, Readable):
        return source
    return IterReader(source)


def iter_chunks(reader: Readable, size: int = CHUNK) -> Iterator[bytes]:
    """The reader's bytes as chunks of at most ``size``."""
    while chunk := reader.read(size):
        yield chunk


class ObjectReader:
    """An object being downloaded: ``read``, iterate in chunks, and close (or use ``with``)."""

    def __init__(self, response: Any, translate: Callable[[BaseException], GroveError]) -> None:
        # ``response`` is urllib3's HTTPResponse; errors mid-body become grove errors through ``translate``.
        self._response = response
        self._translate = translate
        self.size: int | None = _content_length(response)
        """The object's size if the server sent Content-Length."""

    def read(self, size: int = -1, /) -> bytes:
        """Up to ``size`` bytes (the rest when -1); empty at the end."""
        try:
            data = self._response.read() if size < 0 else self._response.read(size)
        except Exception as exc:
            raise self._translate(exc) from exc
        return bytes(data)

    def readable(self) -> bool:
        """Always true."""
        return True

    def __iter__(self) -> Iterator[bytes]:
        return iter_chunks(self)

    def close(self) -> None:
        """Return the connection to the pool (or drop it if the body was not read to the end)."""
        self._response.close()
        self._response.release_conn()

    def __enter__(self) -> ObjectReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _content_length(response: Any) -> int | None:
    value = getattr(response, "headers", {}).get("Content-Length")
    return int(value) if value is not None and str(value).isdigit() else None
