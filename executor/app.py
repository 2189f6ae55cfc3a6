"""The executor's Flask app: ``create_app(settings)``; gunicorn runs it as ``executor.app:create_app()``.

``create_app`` is :func:`app_shell` (the routes) and :func:`bind` (one sandbox's settings and state); the local
backend's zygote builds the shell ahead of its forks (see :mod:`executor.served`).
"""

from __future__ import annotations

import base64
import os
from typing import Any

from flask import Flask, Response, request

from executor.answers import as_grove_error, authenticate, body_type, error_headers
from executor.archive import extract_tar, stream_tar
from executor.e2b_processes import e2b_blueprint
from executor.exec_route import ExecRoute
from executor.files import delete, listing, open_for_read, parse_mode, write_atomic
from executor.manifest import manifest
from executor.outputs import read_kept
from executor.ports import ports_blueprint
from executor.process_routes import processes_blueprint
from executor.push import check_items, put_file, require_files
from executor.served import Served, Slot
from executor.settings import ExecutorSettings
from executor.snapshot import Snapshots
from executor.swerex import swerex_blueprint
from grove.core import wire
from grove.core.errors import BadRequest, Conflict

_SLOT = "grove.executor"


def create_app(settings: ExecutorSettings | None = None) -> Flask:
    """Build the app; with no settings they are read from ``GROVE_EXECUTOR_*`` now (not at import)."""
    settings = settings or ExecutorSettings.from_env()
    return bind(app_shell(settings.root), settings)


def bind(app: Flask, settings: ExecutorSettings) -> Flask:
    """Give a shell from :func:`app_shell` its sandbox: state and descriptors made now, in this process."""
    if os.path.abspath(settings.root) != app.root_path:
        raise ValueError(f"an app shell for root {app.root_path!r} cannot serve root {settings.root!r}")
    app.extensions[_SLOT].bind(Served(settings))
    return app


def release(app: Flask) -> None:
    """Close what :func:`bind` opened (the path resolver's root) in an app that will serve no more."""
    app.extensions[_SLOT].get().paths.close()


def app_shell(root: str) -> Flask:
    """The executor's routes for a sandbox rooted at ``root``; they serve only ``/healthz`` until :func:`bind`."""
    # Both paths given: Flask would otherwise look for a module named "grove-executor" along sys.path, twice
    # (every directory of it, at every sandbox start). No static folder: the executor serves no files of its own.
    here = os.path.abspath(root)
    app = Flask("grove-executor", root_path=here, instance_path=here, static_folder=None)
    app.config["MAX_CONTENT_LENGTH"] = None  # streamed bodies are capped by each handler instead
    slot = app.extensions[_SLOT] = Slot()

    @app.before_request
    def _authenticate() -> None:
        if request.path != "/healthz":
            authenticate(request.headers.get("Authorization", ""), slot.get().token)

    @app.errorhandler(Exception)
    def _error(exc: Exception) -> Response:
        return _error_response(exc)

    @app.get("/healthz")
    def healthz() -> Response:
        return _reply({"ok": True})

    @app.post("/v1/snapshot")
    def snapshot() -> Response:
        # A checkpoint on a backend that keeps files as snapshots (Knative): the workspace to S3 now.
        taken = Snapshots(slot.get().settings).take("checkpoint")
        if taken is None:
            raise Conflict("this sandbox keeps no snapshots: its backend keeps its files itself")
        return _reply(taken)

    @app.post("/v1/computer")
    def computer() -> Response:
        body = wire.decode(request.get_data(cache=False), request.content_type)
        answer = slot.get().desktop.act(body)
        shot = answer.pop("screenshot")
        if _wants_msgpack():  # the router's: the images as bytes, the thumbnail beside
            answer["screenshot"] = {"png": shot.png, "width": shot.width, "height": shot.height,
                                    "thumb": shot.thumb, "thumb_width": shot.thumb_width,
                                    "thumb_height": shot.thumb_height}
        else:
            answer["screenshot"] = {"media_type": "image/png", "data": base64.b64encode(shot.png).decode(),
                                    "width": shot.width, "height": shot.height}
        return _reply(answer)

    @app.get("/v1/display/screen")
    def display_screen() -> Response:
        shot = slot.get().desktop.peek()
        return _reply({"png": shot.png, "width": shot.width, "height": shot.height})

    @app.route("/v1/display", methods=["GET", "POST"])
    def display() -> Response:
        desktop = slot.get().desktop
        if request.method == "GET":
            return _reply(desktop.status())
        body = wire.decode(request.get_data(cache=False), request.content_type) if request.content_length else {}
        browser = body.get("browser") if isinstance(body, dict) else None
        if browser is not None and not isinstance(browser, str):
            raise BadRequest("'browser' must be a URL")
        return _reply(desktop.start(browser))

    @app.route("/v1/files", methods=["GET", "PUT", "DELETE"])
    def files() -> Response:
        paths, settings = slot.get().paths, slot.get().settings
        api = paths.api_path(request.args.get("path", ""))
        if request.method == "GET":
            size, chunks = open_for_read(paths, api)
            return Response(chunks, mimetype="application/octet-stream", headers={"Content-Length": str(size)})
        if request.method == "PUT":
            written = write_atomic(
                paths,
                api,
                request.stream,
                mode=parse_mode(request.args.get("mode")),
                limit=settings.max_file_bytes,
                length=request.content_length,
            )
            return _reply({"path": api, "size": written}, status=201)
        delete(paths, api, recursive=request.args.get("recursive") in ("1", "true"))
        return _reply({"path": api, "deleted": True})

    @app.get("/v1/files/list")
    def files_list() -> Response:
        paths = slot.get().paths
        api = paths.api_path(request.args.get("path", "") or ".")
        return _reply({"path": api, "entries": listing(paths, api)})

    @app.get("/v1/files/manifest")
    def files_manifest() -> Response:
        paths = slot.get().paths
        api = paths.api_path(request.args.get("path", "") or ".")
        skip = frozenset(request.args.getlist("skip"))
        return _reply({"path": api, "entries": manifest(paths, api, skip)})

    @app.get("/v1/outputs")
    def kept_output() -> Response:
        # The full output of a truncated exec, from the descriptor it was written through (outputs.py).
        served = slot.get()
        output = served.outputs.take(served.paths.api_path(request.args.get("path", "")))
        headers = {"Content-Length": str(output.size), "X-Grove-Sha256": output.sha256}
        return Response(read_kept(output), mimetype="application/octet-stream", headers=headers)

    @app.post("/v1/artifacts/push")
    def artifacts_push() -> Response:
        paths = slot.get().paths
        items = check_items(wire.decode(request.get_data(cache=False), request.content_type))
        resolved = [(paths.api_path(api), url) for api, url in items]
        require_files(paths, [api for api, _ in resolved])
        results = []
        for api, url in resolved:
            try:
                results.append({"path": api, **put_file(paths, api, url)})
            except OSError as exc:
                # No route to storage (egress denied) is an answer, not a failure: the caller can relay.
                results.append({"path": api, "uploaded": False, "error": f"{type(exc).__name__}: {exc}"})
        return _reply({"items": results})

    @app.route("/v1/archive", methods=["GET", "PUT"])
    def archive() -> Response:
        paths, settings = slot.get().paths, slot.get().settings
        api = paths.api_path(request.args.get("path", ""))
        if request.method == "GET":
            return Response(stream_tar(paths, api), mimetype="application/x-tar")
        members = extract_tar(
            request.stream,
            paths,
            api,
            max_bytes=settings.max_archive_bytes,
            max_members=settings.max_archive_members,
        )
        return _reply({"path": api, "members": members}, status=201)

    # The SWE-ReX remote-runtime protocol (SWE-agent's), behind the same bearer token.
    app.register_blueprint(swerex_blueprint(slot.get), url_prefix="/swerex")
    app.register_blueprint(processes_blueprint(slot.get), url_prefix="/v1/processes")
    # envd's process service for the router's E2B layer (private to it: envd's shapes) on the same process table.
    app.register_blueprint(e2b_blueprint(slot.get), url_prefix="/e2b")
    # Ports and the terminal: connections upgraded, then carried by a relay thread (executor.ports).
    app.register_blueprint(ports_blueprint(slot.get))
    # POST /v1/exec, the hot route, answered in front of Flask (executor.exec_route); the rest by the routes above.
    app.wsgi_app = ExecRoute(app.wsgi_app, slot)  # type: ignore[method-assign]
    return app


def _wants_msgpack() -> bool:
    return wire.is_msgpack(request.headers.get("Accept"))


def _reply(value: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    as_msgpack = _wants_msgpack()
    return Response(wire.encode(value, as_msgpack), status=status, mimetype=body_type(as_msgpack), headers=headers)


def _error_response(exc: Exception) -> Response:
    """An exception as the one error answer (executor.answers)."""
    err = as_grove_error(exc, request.method, request.path)
    return _reply(err.to_body(), status=err.status, headers=error_headers(err))
