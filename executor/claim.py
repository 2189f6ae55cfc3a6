"""A warm-pool sandbox's executor, handed to its user: ``POST /v1/claim`` swaps in a fresh app.

A pooled sandbox is started before anyone asks for it, with a token only the router knows. When a create
claims it, the router posts the claim's token, environment and working directory here (authenticated by
the pool token). The whole Flask app is built again from the new settings (on the first request after
the claim), so nothing of the old one survives: not the token, not the dedup cache, not a SWE-ReX session.
The old token is refused from then on.
"""

from __future__ import annotations

import dataclasses
import hmac
import json
import os
import threading
from collections.abc import Callable, Iterable
from typing import Any

from executor.settings import ExecutorSettings
from grove.core.errors import BadRequest, GroveError, TooLarge, Unauthorized

_CLAIM_PATH = "/v1/claim"
_MAX_CLAIM_BYTES = 1024 * 1024

StartResponse = Callable[..., Any]
AppFactory = Callable[[ExecutorSettings], Any]


class Claimable:
    """A WSGI app that serves ``create_app(settings)`` and answers ``POST /v1/claim`` itself."""

    def __init__(self, settings: ExecutorSettings, factory: AppFactory) -> None:
        self._settings = settings
        self._factory = factory
        self._app: Any = factory(settings)  # at start: bad settings fail the start, not a first call
        self._lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        """Serve a request: a claim here, anything else by the current app."""
        if environ.get("PATH_INFO") == _CLAIM_PATH and environ.get("REQUEST_METHOD") == "POST":
            status, body = self._claim(environ)
            start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
            return [body]
        app = self._app or self._build()
        return app(environ, start_response)  # type: ignore[no-any-return]

    def _build(self) -> Any:
        with self._lock:
            if self._app is None:
                self._app = self._factory(self._settings)
            return self._app

    def _claim(self, environ: dict[str, Any]) -> tuple[str, bytes]:
        header = environ.get("HTTP_AUTHORIZATION", "")
        scheme, _, given = header.partition(" ")
        with self._lock:
            by_header = scheme.lower() == "bearer" and _same(given.strip(), self._settings.token)
            try:
                # No Content-Length when a proxy (Knative's activator) forwards it chunked: read to the end.
                raw = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or _MAX_CLAIM_BYTES + 1))
                if len(raw) > _MAX_CLAIM_BYTES:
                    return _error(TooLarge(f"a claim body may have {_MAX_CLAIM_BYTES} bytes"))
                body = json.loads(raw or b"{}")
                token, env, workdir = body["token"], body["env"], body["workdir"]
                if not (isinstance(token, str) and token and isinstance(workdir, str) and workdir.startswith("/")
                        and isinstance(env, dict) and all(isinstance(v, str) for v in env.values())):
                    raise ValueError("want {token: str, env: {str: str}, workdir: absolute path}")
            except (ValueError, KeyError, TypeError) as exc:
                if not by_header:  # nothing about the body is told to a caller without the token
                    return _error(Unauthorized("the bearer token is not valid for this sandbox"))
                return _error(BadRequest(f"bad claim: {exc}"))
            if not by_header:
                if not _same(token, self._settings.token):
                    return _error(Unauthorized("the bearer token is not valid for this sandbox"))
                if env == self._settings.env and workdir == self._settings.workdir:
                    return "200 OK", b'{"ok": true, "already": true}'
            # The workdir of a fresh sandbox exists (its init made it); the claim's may be another one.
            os.makedirs(os.path.join(self._settings.root, workdir.lstrip("/")), exist_ok=True)
            self._settings = dataclasses.replace(self._settings, token=token, env=dict(env), workdir=workdir)
            # Built on the claim's first request, so the claim itself answers at once (a burst of claims
            # is the moment a pool exists for); the old app is unreachable from here on.
            self._app = None
        return "200 OK", b'{"ok": true}'


def _same(given: str, token: str) -> bool:
    return bool(given) and hmac.compare_digest(given.encode(), token.encode())


def _error(err: GroveError) -> tuple[str, bytes]:
    return f"{err.status} {err.code}", json.dumps(err.to_body()).encode()
