"""Issue 18, finding 11 (part): an exec reply's size is bounded once encoded, not only in raw bytes.

32 MiB of NUL output became a 201 MB JSON reply (``\\u0000`` is six bytes), which the router held whole to
record it. A JSON reply now carries at most twice ``max_output_bytes`` per stream, plain or streamed; the
msgpack reply still carries the raw bytes, and the cut is marked and counted as truncation.
"""

from __future__ import annotations

import json

import msgpack

from grove.client import Sandbox
from tests.support.router_fixtures import RouterProcess

MiB = 1024 * 1024
LIMIT = 4 * MiB


def _exec(router: RouterProcess, sandbox: Sandbox, command: str, *, stream: bool = False,
          as_msgpack: bool = False) -> bytes:
    headers = {"Accept": "application/msgpack"} if as_msgpack else {}
    reply = router.http("POST", f"/v1/sandboxes/{sandbox.id}/exec" + ("?stream=1" if stream else ""),
                        json_body={"command": command, "max_output_bytes": LIMIT}, headers=headers, timeout=120)
    assert reply.status == 200, reply.body[:300]
    return reply.body


def test_nul_output_does_not_inflate_the_json_reply(router: RouterProcess, sandbox: Sandbox) -> None:
    command = f"head -c {LIMIT} /dev/zero; head -c {LIMIT} /dev/zero >&2"
    body = _exec(router, sandbox, command)
    assert len(body) < 2 * (2 * LIMIT) + 64 * 1024, len(body)  # was 6x: 48 MiB
    result = json.loads(body)
    assert result["stdout_truncated"] and result["stderr_truncated"] and result["stdout_bytes"] == LIMIT
    assert "escaped for JSON" in result["stdout"] and result["stdout"].startswith("\0" * 1000)
    streamed = _exec(router, sandbox, command, stream=True)
    assert len(streamed) < 2 * 2 * (2 * LIMIT) + 64 * 1024, len(streamed)  # chunks, then the result
    frames = [json.loads(line) for line in streamed.splitlines()]
    assert frames[-1]["type"] == "result" and frames[-1]["result"]["stdout_truncated"]
    # msgpack carries raw bytes: all of them, not cut.
    raw = msgpack.unpackb(_exec(router, sandbox, command, as_msgpack=True))
    assert raw["stdout"] == b"\0" * LIMIT and not raw["stdout_truncated"]
    # Ordinary text is never cut by this.
    text = json.loads(_exec(router, sandbox, f"yes 'line of text, ü' | head -c {LIMIT}"))
    assert not text["stdout_truncated"] and text["stdout_bytes"] == LIMIT and "grove:" not in text["stdout"]
