"""A model API that answers from a script: a real HTTP server on loopback, for the vendors' real SDK clients.

A harness's loop talks to ``anthropic.Anthropic(base_url=api.url)`` or ``openai.OpenAI(base_url=api.url +
"/v1")`` as it would to the vendor; each POST is answered with the next reply of the script (a Messages API
message, a Responses API response, written by the test as the vendor's JSON), and every request body is kept
for the test to read (what the SDK sent back: the ``tool_result`` blocks, the ``computer_call_output`` items).
No model is called.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ScriptedAPI:
    """The server's URL, the replies still to give, and the requests it has had (``(path, body)``, in order)."""

    url: str
    replies: list[dict[str, Any]]
    requests: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def bodies(self, path: str) -> list[dict[str, Any]]:
        """The JSON bodies POSTed to ``path``, in order."""
        return [body for at, body in self.requests if at == path]


@contextmanager
def scripted_api(replies: list[dict[str, Any]]) -> Iterator[ScriptedAPI]:
    """A server answering each POST with the next of ``replies`` (a 500 once they run out), for the block."""
    api = ScriptedAPI("", list(replies))
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            with lock:
                api.requests.append((self.path, body))
                reply = api.replies.pop(0) if api.replies else None
            data = json.dumps(reply if reply is not None else {"error": {"message": "the script has run out"}})
            self.send_response(200 if reply is not None else 500)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data.encode())

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    api.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name="scripted-api", daemon=True)
    thread.start()
    try:
        yield api
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
