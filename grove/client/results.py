"""What a command did, as the SDK returns it."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class ExecResult:
    """What a command did."""

    exit_code: int
    stdout: bytes
    stderr: bytes
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    timed_out: bool = False
    oom_killed: bool = False
    duration_s: float = 0.0
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    stdout_sha256: str = ""
    stderr_sha256: str = ""
    stdout_file: str | None = None
    stderr_file: str | None = None
    request_id: str | None = None

    @property
    def ok(self) -> bool:
        """Exit code 0 and no timeout."""
        return self.exit_code == 0 and not self.timed_out

    @property
    def text(self) -> str:
        """stdout as text (invalid UTF-8 replaced)."""
        return self.stdout.decode("utf-8", "replace")

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> ExecResult:
        """Build from the executor's result, ignoring fields this SDK version does not know."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})
