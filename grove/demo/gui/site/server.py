"""The kit's web server, run inside the sandbox (``python3 server.py [--port 8000]``): the standard library only.

- ``GET`` of a file under ``www/`` serves it (``/`` is ``www/index.html``); a page's visit is logged.
- ``POST /api/<kind>`` with a JSON object appends ``{"kind": kind, ...it, "t": ...}`` to ``data/log.jsonl``:
  the site's own database, which a task's check reads once the agent has stopped.
- ``POST /__layout``: the page's element boxes (``kit.js``), kept in ``LAYOUT`` (outside the workdir, so no part
  of the attempt's changes) for a scripted policy to read; ``GET /__layout`` answers it.
"""

from __future__ import annotations

import argparse
import json
import mimetypes
import os
import posixpath
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
WWW = os.path.join(HERE, "www")
LOG = os.path.join(HERE, "data", "log.jsonl")
LAYOUT = "/tmp/grove-layout.json"
_lock = threading.Lock()
_posts = [0]


def record(entry: dict[str, Any]) -> None:
    """Append one entry to the site's log, on disk before the answer goes out."""
    with _lock, open(LOG, "a", encoding="utf-8") as fh:
        fh.write(json.dumps({**entry, "t": round(time.time(), 3)}) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def keep_layout(body: dict[str, Any]) -> None:
    """The page's latest layout, numbered, written whole (a reader never sees half of one)."""
    with _lock:
        _posts[0] += 1
        tmp = LAYOUT + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump({**body, "n": _posts[0]}, fh)
        os.replace(tmp, LAYOUT)


class Handler(BaseHTTPRequestHandler):
    """Static pages, the log's API and the layout."""

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        if url.path == "/__layout":
            try:
                with open(LAYOUT, "rb") as fh:
                    self._send(200, fh.read(), "application/json")
            except OSError:
                self._send(404, b"{}", "application/json")
            return
        rel = posixpath.normpath(urllib.parse.unquote(url.path)).lstrip("/")
        if rel in ("", "."):
            rel = "index.html"
        path = os.path.join(WWW, rel)
        if rel.startswith("..") or not os.path.isfile(path):
            self._send(404, b"<h1>Not found</h1>", "text/html")
            return
        if path.endswith(".html"):
            record({"kind": "visit", "path": "/" + rel, "query": dict(urllib.parse.parse_qsl(url.query))})
        with open(path, "rb") as fh:
            self._send(200, fh.read(), mimetypes.guess_type(path)[0] or "application/octet-stream")

    def do_POST(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        length = min(int(self.headers.get("Content-Length") or 0), 4 << 20)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            body = None
        if not isinstance(body, dict):
            self._send(400, b'{"error": "a JSON object is needed"}', "application/json")
            return
        if url.path == "/__layout":
            keep_layout(body)
        elif url.path.startswith("/api/") and url.path[5:].isidentifier():
            record({**body, "kind": url.path[5:]})
        else:
            self._send(404, b"{}", "application/json")
            return
        self._send(200, b'{"ok": true}', "application/json")

    def _send(self, status: int, data: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(data)


def main() -> None:
    """Serve until killed."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    os.makedirs(os.path.dirname(LOG), exist_ok=True)
    ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
