"""A persistent interactive shell on a pseudo-terminal: one session of the SWE-ReX protocol.

The shell is started in a session of its own with the pty as its controlling terminal, so it has job
control: every command line it runs is a process group of its own, the terminal's foreground group,
and that group is what a timeout kills — the shell, its variables, its cwd and its background jobs
live on. Closing the session kills the shell's whole tree.

Command boundaries need no guessing. Each command is written to a file and sourced (``. file``), so
multi-line commands and heredocs run as one unit and exactly one prompt follows them; the prompt
carries a per-session token, the command's sequence number and its exit status
(``__grove_<token>_<seq>_<status>__``), so a stale prompt can never end the wrong command and the exit
code arrives with the boundary. Echo and CR-LF translation are off on the terminal, so the output is
what the command wrote.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import re
import secrets
import select
import shutil
import signal
import struct
import subprocess
import termios
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

from executor import reaper
from executor.capture import OutputCapture
from executor.proctree import kill_tree
from executor.terminals import read_terminal

_READ = 65536
# Bytes held back from the output until we know they are not the start of a prompt or an expect match.
_HOLD = 4096
_ANSI = re.compile(rb"\x1b[@-_][0-?]*[ -/]*[@-~]")
# Defaults for the shell's environment that keep pagers from waiting for a key nobody will press.
SHELL_ENV_DEFAULTS = {"TERM": "dumb", "PAGER": "cat", "GIT_PAGER": "cat", "MANPAGER": "cat"}
_ROWS, _COLS = 50, 250
# After a timeout kill, how long the shell may take to show its prompt before the session is given up.
_RECOVER_S = 3.0


class ShellExited(Exception):
    """The shell is gone (it ran ``exit``, or was killed): the session cannot continue."""

    def __init__(self, output: str, exit_code: int | None) -> None:
        super().__init__(f"the shell exited with status {exit_code}")
        self.output = output
        self.exit_code = exit_code


class ShellTimeout(Exception):
    """Nothing matched before the deadline; ``output`` is what arrived meanwhile."""

    def __init__(self, output: str, *, recovered: bool) -> None:
        super().__init__("timeout")
        self.output = output
        self.recovered = recovered


@dataclass(frozen=True)
class Match:
    """How a wait ended: the output before the match and which pattern matched."""

    output: str
    index: int
    """Index into the patterns waited for (the prompt is always last)."""
    groups: tuple[bytes, ...]


def clean(data: bytes) -> str:
    """Terminal output as text: escape sequences removed, CR-LF made LF, bad UTF-8 backslash-escaped."""
    return _ANSI.sub(b"", data).replace(b"\r\n", b"\n").decode("utf-8", "backslashreplace")


def find_shell() -> list[str]:
    """argv of the best shell of the image: bash (no line editing) if it has one, else ``sh -i``.

    Looked up in the real filesystem, like an exec's program: commands are not confined to the API root
    (inside a sandbox both are "/").
    """
    for path in ("/bin/bash", "/usr/bin/bash", "/usr/local/bin/bash"):
        if os.access(path, os.X_OK):
            return [path, "--noediting", "-i"]
    return ["/bin/sh", "-i"]


_libc = ctypes.CDLL(None, use_errno=True)
_PR_SET_CHILD_SUBREAPER = 36


def _prepare_shell() -> None:  # pragma: no cover - runs in the child between fork and exec
    # The pty becomes the controlling terminal (job control: each command line a process group), and the
    # shell a subreaper (kept across exec): whatever a command double-forks away (`setsid cmd &`) is
    # re-parented to the shell, not to PID 1, so closing the session still finds and kills it.
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    _libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


class ShellSession:
    """One shell; callers serialise their calls (the app holds a lock per session)."""

    def __init__(
        self,
        argv: list[str],
        *,
        cwd: str,
        env: Mapping[str, str],
        script_dir: str,
        spill_dir: str,
        api_spill_dir: str,
        oom_score_adj: int | None = None,
    ) -> None:
        self.argv = argv
        self.token = secrets.token_hex(6)
        self._seq = 0
        self._pending = b""
        self._script_dir = script_dir
        self._spill_dir, self._api_spill_dir = spill_dir, api_spill_dir
        os.makedirs(script_dir, mode=0o700, exist_ok=True)
        master, slave = os.openpty()
        try:
            attrs = termios.tcgetattr(slave)
            attrs[1] &= ~termios.ONLCR  # oflag: "\n" stays "\n"
            attrs[3] &= ~termios.ECHO  # lflag: what we type is not echoed back
            termios.tcsetattr(slave, termios.TCSANOW, attrs)
            fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", _ROWS, _COLS, 0, 0))
            full_env = {**SHELL_ENV_DEFAULTS, **env, "PS1": "", "PS2": "", "PS0": ""}
            self.proc = reaper.spawn(  # registered: PID 1's orphan reaper must leave its exit to us
                argv,
                stdin=slave,
                stdout=slave,
                stderr=slave,
                cwd=cwd,
                env=full_env,
                start_new_session=True,
                preexec_fn=_prepare_shell,
                close_fds=True,
            )
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)
        self._fd = master
        os.set_blocking(master, False)
        # Collect the shell's exit the moment it happens (PID 1's reaper leaves it to us, and would spin on it).
        threading.Thread(target=self.proc.wait, name=f"shell-{self.proc.pid}", daemon=True).start()
        if oom_score_adj is not None:
            with contextlib.suppress(OSError), open(f"/proc/{self.proc.pid}/oom_score_adj", "w") as fh:
                fh.write(str(oom_score_adj))

    # -- the prompt --------------------------------------------------------------------------------

    def _ps1(self) -> str:
        return f"__grove_{self.token}_${{__grove_seq}}_${{__grove_rc}}__"

    def _prompt(self, seq: int) -> re.Pattern[bytes]:
        return re.compile(rb"__grove_" + self.token.encode() + rb"_" + str(seq).encode() + rb"_(\d*)__")

    def _any_prompt(self) -> re.Pattern[bytes]:
        return re.compile(rb"__grove_" + self.token.encode() + rb"_\d*_\d*__")

    def _line(self, seq: int, body: str) -> bytes:
        # The prompt is reset after every command: a sourced venv `activate` may have rewritten it.
        tail = f"__grove_rc=$?; PS1='{self._ps1()}'; PS2=''"
        return f"__grove_seq={seq}; {body}; {tail}\n".encode()

    # -- calls ---------------------------------------------------------------------------------------

    def start(self, startup_source: list[str], timeout: float) -> str:
        """Source the startup files, install the prompt; return what the shell printed."""
        sources = "; ".join(f". {_quote(path)}" for path in startup_source) or ":"
        self._write(self._line(0, f"unset PROMPT_COMMAND; {sources}"))
        return self._wait([], self._prompt(0), time.monotonic() + timeout, limit=1 << 20).output

    def run(self, command: str, timeout: float, expect: list[str], limit: int) -> tuple[str, int | None, int]:
        """Run one command; (output, exit status or None if an expect string matched, index matched).

        Raises :class:`ShellTimeout` (after killing the foreground job) or :class:`ShellExited`.
        """
        self._seq += 1
        seq = self._seq
        stale = self._drain()
        script = os.path.join(self._script_dir, f"{seq}.sh")
        # The name is predictable and the directory is the sandbox's to change: never write through a link
        # or into a FIFO put there (that would block this call for good); one planted meanwhile fails it.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(script)
        fd = os.open(script, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as fh:
            fh.write(command + "\n")
        try:
            self._write(self._line(seq, f". {_quote(script)}"))
            deadline = time.monotonic() + timeout
            try:
                match = self._wait([_pattern(e) for e in expect], self._prompt(seq), deadline, limit=limit)
            except ShellTimeout as exc:
                recovered = self._kill_foreground(seq)
                raise ShellTimeout(stale + exc.output, recovered=recovered) from None
        finally:
            with contextlib.suppress(OSError):
                os.unlink(script)
        output = stale + match.output
        if match.index < len(expect):
            return output, None, match.index
        status = match.groups[0]
        return output, int(status) if status else None, match.index

    def send(self, text: str, timeout: float, expect: list[str]) -> tuple[str, int]:
        """Type ``text`` (input for a program that is running, e.g. a REPL); wait for an expect string
        or the prompt. Returns the output and the index matched (``len(expect)``: the prompt)."""
        self._drain()
        self._write(text.encode() + b"\n")
        match = self._wait([_pattern(e) for e in expect], self._prompt(self._seq), time.monotonic() + timeout,
                           limit=1 << 20)
        return match.output, match.index

    def interrupt(self, timeout: float, retries: int, expect: list[str]) -> tuple[str, int]:
        """^C until the prompt (or an expect string) shows; the foreground job is killed if ^C is not enough."""
        patterns = [_pattern(e) for e in expect]
        output = ""
        for _ in range(max(1, retries)):
            self._write(b"\x03")
            try:
                match = self._wait(patterns, self._prompt(self._seq), time.monotonic() + timeout, limit=1 << 20)
            except ShellTimeout as exc:
                output += exc.output
                continue
            return (output + match.output).strip(), match.index
        if self._kill_foreground(self._seq):
            return output.strip(), len(expect)
        raise ShellTimeout(output, recovered=False)

    def alive(self) -> bool:
        """Whether the shell process still runs."""
        return self.proc.poll() is None

    def close(self) -> None:
        """Kill the shell and everything it started; release the terminal."""
        if self.proc.poll() is None:
            kill_tree(self.proc.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
            reaper.release(self.proc)
        with contextlib.suppress(OSError):
            os.close(self._fd)
        shutil.rmtree(self._script_dir, ignore_errors=True)

    # -- plumbing ------------------------------------------------------------------------------------

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        deadline = time.monotonic() + 10
        while view:
            try:
                view = view[os.write(self._fd, view) :]
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise ShellTimeout("", recovered=False) from None
                select.select([], [self._fd], [], 0.1)
            except OSError as exc:
                raise ShellExited("", self._exit_status()) from exc

    def _drain(self) -> str:
        """What arrived since the last call (a background job's output), minus stale prompts."""
        data = bytearray(self._pending)
        self._pending = b""
        while len(data) < (1 << 20):
            try:
                chunk = os.read(self._fd, _READ)
            except (BlockingIOError, OSError):
                break
            if not chunk:
                break
            data += chunk
        return clean(self._any_prompt().sub(b"", bytes(data)))

    def _wait(
        self, expect: list[re.Pattern[bytes]], prompt: re.Pattern[bytes], deadline: float, *, limit: int
    ) -> Match:
        """Read until a pattern matches (the earliest match wins); output before it is captured, bounded."""
        patterns = [*expect, prompt]
        name = f"swerex-{self.token}-{self._seq}-{secrets.token_hex(3)}"
        capture = OutputCapture(limit, os.path.join(self._spill_dir, name), f"{self._api_spill_dir}/{name}")
        window = bytearray()

        def output() -> str:
            capture.feed(bytes(window))
            window.clear()
            return clean(capture.finish().data)

        while True:
            found = [(m.start(), i, m) for i, p in enumerate(patterns) if (m := p.search(window))]
            if found:
                _, index, m = min(found, key=lambda f: (f[0], f[1]))
                groups = tuple(bytes(g or b"") for g in m.groups())  # before the buffer changes
                self._pending = bytes(window[m.end() :])  # e.g. a background job's output: the next call's
                del window[m.start() :]
                return Match(output(), index, groups)
            if len(window) > _HOLD:
                capture.feed(bytes(window[:-_HOLD]))
                del window[:-_HOLD]
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ShellTimeout(output(), recovered=True)
            ready, _, _ = select.select([self._fd], [], [], min(remaining, 1.0))
            if not ready:
                continue
            chunk = read_terminal(self._fd, _READ)
            if chunk is None:
                continue
            if not chunk:
                raise ShellExited(output(), self._exit_status())
            window += chunk

    def _exit_status(self) -> int | None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            code = self.proc.wait(timeout=1)
            return 128 - code if code < 0 else code
        return None

    def _kill_foreground(self, seq: int) -> bool:
        """Kill the job in the foreground (or interrupt the shell running a builtin loop); True if the
        shell came back to its prompt, False if it did not and the session was killed."""
        try:
            group = os.tcgetpgrp(self._fd)
        except OSError:
            group = self.proc.pid
        if group != self.proc.pid:
            kill_tree(group)
        else:
            with contextlib.suppress(OSError):
                os.kill(self.proc.pid, signal.SIGINT)  # bash aborts the line it runs and prompts again
        try:
            self._wait([], self._prompt(seq), time.monotonic() + _RECOVER_S, limit=1 << 16)
            return True
        except (ShellTimeout, ShellExited):
            self.close()
            return False


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


def _pattern(expr: str) -> re.Pattern[bytes]:
    """An expect string is a regular expression, as in pexpect (which SWE-ReX uses)."""
    return re.compile(expr.encode())
