"""``POST /sandbox-fusion/run_code``: one program compiled and run in a sandbox of its own.

The sandbox is claimed from the caller's project's warm pool named ``sandbox-fusion`` (a fresh ``default``
sandbox when the project has no such pool), labelled with the request (``task_id`` ``run_code-<id>``,
harness ``sandbox-fusion``, the language and the code's sha256), and deleted once the answer is ready: a
sandbox one request touched never serves another. Every step (files written, compile, run, files fetched)
goes through :class:`~router.api.compat.calls.SandboxCalls`, so the sandbox's trajectory holds them as grove's
own calls. A request grove cannot run (no sandbox could be made, the executor lost) answers 200 with
``status: SandboxError``, as SandboxFusion does, and its client retries it; bad input is a 4xx.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import posixpath
import uuid
from typing import Any

from aiohttp import web

from grove.core.errors import BadRequest, GroveError, Invalid, NotFound
from grove.core.schema import parse
from router.api.appkeys import project_of, service_of
from router.api.compat.calls import SandboxCalls
from router.api.compat.fusion.languages import Language, language, shell
from router.api.compat.fusion.models import RunCodeBody, command_result, run_answer
from router.api.replies import reply
from router.api.sandboxes import read_body
from router.lifecycle.service import SandboxService
from router.models import CreateRequest, Metadata

log = logging.getLogger("grove.router")
POOL = "sandbox-fusion"
"""The warm pool ``run_code`` claims from, in the caller's project."""
WORKDIR = "/workspace"


async def run_code(request: web.Request) -> web.Response:
    """SandboxFusion's ``run_code``: its ``RunCodeResponse``, field for field."""
    body = parse(RunCodeBody, await read_body(request))
    lang = language(body.language)
    files = {_place(path): _decoded(path, content) for path, content in body.files.items()}
    fetch = {path: _place(path) for path in body.fetch_files}
    service, project = service_of(request), project_of(request)
    try:
        record = await service.create(_create(service, body, project), frozenset({"pool", "metadata", "workdir"}),
                                      project)
    except GroveError as exc:
        return reply(request, run_answer("SandboxError", f"no sandbox for the run: {exc.message}"))
    calls = SandboxCalls(service, record, "sandbox-fusion")
    try:
        answer = await _run(calls, body, lang, files, fetch)
    except GroveError as exc:
        answer = run_answer("SandboxError", f"{exc.code}: {exc.message}", sandbox_id=record.id)
    finally:
        try:
            await service.delete(record.id, reason="sandbox-fusion run_code answered")
        except GroveError as exc:  # the answer stands; the reaper deletes what is left
            log.warning("run_code: deleting %s failed: %s", record.id, exc.message)
    return reply(request, answer)


def _create(service: SandboxService, body: RunCodeBody, project: str) -> CreateRequest:
    """A create claiming from the project's pool (if it has one), labelled with the request."""
    try:
        pool: str | None = service.pools.get(POOL, project).definition.name
    except NotFound:
        pool = None
    labels = {"api": "sandbox-fusion", "language": body.language,
              "code_sha256": hashlib.sha256(body.code.encode()).hexdigest()}
    metadata = Metadata(task_id=f"run_code-{uuid.uuid4().hex[:16]}", harness="sandbox-fusion", labels=labels)
    return CreateRequest(pool=pool, metadata=metadata, heartbeat_timeout_s=600.0, workdir=WORKDIR)


async def _run(calls: SandboxCalls, body: RunCodeBody, lang: Language, files: dict[str, bytes],
               fetch: dict[str, str]) -> dict[str, Any]:
    for path, data in files.items():
        await calls.write(path, data)
    await calls.write(posixpath.join(WORKDIR, lang.source), body.code.encode())
    compiled: dict[str, Any] | None = None
    if lang.compile is not None:
        result = await calls.exec(_exec(lang.compile, body.compile_timeout))
        compiled = command_result(result, body.compile_timeout)
        if result.get("timed_out") or result.get("exit_code") != 0:
            return run_answer("Failed", "", compile_result=compiled, sandbox_id=calls.record.id)
    command = shell(lang, body.memory_limit_MB)
    result = await calls.exec(_exec(command, body.run_timeout, stdin=body.stdin))
    ran = command_result(result, body.run_timeout)
    fetched: dict[str, str] = {}
    for asked, path in fetch.items():  # answered under the paths the request gave
        try:
            fetched[asked] = base64.b64encode(await calls.read(path)).decode()
        except NotFound:
            continue
    ok = ran["status"] == "Finished" and ran["return_code"] == 0
    return run_answer("Success" if ok else "Failed", "", compile_result=compiled, run_result=ran,
                      sandbox_id=calls.record.id, files=fetched)


def _exec(command: str, timeout_s: float, *, stdin: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"command": command, "cwd": WORKDIR, "timeout_s": timeout_s, "request_id": uuid.uuid4().hex}
    if stdin:
        body["stdin"] = stdin.encode()
    return body


def _place(path: str) -> str:
    """A request's file path in the sandbox: relative ones under the working directory."""
    if not path or "\0" in path:
        raise BadRequest(f"file path {path!r} is empty or holds a NUL byte")
    return posixpath.normpath(posixpath.join(WORKDIR, path))


def _decoded(path: str, content: str | None) -> bytes:
    if content is None:
        return b""
    try:
        return base64.b64decode(content, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise Invalid(f"files[{path!r}] is not base64 ({exc}): SandboxFusion's files carry base64 content") from exc
