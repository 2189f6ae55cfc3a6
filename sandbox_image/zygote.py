"""The zygote: one pre-imported interpreter that forks every local sandbox.

Starting a fresh interpreter per sandbox costs ~200 ms of CPU (Python, Flask, gunicorn imports) and
~30 MiB per process. The zygote pays that once: it imports everything the executor needs, freezes
the heap out of the garbage collector's reach (so forked children keep sharing its pages), then reads
one JSON request per line on stdin and forks a child per request that runs
:func:`sandbox_image.init.launch` and writes ``{"rid", "pid"|"error"}`` as one line on stdout (a line
under PIPE_BUF, so concurrent children never interleave). When stdin closes — the router exited — the
zygote exits; the sandboxes it started live on.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
from typing import Any

from sandbox_image import init


def _lazy_url_builders() -> None:
    """Make werkzeug compile a route's two URL-builder functions when first used, not when the route is added.

    Building them (Python source, ``compile()``, ``exec``) is most of the cost of creating the executor's
    Flask app — ~4 ms of CPU per sandbox start, plus the memory pages it copies — and the executor never
    builds a URL. ``url_for`` still works: the first call compiles the builder and keeps it.
    """
    from werkzeug.routing.rules import Rule

    compile_builder = getattr(Rule, "_compile_builder", None)
    if compile_builder is None:  # another werkzeug: leave it be
        return

    def lazy(self: Rule, append_unknown: bool = True) -> Any:
        def build(rule: Rule, *args: Any, **kwargs: Any) -> Any:
            real = compile_builder(rule, append_unknown).__get__(rule, None)
            setattr(rule, "_build_unknown" if append_unknown else "_build", real)
            return real(*args, **kwargs)

        return build

    Rule._compile_builder = lazy  # type: ignore[method-assign]


def _warm_up() -> None:
    """Import and exercise what every executor start needs, so children inherit it ready-made."""
    import gunicorn.arbiter
    import gunicorn.glogging
    import gunicorn.workers.gthread  # noqa: F401

    import executor.app
    import executor.serve
    from executor.settings import ExecutorSettings

    _lazy_url_builders()
    # gunicorn's config (120 settings, each validated and copied) built once here; every sandbox
    # re-targets its own copy of it (see init._serve).
    init.SERVER_TEMPLATE = executor.serve.ExecutorServer(
        ExecutorSettings(token="warm-up", root="/"), "fd://0", worker_tmp_dir=init.WORKER_TMP_DIR
    )

    # Serve a few requests once: lazily built state (URL map, JSON providers, parsers) is then made
    # here, shared by every sandbox, instead of privately in each.
    app = executor.app.create_app(ExecutorSettings(token="warm-up", root="/"))
    client = app.test_client()
    auth = {"Authorization": "Bearer warm-up"}
    client.get("/healthz")
    client.get("/v1/files/list?path=/", headers=auth)
    client.post("/v1/exec", data=b"{}", headers={**auth, "Content-Type": "application/json"})
    client.post("/v1/exec", data=b"\x80", headers={**auth, "Content-Type": "application/msgpack"})


def _child(request: dict[str, Any]) -> None:
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    try:
        reply: dict[str, Any] = {"rid": request["rid"], "pid": init.launch(request["config"])}
    except Exception as exc:
        reply = {"rid": request["rid"], "error": f"{type(exc).__name__}: {exc}"}
    os.write(1, (json.dumps(reply) + "\n").encode())


def main() -> None:
    """Serve spawn requests until stdin closes."""
    os.chdir("/")  # see init.launch: gunicorn fixes its default chdir at import time
    _warm_up()
    init.PACKAGE_PATHS[:] = init._package_paths()
    gc.collect()
    gc.freeze()
    # Children are reaped by the kernel; each one reports on stdout before it exits.
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    print(json.dumps({"ready": os.getpid()}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
        except ValueError as exc:
            print(json.dumps({"rid": None, "error": f"bad request line: {exc}"}), flush=True)
            continue
        if os.fork() == 0:
            try:
                _child(request)
            finally:
                os._exit(0)


if __name__ == "__main__":
    main()
