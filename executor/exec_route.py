"""``/v1/exec`` as a thin WSGI layer in front of Flask: the executor's hot route without Flask's per-request
machinery (request context, URL matching, hooks, response object), with the same bearer check, limits,
errors and answers (:mod:`executor.answers`). Every other path goes on to the Flask app.

Measured (perf/README.md, issue 38): the sandbox's CPU per exec of ``true`` and the exec's p50 through the
router, this layer against the Flask route, alternated call by call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs

from executor.answers import as_grove_error, authenticate, body_type, error_headers, frames, stream_type
from executor.dedup import Deduplicator
from executor.jsonfit import JSON_FACTOR, escaped_size, fit_for_json
from executor.models import ExecRequest
from executor.runner import Chunk
from executor.served import Served, Slot
from grove.core import wire
from grove.core.errors import BadRequest, MethodNotAllowed, TooLarge

EXEC_PATH = "/v1/exec"
Environ = dict[str, Any]
StartResponse = Callable[..., Any]
WSGIApp = Callable[[Environ, StartResponse], Iterable[bytes]]
Answer = tuple[int, dict[str, str], Iterable[bytes]]


class ExecRoute:
    """WSGI middleware: answers ``/v1/exec`` itself, passes anything else to ``inner`` (the Flask app)."""

    def __init__(self, inner: WSGIApp, slot: Slot) -> None:
        self._inner = inner
        self._slot = slot

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        """Serve one request."""
        if environ.get("PATH_INFO") != EXEC_PATH:
            return self._inner(environ, start_response)
        method = environ.get("REQUEST_METHOD", "")
        as_msgpack = wire.is_msgpack(environ.get("HTTP_ACCEPT"))
        try:
            served = self._slot.get()
            authenticate(environ.get("HTTP_AUTHORIZATION", ""), served.token)
            if method != "POST":
                raise MethodNotAllowed(f"{method} is not allowed on {EXEC_PATH}")
            status, headers, body = exec_answer(served, environ, as_msgpack)
        except Exception as exc:
            err = as_grove_error(exc, method, EXEC_PATH)
            status, headers = err.status, {"Content-Type": body_type(as_msgpack), **error_headers(err)}
            body = [wire.encode(err.to_body(), as_msgpack)]
        if isinstance(body, list):
            headers["Content-Length"] = str(sum(map(len, body)))
        start_response(f"{status} {HTTPStatus(status).phrase}", list(headers.items()))
        return body


def exec_answer(served: Served, environ: Environ, as_msgpack: bool) -> Answer:
    """Run the command a ``POST /v1/exec`` asks for; its status, headers and body (a list when whole, frames
    when ``?stream=1``). Bad input raises the ``GroveError`` that names it."""
    settings, runner, dedup = served.settings, served.runner, served.dedup
    length = _content_length(environ)
    if length is not None and length > settings.max_request_bytes:
        raise TooLarge(f"exec body of {length} bytes exceeds {settings.max_request_bytes}")
    body = environ["wsgi.input"].read(settings.max_request_bytes + 1)
    if len(body) > settings.max_request_bytes:
        raise TooLarge(f"exec body exceeds {settings.max_request_bytes} bytes")
    req = ExecRequest.parse(wire.decode(body, environ.get("CONTENT_TYPE")), settings)
    stream = parse_qs(environ.get("QUERY_STRING", "")).get("stream", [""])[0] in ("1", "true")
    events: Iterable[Chunk | dict[str, Any]]
    if req.request_id is not None:
        first, entry = dedup.claim(req.request_id, req.fingerprint())
        if not first:
            earlier = dedup.wait(entry, req.timeout_s + 30)
            if earlier is None:
                raise BadRequest(f"request_id {req.request_id!r} belongs to a call that failed or still runs")
            earlier = earlier if as_msgpack else fit_for_json(earlier, req.max_output_bytes)
            return _whole_or_streamed([earlier], stream, as_msgpack)
        try:
            started = runner.run(req)
        except BaseException:
            dedup.finish(req.request_id, entry, None)
            raise
        events = _remember(started, dedup, req.request_id, entry)
    else:
        events = runner.run(req)
    if not as_msgpack:
        events = _fitted(events, req.max_output_bytes)
    return _whole_or_streamed(events, stream, as_msgpack)


def _content_length(environ: Environ) -> int | None:
    try:
        length = int(environ.get("CONTENT_LENGTH") or "")
    except ValueError:
        return None
    return length if length >= 0 else None


def _whole_or_streamed(events: Iterable[Chunk | dict[str, Any]], stream: bool, as_msgpack: bool) -> Answer:
    if stream:
        return 200, {"Content-Type": stream_type(as_msgpack), "X-Accel-Buffering": "no"}, frames(events, as_msgpack)
    result: dict[str, Any] = {}
    for event in events:
        if isinstance(event, dict):
            result = event
    return 200, {"Content-Type": body_type(as_msgpack)}, [wire.encode(result, as_msgpack)]


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


def _fitted(events: Iterable[Chunk | dict[str, Any]], max_output_bytes: int) -> Iterator[Chunk | dict[str, Any]]:
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
