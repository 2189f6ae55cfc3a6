"""Long-lived processes for the router's E2B layer (envd's ``process.Process`` service), under ``/e2b/processes``.

Private to :mod:`router.api.compat.e2b`: its shapes follow envd's, not grove's public API. A process is started
with its output streamed back as newline-delimited JSON events (``{"start": pid}``, ``{"stdout"|"stderr":
base64}``, ``{"end": {"exit_code", "signal"}}``) and lives on when that stream is dropped (an E2B background
command): it can be listed, re-attached to (output from then on, as envd does), fed stdin, have its stdin
closed, and be signalled, all by pid. Output nobody is attached to is dropped, as envd drops it. A process
runs in its own session, so a signal reaches its whole process group.
"""

from __future__ import annotations

import base64
import json
import os
import queue
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from flask import Blueprint, Response, request

from executor import reaper
from executor.served import Served
from grove.core.errors import BadRequest, Conflict, Invalid, NotFound, Unavailable

MAX_PROCESSES = 64
_READ = 16 * 1024  # base64 of it stays one line under the router's 64 KiB line limit
SIGNALS = {"SIGNAL_SIGKILL": signal.SIGKILL, "SIGNAL_SIGTERM": signal.SIGTERM}


@dataclass
class _Process:
    popen: subprocess.Popen[bytes]
    config: dict[str, Any]
    tag: str | None
    watchers: list[queue.SimpleQueue[dict[str, Any] | None]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    ended: dict[str, Any] | None = None

    def publish(self, event: dict[str, Any]) -> None:
        with self.lock:
            for watcher in self.watchers:
                watcher.put(event)

    def watch(self) -> queue.SimpleQueue[dict[str, Any] | None]:
        watcher: queue.SimpleQueue[dict[str, Any] | None] = queue.SimpleQueue()
        with self.lock:
            if self.ended is not None:
                watcher.put({"end": self.ended})
                watcher.put(None)
            else:
                self.watchers.append(watcher)
        return watcher

    def unwatch(self, watcher: queue.SimpleQueue[dict[str, Any] | None]) -> None:
        with self.lock:
            if watcher in self.watchers:
                self.watchers.remove(watcher)


class Processes:
    """The E2B layer's processes of one executor, by pid."""

    def __init__(self, served: Served) -> None:
        self._served = served
        self._table: dict[int, _Process] = {}
        self._lock = threading.Lock()

    def start(self, spec: dict[str, Any]) -> tuple[_Process, queue.SimpleQueue[dict[str, Any] | None]]:
        """Start a process described by envd's ``ProcessConfig`` (plus ``stdin``, ``tag``); watched from birth."""
        cmd, args, envs = spec.get("cmd"), spec.get("args") or [], spec.get("envs") or {}
        if not isinstance(cmd, str) or not cmd or not isinstance(args, list) or not isinstance(envs, dict):
            raise BadRequest("a process needs 'cmd' (a non-empty string), 'args' (a list) and 'envs' (a map)")
        settings, paths = self._served.settings, self._served.paths
        cwd = paths.resolve(spec.get("cwd") or settings.workdir)
        if not os.path.isdir(cwd):
            raise NotFound(f"cwd {spec.get('cwd')!r} is not a directory in the sandbox")
        with self._lock:
            if len(self._table) >= MAX_PROCESSES:
                raise Unavailable(f"the sandbox runs {MAX_PROCESSES} processes already; wait for one to end",
                                  retry_after=1)
        env = {**settings.env, **self._served.runner.extra_env, **{str(k): str(v) for k, v in envs.items()}}
        try:
            popen = reaper.spawn([cmd, *map(str, args)], stdin=subprocess.PIPE if spec.get("stdin") else
                                 subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd,
                                 env=env, start_new_session=True, close_fds=True)
        except FileNotFoundError as exc:
            raise NotFound(f"program not found: {cmd!r}") from exc
        except OSError as exc:
            raise Invalid(f"cannot start {cmd!r}: {exc.strerror}") from exc
        proc = _Process(popen, {"cmd": cmd, "args": list(args), "envs": dict(envs), "cwd": spec.get("cwd")},
                        spec.get("tag") if isinstance(spec.get("tag"), str) else None)
        watcher = proc.watch()
        with self._lock:
            self._table[popen.pid] = proc
        threading.Thread(target=self._pump, args=(proc,), daemon=True, name=f"e2b-{popen.pid}").start()
        return proc, watcher

    def _pump(self, proc: _Process) -> None:
        """Copy both outputs to the watchers, then publish the end and forget the process."""
        def copy(name: str, stream: Any) -> None:
            while chunk := os.read(stream.fileno(), _READ):
                proc.publish({name: base64.b64encode(chunk).decode()})

        other = threading.Thread(target=copy, args=("stderr", proc.popen.stderr), daemon=True)
        other.start()
        copy("stdout", proc.popen.stdout)
        other.join()
        code = proc.popen.wait()
        reaper.release(proc.popen)
        for stream in (proc.popen.stdout, proc.popen.stderr, proc.popen.stdin):
            if stream is not None:
                stream.close()
        ended = {"exit_code": code if code >= 0 else 128 - code, "signal": -code if code < 0 else None}
        with self._lock:
            self._table.pop(proc.popen.pid, None)
        with proc.lock:
            proc.ended = ended
            for watcher in proc.watchers:
                watcher.put({"end": ended})
                watcher.put(None)
            proc.watchers.clear()

    def get(self, pid: Any) -> _Process:
        """A running process by pid; ``NotFound`` for one that ended or never was."""
        with self._lock:
            proc = self._table.get(pid) if isinstance(pid, int) else None
        if proc is None:
            raise NotFound(f"process with pid {pid} not found")
        return proc

    def listing(self) -> list[dict[str, Any]]:
        """envd's ``ProcessInfo`` of every running process."""
        with self._lock:
            running = list(self._table.items())
        return [{"pid": pid, "tag": p.tag, "config": p.config} for pid, p in running]

    def signal(self, pid: Any, name: Any) -> None:
        """Send ``SIGNAL_SIGKILL`` or ``SIGNAL_SIGTERM`` to the process's group."""
        sig = SIGNALS.get(name) if isinstance(name, str) else None
        if sig is None:
            raise BadRequest(f"signal {name!r} is not one of {', '.join(SIGNALS)}")
        proc = self.get(pid)
        try:
            os.killpg(proc.popen.pid, sig)
        except ProcessLookupError:
            raise NotFound(f"process with pid {pid} not found") from None

    def write(self, pid: Any, data: bytes, *, close: bool = False) -> None:
        """Feed the process's stdin (or close it)."""
        stdin = self.get(pid).popen.stdin
        if stdin is None:
            raise Conflict(f"process {pid} was started without stdin")
        try:
            if close:
                stdin.close()
            else:
                stdin.write(data)
                stdin.flush()
        except (BrokenPipeError, ValueError) as exc:
            raise Conflict(f"process {pid} no longer reads its stdin") from exc


def _lines(watcher: queue.SimpleQueue[dict[str, Any] | None], first: dict[str, Any] | None,
           done: Callable[[], None]) -> Iterator[bytes]:
    try:
        if first is not None:
            yield json.dumps(first).encode() + b"\n"
        while (event := watcher.get()) is not None:
            yield json.dumps(event).encode() + b"\n"
    finally:
        done()  # the client went away: the process lives on, its output no longer kept for this stream


def e2b_blueprint(served: Callable[[], Served]) -> Blueprint:
    """The routes; the table is made at the first call, in the bound executor."""
    bp = Blueprint("e2b", __name__)
    tables: dict[int, Processes] = {}
    lock = threading.Lock()

    def table() -> Processes:
        current = served()
        with lock:
            return tables.setdefault(id(current), Processes(current))

    def body() -> dict[str, Any]:
        value = request.get_json(silent=True)
        if not isinstance(value, dict):
            raise BadRequest("the body must be a JSON object")
        return value

    def stream(events: Iterator[bytes]) -> Response:
        return Response(events, mimetype="application/x-ndjson")

    @bp.post("/processes")
    def start() -> Response:
        proc, watcher = table().start(body())
        return stream(_lines(watcher, {"start": proc.popen.pid}, lambda: proc.unwatch(watcher)))

    @bp.post("/processes/connect")
    def connect() -> Response:
        proc = table().get(body().get("pid"))
        watcher = proc.watch()
        return stream(_lines(watcher, {"start": proc.popen.pid}, lambda: proc.unwatch(watcher)))

    @bp.get("/processes")
    def listing() -> Response:
        return Response(json.dumps({"processes": table().listing()}), mimetype="application/json")

    @bp.post("/processes/signal")
    def send_signal() -> Response:
        sent = body()
        table().signal(sent.get("pid"), sent.get("signal"))
        return Response("{}", mimetype="application/json")

    @bp.post("/processes/stdin")
    def send_input() -> Response:
        sent = body()
        try:
            data = base64.b64decode(str(sent.get("data", "")), validate=True)
        except ValueError as exc:
            raise BadRequest("'data' must be base64") from exc
        table().write(sent.get("pid"), data)
        return Response("{}", mimetype="application/json")

    @bp.post("/processes/close-stdin")
    def close_stdin() -> Response:
        table().write(body().get("pid"), b"", close=True)
        return Response("{}", mimetype="application/json")

    return bp
