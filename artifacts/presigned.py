"""Upload to and download from presigned S3 URLs with nothing but ``http.client``.

For code that holds no S3 credentials — the executor inside a sandbox. Error messages name the host
and the key but never the query string (it carries the signature).
"""

from __future__ import annotations

import http.client
import re
from collections.abc import Iterable, Iterator
from urllib.parse import urlsplit

from artifacts.streams import CHUNK, Readable, as_reader, iter_chunks
from grove.core.errors import BadRequest, Forbidden, GroveError, InternalError, NotFound, Unavailable


def upload_via_presigned(
    url: str,
    body: bytes | bytearray | memoryview | Readable | Iterable[bytes],
    *,
    length: int | None = None,
    timeout: float = 120.0,
) -> str | None:
    """PUT ``body`` to a presigned URL in one request with a Content-Length; return the ETag.

    A stream needs its ``length`` up front: S3 wants a Content-Length on a PUT, and AWS refuses chunked
    encoding. A stream of unknown length goes as a multipart upload (:mod:`artifacts.multipart`).
    A bytes-like body is sent as it is, without a copy.
    """
    if isinstance(body, bytes | bytearray | memoryview):
        return _put(url, [body], len(body), timeout)
    if length is None:
        raise BadRequest("a streamed upload to a presigned URL needs its length")
    return _put(url, _exactly(as_reader(body), length), length, timeout)


def download_via_presigned(url: str, *, timeout: float = 120.0) -> PresignedDownload:
    """GET a presigned URL; return a reader over the body (close it, or use ``with``)."""
    conn, target = connect(url, timeout)
    try:
        conn.request("GET", target, headers={"Accept-Encoding": "identity"})
        response = conn.getresponse()
    except OSError as exc:
        conn.close()
        raise Unavailable(f"S3 at {where(url)} is unreachable: {exc}", retry_after=5) from exc
    if response.status != 200:
        error = error_for(url, response.status, response.read())
        conn.close()
        raise error
    return PresignedDownload(conn, response, url)


class PresignedDownload:
    """A body being downloaded from a presigned URL."""

    def __init__(self, conn: http.client.HTTPConnection, response: http.client.HTTPResponse, url: str) -> None:
        self._conn = conn
        self._response = response
        self._url = url
        length = response.getheader("Content-Length")
        self.size: int | None = int(length) if length and length.isdigit() else None
        """The body's size, when the server sent it."""

    def read(self, size: int = -1, /) -> bytes:
        """Up to ``size`` bytes (the rest when -1); empty at the end."""
        try:
            return self._response.read() if size < 0 else self._response.read(size)
        except (OSError, http.client.HTTPException) as exc:
            raise Unavailable(f"download from {where(self._url)} broke off: {exc}", retry_after=5) from exc

    def readable(self) -> bool:
        """Always true."""
        return True

    def __iter__(self) -> Iterator[bytes]:
        return iter_chunks(self)

    def close(self) -> None:
        """Close the connection."""
        self._response.close()
        self._conn.close()

    def __enter__(self) -> PresignedDownload:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _put(url: str, chunks: Iterable[bytes | bytearray | memoryview], length: int, timeout: float) -> str | None:
    conn, target = connect(url, timeout)
    try:
        conn.putrequest("PUT", target, skip_accept_encoding=True)
        conn.putheader("Content-Length", str(length))
        conn.putheader("Content-Type", "application/octet-stream")
        conn.endheaders()
        for chunk in chunks:
            conn.send(chunk)
        response = conn.getresponse()
        body = response.read()
    except OSError as exc:
        raise Unavailable(f"upload to {where(url)} failed: {exc}", retry_after=5) from exc
    finally:
        conn.close()
    if response.status not in (200, 201, 204):
        raise error_for(url, response.status, body)
    return response.getheader("ETag")


def _exactly(reader: Readable, length: int) -> Iterator[bytes]:
    left = length
    while left > 0:
        chunk = reader.read(min(CHUNK, left))
        if not chunk:
            raise BadRequest(f"upload body ended {left} bytes short of the {length} announced")
        left -= len(chunk)
        yield chunk


def connect(url: str, timeout: float) -> tuple[http.client.HTTPConnection, str]:
    """An unopened connection to the URL's host, and the request target (path and query)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadRequest("a presigned URL must be http(s)://host/…")
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.hostname, parts.port, timeout=timeout)
    return conn, f"{parts.path or '/'}?{parts.query}" if parts.query else parts.path or "/"


def where(url: str) -> str:
    """The URL without its query (which carries the signature): safe to log."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}{parts.path}"


def error_for(url: str, status: int, body: bytes) -> GroveError:
    """The GroveError for an S3 error answer (its <Code>), naming the URL without its signature."""
    match = re.search(rb"<Code>([^<]*)</Code>", body)
    code = match.group(1).decode(errors="replace") if match else f"HTTP {status}"
    message = f"{where(url)}: {code}"
    if status == 404:
        return NotFound(message)
    if status == 403:
        return Forbidden(f"{message} (expired URL or bad signature)")
    if status >= 500:
        return Unavailable(message, retry_after=5)
    return BadRequest(message) if 400 <= status < 500 else InternalError(message)
