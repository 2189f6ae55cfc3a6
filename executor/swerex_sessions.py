"""The named shell sessions of SWE-ReX's protocol: ``create_session``, ``run_in_session``, ``close_session``.

Each session is a shell on a pty (:mod:`executor.shell`). Answers are SWE-ReX's ``BashObservation``; its
exceptions (a timeout, a non-zero exit under ``check="raise"``, a syntax error, an unknown session) are
raised as :class:`~executor.swerex_models.SwerexError`. A command that times out has its process group
killed and the session lives on; a session whose shell cannot come back is dropped, everything it
started killed.
"""

from __future__ import annotations

import os
import subprocess
import threading
from dataclasses import dataclass, field
from typing import Any

from executor import reaper
from executor.paths import PathResolver
from executor.settings import ExecutorSettings
from executor.shell import ShellExited, ShellSession, ShellTimeout, find_shell
from executor.swerex_models import BashAction, BashInterruptAction, CreateSession, SwerexError
from grove.core.errors import Unavailable

MAX_SESSIONS = 32
# SWE-ReX reports its own PS1 as the ``expect_string`` when the prompt ended a command; so do we.
PS1_NAME = "SHELLPS1PREFIX"


@dataclass
class _Session:
    shell: ShellSession
    lock: threading.Lock = field(default_factory=threading.Lock)


class Sessions:
    """The named shells of one executor."""

    def __init__(self, settings: ExecutorSettings, paths: PathResolver) -> None:
        self._settings = settings
        self._paths = paths
        self._lock = threading.Lock()
        self._sessions: dict[str, _Session] = {}

    def create(self, req: CreateSession) -> str:
        """Start a shell; its startup output."""
        with self._lock:
            if req.session in self._sessions:
                raise SwerexError("SessionExistsError", f"session {req.session} already exists")
            if len(self._sessions) >= MAX_SESSIONS:
                raise Unavailable(f"this sandbox already has {MAX_SESSIONS} sessions; close one", retry_after=1)
            s = self._settings
            cwd = self._paths.resolve(s.workdir)
            if not os.path.isdir(cwd):
                cwd = self._paths.resolve("/")
            tag = os.urandom(6).hex()
            try:
                shell = ShellSession(
                    find_shell(),
                    cwd=cwd,
                    env=s.env,
                    script_dir=self._paths.resolve(f"/tmp/.grove-swerex/{tag}"),
                    spill_dir=self._paths.resolve(s.output_dir),
                    api_spill_dir=s.output_dir.rstrip("/"),
                    oom_score_adj=s.command_oom_score_adj,
                )
            except BlockingIOError as exc:
                raise Unavailable("cannot start a shell: the sandbox is out of processes", retry_after=1) from exc
            entry = self._sessions[req.session] = _Session(shell)
        with entry.lock:
            try:
                # The client's default of 1 s is tight for a loaded machine; a slow start is no failure.
                return entry.shell.start(req.startup_source, max(req.startup_timeout, 10.0))
            except (ShellTimeout, ShellExited) as exc:
                self._drop(req.session)
                raise SwerexError("CommandTimeoutError", f"session {req.session} did not start: {exc}") from exc

    def get(self, name: str) -> _Session:
        """A session by name (SessionDoesNotExistError if none)."""
        entry = self._sessions.get(name)
        if entry is None:
            raise SwerexError("SessionDoesNotExistError", f"session {name!r} does not exist")
        return entry

    def close(self, name: str) -> None:
        """Kill one session's shell and everything it started."""
        self.get(name)
        self._drop(name)

    def close_all(self) -> None:
        """Kill every session."""
        for name in list(self._sessions):
            self._drop(name)

    def _drop(self, name: str) -> None:
        with self._lock:
            entry = self._sessions.pop(name, None)
        if entry is not None:
            entry.shell.close()

    def run(self, action: BashAction | BashInterruptAction) -> dict[str, Any]:
        """``run_in_session``: the BashObservation body."""
        entry = self.get(action.session)
        with entry.lock:
            if isinstance(action, BashInterruptAction):
                return self._interrupt(action, entry.shell)
            if action.is_interactive_command or action.is_interactive_quit:
                return self._interactive(action, entry.shell)
            return self._command(action, entry.shell)

    def _command(self, action: BashAction, shell: ShellSession) -> dict[str, Any]:
        if shell.argv[0].endswith("bash"):
            _check_syntax(shell.argv[0], action.command, self._settings)
        timeout = clamp(action.timeout, self._settings)
        limit = self._settings.default_max_output_bytes
        failure = ""
        try:
            output, code, index = shell.run(action.command, timeout, action.expect, limit)
        except ShellTimeout as exc:
            if not exc.recovered:
                self._drop(action.session)
            message = f"timeout after {action.timeout} seconds while running command {action.command!r}"
            raise SwerexError("CommandTimeoutError", message, {"output": exc.output}) from None
        except ShellExited as exc:
            self._drop(action.session)
            output, code, index = exc.output, exc.exit_code, len(action.expect)
            failure = f"the shell exited (status {exc.exit_code}); create a new session"
        expect = [*action.expect, PS1_NAME][index]
        if action.check == "ignore":
            code = None
        elif action.check == "raise" and code != 0:
            message = f"Command {action.command!r} failed with exit code {code}. Here is the output:\n{output!r}"
            raise SwerexError("NonZeroExitCodeError", f"{action.error_msg}: {message}" if action.error_msg else message,
                              {"exit_code": code, "output": output})
        return _observation(output, code, expect, failure)

    def _interactive(self, action: BashAction, shell: ShellSession) -> dict[str, Any]:
        timeout = clamp(action.timeout, self._settings)
        try:
            output, index = shell.send(action.command, timeout, action.expect)
        except ShellTimeout as exc:
            message = f"timeout after {action.timeout} seconds while running command {action.command!r}"
            raise SwerexError("CommandTimeoutError", message, {"output": exc.output}) from None
        except ShellExited as exc:
            self._drop(action.session)
            return _observation(exc.output.strip(), exc.exit_code, PS1_NAME, "the shell exited")
        # A REPL may echo the line back; SWE-ReX drops it too.
        output = output.lstrip().removeprefix(action.command).strip()
        return _observation(output, 0, [*action.expect, PS1_NAME][index], "")

    def _interrupt(self, action: BashInterruptAction, shell: ShellSession) -> dict[str, Any]:
        try:
            output, index = shell.interrupt(action.timeout, action.n_retry, action.expect)
        except (ShellTimeout, ShellExited):
            self._drop(action.session)
            raise SwerexError("pexpect.exceptions.TIMEOUT", "Failed to interrupt session") from None
        return _observation(output, 0, [*action.expect, PS1_NAME][index], "")


def _observation(output: str, code: int | None, expect: str, failure: str) -> dict[str, Any]:
    return {"output": output, "exit_code": code, "failure_reason": failure, "expect_string": expect,
            "session_type": "bash"}


def clamp(timeout: float | None, settings: ExecutorSettings) -> float:
    """SWE-ReX's "no timeout" is the executor's default; nothing runs past the executor's maximum."""
    return min(timeout or settings.default_timeout_s, settings.max_timeout_s)


def _check_syntax(bash: str, command: str, settings: ExecutorSettings) -> None:
    """``bash -n`` first, as SWE-ReX does: a command with a syntax error is refused, not half run."""
    proc = reaper.spawn([bash, "-n"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                        env=dict(settings.env))
    try:
        out, err = proc.communicate(command.encode(errors="surrogateescape"), timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    finally:
        reaper.release(proc)
    if proc.returncode == 0:
        return
    stdout = out.decode(errors="backslashreplace")
    stderr = err.decode(errors="backslashreplace")
    message = (f"Error (exit code {proc.returncode}) while checking bash command \n{command!r}\n"
               f"---- Stderr ----\n{stderr}\n---- Stdout ----\n{stdout}")
    raise SwerexError("BashIncorrectSyntaxError", message, {"bash_stdout": stdout, "bash_stderr": stderr})
