"""Upload to and download from presigned S3 URLs with nothing but ``http.client``.

For code that holds no S3 credentials — the executor inside a sandbox. Error messages name the host
and the key but never the query string (it carries the signature).
"""

from __future__ import annotations

import http.client
import os
import re
import tempfile
from collections.abc import Iterable, Iterator
from urllib.parse import urlsplit

from artifacts.streams import CHUNK, Readable, as_reader, iter_chunks
from grove.errors import BadRequest, Forbidden, GroveError, InternalError, NotFound, Unavailable

# Bodies of unknown length are staged first (memory up to this size, then a temporary file): S3
# wants a Content-Length on a single PUT, and not every S3 server accepts chunked encoding.
_STAGE_IN_MEMORY = 8 * 1024 * 1024


def upload_via_presigned(
    url: str,
    body: bytes | Readable | Iterable[bytes],
    *,
    length: int | None = None,
    chunked: bool = False,
    stage_dir: str | os.PathLike[str] | None = None,
    timeout: float = 120.0,
) -> str | None:
    """PUT ``body`` to a presigned URL in one request; return the ETag.

    A body of unknown size is staged (in memory up to 8 MiB, then in a temporary file in
    ``stage_dir``) to learn its Content-Length, unless ``length`` is given or ``chunked`` is set.
    ``chunked`` streams with chunked transfer encoding instead: weed and MinIO accept it, AWS S3 does
    not.
    """
    if isinstance(body, bytes | bytearray | memoryview):
        data = bytes(body)
        return _put(url, [data], len(data), timeout)
    reader = as_reader(body)
    if length is not None:
        return _put(url, _exactly(reader, length), length, timeout)
    if chunked:
        return _put(url, iter_chunks(reader), None, timeout)
    with tempfile.SpooledTemporaryFile(
        max_size=_STAGE_IN_MEMORY, dir=None if stage_dir is None else os.fspath(stage_dir)
    ) as stage:
        size = 0
        for chunk in iter_chunks(reader):
            stage.write(chunk)
            size += len(chunk)
        stage.seek(0)
        return _put(url, iter_chunks(stage), size, timeout)


def download_via_presigned(url: str, *, timeout: float = 120.0) -> PresignedDownload:
    """GET a presigned URL; return a reader over the body (close it, or use ``with``)."""
    conn, target = _connect(url, timeout)
    try:
        conn.request("GET", target, headers={"Accept-Encoding": "identity"})
        response = conn.getresponse()
    except OSError as exc:
        conn.close()
        raise Unavailable(f"S3 at {_where(url)} is unreachable: {exc}", retry_after=5) from exc
    if response.status != 200:
        error = _error(url, response.status, response.read())
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
            raise Unavailable(f"download from {_where(self._url)} broke off: {exc}", retry_after=5) from exc

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


def _put(url: str, chunks: Iterable[bytes], length: int | None, timeout: float) -> str | None:
    conn, target = _connect(url, timeout)
    try:
        conn.putrequest("PUT", target, skip_accept_encoding=True)
        if length is None:
            conn.putheader("Transfer-Encoding", "chunked")
        else:
            conn.putheader("Content-Length", str(length))
        conn.putheader("Content-Type", "application/octet-stream")
        conn.endheaders()
        for chunk in chunks:
            if length is not None:
                conn.send(chunk)
            elif chunk:  # an empty chunk would end the body early
                conn.send(b"%x\r\n%b\r\n" % (len(chunk), chunk))
        if length is None:
            conn.send(b"0\r\n\r\n")
        response = conn.getresponse()
        body = response.read()
    except OSError as exc:
        raise Unavailable(f"upload to {_where(url)} failed: {exc}", retry_after=5) from exc
    finally:
        conn.close()
    if response.status not in (200, 201, 204):
        raise _error(url, response.status, body)
    return response.getheader("ETag")


def _exactly(reader: Readable, length: int) -> Iterator[bytes]:
    left = length
    while left > 0:
        chunk = reader.read(min(CHUNK, left))
        if not chunk:
            raise BadRequest(f"upload body ended {left} bytes short of the {length} announced")
        left -= len(chunk)
        yield chunk


def _connect(url: str, timeout: float) -> tuple[http.client.HTTPConnection, str]:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadRequest("a presigned URL must be http(s)://host/…")
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.hostname, parts.port, timeout=timeout)
    return conn, f"{parts.path or '/'}?{parts.query}" if parts.query else parts.path or "/"


def _where(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}{parts.path}"


def _error(url: str, status: int, body: bytes) -> GroveError:
    match = re.search(rb"<Code>([^<]*)</Code>", body)
    code = match.group(1).decode(errors="replace") if match else f"HTTP {status}"
    message = f"{_where(url)}: {code}"
    if status == 404:
        return NotFound(message)
    if status == 403:
        return Forbidden(f"{message} (expired URL or bad signature)")
    if status >= 500:
        return Unavailable(message, retry_after=5)
    return BadRequest(message) if 400 <= status < 500 else InternalError(message)
