"""What an MCP tool call records as an ``mcp_call`` step, for both forms of a published server (HTTP on a port,
or a stdio command): the tool, its arguments, what it answered (bounded), whether it failed, and how long it
took."""

from __future__ import annotations

import time
from typing import Any

RESULT_TEXT = 16 * 1024
"""Most text of a tool's result a step keeps."""


def call_step(server: str, tool: str, arguments: Any, status: int, started: float,
              answer: dict[str, Any] | None) -> dict[str, Any]:
    """The step of one ``tools/call``; ``answer``: its JSON-RPC response, if one was seen."""
    step: dict[str, Any] = {"type": "mcp_call", "t": started, "server": server, "tool": tool,
                            "arguments": arguments, "status": status, "duration_s": time.time() - started}
    if answer is not None:
        step.update(outcome(answer))
    return step


def outcome(item: dict[str, Any]) -> dict[str, Any]:
    """What a JSON-RPC response to a ``tools/call`` says: an error's message, or the result's text."""
    if isinstance(item.get("error"), dict):
        return {"is_error": True, "error": str(item["error"].get("message", ""))[:RESULT_TEXT]}
    result: dict[str, Any] = item["result"] if isinstance(item.get("result"), dict) else {}
    texts = [c.get("text", "") for c in result.get("content", []) if isinstance(c, dict) and c.get("type") == "text"]
    return {"is_error": bool(result.get("isError")), "result": "\n".join(map(str, texts))[:RESULT_TEXT]}
