"""Uploading sandbox files straight to object storage through presigned URLs (no credentials inside)."""

from __future__ import annotations

import errno
import hashlib
import http.client
import os
from typing import Any
from urllib.parse import urlsplit

from executor.files import open_regular
from executor.paths import PathResolver
from grove.core.errors import BadRequest, NotFound

_CHUNK = 1024 * 1024


def check_items(body: Any) -> list[tuple[str, str]]:
    """Validate ``{"items": [{"path", "url"}, ...]}``."""
    items = body.get("items") if isinstance(body, dict) else None
    if not isinstance(items, list) or not items:
        raise BadRequest("body must be {\"items\": [{\"path\": ..., \"url\": ...}, ...]}")
    out = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("path"), str) or not isinstance(item.get("url"), str):
            raise BadRequest("each item needs a string 'path' and a presigned 'url'")
        if urlsplit(item["url"]).scheme not in ("http", "https"):
            raise BadRequest(f"item {item['path']!r}: the url must be http or https")
        out.append((item["path"], item["url"]))
    return out


def require_files(paths: PathResolver, apis: list[str]) -> None:
    """Every path must be a regular file (404 naming the first missing, 400 the first that is not a file)."""
    for api in apis:
        try:
            fd, _ = open_regular(paths, api, what=api)
        except (NotFound, OSError) as exc:
            raise NotFound(f"no such file in the sandbox: {api}") from exc
        os.close(fd)


def put_file(paths: PathResolver, api: str, url: str, timeout_s: float = 300.0) -> dict[str, Any]:
    """Stream one file to a presigned PUT URL; returns size, sha256 and the server's status.

    The file is opened once (no FIFO or device, no link out of the root) and exactly the size it had then
    is sent: one that grows meanwhile does not overrun the Content-Length, one that shrinks fails the upload.
    """
    parts = urlsplit(url)
    conn_cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    fd, st = open_regular(paths, api, what=api)
    size = st.st_size
    digest = hashlib.sha256()
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    conn = conn_cls(parts.netloc, timeout=timeout_s)
    try:
        with os.fdopen(fd, "rb") as fh:
            conn.putrequest("PUT", target, skip_accept_encoding=True)
            conn.putheader("Content-Length", str(size))
            conn.endheaders()
            left = size
            while left > 0:
                block = fh.read(min(_CHUNK, left))
                if not block:
                    raise OSError(errno.EIO, f"{api} shrank from {size} to {size - left} bytes while it was uploaded")
                left -= len(block)
                digest.update(block)
                conn.send(block)
        resp = conn.getresponse()
        detail = resp.read(2000)
    finally:
        conn.close()
    ok = 200 <= resp.status < 300
    result: dict[str, Any] = {"size": size, "sha256": digest.hexdigest(), "status": resp.status, "uploaded": ok}
    if not ok:
        result["error"] = detail.decode("utf-8", "replace")
    return result
