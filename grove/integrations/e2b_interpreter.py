"""A server speaking the protocol of E2B's code interpreter (what ``e2b-code-interpreter``'s ``run_code`` and
its contexts calls send to port 49999), on Jupyter's own kernel machinery: ``jupyter_client`` runs an
``ipykernel`` per context, so a context keeps its state between calls as in E2B's server.

It runs inside a sandbox (``python3 -m grove.integrations.e2b_interpreter [PORT]``, or this file on its
own: it needs only ``aiohttp`` (3.8, Debian bookworm's, will do), ``jupyter_client`` and ``ipykernel``), and E2B's
SDK reaches it through grove's E2B endpoint, ``E2b-Sandbox-Port: 49999``. The image ``grove image build-debian
--preset code-interpreter`` makes carries it and starts it (the image's ``Cmd``) on an E2B create.

``POST /execute {code, context_id, language, env_vars}`` answers a stream of JSON lines, E2B's: ``stdout`` and
``stderr`` (``text``, ``timestamp``), ``result`` (the MIME bundle as ``text``, ``html``, ``png``..., and
``is_main_result``), ``error`` (``name``, ``value``, ``traceback``), ``number_of_executions``, then
``end_of_execution``. ``/contexts`` lists, creates (``{language, cwd}``), removes and restarts contexts; Python
is the one language.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import socket
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from jupyter_client.asynchronous.client import AsyncKernelClient
from jupyter_client.manager import AsyncKernelManager

LANGUAGE = "python"
_MIME = {"text/plain": "text", "text/html": "html", "text/markdown": "markdown", "image/svg+xml": "svg",
         "image/png": "png", "image/jpeg": "jpeg", "application/pdf": "pdf", "text/latex": "latex",
         "application/json": "json", "application/javascript": "javascript"}
_ENV_SET = ("import os as __grove_os\n__grove_env_saved = {k: __grove_os.environ.get(k) for k in %r}\n"
            "__grove_os.environ.update(%r)")
_ENV_RESTORE = ("for __k, __v in __grove_env_saved.items():\n"
                "    __grove_os.environ.pop(__k, None) if __v is None else __grove_os.environ.__setitem__(__k, __v)")


class Refused(web.HTTPException):
    """A request the server cannot do: its status and a message a person can act on, as plain text (what
    the SDK puts in its exception)."""

    def __init__(self, status: int, message: str) -> None:
        self.status_code = status
        super().__init__(text=message)


@dataclass
class Context:
    """One kernel, the client kept connected to it, its working directory, and the lock that runs its cells one
    at a time."""

    id: str
    cwd: str
    kernel: AsyncKernelManager
    client: AsyncKernelClient
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def body(self) -> dict[str, str]:
        return {"id": self.id, "language": LANGUAGE, "cwd": self.cwd}


async def start_context(cwd: str, context_id: str | None = None) -> Context:
    """A fresh Python kernel working in ``cwd``."""
    if not os.path.isdir(cwd):
        raise Refused(400, f"cwd {cwd!r} is not a directory in the sandbox")
    kernel = AsyncKernelManager(kernel_name="python3")
    await kernel.start_kernel(cwd=cwd)
    client = kernel.client()
    client.start_channels()
    await client.wait_for_ready(timeout=60)
    return Context(context_id or uuid.uuid4().hex, cwd, kernel, client)


async def stop_context(context: Context) -> None:
    context.client.stop_channels()
    await context.kernel.shutdown_kernel(now=True)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat()


def _line(kind: str, **fields: Any) -> bytes:
    return json.dumps({"type": kind, **fields}).encode() + b"\n"


def _result(content: dict[str, Any], main: bool) -> bytes:
    data: dict[str, Any] = content.get("data", {})
    known = {_MIME[mime]: value for mime, value in data.items() if mime in _MIME}
    extra = {mime: value for mime, value in data.items() if mime not in _MIME}
    return _line("result", **known, is_main_result=main, extra=extra or None)


async def _reply(client: AsyncKernelClient, msg_id: str) -> None:
    """Wait for the shell's reply to ``msg_id`` (so none is left queued for the next cell)."""
    while (await client.get_shell_msg(timeout=60))["parent_header"].get("msg_id") != msg_id:
        pass


async def _silent(context: Context, code: str) -> None:
    await _reply(context.client, context.client.execute(code, silent=True, store_history=False))


async def run_cell(context: Context, code: str) -> AsyncIterator[bytes]:
    """The cell's outputs as E2B's lines, until the kernel is idle again."""
    client = context.client
    msg_id = client.execute(code, store_history=True)
    while True:
        message = await client.get_iopub_msg()
        if message["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = message["msg_type"], message["content"]
        if kind == "stream":
            yield _line("stdout" if content["name"] == "stdout" else "stderr", text=content["text"],
                        timestamp=_now())
        elif kind in ("execute_result", "display_data"):
            yield _result(content, kind == "execute_result")
        elif kind == "error":
            yield _line("error", name=content["ename"], value=content["evalue"],
                        traceback="\n".join(content["traceback"]))
        elif kind == "execute_input":
            yield _line("number_of_executions", execution_count=content["execution_count"])
        elif kind == "status" and content["execution_state"] == "idle":
            await _reply(client, msg_id)
            yield _line("end_of_execution")
            return


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError as exc:
        raise Refused(400, f"the body must be JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise Refused(400, "the body must be a JSON object")
    return body


def _language(body: dict[str, Any]) -> None:
    language = body.get("language") or LANGUAGE
    if language != LANGUAGE:
        raise Refused(400, f"language {language!r} is not supported by grove's code interpreter: only python")


class Server:
    """The contexts of one server and its routes (state kept here, not in app keys: aiohttp 3.8 has none)."""

    def __init__(self, cwd: str) -> None:
        self.cwd = cwd
        self.contexts: dict[str, Context] = {}

    def context(self, context_id: str) -> Context:
        """A context by id; 404 naming it if there is none."""
        context = self.contexts.get(context_id)
        if context is None:
            raise Refused(404, f"context {context_id[:80]!r} not found")
        return context

    async def execute(self, request: web.Request) -> web.StreamResponse:
        """``POST /execute``: one cell in a context (the default one unless ``context_id`` names another)."""
        body = await _body(request)
        code, env = body.get("code"), body.get("env_vars") or {}
        if not isinstance(code, str):
            raise Refused(400, "code must be a string")
        if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise Refused(400, "env_vars must be a map of strings to strings")
        if body.get("context_id") and body.get("language"):
            raise Refused(400, "give context_id or language, not both")
        _language(body)
        context = self.context(body.get("context_id") or "default")
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        async with context.lock:
            if env:
                await _silent(context, _ENV_SET % (list(env), env))
            try:
                async for line in run_cell(context, code):
                    await response.write(line)
            except (asyncio.CancelledError, ConnectionResetError):
                await context.kernel.interrupt_kernel()  # the client left (its timeout): the cell stops too
                raise
            finally:
                if env:
                    await _silent(context, _ENV_RESTORE)
        await response.write_eof()
        return response

    async def create_context(self, request: web.Request) -> web.Response:
        """``POST /contexts {language, cwd}``."""
        body = await _body(request)
        _language(body)
        context = await start_context(str(body.get("cwd") or self.cwd))
        self.contexts[context.id] = context
        return web.json_response(context.body())

    async def list_contexts(self, request: web.Request) -> web.Response:
        """``GET /contexts``."""
        return web.json_response([c.body() for c in self.contexts.values()])

    async def remove_context(self, request: web.Request) -> web.Response:
        """``DELETE /contexts/{id}``."""
        context = self.context(request.match_info["id"])
        del self.contexts[context.id]
        await stop_context(context)
        return web.Response(status=204)

    async def restart_context(self, request: web.Request) -> web.Response:
        """``POST /contexts/{id}/restart``: the same context, its state gone."""
        context = self.context(request.match_info["id"])
        async with context.lock:
            await context.kernel.restart_kernel(now=True)
            await context.client.wait_for_ready(timeout=60)
        return web.Response(status=204)

    async def kernels(self, app: web.Application) -> AsyncIterator[None]:
        """The default context for the server's life; every kernel ends with it."""
        self.contexts["default"] = await start_context(self.cwd, "default")
        yield
        await asyncio.gather(*(stop_context(c) for c in self.contexts.values()))


async def health(request: web.Request) -> web.Response:
    """``GET /health``: the server is up (its default kernel ready: it starts before the server listens, its port
    taken before either: :func:`reserve`)."""
    return web.Response(text="OK")


def make_app(cwd: str) -> web.Application:
    """The server's app; the default context starts with it and every kernel ends with it."""
    server = Server(cwd)
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.cleanup_ctx.append(server.kernels)
    app.add_routes([web.get("/health", health), web.post("/execute", server.execute),
                    web.get("/contexts", server.list_contexts), web.post("/contexts", server.create_context),
                    web.delete("/contexts/{id}", server.remove_context),
                    web.post("/contexts/{id}/restart", server.restart_context)])
    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="E2B's code interpreter protocol on Jupyter kernels")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("port", type=int, nargs="?", default=49999, help="the port (also --port); E2B's: 49999")
    parser.add_argument("--port", type=int, dest="port")
    parser.add_argument("--cwd", default=os.getcwd(), help="the default context's working directory")
    args = parser.parse_args(argv)
    web.run_app(make_app(args.cwd), sock=reserve(args.host, args.port), print=None)


def reserve(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port``, not yet listening: the server's port is taken before the default kernel
    starts, and listens (aiohttp's start) once that kernel is ready.

    A kernel's five ports are free ports the system picks, from the range a client's own ports come from: were the
    server's port still free then, a kernel could take it, and the server would then fail to bind while a
    kernel's ZeroMQ socket answered on its port."""
    sock: socket.socket | None = None
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as aiohttp's own site does: a restart at once
        sock.bind(address)
    except OSError as exc:  # a taken port, an address not this host's, a name that resolves to none
        if sock is not None:
            sock.close()
        raise SystemExit(f"grove's code interpreter cannot listen on {host}:{port}: {exc.strerror}; stop what holds "
                         "the port, or give another (--port N) or an address of this host (--host)") from exc
    return sock


if __name__ == "__main__":
    main()
