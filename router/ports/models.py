"""The request bodies of the port, terminal and MCP routes."""

from __future__ import annotations

from dataclasses import dataclass

from grove.core.schema import spec
from router.ports.signing import DEFAULT_EXPIRES_S, MAX_EXPIRES_S


@dataclass(frozen=True)
class PortUrlRequest:
    """A signed URL for one port of one sandbox."""

    expires_s: float = spec("seconds the URL works", default=DEFAULT_EXPIRES_S, minimum=1, maximum=MAX_EXPIRES_S)


@dataclass(frozen=True)
class McpServerRequest:
    """An MCP server that serves streamable HTTP on a port in the sandbox, published under a name."""

    port: int = spec("the port it listens on inside the sandbox", minimum=1, maximum=65535)
    path: str = spec("its MCP endpoint's path", default="/mcp")
