"""Serving the executor under gunicorn, in-process: one worker, threads for concurrent execs.

One worker process because ``request_id`` deduplication lives in memory; threads because gunicorn's
sync workers close the connection after every response and the router relies on keep-alive.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import signal
import sys
from collections.abc import Sequence
from typing import Any

from gunicorn.app.base import BaseApplication

from executor.settings import ExecutorSettings
from executor.snapshot import IdleSnapshots, Snapshots, unrestored_app
from executor.worker import LingeringWorker

log = logging.getLogger("grove.executor")
_IDLE_TICK_S = 15.0
_WORKER_SIGNALS = (signal.SIGQUIT, signal.SIGTERM, signal.SIGINT, signal.SIGABRT, signal.SIGUSR1, signal.SIGWINCH)


class ExecutorServer(BaseApplication):  # type: ignore[misc]
    """A gunicorn application whose WSGI app is ``create_app(settings)``."""

    def __init__(
        self,
        settings: ExecutorSettings,
        bind: str,
        *,
        threads: int = 32,
        log_level: str = "warning",
        worker_tmp_dir: str | None = None,
        app_shell: Any = None,
        claim_shell: Any = None,
    ) -> None:
        self._settings = settings
        # Routes built ahead (executor.app.app_shell) by a process that then forks: the first app is this
        # shell bound to the settings, which saves each child ~3 ms of CPU and the pages building one dirties.
        self._app_shell = app_shell
        # A second such shell, never bound before, for the app a warm-pool claim builds anew: a claimed
        # sandbox's first call then binds it instead of building all the routes (~4-6 ms of CPU in every
        # claimed sandbox of a burst). Until a claim its pages are the forking process's, shared.
        self._claim_shell = claim_shell
        self._logger: Any = None
        self._threads, self._log_level, self._worker_tmp_dir = threads, log_level, worker_tmp_dir
        self._snapshots: Snapshots | None = None
        self._options = self._make_options(settings, bind)
        super().__init__()

    def _make_options(self, settings: ExecutorSettings, bind: str) -> dict[str, Any]:
        options: dict[str, Any] = {
            "bind": [bind],
            "workers": 1,
            # gthread, with the thread that answered kept for the connection's next request (executor.worker).
            "worker_class": LingeringWorker,
            "threads": self._threads,
            # Longer than the router's pooled-connection idle time, so the router never reuses a closed one.
            "keepalive": 75,
            "timeout": 0,
            "graceful_timeout": 5,
            "loglevel": self._log_level,
            "accesslog": None,
            "errorlog": "-",
            "proc_name": "grove-executor",
            "forwarded_allow_ips": "",
            "worker_tmp_dir": self._worker_tmp_dir,
            # gunicorn's default is the cwd when its config module was imported, which may predate a pivot_root.
            "chdir": os.getcwd(),
            # gunicorn 27's control socket starts an asyncio server in every arbiter: ~3.4 MiB per sandbox
            # and nothing grove uses.
            "control_socket_disable": True,
        }
        # Snapshots (and the root descriptor its path resolver opens) only where asked for: built for every
        # server, it left a descriptor of the zygote's root — the host's — open in every sandbox it forked.
        if settings.snapshot_upload_url or settings.snapshot_get_url or settings.snapshot_dir:
            snapshots = self._snapshots = Snapshots(settings)
            # In the arbiter: restore before the socket is bound (nothing is served from a half-restored
            # workspace), snapshot after the workers are gone (SIGTERM: Knative is taking the pod away).
            options["on_starting"] = lambda _server: snapshots.restore_or_hold()
            options["on_exit"] = lambda _server: _final_snapshot(snapshots)
        return options

    def retarget(self, settings: ExecutorSettings, bind: str) -> ExecutorServer:
        """This server, for other settings and another socket, without building gunicorn's config again.

        For a server built ahead of time in a process that then forks (the local backend's zygote): each
        child re-targets its own copy, which saves it ~4 ms of CPU and the memory pages building one
        copies. A server with snapshot hooks set is not re-targeted (a hook cannot be unset): build anew.
        """
        if "on_starting" in self._options:
            return ExecutorServer(
                settings, bind, threads=self._threads, log_level=self._log_level, worker_tmp_dir=self._worker_tmp_dir
            )
        self._settings = settings
        options = self._make_options(settings, bind)
        # The config already holds the template's values, each validated: set only what differs (the
        # socket, as a rule), not all of them again.
        changed = {key: value for key, value in options.items() if self._options.get(key) != value}
        self._options = options
        for key, value in changed.items():
            self.cfg.set(key, value)
        if set(changed) - {"bind"}:
            self._logger = None  # built for other options
        return self

    def gunicorn_logger(self) -> Any:
        """gunicorn's logger for this config, built once: a zygote builds it before it forks (each sandbox's
        own cost ~1 ms of CPU and ~200 page faults); its handlers write to fd 2, the sandbox's log there."""
        if self._logger is None:
            self._logger = self.cfg.logger_class(self.cfg)
        return self._logger

    def load_config(self) -> None:
        """Copy our options into gunicorn's config."""
        for key, value in self._options.items():
            self.cfg.set(key, value)
        if "http_parser" in self.cfg.settings:  # a gunicorn that has the choice
            # Its default ("auto") tries `import gunicorn_h1c` (a C parser grove does not ship) on every worker's
            # first request: a failed import that scans every directory of sys.path, in every sandbox.
            self.cfg.set("http_parser", "python")

    def run_single_worker(self) -> None:
        """Serve with one gthread worker in this very process, without an arbiter (the sandbox's init
        supervises it instead). Returns only when the worker stops."""
        from gunicorn import sock

        log = self.gunicorn_logger()
        listeners = sock.create_sockets(self.cfg, log)
        worker = self.cfg.worker_class(1, os.getppid(), listeners, self, 30, self.cfg, log)
        worker.pid = os.getpid()
        # gthread's loop wakes every second to tell an arbiter it lives; there is none here, and hundreds of
        # idle sandboxes waking each second cost real CPU. Requests still wake it at once; only the idle
        # keep-alive sweep runs less often (and SIGKILL, how a local sandbox is stopped, needs no loop).
        dispatch = worker.wait_for_and_dispatch_events

        def dispatch_less_often(timeout: float) -> None:
            dispatch(max(timeout, _IDLE_TICK_S))

        worker.wait_for_and_dispatch_events = dispatch_less_often
        # gthread touches its heartbeat file (a utime system call) on every turn of its loop, for an arbiter
        # to see it live; there is none to look, and on the exec path it was ~10 % of the worker's CPU.
        worker.notify = _no_heartbeat
        init_signals = worker.init_signals

        def no_signal_handlers() -> None:
            # This process is its PID namespace's init: the kernel drops any signal sent to it from
            # inside the namespace unless it has a handler. gunicorn's handlers (QUIT, TERM, INT, ABRT,
            # USR1, WINCH) would let a command end its own executor with `kill -QUIT 1`; without them
            # only the host (the router, which stops a sandbox with SIGKILL) can.
            init_signals()
            for sig in _WORKER_SIGNALS:
                signal.signal(sig, signal.SIG_DFL)

        worker.init_signals = no_signal_handlers
        worker.init_process()

    def load(self) -> Any:
        """Build the WSGI app (in the worker, after fork); a warm-pool claim builds it again, anew."""
        from executor.app import bind, create_app
        from executor.claim import Claimable

        shells = [s for s in (self._app_shell, self._claim_shell) if s is not None]
        self._app_shell = self._claim_shell = None
        if self._snapshots is not None and self._snapshots.failure is not None:
            return unrestored_app(self._snapshots.failure)  # forked after the restore: it knows

        def build(settings: ExecutorSettings) -> Any:
            if settings.snapshot_upload_url and settings.idle_snapshot_s > 0:
                app = create_app(settings)  # a shell has served already: too late to add the hooks
                IdleSnapshots(Snapshots(settings), settings.idle_snapshot_s).install(app)
                return app
            # Each shell used once: a claim gets an app of its own (a shell no request has reached), nothing of
            # the one before it.
            return bind(shells.pop(0), settings) if shells else create_app(settings)

        return Claimable(self._settings, build)


def _no_heartbeat() -> None:
    """A worker's heartbeat where no arbiter watches it: nothing to do."""


def _final_snapshot(snapshots: Snapshots) -> None:
    try:
        snapshots.take("exit")
    except Exception:  # the exit goes on; the last idle snapshot is what survives
        log.exception("the snapshot on exit failed")


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m executor --bind unix:/path|HOST:PORT|fd://N``; settings come from GROVE_EXECUTOR_*."""
    parser = argparse.ArgumentParser(prog="executor", description="grove's in-sandbox executor")
    parser.add_argument("--bind", default=os.environ.get("GROVE_EXECUTOR_BIND", "127.0.0.1:8080"))
    parser.add_argument("--threads", type=int, default=32)
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)
    # grove's own records (restores and snapshots: sizes, parts, memory) go to stderr, the pod's log.
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s [%(process)d] %(name)s %(levelname)s %(message)s"))
    for name in ("grove.executor", "grove.snapshot"):
        logging.getLogger(name).addHandler(handler)
        logging.getLogger(name).setLevel(logging.INFO)
    settings = ExecutorSettings.from_env()
    if os.environ.get("GROVE_EXECUTOR_SECCOMP") == "1":
        # Test-only: calls the filter answers ENOSYS, as a kernel that lacks them (openat2 under older gVisor).
        missing = os.environ.get("GROVE_EXECUTOR_SECCOMP_ENOSYS", "")
        _install_seccomp(tuple(name for name in missing.split(",") if name))
    sys.argv = [sys.argv[0]]  # gunicorn parses sys.argv itself; ours are already consumed
    ExecutorServer(settings, args.bind, threads=args.threads, log_level=args.log_level).run()


def _install_seccomp(enosys: tuple[str, ...] = ()) -> None:
    """grove's own filter (:mod:`sandbox_image.seccomp`) on the executor and everything it starts, where no
    grove PID 1 installs it (a Knative pod). The executor already runs under it on the local backend. The
    program is built for the node's architecture (x86-64 or aarch64); on any other the runtime's default
    profile alone applies."""
    from sandbox_image import seccomp, syscalls

    if syscalls.current() is None:
        log.warning("grove's seccomp filter has no system call table for %s; only the runtime's profile applies",
                    platform.machine())
        return
    seccomp.install(enosys)
