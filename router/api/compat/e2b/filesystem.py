"""envd's ``filesystem.Filesystem`` service (``Stat``, ``ListDir``, ``MakeDir``, ``Move``, ``Remove``) and its
plain ``/files`` routes, over grove's own file calls and execs (each recorded in the trajectory).

``Stat``, ``MakeDir`` and ``Move`` run coreutils in the sandbox (``stat``, ``mkdir``, ``mv``: an image without
them answers ``unavailable``); listing, reading, writing and removing use the executor's file API.
"""

from __future__ import annotations

import datetime
import posixpath
import stat as statmod
import uuid
from typing import Any

from aiohttp import BodyPartReader, web

from grove.core.errors import BadRequest, NotFound
from router.api.compat.calls import SandboxCalls
from router.api.compat.e2b.wire import ConnectError

MAX_DEPTH = 8
_TYPES = {"file": "FILE_TYPE_FILE", "dir": "FILE_TYPE_DIRECTORY", "symlink": "FILE_TYPE_SYMLINK"}
_STAT_FORMAT = "%s\t%f\t%U\t%G\t%Y"  # size, raw mode (hex), owner, group, mtime


def _path(body: dict[str, Any], name: str = "path") -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value:
        raise BadRequest(f"'{name}' must be a non-empty path")
    return value


async def _run(calls: SandboxCalls, argv: list[str]) -> dict[str, Any]:
    result = await calls.exec({"command": argv, "timeout_s": 60, "request_id": uuid.uuid4().hex})
    return result


def _failure(result: dict[str, Any], path: str) -> ConnectError:
    err = bytes(result.get("stderr") or b"").decode("utf-8", "replace").strip()
    if "No such file" in err:
        return ConnectError("not_found", f"path '{path}' does not exist")
    if "Permission denied" in err:
        return ConnectError("permission_denied", f"{path}: permission denied")
    return ConnectError("invalid_argument", err or f"{path}: exit code {result.get('exit_code')}")


def _entry(path: str, kind: str, size: int, mode: int, mtime: float, owner: str = "",
           group: str = "") -> dict[str, Any]:
    """envd's ``EntryInfo``."""
    return {"name": posixpath.basename(path.rstrip("/")) or "/", "type": _TYPES.get(kind, "FILE_TYPE_UNSPECIFIED"),
            "path": path, "size": str(size), "mode": statmod.S_IMODE(mode), "permissions": statmod.filemode(mode),
            "owner": owner, "group": group,
            "modifiedTime": datetime.datetime.fromtimestamp(mtime, datetime.UTC).isoformat().replace("+00:00", "Z")}


async def _stat(calls: SandboxCalls, path: str) -> dict[str, Any]:
    result = await _run(calls, ["stat", "-c", _STAT_FORMAT, "--", path])
    if result.get("exit_code") != 0:
        raise _failure(result, path)
    size, raw_mode, owner, group, mtime = bytes(result["stdout"]).decode().rstrip("\n").split("\t")
    mode = int(raw_mode, 16)
    name = "dir" if statmod.S_ISDIR(mode) else "symlink" if statmod.S_ISLNK(mode) else "file"
    return _entry(path, name, int(size), mode, float(mtime), owner, group)


async def stat_entry(calls: SandboxCalls, body: dict[str, Any]) -> dict[str, Any]:
    """``Stat``."""
    return {"entry": await _stat(calls, _path(body))}


async def list_dir(calls: SandboxCalls, body: dict[str, Any]) -> dict[str, Any]:
    """``ListDir``, ``depth`` levels down (1 by default)."""
    root = _path(body)
    depth = body.get("depth") or 1
    if not isinstance(depth, int) or not 1 <= depth <= MAX_DEPTH:
        raise BadRequest(f"depth must be from 1 to {MAX_DEPTH}")
    entries: list[dict[str, Any]] = []
    level = [root]
    for _ in range(depth):
        below = []
        for directory in level:
            try:
                found = await calls.listing(directory)
            except NotFound:
                raise ConnectError("not_found", f"path '{directory}' does not exist") from None
            for item in found:
                path = posixpath.join(directory, str(item["name"]))
                entries.append(_entry(path, str(item["type"]), int(item.get("size") or 0),
                                      int(item.get("mode") or 0), float(item.get("mtime") or 0)))
                if item["type"] == "dir":
                    below.append(path)
        level = below
    return {"entries": entries}


async def make_dir(calls: SandboxCalls, body: dict[str, Any]) -> dict[str, Any]:
    """``MakeDir``: ``already_exists`` if the path exists (the SDK's ``make_dir`` then answers False)."""
    path = _path(body)
    result = await _run(calls, ["/bin/sh", "-c", '[ -e "$1" ] && exit 17; exec mkdir -p -- "$1"', "sh", path])
    if result.get("exit_code") == 17:
        raise ConnectError("already_exists", f"directory '{path}' already exists")
    if result.get("exit_code") != 0:
        raise _failure(result, path)
    return {"entry": await _stat(calls, path)}


async def move(calls: SandboxCalls, body: dict[str, Any]) -> dict[str, Any]:
    """``Move`` (a rename: the destination is the new path, never a directory to move into)."""
    source, destination = _path(body, "source"), _path(body, "destination")
    result = await _run(calls, ["mv", "-T", "--", source, destination])
    if result.get("exit_code") != 0:
        raise _failure(result, source)
    return {"entry": await _stat(calls, destination)}


async def remove(calls: SandboxCalls, body: dict[str, Any]) -> dict[str, Any]:
    """``Remove`` (a directory with everything in it)."""
    path = _path(body)
    try:
        await calls.remove(path)
    except NotFound:
        raise ConnectError("not_found", f"path '{path}' does not exist") from None
    return {}


async def read_file(request: web.Request, calls: SandboxCalls) -> web.Response:
    """``GET /files?path=``: the file's bytes."""
    path = request.query.get("path", "")
    if not path:
        raise BadRequest("'path' is required")
    return web.Response(body=await calls.read(path), content_type="application/octet-stream")


async def write_files(request: web.Request, calls: SandboxCalls) -> web.Response:
    """``POST /files``: one octet-stream body to ``?path=``, or multipart files each named by its path; answers
    envd's ``[{name, type, path}]``."""
    if request.headers.get("Content-Encoding"):
        raise BadRequest("compressed uploads are not supported by grove's E2B endpoint")
    written: list[str] = []
    if request.content_type == "application/octet-stream":
        path = request.query.get("path", "")
        if not path:
            raise BadRequest("'path' is required for an octet-stream upload")
        await calls.write(path, await request.read())
        written.append(path)
    else:
        reader = await request.multipart()
        async for part in reader:
            if not isinstance(part, BodyPartReader) or part.filename is None:
                continue
            path = request.query.get("path") or part.filename
            await calls.write(path, bytes(await part.read()))
            written.append(path)
    if not written:
        raise BadRequest("no file in the upload")
    return web.json_response([{"name": posixpath.basename(p), "type": "file", "path": p} for p in written])
