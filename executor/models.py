"""The exec request: parsed once from JSON or msgpack, unknown fields rejected, every field checked."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from executor.settings import ExecutorSettings
from executor.users import parse_spec
from grove.core.api import EXEC_FIELDS, MIN_OUTPUT_BYTES, MIN_TIMEOUT_S
from grove.core.errors import BadRequest, Invalid

# The fields and bounds are the published model's (grove.core.api.ExecBody, in /v1/openapi.json); the upper
# bounds come from the executor's settings, whose defaults are the published ones (a Knative revision's
# timeout lowers max_timeout_s).
_FIELDS = EXEC_FIELDS


@dataclass(frozen=True)
class ExecRequest:
    """One command to run."""

    argv: list[str]
    """The program and its arguments; a string ``command`` becomes ``["/bin/sh", "-c", command]``."""
    cwd: str | None
    """Working directory (API path); the sandbox's workdir when None."""
    env: dict[str, str]
    """Variables merged over the sandbox's environment."""
    stdin: bytes
    """Bytes written to the command's standard input (empty: /dev/null)."""
    timeout_s: float
    """Server-side deadline; at it the whole process tree is killed."""
    max_output_bytes: int
    """Cap per stream of what the response carries."""
    request_id: str | None
    """Idempotency key: a retry with the same id never runs the command twice."""
    user: str | None = None
    """Run as this user (``name``, ``uid``, ``name:group``, ``uid:gid``); the sandbox's root when None."""

    def fingerprint(self) -> str:
        """What the call runs (command, place, environment, input, user), for telling a retry from a reuse."""
        digest = hashlib.sha256(repr((self.argv, self.cwd, sorted(self.env.items()), self.user)).encode())
        digest.update(self.stdin)
        return digest.hexdigest()

    @classmethod
    def parse(cls, body: Any, settings: ExecutorSettings) -> ExecRequest:
        """Validate a decoded body; raise ``BadRequest``/``Invalid`` naming the offending field."""
        if not isinstance(body, Mapping):
            raise BadRequest("exec body must be an object with at least a 'command' field")
        unknown = sorted(set(body) - _FIELDS)
        if unknown:
            raise BadRequest(f"unknown field(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(sorted(_FIELDS))}")
        return cls(
            argv=_argv(body.get("command")),
            cwd=_opt_text(body, "cwd"),
            env=_env(body.get("env")),
            stdin=_stdin(body.get("stdin")),
            timeout_s=_timeout(body.get("timeout_s"), settings),
            max_output_bytes=_max_output(body.get("max_output_bytes"), settings),
            request_id=_request_id(body.get("request_id")),
            user=_user(body.get("user")),
        )


def _no_nul(value: str, what: str) -> str:
    if "\x00" in value:
        raise BadRequest(f"{what} contains a NUL byte, which no process can receive")
    return value


def _argv(command: Any) -> list[str]:
    if isinstance(command, str):
        if not command.strip():
            raise Invalid("'command' is empty")
        return ["/bin/sh", "-c", _no_nul(command, "'command'")]
    if isinstance(command, list) and command:
        if not all(isinstance(a, str) for a in command):
            raise BadRequest("'command' as a list must hold only strings")
        if not command[0]:
            raise Invalid("'command[0]' (the program) is empty")
        return [_no_nul(a, f"'command[{i}]'") for i, a in enumerate(command)]
    raise BadRequest("'command' must be a non-empty string (run by /bin/sh -c) or a non-empty list (argv)")


def _opt_text(body: Mapping[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise BadRequest(f"'{name}' must be a non-empty string")
    return _no_nul(value, f"'{name}'")


def _env(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise BadRequest("'env' must be an object of string to string")
    out: dict[str, str] = {}
    for key, val in value.items():
        if not isinstance(key, str) or not isinstance(val, str):
            raise BadRequest("'env' must be an object of string to string")
        if not key or "=" in key:
            raise Invalid(f"'env' key {key!r} is not a valid variable name")
        out[_no_nul(key, "an 'env' key")] = _no_nul(val, f"'env[{key}]'")
    return out


def _stdin(value: Any) -> bytes:
    if value is None:
        return b""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    raise BadRequest("'stdin' must be bytes (msgpack) or a string")


def _timeout(value: Any, settings: ExecutorSettings) -> float:
    if value is None:  # a lower ceiling (a Knative revision's timeout) lowers the default with it
        return min(settings.default_timeout_s, settings.max_timeout_s)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadRequest("'timeout_s' must be a number of seconds")
    if not math.isfinite(value):
        raise Invalid(f"'timeout_s' must be a finite number of seconds, got {value}")
    if value < MIN_TIMEOUT_S or value > settings.max_timeout_s:
        raise Invalid(f"'timeout_s' must be between {MIN_TIMEOUT_S:g} and {settings.max_timeout_s:g} (this sandbox's "
                      f"longest call), got {value}; for longer work, start it in the background and poll")
    return float(value)


def _max_output(value: Any, settings: ExecutorSettings) -> int:
    if value is None:
        return settings.default_max_output_bytes
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest("'max_output_bytes' must be an integer")
    if value < MIN_OUTPUT_BYTES or value > settings.max_output_bytes_limit:
        raise Invalid(f"'max_output_bytes' must be between {MIN_OUTPUT_BYTES} and {settings.max_output_bytes_limit}, "
                      f"got {value}; the full output of a truncated stream is stored whole")
    return value


def _request_id(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not 1 <= len(value) <= 200:
        raise BadRequest("'request_id' must be a string of 1 to 200 characters")
    return value


def _user(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise BadRequest("'user' must be a string: 'name', 'uid', 'name:group' or 'uid:gid'")
    parse_spec(_no_nul(value, "'user'"))
    return value
