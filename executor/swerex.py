"""The SWE-ReX remote-runtime protocol, served by the executor under ``/swerex/``.

SWE-agent (through SWE-ReX's ``RemoteRuntime``) drives a grove sandbox unchanged: the routes, bodies and
answers are those of SWE-ReX's own server (``swerex/server.py``). Two things are SWE-ReX's rather than
grove's, on purpose, because its client depends on them: an exception raised by the runtime (a command
timeout, a non-zero exit with ``check="raise"``, an unknown session) travels as status 511 with
``{"swerexception": {message, class_path, traceback, extra_info}}``, which the client re-raises as the
same class; and unknown request fields are ignored. Everything else — auth (the executor's bearer
token; the router accepts SWE-ReX's ``X-API-Key``), malformed bodies, paths outside the root — answers
like the rest of the executor. Sessions are shells on a pty (:mod:`executor.shell`); a command that
times out has its process group killed and the session lives on, like an exec.
"""

from __future__ import annotations

import contextlib
import io
import os
import zipfile
from collections.abc import Callable, Iterator
from typing import Any

from flask import Blueprint, Response, request

from executor.archive import NEW_FILE, make_dir, member_parent, replace_entry
from executor.files import open_regular, write_atomic
from executor.models import ExecRequest
from executor.paths import PathResolver
from executor.runner import Runner
from executor.served import Served
from executor.settings import ExecutorSettings
from executor.swerex_models import (
    Command,
    CreateSession,
    ReadFile,
    SwerexError,
    WriteFile,
    parse_action,
    parse_close_session,
)
from executor.swerex_sessions import clamp
from grove.core import wire
from grove.core.errors import BadRequest, Conflict, Invalid, NotFound, TooLarge


def _execute(cmd: Command, runner: Runner, settings: ExecutorSettings) -> dict[str, Any]:
    timeout = clamp(cmd.timeout, settings)
    req = ExecRequest(argv=cmd.argv(), cwd=cmd.cwd, env=cmd.env or {}, stdin=b"", timeout_s=timeout,
                      max_output_bytes=settings.default_max_output_bytes, request_id=None)
    try:
        events = runner.run(req)
    except NotFound as exc:
        raise SwerexError("builtins.FileNotFoundError", exc.message) from None
    except Invalid as exc:
        raise SwerexError("builtins.PermissionError", exc.message) from None
    result: dict[str, Any] = {}
    for event in events:
        if isinstance(event, dict):
            result = event
    stdout = bytes(result["stdout"]).decode(errors="backslashreplace")
    stderr = bytes(result["stderr"]).decode(errors="backslashreplace")
    answer = {"stdout": stdout, "stderr": stderr, "exit_code": result["exit_code"]}
    if result["timed_out"]:
        # Its process tree is killed already; what it wrote so far rides along for the record.
        raise SwerexError("CommandTimeoutError", f"Timeout ({cmd.timeout}s) exceeded while running command", answer)
    if cmd.check and result["exit_code"] != 0:
        message = (f"Command {cmd.command!r} failed with exit code {result['exit_code']}. "
                   f"Stdout:\n{stdout!r}\nStderr:\n{stderr!r}")
        raise SwerexError("NonZeroExitCodeError", f"{cmd.error_msg}: {message}" if cmd.error_msg else message,
                          answer)
    return answer


def _os_error(exc: OSError, path: str) -> SwerexError:
    return SwerexError(f"builtins.{type(exc).__name__}", f"[Errno {exc.errno}] {exc.strerror}: {path!r}")


@contextlib.contextmanager
def _as_builtins(path: str) -> Iterator[None]:
    """File errors as the builtin exceptions SWE-ReX's own server raises (its client re-raises them)."""
    try:
        yield
    except NotFound as exc:
        raise SwerexError("builtins.FileNotFoundError", f"[Errno 2] {exc.message}: {path!r}") from None
    except Conflict as exc:  # a directory where a file goes, or the other way round
        kind = "IsADirectoryError" if " is a directory" in exc.message else "FileExistsError"
        raise SwerexError(f"builtins.{kind}", f"{exc.message}: {path!r}") from None
    except OSError as exc:
        raise _os_error(exc, path) from None


def _read(req: ReadFile, paths: PathResolver, settings: ExecutorSettings) -> dict[str, Any]:
    with _as_builtins(req.path):
        try:
            fd, st = open_regular(paths, paths.api_path(req.path), what=req.path)
        except BadRequest as exc:  # a directory, a FIFO, a device: what open() and read() would raise
            kind = "IsADirectoryError" if " is a directory" in exc.message else "OSError"
            raise SwerexError(f"builtins.{kind}", exc.message) from None
    with os.fdopen(fd, "rb") as fh:
        if st.st_size > settings.max_request_bytes:
            raise TooLarge(f"{req.path} is larger than {settings.max_request_bytes} bytes; use the files API")
        data = fh.read(settings.max_request_bytes + 1)  # it may have grown since fstat
    if len(data) > settings.max_request_bytes:
        raise TooLarge(f"{req.path} is larger than {settings.max_request_bytes} bytes; use the files API")
    try:
        # Decoded exactly as open(path, encoding=..., errors=...) would (universal newlines included).
        return {"content": io.TextIOWrapper(io.BytesIO(data), encoding=req.encoding, errors=req.errors).read()}
    except (UnicodeDecodeError, LookupError) as exc:
        raise SwerexError(f"builtins.{type(exc).__name__}", str(exc)) from None


def _unzip(archive: Any, target: int, settings: ExecutorSettings) -> None:
    """Extract like ``ZipFile.extractall`` (names made safe the same way), bounded, permissions kept.

    Members resolve on the target's descriptor without following links, like a tar's (:mod:`executor.archive`).
    """
    try:
        zf = zipfile.ZipFile(archive)
    except zipfile.BadZipFile as exc:
        raise SwerexError("zipfile.BadZipFile", str(exc)) from None
    with zf:
        members = zf.infolist()
        if len(members) > settings.max_archive_members:
            raise TooLarge(f"zip of {len(members)} members exceeds {settings.max_archive_members}")
        budget = settings.max_archive_bytes
        for info in members:
            parts = [p for p in info.filename.replace("\\", "/").split("/") if p not in ("", ".", "..")]
            if not parts:
                continue
            parent = member_parent(target, parts, info.filename)
            try:
                if info.is_dir():
                    make_dir(parent, parts[-1], 0o755)
                    continue
                replace_entry(parent, parts[-1])
                with zf.open(info) as src, os.fdopen(os.open(parts[-1], NEW_FILE, 0o644, dir_fd=parent), "wb") as out:
                    while chunk := src.read(1 << 20):
                        budget -= len(chunk)
                        if budget < 0:
                            raise TooLarge(f"zip expands past {settings.max_archive_bytes} bytes")
                        out.write(chunk)
                    if mode := (info.external_attr >> 16) & 0o7777:
                        os.fchmod(out.fileno(), mode)
            finally:
                os.close(parent)


def swerex_blueprint(served: Callable[[], Served]) -> Blueprint:
    """The ``/swerex/...`` routes of one executor (registered by ``app_shell``); ``served()`` is its sandbox."""
    bp = Blueprint("swerex", __name__)

    def body() -> Any:
        limit = served().settings.max_request_bytes
        data = request.get_data(cache=False)
        if len(data) > limit:
            raise TooLarge(f"body exceeds {limit} bytes")
        return wire.decode(data, request.content_type or wire.JSON)

    @bp.errorhandler(SwerexError)
    def _transfer(exc: SwerexError) -> Response:
        return _json(exc.to_body(), 511)

    @bp.errorhandler(OSError)
    def _os(exc: OSError) -> Response:
        # A bad path or a full disk is the caller's answer (re-raised by the client as the same builtin),
        # not a failure of the executor.
        return _transfer(_os_error(exc, str(exc.filename or "")))

    @bp.get("/")
    def root() -> Response:
        return _json({"message": "hello world"})

    @bp.get("/is_alive")
    def is_alive() -> Response:
        return _json({"is_alive": True, "message": ""})

    @bp.post("/create_session")
    def create_session() -> Response:
        return _json({"output": served().sessions.create(CreateSession.parse(body())), "session_type": "bash"})

    @bp.post("/run_in_session")
    def run_in_session() -> Response:
        return _json(served().sessions.run(parse_action(body())))

    @bp.post("/close_session")
    def close_session() -> Response:
        served().sessions.close(parse_close_session(body()))
        return _json({"session_type": "bash"})

    @bp.post("/execute")
    def execute() -> Response:
        return _json(_execute(Command.parse(body()), served().runner, served().settings))

    @bp.post("/read_file")
    def read_file() -> Response:
        return _json(_read(ReadFile.parse(body()), served().paths, served().settings))

    @bp.post("/write_file")
    def write_file() -> Response:
        req = WriteFile.parse(body())
        paths, settings = served().paths, served().settings
        data = req.content.encode(errors="surrogateescape")
        with _as_builtins(req.path):
            write_atomic(paths, paths.api_path(req.path), io.BytesIO(data), mode=None,
                         limit=settings.max_file_bytes, length=len(data))
        return _json({})

    @bp.post("/upload")
    def upload() -> Response:
        paths, settings = served().paths, served().settings
        length = request.content_length
        if length is not None and length > settings.max_file_bytes:
            raise TooLarge(f"upload of {length} bytes exceeds {settings.max_file_bytes}")
        target_api = request.form.get("target_path")
        upload = request.files.get("file")
        if not target_api or upload is None:
            raise Invalid("upload needs multipart fields 'file' and 'target_path'")
        api = paths.api_path(target_api)
        if request.form.get("unzip", "false").lower() in ("true", "1", "yes", "on"):
            with _as_builtins(target_api):
                target = paths.open_dir(api, create=True)
            try:
                _unzip(upload.stream, target, settings)
            finally:
                os.close(target)
        else:
            with _as_builtins(target_api):
                write_atomic(paths, api, upload.stream, mode=None, limit=settings.max_file_bytes, length=None)
        return _json({})

    @bp.post("/close")
    def close() -> Response:
        served().sessions.close_all()
        return _json({})

    return bp


def _json(value: Any, status: int = 200) -> Response:
    # SWE-ReX's client reads JSON only; these answers never switch to msgpack.
    return Response(wire.encode(value, False), status=status, mimetype=wire.JSON)

