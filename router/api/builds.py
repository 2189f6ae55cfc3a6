"""``POST /v1/images/build``: a Dockerfile build in one call. The body is the build context as a tar (what
``tar -C CONTEXT -c .`` makes); the query names the Dockerfile in it, the tag, build arguments, the steps' network
and ``no_cache``. The answer streams as JSON lines (``application/x-ndjson``): ``{"line": TEXT}`` as the build
goes, then ``{"image": NAME, "digest", "steps", "cached", "seconds"}``, or ``{"error": {"code", "message"}}``
(a failing step's names its Dockerfile line).

The router runs grove's one builder (:mod:`grove.build.builder`) as a process of its own (``python -m
grove.build``): an API client of this router with the caller's key, so every step's sandbox is the caller's
project's, counted against its quota like any other. The server imports no SDK code; the context is unpacked
with Python's ``data`` tar filter (nothing absolute, no link or ``..`` out of it, no devices) into a temporary
directory removed with the build. A caller gone mid-build ends the build's process, which deletes the sandbox
of the step it was running.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from grove.core.errors import BadRequest, GroveError, TooLarge, error_body
from grove.core.schema import parse_query, spec

MAX_CONTEXT_BYTES = 512 * 1024 * 1024
"""The largest build context a build call takes (its tar)."""
NDJSON = "application/x-ndjson"
_CHUNK = 1 << 16
_WATCH_S = 0.5
_STOP_S = 30.0


@dataclass(frozen=True)
class BuildQuery:
    """The query of ``POST /v1/images/build`` (the body is the context's tar)."""

    tag: str = spec("the image's name", max_len=200)
    dockerfile: str = spec("the Dockerfile's path in the context", default="Dockerfile", max_len=4096)
    build_arg: str | None = spec("a build argument as `K=V` (repeat the parameter for more)", default=None,
                                 max_len=65536)
    network: str = spec("egress of the RUN steps' sandboxes: `deny` (default: no address at all) or `allow`",
                        default="deny", enum=("deny", "allow"))
    no_cache: bool = spec("run every step, even unchanged ones", default=False)


async def build_image(request: web.Request) -> web.StreamResponse:
    """Unpack the context, run the build, stream its output; 4xx before anything streams for a bad call."""
    query = parse_query(BuildQuery, {k: v for k, v in request.query.items() if k != "build_arg"})
    build_args = request.query.getall("build_arg", [])
    for item in build_args:
        if not item.partition("=")[1] or item.startswith("="):
            raise BadRequest(f"build_arg takes K=V, got {item!r}")
    scheme, _, key = request.headers.get("Authorization", "").partition(" ")
    workdir = Path(tempfile.mkdtemp(prefix="grove-build-"))
    try:
        context = workdir / "context"
        await _unpack(request, context)
        dockerfile = (context / query.dockerfile).resolve()
        if not dockerfile.is_relative_to(context.resolve()) or not dockerfile.is_file():
            raise BadRequest(f"dockerfile {query.dockerfile!r}: no such file in the build context (the body is the "
                             "context's tar, its root the context directory)")
        argv = [sys.executable, "-m", "grove.build", "--url", _own_url(request), "--tag", query.tag,
                "--dockerfile", str(dockerfile.relative_to(context.resolve())), "--network", query.network,
                *(a for arg in build_args for a in ("--build-arg", arg)), *(["--no-cache"] if query.no_cache else []),
                str(context)]
        return await _stream(request, argv, key if scheme.lower() == "bearer" else "")
    finally:
        await asyncio.to_thread(shutil.rmtree, workdir, True)


def _own_url(request: web.Request) -> str:
    """This router as the call reached it (the local end of its connection)."""
    sockname = request.transport.get_extra_info("sockname") if request.transport else None
    if not isinstance(sockname, tuple):
        raise BadRequest("builds are served on the router's TCP listener only")
    host = str(sockname[0])
    return f"http://[{host}]:{sockname[1]}" if ":" in host else f"http://{host}:{sockname[1]}"


async def _unpack(request: web.Request, context: Path) -> None:
    """The body (at most :data:`MAX_CONTEXT_BYTES`) into a file, then unpacked into ``context``."""
    if request.content_length is not None and request.content_length > MAX_CONTEXT_BYTES:
        raise TooLarge(f"the build context's tar is {request.content_length} bytes; a build takes at most "
                       f"{MAX_CONTEXT_BYTES} (leave what the Dockerfile does not COPY out of the context)")
    tar_path = context.parent / "context.tar"
    size = 0
    with tar_path.open("wb") as out:
        async for chunk in request.content.iter_chunked(_CHUNK):
            size += len(chunk)
            if size > MAX_CONTEXT_BYTES:
                raise TooLarge(f"the build context's tar is over {MAX_CONTEXT_BYTES} bytes, what a build takes at "
                               "most (leave what the Dockerfile does not COPY out of the context)")
            await asyncio.to_thread(out.write, chunk)
    if size == 0:
        raise BadRequest("the body is empty: send the build context as a tar (tar -C CONTEXT -c .)")
    context.mkdir()

    def unpack() -> None:
        with tarfile.open(tar_path) as tf:
            tf.extractall(context, filter="data")

    try:
        await asyncio.to_thread(unpack)
    except (tarfile.TarError, OSError) as exc:
        raise BadRequest(f"the body is not a build context this router can unpack as a tar: {exc}") from None


async def _stream(request: web.Request, argv: list[str], key: str) -> web.StreamResponse:
    """Run the build's process; its JSON lines go out as they come (an ending without a result says so)."""
    # Only what it needs: the router's own secrets (S3 credentials, its keys file) stay out of the build.
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GROVE_API_KEY": key,
           **{k: os.environ[k] for k in ("PYTHONPATH", "HOME", "LANG") if k in os.environ}}
    proc = await asyncio.create_subprocess_exec(*argv, env=env, stdin=asyncio.subprocess.DEVNULL,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                                                start_new_session=True)
    watcher = asyncio.ensure_future(_watch(request, proc))
    response = web.StreamResponse(headers={"Content-Type": NDJSON})
    ended = False
    try:
        await response.prepare(request)
        assert proc.stdout is not None and proc.stderr is not None
        errors = asyncio.ensure_future(proc.stderr.read())
        while line := await proc.stdout.readline():
            with contextlib.suppress(ValueError):
                ended = ended or not {"image", "error"}.isdisjoint(json.loads(line))
            await response.write(line)
        await proc.wait()
        said = (await errors).decode(errors="replace").strip()
        if not ended:
            await response.write(json.dumps(error_body(GroveError.code, f"the build ended without a result (exit "
                                                       f"{proc.returncode}): {said[-600:]}")).encode() + b"\n")
        await response.write_eof()
    finally:
        watcher.cancel()
        await _stop(proc)
    return response


async def _watch(request: web.Request, proc: asyncio.subprocess.Process) -> None:
    """Stop the build once its caller is gone (a quiet step writes nothing that would find out)."""
    while proc.returncode is None:
        if request.transport is None or request.transport.is_closing():
            await _stop(proc)
            return
        await asyncio.sleep(_WATCH_S)


async def _stop(proc: asyncio.subprocess.Process) -> None:
    """End the build's process (its own session, which this call started): SIGTERM first, which the builder
    takes as a cancel and deletes the sandbox of the step it was running, then SIGKILL if it has not ended in
    :data:`_STOP_S`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(proc.wait()), _STOP_S)
