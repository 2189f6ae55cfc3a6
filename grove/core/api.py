"""Request models of the calls that more than one layer handles: the router publishes them in
``/v1/openapi.json``, the executor validates against the same field set, the SDK sends them.

Defined with :func:`grove.core.schema.spec`, so every field is documented once and the published schema is
generated from the definition, never kept beside it.
"""

from __future__ import annotations

from dataclasses import dataclass

from grove.core.schema import spec

DAY = 86400.0


@dataclass(frozen=True)
class ExecBody:
    """Run one command in a sandbox (``POST /v1/sandboxes/{id}/exec``)."""

    command: str | list[str] = spec("a string runs under `/bin/sh -c`; a list is the argv itself (non-empty)")
    cwd: str | None = spec("working directory (absolute, or relative to the sandbox's workdir)", default=None,
                           max_len=4096)
    env: dict[str, str] = spec("variables merged over the sandbox's environment", factory=dict)
    stdin: bytes | str | None = spec("bytes written to the command's standard input (msgpack bin, or a UTF-8 "
                                     "string in JSON)", default=None)
    timeout_s: float | None = spec("server-side deadline: the command's whole process tree is killed at it "
                                   "(default 600)", default=None, minimum=0.001, maximum=7 * DAY)
    max_output_bytes: int | None = spec("cap per stream of what the reply carries; past it head and tail are "
                                        "kept and the full output is stored (default 1 MiB)", default=None,
                                        minimum=0, maximum=1 << 30)
    request_id: str | None = spec("idempotency key: a retry with the same id returns the first call's result "
                                  "and never runs the command twice", default=None, max_len=200)
    user: str | None = spec("run as this user of the sandbox: `name`, `uid`, `name:group` or `uid:gid` "
                            "(default: the sandbox's root)", default=None, max_len=256)


#: The exec call's field names (the executor refuses any other).
EXEC_FIELDS = frozenset(ExecBody.__dataclass_fields__)
