"""The SWE-ReX remote-runtime wire models (swe-rex 1.x ``swerex.runtime.abstract``), parsed without pydantic,
and the exception transfer of its server.

Field names, defaults and meanings are SWE-ReX's. Unlike grove's own API, unknown fields are ignored
rather than refused: that is what SWE-ReX's server (pydantic's default) does, and a newer SWE-ReX client
that adds a field must keep working against this executor.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from grove.core.errors import BadRequest, Invalid

_EXC = "swerex.exceptions."


def _obj(body: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(body, Mapping):
        raise BadRequest(f"{what} body must be a JSON object")
    return body


def _str(body: Mapping[str, Any], name: str, default: str | None = None) -> str:
    value = body.get(name, default)
    if not isinstance(value, str):
        raise BadRequest(f"'{name}' must be a string" + ("" if default is not None else " (required)"))
    if "\x00" in value and name != "content":
        raise BadRequest(f"'{name}' contains a NUL byte")
    return value


def _opt_str(body: Mapping[str, Any], name: str) -> str | None:
    return None if body.get(name) is None else _str(body, name)


def _bool(body: Mapping[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise BadRequest(f"'{name}' must be true or false")
    return value


def _strs(body: Mapping[str, Any], name: str) -> list[str]:
    value = body.get(name) or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BadRequest(f"'{name}' must be a list of strings")
    return list(value)


def _seconds(body: Mapping[str, Any], name: str, default: float | None) -> float | None:
    value = body.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadRequest(f"'{name}' must be a number of seconds")
    if not math.isfinite(value):
        raise Invalid(f"'{name}' must be a finite number of seconds, got {value}")
    if value <= 0:
        raise Invalid(f"'{name}' must be > 0, got {value}")
    return float(value)


def _literal(body: Mapping[str, Any], name: str, allowed: tuple[str, ...]) -> str:
    value = body.get(name, allowed[0])
    if value not in allowed:
        raise BadRequest(f"'{name}' must be one of {', '.join(map(repr, allowed))}, got {value!r}")
    return str(value)


@dataclass(frozen=True)
class CreateSession:
    """``CreateBashSessionRequest``: start a named shell."""

    session: str
    startup_source: list[str]
    """Files sourced before the first command (they often set PS1, which is reset after them)."""
    startup_timeout: float

    @classmethod
    def parse(cls, body: Any) -> CreateSession:
        """From the JSON body."""
        b = _obj(body, "create_session")
        _literal(b, "session_type", ("bash",))
        return cls(_session(b), _strs(b, "startup_source"), _seconds(b, "startup_timeout", 1.0) or 1.0)


@dataclass(frozen=True)
class BashAction:
    """``BashAction``: a command (or, for an interactive program, a line of input) for a session."""

    session: str
    command: str
    timeout: float | None
    is_interactive_command: bool
    is_interactive_quit: bool
    check: str
    """``raise`` (non-zero exit → NonZeroExitCodeError), ``silent`` or ``ignore`` (no exit code)."""
    error_msg: str
    expect: list[str]
    """Regular expressions that also end the wait (besides the prompt)."""


@dataclass(frozen=True)
class BashInterruptAction:
    """``BashInterruptAction``: ^C the session until its prompt shows."""

    session: str
    timeout: float
    n_retry: int
    expect: list[str]


def parse_action(body: Any) -> BashAction | BashInterruptAction:
    """A ``run_in_session`` body: discriminated by ``action_type``."""
    b = _obj(body, "run_in_session")
    kind = _literal(b, "action_type", ("bash", "bash_interrupt"))
    if kind == "bash_interrupt":
        retries = b.get("n_retry", 3)
        if isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= 100:
            raise BadRequest("'n_retry' must be an integer between 0 and 100")
        return BashInterruptAction(_session(b), _seconds(b, "timeout", 0.2) or 0.2, retries, _strs(b, "expect"))
    return BashAction(
        session=_session(b),
        command=_str(b, "command"),
        timeout=_seconds(b, "timeout", None),
        is_interactive_command=_bool(b, "is_interactive_command", False),
        is_interactive_quit=_bool(b, "is_interactive_quit", False),
        check=_literal(b, "check", ("raise", "silent", "ignore")),
        error_msg=_str(b, "error_msg", ""),
        expect=_strs(b, "expect"),
    )


def parse_close_session(body: Any) -> str:
    """A ``close_session`` body: the session's name."""
    b = _obj(body, "close_session")
    _literal(b, "session_type", ("bash",))
    return _session(b)


@dataclass(frozen=True)
class Command:
    """``Command``: one process, independent of any session (like ``subprocess.run``)."""

    command: str | list[str]
    timeout: float | None
    shell: bool
    check: bool
    error_msg: str
    env: dict[str, str] | None
    """Merged over the sandbox's environment (SWE-ReX replaces the server's: here PATH and friends stay)."""
    cwd: str | None
    merge_output_streams: bool

    @classmethod
    def parse(cls, body: Any) -> Command:
        """From the JSON body."""
        b = _obj(body, "execute")
        command = b.get("command")
        if isinstance(command, list):
            if not all(isinstance(a, str) and "\x00" not in a for a in command):
                raise BadRequest("'command' as a list must hold strings without NUL bytes")
        else:
            command = _str(b, "command")
        shell = _bool(b, "shell", False)
        # Under a shell an empty (or blank) command is a no-op that exits 0, as on SWE-ReX's own server;
        # without one there is nothing to run.
        if not command and not (shell and isinstance(command, str)):
            raise Invalid("'command' is empty")
        env = b.get("env")
        if env is not None and (
            not isinstance(env, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
        ):
            raise BadRequest("'env' must be an object of string to string")
        return cls(
            command=command,
            timeout=_seconds(b, "timeout", None),
            shell=shell,
            check=_bool(b, "check", False),
            error_msg=_str(b, "error_msg", ""),
            env=dict(env) if env is not None else None,
            cwd=_opt_str(b, "cwd"),
            merge_output_streams=_bool(b, "merge_output_streams", False),
        )

    def argv(self) -> list[str]:
        """The argv ``subprocess.run`` would run for these fields."""
        if self.shell:
            head, rest = (self.command, []) if isinstance(self.command, str) else (self.command[0], self.command[1:])
            argv = ["/bin/sh", "-c", head, *rest]
        else:
            argv = [self.command] if isinstance(self.command, str) else list(self.command)
        if self.merge_output_streams:
            # One pipe for both streams keeps their interleaving, as stderr=STDOUT does.
            argv = ["/bin/sh", "-c", 'exec "$@" 2>&1', "sh", *argv]
        return argv


@dataclass(frozen=True)
class ReadFile:
    """``ReadFileRequest``."""

    path: str
    encoding: str | None
    errors: str | None

    @classmethod
    def parse(cls, body: Any) -> ReadFile:
        """From the JSON body."""
        b = _obj(body, "read_file")
        return cls(_str(b, "path"), _opt_str(b, "encoding"), _opt_str(b, "errors"))


@dataclass(frozen=True)
class WriteFile:
    """``WriteFileRequest``."""

    path: str
    content: str

    @classmethod
    def parse(cls, body: Any) -> WriteFile:
        """From the JSON body."""
        b = _obj(body, "write_file")
        return cls(_str(b, "path"), _str(b, "content"))


def _session(b: Mapping[str, Any]) -> str:
    name = _str(b, "session", "default")
    if not 1 <= len(name) <= 200:
        raise Invalid("'session' must be a name of 1 to 200 characters")
    return name


class SwerexError(Exception):
    """A runtime exception as SWE-ReX's client expects it: re-raised there as ``class_path``."""

    def __init__(self, class_path: str, message: str, extra_info: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.class_path = class_path if "." in class_path else _EXC + class_path
        self.message = message
        self.extra_info = extra_info or {}

    def to_body(self) -> dict[str, Any]:
        """The 511 body of SWE-ReX's server."""
        transfer = {"message": self.message, "class_path": self.class_path, "traceback": "",
                    "extra_info": self.extra_info}
        return {"swerexception": transfer}
