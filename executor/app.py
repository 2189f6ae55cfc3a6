"""The executor's Flask app: ``create_app(settings)``; gunicorn runs it as ``executor.app:create_app()``.

``create_app`` is :func:`app_shell` (the routes) and :func:`bind` (one sandbox's settings and state); the local
backend's zygote builds the shell ahead of its forks (see :mod:`executor.served`).
"""

from __future__ import annotations

import base64
import errno
import hmac
import logging
import os
from collections.abc import Iterator
from typing import Any

from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException

from executor.archive import extract_tar, stream_tar
from executor.dedup import Deduplicator
from executor.e2b_processes import e2b_blueprint
from executor.files import delete, listing, open_for_read, parse_mode, write_atomic
from executor.jsonfit import JSON_FACTOR, escaped_size, fit_for_json
from executor.manifest import manifest
from executor.models import ExecRequest
from executor.outputs import read_kept
from executor.ports import ports_blueprint
from executor.process_routes import processes_blueprint
from executor.push import check_items, put_file, require_files
from executor.runner import Chunk
from executor.served import Served, Slot
from executor.settings import ExecutorSettings
from executor.snapshot import Snapshots
from executor.swerex import swerex_blueprint
from grove.core import wire
from grove.core.api import chunk_frame, encode_frame, error_frame, result_frame
from grove.core.errors import (
    BadRequest,
    Conflict,
    Forbidden,
    GroveError,
    InternalError,
    MethodNotAllowed,
    NotFound,
    TooLarge,
    Unauthorized,
)

log = logging.getLogger("grove.executor")


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
        if request.path == "/healthz":
            return
        token = slot.get().token
        header = request.headers.get("Authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not given:
            raise Unauthorized("missing 'Authorization: Bearer <token>' header")
        if not hmac.compare_digest(given.strip().encode(), token):
            raise Unauthorized("the bearer token is not valid for this sandbox")

    @app.errorhandler(Exception)
    def _error(exc: Exception) -> Response:
        return _error_response(exc)

    @app.get("/healthz")
    def healthz() -> Response:
        return _reply({"ok": True})

    @app.post("/v1/exec")
    def exec_() -> Response:
        served = slot.get()
        settings, runner, dedup = served.settings, served.runner, served.dedup
        length = request.content_length
        if length is not None and length > settings.max_request_bytes:
            raise TooLarge(f"exec body of {length} bytes exceeds {settings.max_request_bytes}")
        body = request.get_data(cache=False)
        if len(body) > settings.max_request_bytes:
            raise TooLarge(f"exec body exceeds {settings.max_request_bytes} bytes")
        req = ExecRequest.parse(wire.decode(body, request.content_type), settings)
        stream = request.args.get("stream") in ("1", "true")
        if req.request_id is not None:
            first, entry = dedup.claim(req.request_id, req.fingerprint())
            if not first:
                earlier = dedup.wait(entry, req.timeout_s + 30)
                if earlier is None:
                    raise BadRequest(f"request_id {req.request_id!r} belongs to a call that failed or still runs")
                earlier = earlier if _wants_msgpack() else fit_for_json(earlier, req.max_output_bytes)
                return _stream_of([earlier]) if stream else _reply(earlier)
            try:
                started = runner.run(req)
            except BaseException:
                dedup.finish(req.request_id, entry, None)
                raise
            events = _remember(started, dedup, req.request_id, entry)
        else:
            events = runner.run(req)
        if not _wants_msgpack():
            events = _fitted(events, req.max_output_bytes)
        if stream:
            return _stream_of(events)
        result: dict[str, Any] = {}
        for event in events:
            if isinstance(event, dict):
                result = event
        return _reply(result)

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
    return app


def _remember(
    events: Iterator[Chunk | dict[str, Any]], dedup: Deduplicator, request_id: str, entry: Any
) -> Iterator[Chunk | dict[str, Any]]:
    """Pass events through and publish the final result to retries of the same request id."""
    result: dict[str, Any] | None = None
    try:
        for event in events:
            if isinstance(event, dict):
                result = event
            yield event
    finally:
        dedup.finish(request_id, entry, result)


def _fitted(events: Iterator[Chunk | dict[str, Any]], max_output_bytes: int) -> Iterator[Chunk | dict[str, Any]]:
    """The events, the result's streams cut to fit their budget once escaped for JSON (jsonfit.py); streamed
    chunks stop once a stream's escaped chunks reach it (the result still carries head and tail)."""
    spent = {"stdout": 0, "stderr": 0}
    for event in events:
        if isinstance(event, dict):
            yield fit_for_json(event, max_output_bytes)
            continue
        spent[event.stream] += escaped_size(event.data)
        if spent[event.stream] <= JSON_FACTOR * max_output_bytes:
            yield event


def _wants_msgpack() -> bool:
    return wire.is_msgpack(request.headers.get("Accept"))


def _reply(value: Any, status: int = 200) -> Response:
    as_msgpack = _wants_msgpack()
    return Response(
        wire.encode(value, as_msgpack),
        status=status,
        mimetype=wire.MSGPACK if as_msgpack else wire.JSON,
    )


def _stream_of(events: Any) -> Response:
    """Chunked response: one frame per chunk (msgpack objects, or JSON lines), the result last."""
    as_msgpack = _wants_msgpack()

    def frames() -> Iterator[bytes]:
        try:
            for event in events:
                frame = chunk_frame(event.stream, event.data) if isinstance(event, Chunk) else result_frame(event)
                yield encode_frame(frame, as_msgpack)
        except GroveError as exc:
            yield encode_frame(error_frame(exc.to_body()), as_msgpack)

    mimetype = wire.MSGPACK if as_msgpack else "application/x-ndjson"
    return Response(frames(), mimetype=mimetype, headers={"X-Accel-Buffering": "no"})


_CLIENT_ERRNOS: dict[int, type[GroveError]] = {
    errno.ENAMETOOLONG: BadRequest, errno.ELOOP: BadRequest, errno.EINVAL: BadRequest, errno.EILSEQ: BadRequest,
    errno.ENOENT: NotFound, errno.ENOTDIR: NotFound, errno.EACCES: Forbidden, errno.EPERM: Forbidden,
    errno.EROFS: Forbidden, errno.EISDIR: Conflict, errno.EEXIST: Conflict, errno.ENOTEMPTY: Conflict,
    errno.ENOSPC: TooLarge, errno.EDQUOT: TooLarge, errno.EFBIG: TooLarge,
}


def _error_response(exc: Exception) -> Response:
    """The one place an exception becomes an HTTP error."""
    if isinstance(exc, HTTPException):
        code = exc.code or 500
        if code == 404:
            err: GroveError = NotFound(f"no such endpoint: {request.method} {request.path}")
        elif code == 405:
            err = MethodNotAllowed(f"{request.method} is not allowed on {request.path}")
        elif code == 413:
            err = TooLarge("request body too large")
        else:
            err = BadRequest(exc.description or "bad request") if code < 500 else InternalError(str(exc))
    elif isinstance(exc, GroveError):
        err = exc
    elif isinstance(exc, OSError) and exc.errno in _CLIENT_ERRNOS:
        # A path the caller chose that the kernel refuses (too long, a loop, not a directory, ...):
        # the caller's mistake, named, not a server error.
        err = _CLIENT_ERRNOS[exc.errno](f"{os.strerror(exc.errno)}: {exc.filename or request.path}")
    else:
        log.exception("unhandled error on %s %s", request.method, request.path)
        err = InternalError(f"executor error: {type(exc).__name__}: {exc}")
    resp = _reply(err.to_body(), status=err.status)
    if err.retry_after is not None:
        resp.headers["Retry-After"] = str(max(1, round(err.retry_after)))
    return resp
