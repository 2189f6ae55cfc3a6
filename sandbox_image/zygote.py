"""The zygote: one pre-imported interpreter that forks every local sandbox.

Starting a fresh interpreter per sandbox costs ~200 ms of CPU (Python, Flask, gunicorn imports) and
~30 MiB per process. The zygote pays that once: it imports everything the executor needs, freezes
the heap out of the garbage collector's reach (so forked children keep sharing its pages), then reads
one JSON request per line on stdin and forks, per request, the sandbox's PID 1 straight into a new
PID namespace; it runs :func:`sandbox_image.init.become_pid1` and writes ``{"rid", "pid"|"error"}`` as
one line on stdout once set up (a line under PIPE_BUF, so concurrent children never interleave). When
stdin closes — the router exited — the zygote exits; the sandboxes it started live on.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
import sys
from typing import Any, NoReturn

from sandbox_image import importpaths, init, linux


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
    # Besides what the executor imports at the top of its modules, what every sandbox start or first request
    # would import (gthread's pool; the ascii codec of the cgroup and /proc writes; the warm-pool wrapper):
    # imported after the sandbox's pivot_root, each one would scan the bundle's directories again and land
    # in memory pages of the sandbox's own.
    import concurrent.futures.thread  # noqa: F401
    import encodings.ascii  # noqa: F401

    import gunicorn.arbiter
    import gunicorn.glogging
    import gunicorn.workers.gthread  # noqa: F401

    import executor.app
    import executor.claim
    import executor.serve
    from executor.settings import ExecutorSettings
    from sandbox_image import seccomp

    with contextlib.suppress(OSError):  # no system call table for this machine: every start says so
        seccomp.packed()
    _lazy_url_builders()
    # gunicorn's config (120 settings, each validated and copied) built once here; every sandbox
    # re-targets its own copy of it (see init._serve). So are the executor's routes (the app's shell, with
    # no sandbox's state in it: each sandbox binds its own, see executor.served), warmed by one request.
    # A second shell is kept for the app a warm-pool claim builds (see executor.serve.ExecutorServer).
    shell, claim_shell = executor.app.app_shell("/"), executor.app.app_shell("/")
    shell.test_client().get("/healthz")
    claim_shell.test_client().get("/healthz")
    init.SERVER_TEMPLATE = executor.serve.ExecutorServer(
        ExecutorSettings(token="warm-up", root="/"), "fd://0", worker_tmp_dir=init.WORKER_TMP_DIR, app_shell=shell,
        claim_shell=claim_shell,
    )
    init.SERVER_TEMPLATE.gunicorn_logger()

    # Serve a few requests once: lazily built state (URL map, JSON providers, parsers) is then made
    # here, shared by every sandbox, instead of privately in each.
    app = executor.app.create_app(ExecutorSettings(token="warm-up", root="/"))
    client = app.test_client()
    auth = {"Authorization": "Bearer warm-up"}
    client.get("/healthz")
    client.get("/v1/files/list?path=/", headers=auth)
    client.post("/v1/exec", data=b"{}", headers={**auth, "Content-Type": "application/json"})
    client.post("/v1/exec", data=b"\x80", headers={**auth, "Content-Type": "application/msgpack"})
    # Its root descriptor is the host's root: no sandbox forked from here may inherit it.
    executor.app.release(app)


def _pid1(request: dict[str, Any], host_pid_ns: int) -> NoReturn:
    """In the child forked into a new PID namespace (its PID 1): set the sandbox up, report, serve."""
    os.close(host_pid_ns)  # no handle on the host's PID namespace may reach the sandbox
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    # Its pid on the host, for the router: the host's /proc is still mounted here (the zygote's mount namespace).
    host_pid = int(os.readlink("/proc/self"))

    def report(failure: dict[str, Any]) -> None:
        reply = {"rid": request["rid"], **failure} if failure else {"rid": request["rid"], "pid": host_pid}
        os.write(1, (json.dumps(reply) + "\n").encode())

    init.become_pid1(request["config"], report)


def _spawn(request: dict[str, Any], host_pid_ns: int) -> None:
    """Fork the sandbox's PID 1 straight into a new PID namespace; the zygote's own stays the host's."""
    try:
        linux.unshare(linux.CLONE_NEWPID)  # for the children made from now on: undone right after the fork
        try:
            pid = os.fork()
        except OSError:
            linux.setns(host_pid_ns, linux.CLONE_NEWPID)
            raise
    except OSError as exc:
        print(json.dumps({"rid": request.get("rid"), "error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return
    if pid == 0:
        try:
            _pid1(request, host_pid_ns)
        finally:
            os._exit(1)
    # A failure here leaves the zygote unable to make another namespace: it exits (and is started again).
    linux.setns(host_pid_ns, linux.CLONE_NEWPID)


def main() -> None:
    """Serve spawn requests until stdin closes."""
    os.chdir("/")  # see init.become_pid1: gunicorn fixes its default chdir at import time
    _warm_up()
    importpaths.PACKAGE_PATHS[:] = importpaths.package_paths()
    gc.collect()
    gc.freeze()
    # Children are reaped by the kernel; each one reports on stdout before it exits.
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    host_pid_ns = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    print(json.dumps({"ready": os.getpid()}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
        except ValueError as exc:
            print(json.dumps({"rid": None, "error": f"bad request line: {exc}"}), flush=True)
            continue
        _spawn(request, host_pid_ns)


if __name__ == "__main__":
    main()
