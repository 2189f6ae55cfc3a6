"""Background processes: started by one call, outliving it, watched, signalled and waited for by later ones.

Each runs in a session of its own (an exec's timeout or a grading's clean-up by session spares it), its stdout
and stderr together in one log file the child writes itself (``<output_dir>/proc-<pid>.log``: nothing is held in
the executor's memory, and a follower reads what the file holds). One thread per process waits for its exit and
hands it back to the reaper. The count of running ones is capped: a sandbox is not a process supervisor for an
unbounded fleet. They end with the sandbox — its namespace's PID 1 takes them down on the local backend, the
pod's end on Knative — and nothing restarts them.

E2B's process service (:mod:`executor.e2b_processes`) runs on this same table: its processes are started
*attached* — stdin a pipe if asked for, stdout and stderr pipes whose pumps append to the same log and hand each
chunk to the attached streams (:mod:`executor.process_output`) — and carry E2B's ``tag``. Any process can be
attached to later: a piped one's streams get its output from then on, a logged one's the log from its end on.

Exits are also queued for the router, which records each one as a trajectory step: handed out with any answer
(:meth:`Processes.exits`), to the router's one long poll per sandbox as they happen (:meth:`Processes.next_exits`),
and by :meth:`Processes.end_all` before the sandbox stops. The queue hands each exit out once, whichever of them
takes it, so an exit is never recorded twice.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import signal as signals
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from executor import reaper
from executor.paths import PathResolver
from executor.process_output import Event, Fanout, pumps
from executor.proctree import kill_tree
from executor.runner import Runner
from executor.settings import ExecutorSettings
from grove.core.errors import Conflict, Invalid, NotFound

MAX_RUNNING = 16
"""Background processes a sandbox may have running at once."""
MAX_KEPT = 256
"""Processes remembered, running or not: the oldest ended ones are forgotten first (their logs stay on disk)."""
END_GRACE_S = 2.0
"""How long :meth:`Processes.end_all` gives processes after SIGTERM before it kills what is left."""
_FOLLOW_POLL_S = 0.1
_READ = 65536
SIGNALS = {name: int(getattr(signals, name)) for name in ("SIGTERM", "SIGKILL", "SIGINT", "SIGHUP", "SIGQUIT",
                                                          "SIGUSR1", "SIGUSR2", "SIGSTOP", "SIGCONT")}
"""The signals a caller may send, by name."""


@dataclass
class Process:
    """One background process and what is known of it."""

    pid: int
    argv: list[str]
    cwd: str | None
    user: str | None
    log: str
    """The log file's API path (stdout and stderr, as written)."""
    started_at: float
    popen: subprocess.Popen[bytes] = field(repr=False)
    exit_code: int | None = None
    ended_at: float | None = None
    signalled: str | None = None
    """The last signal a caller sent, by name."""
    done: threading.Event = field(default_factory=threading.Event, repr=False)
    env: dict[str, str] = field(default_factory=dict, repr=False)
    """The environment it was started with over the sandbox's (E2B's ``List`` answers it)."""
    tag: str | None = None
    """A name the starter gave it (E2B's ``tag``), or None."""
    exit_signal: int | None = None
    """The signal that ended it, or None."""
    output: Fanout | None = field(default=None, repr=False)
    """Its attached streams, for one started attached (its outputs piped through the executor); else None."""

    def view(self) -> dict[str, Any]:
        """What the API answers about it."""
        return {"pid": self.pid, "command": self.argv, "cwd": self.cwd, "user": self.user,
                "status": "exited" if self.done.is_set() else "running", "exit_code": self.exit_code,
                "started_at": self.started_at, "ended_at": self.ended_at, "signalled": self.signalled,
                "log": self.log, "tag": self.tag}

    def ended(self) -> dict[str, Any]:
        """How it ended, as an attached stream's last event carries it."""
        return {"exit_code": self.exit_code, "signal": self.exit_signal}


class Processes:
    """The background processes of one sandbox."""

    def __init__(self, settings: ExecutorSettings, paths: PathResolver, runner: Runner,
                 max_running: int = MAX_RUNNING) -> None:
        self._settings, self._paths, self._runner = settings, paths, runner
        self._max_running = max_running
        self._lock = threading.Lock()
        self._table: dict[int, Process] = {}
        self._exits: list[dict[str, Any]] = []
        self._changed = threading.Condition(self._lock)
        """Notified when an exit is queued, or when :meth:`end_all` ends every process (long polls return)."""
        self._ending = False

    def start(self, argv: list[str], cwd: str | None, user: str | None, env: dict[str, str],
              stdio: bool = False) -> dict[str, Any]:
        """Start one; Conflict past the cap (naming how to make room). ``stdio``: its stdin and stdout are pipes
        for one client to attach to (:meth:`take_stdio`; a stdio MCP server), only stderr goes to its log."""
        return self._spawn(argv, cwd, user, env, tag=None, stdin=stdio, attached=False, stdio=stdio)[0].view()

    def start_attached(self, argv: list[str], cwd: str | None, env: dict[str, str], *, tag: str | None,
                       stdin: bool) -> tuple[Process, Iterator[Event]]:
        """Start one with its outputs piped and a stream attached from birth (E2B's ``Start``), stdin a pipe
        when ``stdin``. Its starter records its end (from the stream), so its exit is not queued for the router."""
        process, stream = self._spawn(argv, cwd, None, env, tag=tag, stdin=stdin, attached=True)
        assert stream is not None
        return process, stream

    def _spawn(self, argv: list[str], cwd: str | None, user: str | None, env: dict[str, str], *, tag: str | None,
               stdin: bool, attached: bool, stdio: bool = False) -> tuple[Process, Iterator[Event] | None]:
        with self._lock:
            running = [p.pid for p in self._table.values() if not p.done.is_set()]
            if len(running) >= self._max_running:
                raise Conflict(f"this sandbox already runs {len(running)} background processes (pids "
                               f"{', '.join(map(str, sorted(running)))}), the most it may; end one (POST "
                               f".../processes/PID/signal, or E2B's commands.kill(pid)) or wait for one before "
                               f"starting another")
            out_dir = self._paths.resolve(self._settings.output_dir)
            os.makedirs(out_dir, exist_ok=True)
            pending = os.path.join(out_dir, f"proc-starting-{threading.get_ident()}.log")
            fd = os.open(pending, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW,
                         0o600)
            outputs = subprocess.PIPE if attached else fd  # attached: the pumps write the log (and the streams)
            try:
                stdout = subprocess.PIPE if stdio else outputs  # stdio: one client reads it (take_stdio)
                popen = self._runner.launch(argv, cwd, user, env, stdin=subprocess.PIPE if stdin else
                                            subprocess.DEVNULL, stdout=stdout, stderr=outputs)
            except BaseException:
                os.close(fd)
                os.unlink(pending)
                raise
            if not attached:
                os.close(fd)
            os.replace(pending, os.path.join(out_dir, f"proc-{popen.pid}.log"))
            log = f"{self._settings.output_dir.rstrip('/')}/proc-{popen.pid}.log"
            process = Process(popen.pid, argv, cwd, user, log, time.time(), popen, env=dict(env), tag=tag,
                              output=Fanout() if attached else None)
            stream = process.output.attach() if process.output is not None else None
            self._table[popen.pid] = process
            self._ending = False
            self._forget_oldest()
        threading.Thread(target=self._watch, args=(process, fd if attached else None), name=f"grove-proc-{popen.pid}",
                         daemon=True).start()
        return process, stream

    def list(self) -> builtins.list[dict[str, Any]]:
        """Every remembered process, oldest first."""
        with self._lock:
            return [p.view() for p in self._table.values()]

    def get(self, pid: int) -> dict[str, Any]:
        """One process's state."""
        return self._find(pid).view()

    def signal(self, pid: int, name: str) -> dict[str, Any]:
        """Send a signal (by name) to the process's whole group; ``SIGKILL`` ends everything it started."""
        number = SIGNALS.get(name.upper() if name.upper().startswith("SIG") else f"SIG{name.upper()}")
        if number is None:
            raise Invalid(f"unknown signal {name!r}; one of {', '.join(SIGNALS)}")
        process = self._find(pid)
        if process.done.is_set():
            raise Conflict(f"process {pid} has already exited (exit code {process.exit_code}): nothing to signal")
        process.signalled = next(k for k, v in SIGNALS.items() if v == number)
        if number == signals.SIGKILL:
            kill_tree(pid)
        else:
            with contextlib.suppress(ProcessLookupError):  # it exited just now: its watcher records it
                os.killpg(pid, number)
        return process.view()

    def take_stdio(self, pid: int) -> tuple[int, int]:
        """The stdin and stdout pipes of a process started with ``stdio`` (the caller owns and closes them):
        handed out once, as a stdio server serves one client."""
        process = self._find(pid)
        with self._lock:
            if process.done.is_set():
                raise Conflict(f"process {pid} has already exited (exit code {process.exit_code})")
            stdin, stdout = process.popen.stdin, process.popen.stdout
            if stdin is None or stdout is None:
                raise Conflict(f"process {pid} has no stdio to attach to: it was not started for it, or its stdio "
                               "was taken already")
            process.popen.stdin = process.popen.stdout = None
        try:  # the pipes are the caller's alone now (_watch closes only what is still on popen)
            return os.dup(stdin.fileno()), os.dup(stdout.fileno())
        finally:
            stdin.close()
            stdout.close()

    def wait(self, pid: int, timeout_s: float) -> dict[str, Any]:
        """Block until the process exits or ``timeout_s`` passes; its state either way (``status`` tells)."""
        process = self._find(pid)
        process.done.wait(timeout_s)
        return process.view()

    def logs(self, pid: int, offset: int, follow: bool) -> Iterator[bytes]:
        """The log from ``offset``; with ``follow``, new output as it comes until the process has exited."""
        process = self._find(pid)
        try:  # the sandbox owns the file: never blocking on a FIFO put in its place, never following a link
            fd = self._paths.open(process.log, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except NotFound:
            raise NotFound(f"the log of process {pid} ({process.log}) is gone: something in the sandbox deleted "
                           "it") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise Conflict(f"the log of process {pid} ({process.log}) is no longer a regular file: something in "
                           "the sandbox replaced it")
        return self._read(fd, process, offset, follow)

    def running(self, pid: int) -> Process:
        """A running process; NotFound for one that ended or never was (how E2B names both)."""
        with self._lock:
            process = self._table.get(pid)
        if process is None or process.done.is_set():
            raise NotFound(f"process with pid {pid} not found (it ended, or never ran in this sandbox)")
        return process

    def running_ones(self) -> builtins.list[Process]:
        """The running processes, oldest first."""
        with self._lock:
            return [p for p in self._table.values() if not p.done.is_set()]

    def attach(self, pid: int) -> Iterator[Event]:
        """A running process's events from now on (E2B's ``Connect``): an attached one's outputs apart, a logged
        one's log from its present end as stdout; then its end. Closing the iterator detaches."""
        process = self.running(pid)
        if process.output is not None:
            return process.output.attach()
        try:
            end = os.lstat(self._paths.resolve(process.log)).st_size
        except OSError:
            end = 0  # the sandbox removed it: logs() names that below
        return self._logged(process, self.logs(pid, end, True))

    @staticmethod
    def _logged(process: Process, follow: Iterator[bytes]) -> Iterator[Event]:
        try:
            for chunk in follow:
                yield "stdout", chunk
        finally:
            close = getattr(follow, "close", None)
            if close is not None:
                close()
        process.done.wait()
        yield "end", process.ended()

    def write(self, pid: int, data: bytes, *, close: bool = False) -> None:
        """Feed a running process's stdin, or close it; Conflict if it has none or reads it no more."""
        stdin = self.running(pid).popen.stdin
        if stdin is None:
            raise Conflict(f"process {pid} has no stdin to write to: it was started without one, or a stdio "
                           "client (an MCP publication) holds it")
        try:
            if close:
                stdin.close()
            else:
                stdin.write(data)
                stdin.flush()
        except (BrokenPipeError, ValueError) as exc:
            raise Conflict(f"process {pid} no longer reads its stdin") from exc

    def exits(self) -> builtins.list[dict[str, Any]]:
        """The exits not handed out yet (for the router's record), each once."""
        with self._lock:
            taken, self._exits = self._exits, []
        return taken

    def next_exits(self, timeout_s: float) -> dict[str, Any]:
        """Block until an exit is queued (or ``timeout_s`` passes, or :meth:`end_all` runs); the exits, each
        once, and how many processes still run (the router's watch polls again while any do)."""
        with self._changed:
            if not self._ending:
                self._changed.wait_for(lambda: bool(self._exits) or self._ending, timeout_s)
            taken, self._exits = self._exits, []
            # Attached (E2B) processes' ends are recorded by their streams, never queued: not waited for here.
            running = sum(not p.done.is_set() and p.output is None for p in self._table.values())
        return {"exits": taken, "running": running}

    def end_all(self, grace_s: float = END_GRACE_S) -> builtins.list[dict[str, Any]]:
        """End every running process (SIGTERM to its group, SIGKILL to what is left after ``grace_s``) and wait
        for their exits; the exits not handed out yet, each once. Run before the sandbox stops, so that each
        exit is recorded with the signal that ended it before the sandbox's record is closed."""
        with self._lock:
            running = [p for p in self._table.values() if not p.done.is_set()]
        for process in running:
            process.signalled = "SIGTERM"
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signals.SIGTERM)
        deadline = time.monotonic() + grace_s
        for process in running:
            if not process.done.wait(max(0.0, deadline - time.monotonic())):
                process.signalled = "SIGKILL"
                kill_tree(process.pid)
        for process in running:
            process.done.wait(grace_s)
        with self._changed:
            self._ending = True  # the router's long poll answers now rather than at its timeout
            self._changed.notify_all()
            taken, self._exits = self._exits, []
        return taken

    def _read(self, fd: int, process: Process, offset: int, follow: bool) -> Iterator[bytes]:
        try:
            os.lseek(fd, offset, os.SEEK_SET)
            while True:
                ended = process.done.is_set()  # before reading: what it wrote before its exit is read below
                data = os.read(fd, _READ)
                if data:
                    yield data
                    continue
                if not follow or ended:
                    return
                time.sleep(_FOLLOW_POLL_S)
        finally:
            os.close(fd)

    def _find(self, pid: int) -> Process:
        with self._lock:
            process = self._table.get(pid)
        if process is None:
            raise NotFound(f"no background process {pid} in this sandbox (GET .../processes lists them)")
        return process

    def _forget_oldest(self) -> None:
        ended = [pid for pid, p in self._table.items() if p.done.is_set()]
        while len(self._table) > MAX_KEPT and ended:
            del self._table[ended.pop(0)]

    def _watch(self, process: Process, log_fd: int | None) -> None:
        popen, output = process.popen, process.output
        copying = []
        if output is not None and log_fd is not None and popen.stdout is not None and popen.stderr is not None:
            copying = pumps(popen.stdout, popen.stderr, log_fd, output, process.pid)
        code = popen.wait()
        reaper.release(popen)
        process.exit_code = 128 - code if code < 0 else code
        process.exit_signal = -code if code < 0 else None
        process.ended_at = time.time()
        for pump in copying:  # its output all read before its end is told (as envd's streams end)
            pump.join()
        if log_fd is not None:
            os.close(log_fd)
        with self._changed:  # its pipes no one took (a stdio one's), taken from take_stdio's reach, then closed
            pipes = [popen.stdin, popen.stdout if output is None else None]
            popen.stdin = None
            if output is None:
                popen.stdout = None
            process.done.set()
            if output is None:
                self._exits.append({"pid": process.pid, "command": process.argv, "exit_code": process.exit_code,
                                    "signalled": process.signalled, "ended_at": process.ended_at,
                                    "duration_s": round(process.ended_at - process.started_at, 3)})
                self._changed.notify_all()
        for pipe in pipes:
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        if output is not None:
            output.end(process.ended())
