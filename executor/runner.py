"""Running one command: its own session, bounded capture, server-side timeout, stdin, live chunks."""

from __future__ import annotations

import os
import selectors
import subprocess
import time
import uuid
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import Any

from executor import reaper
from executor.capture import Captured, OutputCapture
from executor.models import ExecRequest
from executor.outputs import KeptOutputs
from executor.paths import PathResolver
from executor.proctree import kill_tree
from executor.settings import ExecutorSettings
from executor.users import RunAs, account_file, parse_spec, resolve
from grove.core.errors import Invalid, NotFound, Unavailable

_READ = 65536
# After the command exits, how long to keep reading output that a background child may still hold.
_DRAIN_AFTER_EXIT_S = 0.2


@dataclass(frozen=True)
class Chunk:
    """Output as it arrives (for ``?stream=1``)."""

    stream: str
    data: bytes


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _oom_kills(path: str | None) -> int:
    if not path:
        return 0
    try:
        with open(path, encoding="ascii") as fh:
            for line in fh:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class Runner:
    """Runs commands for one executor; holds only settings and the path resolver."""

    def __init__(self, settings: ExecutorSettings, paths: PathResolver, outputs: KeptOutputs | None = None) -> None:
        self._settings = settings
        self._paths = paths
        self._outputs = outputs
        self.extra_env: dict[str, str] = {}
        """Set by the executor as the sandbox runs (``DISPLAY`` once its screen is up), under the sandbox's own."""

    def run(self, req: ExecRequest) -> Iterator[Chunk | dict[str, Any]]:
        """Start the command (errors raise here), then iterate: output chunks as they come, the result last."""
        settings = self._settings
        started = time.monotonic()  # the command's timeout covers looking up its user too
        exec_id = uuid.uuid4().hex[:16]
        out_dir = self._paths.resolve(settings.output_dir)
        captures = {
            name: OutputCapture(
                req.max_output_bytes,
                os.path.join(out_dir, f"{exec_id}.{name}"),
                f"{settings.output_dir.rstrip('/')}/{exec_id}.{name}",
                self._outputs.keep if self._outputs is not None else None,
            )
            for name in ("stdout", "stderr")
        }
        oom_before = _oom_kills(settings.oom_control_path)
        proc = self.launch(
            req.argv, req.cwd, req.user, req.env,
            stdin=subprocess.PIPE if req.stdin else subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        if settings.command_oom_score_adj is not None:
            _set_oom_score(proc.pid, settings.command_oom_score_adj)
        return self._events(proc, req, captures, started, oom_before)

    def launch(self, argv: list[str], cwd: str | None, user: str | None, env: dict[str, str], *, stdin: Any,
               stdout: Any, stderr: Any) -> subprocess.Popen[bytes]:
        """Start ``argv`` in a session of its own, in ``cwd`` (the workdir when None), as ``user`` (root when
        None), with ``env`` over the sandbox's; the reaper leaves it to the caller. Errors name what is wrong."""
        settings = self._settings
        cwd_api = cwd or settings.workdir
        where = self._paths.resolve(cwd_api)
        if not os.path.isdir(where):
            raise NotFound(f"cwd {cwd_api!r} is not a directory in the sandbox")
        run_as = self._run_as(user) if user is not None else None
        full_env = {**settings.env, **self.extra_env, **(_user_env(run_as) if run_as else {}), **env}
        try:
            return reaper.spawn(
                argv,
                stdin=stdin,
                stdout=stdout,
                stderr=stderr,
                cwd=where,
                env=full_env,
                start_new_session=True,
                close_fds=True,
                **(_credentials(run_as) if run_as else {}),
            )
        except PermissionError as exc:
            if run_as is not None and exc.filename == where:
                raise Invalid(f"user {user!r} may not enter the working directory {cwd_api!r}") from exc
            raise Invalid(f"program is not executable: {argv[0]!r}") from exc
        except FileNotFoundError as exc:
            raise NotFound(f"program not found: {argv[0]!r}") from exc
        except BlockingIOError as exc:
            raise Unavailable(
                "cannot start the command: the sandbox is out of processes (pids_max)", retry_after=1
            ) from exc
        except OSError as exc:
            raise Invalid(f"cannot start {argv[0]!r}: {exc.strerror}") from exc

    def _run_as(self, user: str) -> RunAs:
        parse_spec(user)  # a malformed value is named before the sandbox's files are read
        passwd = account_file(self._paths, "/etc/passwd", user)
        return resolve(user, passwd, account_file(self._paths, "/etc/group", user))

    def _events(
        self,
        proc: subprocess.Popen[bytes],
        req: ExecRequest,
        captures: dict[str, OutputCapture],
        started: float,
        oom_before: int,
    ) -> Iterator[Chunk | dict[str, Any]]:
        settings = self._settings
        timed_out = False
        try:
            timed_out = yield from self._pump(proc, req, captures, started + req.timeout_s)
        finally:
            if proc.poll() is None:
                kill_tree(proc.pid)
            proc.wait()
            reaper.release(proc)
        duration = time.monotonic() - started
        out, err = captures["stdout"].finish(), captures["stderr"].finish()
        oom = proc.returncode == -9 and not timed_out and _oom_kills(settings.oom_control_path) > oom_before
        if oom:
            err = _note(err, b"\n[grove: killed by the out-of-memory killer: the sandbox reached its memory limit]\n")
        yield {
            "exit_code": _exit_code(proc.returncode),
            "stdout": out.data,
            "stderr": err.data,
            "stdout_truncated": out.truncated,
            "stderr_truncated": err.truncated,
            "stdout_bytes": out.total_bytes,
            "stderr_bytes": err.total_bytes,
            "stdout_sha256": out.sha256,
            "stderr_sha256": err.sha256,
            "stdout_file": out.full_path,
            "stderr_file": err.full_path,
            "timed_out": timed_out,
            "oom_killed": oom,
            "duration_s": round(duration, 6),
            "request_id": req.request_id,
        }

    def _pump(
        self,
        proc: subprocess.Popen[bytes],
        req: ExecRequest,
        captures: dict[str, OutputCapture],
        deadline: float,
    ) -> Generator[Chunk, None, bool]:
        """Move bytes between the command and us until it exits; return whether it timed out."""
        sel = selectors.DefaultSelector()
        assert proc.stdout is not None and proc.stderr is not None
        for name, pipe in (("stdout", proc.stdout), ("stderr", proc.stderr)):
            os.set_blocking(pipe.fileno(), False)
            sel.register(pipe.fileno(), selectors.EVENT_READ, name)
        pidfd = os.pidfd_open(proc.pid)
        sel.register(pidfd, selectors.EVENT_READ, "exit")
        pending = memoryview(req.stdin)
        if req.stdin:
            assert proc.stdin is not None
            os.set_blocking(proc.stdin.fileno(), False)
            sel.register(proc.stdin.fileno(), selectors.EVENT_WRITE, "stdin")
        streamed = {"stdout": 0, "stderr": 0}
        open_streams = {"stdout", "stderr"}
        exited_at: float | None = None
        timed_out = False
        try:
            while open_streams or exited_at is None:
                now = time.monotonic()
                if exited_at is None and now >= deadline:
                    timed_out = True
                    kill_tree(proc.pid)
                    exited_at = now
                limit = deadline if exited_at is None else exited_at + _DRAIN_AFTER_EXIT_S
                if now >= limit:
                    break
                for key, _ in sel.select(limit - now):
                    name = key.data
                    if name == "exit":
                        sel.unregister(pidfd)
                        exited_at = exited_at or time.monotonic()
                    elif name == "stdin":
                        try:
                            pending = pending[os.write(key.fd, pending) :]
                        except (BrokenPipeError, OSError):
                            pending = pending[:0]
                        if not pending:
                            sel.unregister(key.fd)
                            assert proc.stdin is not None
                            proc.stdin.close()
                    else:
                        try:
                            data = os.read(key.fd, _READ)
                        except BlockingIOError:
                            continue
                        if not data:
                            sel.unregister(key.fd)
                            open_streams.discard(name)
                            continue
                        captures[name].feed(data)
                        # Stream no more than the cap, like the final result; the rest is in the file.
                        room = req.max_output_bytes - streamed[name]
                        if room > 0:
                            streamed[name] += min(room, len(data))
                            yield Chunk(name, data[:room])
        finally:
            sel.close()
            os.close(pidfd)
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        return timed_out


def _user_env(run_as: RunAs) -> dict[str, str]:
    env = {"HOME": run_as.home}
    if run_as.name is not None:
        env["USER"] = env["LOGNAME"] = run_as.name
    return env


def _credentials(run_as: RunAs) -> dict[str, Any]:
    return {"user": run_as.uid, "group": run_as.gid, "extra_groups": list(run_as.groups)}


def _set_oom_score(pid: int, score: int) -> None:
    """Give the command and whatever it already started the score; children started later inherit it.

    The executor keeps 0 (root here cannot lower its own score) and the command is written right after
    its exec, so a child it forked before that would keep the executor's 0: its descendants are found
    (the sandbox's /proc holds only its own processes) and written too, until a pass finds none new.
    That pass reads every process's ``stat``, so it is skipped when the last pid handed out in the executor's
    pid namespace is still the command's once it is written: then nothing has been forked since it started.
    """
    done: set[int] = set()
    todo = {pid}
    while todo:
        for target in todo:
            try:
                with open(f"/proc/{target}/oom_score_adj", "w", encoding="ascii") as fh:
                    fh.write(str(score))
            except OSError:
                pass  # it has exited already
        done |= todo
        if _last_pid() == pid:
            return
        todo = _descendants(pid) - done


def _last_pid() -> int | None:
    """The last pid handed out in this process's pid namespace (None when it cannot be read)."""
    try:
        with open("/proc/sys/kernel/ns_last_pid", "rb") as fh:
            return int(fh.read())
    except (OSError, ValueError):
        return None


def _descendants(pid: int) -> set[int]:
    parents: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as fh:
                    parents[int(entry.name)] = int(fh.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found = {pid}
    while grown := {child for child, parent in parents.items() if parent in found} - found:
        found |= grown
    return found - {pid}


def _note(cap: Captured, note: bytes) -> Captured:
    return Captured(cap.data + note, cap.truncated, cap.total_bytes, cap.sha256, cap.full_path)
