"""SandboxFusion's ``run_code`` request and answer, field for field as its client (PyPI ``sandbox-fusion``,
``sandbox_fusion.models``) and verl's reward code send and read them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grove.core.schema import spec

RUN_STATUSES = ("Success", "Failed", "SandboxError")
"""``Success``: every command finished with 0; ``Failed``: one did not (or ran out of time);
``SandboxError``: grove could not run it (the client raises and retries)."""
COMMAND_STATUSES = ("Finished", "Error", "TimeLimitExceeded")


@dataclass(frozen=True)
class RunCodeBody:
    """``POST /sandbox-fusion/run_code``: compile (if the language needs it) and run one program."""

    code: str = spec("the program's source", max_len=16 * 1024 * 1024)
    language: str = spec("the language or execution mode (see the README's table)", max_len=64)
    stdin: str | None = spec("text fed to the program's standard input", default=None, max_len=64 * 1024 * 1024)
    compile_timeout: float = spec("seconds the compiler may take", default=10.0, minimum=0.1, maximum=3600)
    run_timeout: float = spec("seconds the program may take", default=10.0, minimum=0.1, maximum=3600)
    memory_limit_MB: int = spec("address space of the program in MiB (verl sends it); -1 or 0: no limit beyond "
                                "the sandbox's own", default=-1, minimum=-1, maximum=262144)
    files: dict[str, str | None] = spec("files to place first: path (relative to the working directory, or "
                                        "absolute) to base64 content", factory=dict, max_items=1024,
                                        max_len=64 * 1024 * 1024)
    fetch_files: list[str] = spec("paths to return after the run, base64 encoded (missing ones left out)",
                                  factory=list, max_items=1024)


def command_result(result: dict[str, Any] | None, timeout_s: float) -> dict[str, Any]:
    """SandboxFusion's ``CommandRunResult`` of one grove exec result."""
    if result is None:
        return {"status": "Error", "execution_time": None, "cpu_time": None, "return_code": None,
                "stdout": None, "stderr": None}
    return {
        "status": "TimeLimitExceeded" if result.get("timed_out") else "Finished",
        "execution_time": min(float(result.get("duration_s") or 0.0), timeout_s) if result.get("timed_out")
        else float(result.get("duration_s") or 0.0),
        "cpu_time": None,
        "return_code": result.get("exit_code"),
        "stdout": _text(result.get("stdout")),
        "stderr": _text(result.get("stderr")),
    }


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value or "")


def run_answer(status: str, message: str, *, compile_result: dict[str, Any] | None = None,
               run_result: dict[str, Any] | None = None, sandbox_id: str | None = None,
               files: dict[str, str] | None = None) -> dict[str, Any]:
    """SandboxFusion's ``RunCodeResponse``."""
    return {"status": status, "message": message, "compile_result": compile_result, "run_result": run_result,
            "executor_pod_name": sandbox_id, "files": files or {}}
