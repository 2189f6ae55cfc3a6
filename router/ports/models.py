"""The request bodies of the port, terminal and MCP routes."""

from __future__ import annotations

from dataclasses import dataclass

from grove.core.errors import Invalid
from grove.core.schema import spec
from router.ports.signing import DEFAULT_EXPIRES_S, MAX_EXPIRES_S


@dataclass(frozen=True)
class PortUrlRequest:
    """A signed URL for one port of one sandbox."""

    expires_s: float = spec("seconds the URL works", default=DEFAULT_EXPIRES_S, minimum=1, maximum=MAX_EXPIRES_S)


@dataclass(frozen=True)
class McpServerRequest:
    """An MCP server of the sandbox published under a name: one serving streamable HTTP on a port (``port``,
    ``path``), or a stdio server the router starts (``command``, ``cwd``, ``env``). Exactly one of ``port`` and
    ``command``."""

    port: int | None = spec("the port it serves streamable HTTP on inside the sandbox", default=None, minimum=1,
                            maximum=65535)
    path: str = spec("its MCP endpoint's path (with port)", default="/mcp", max_len=1024)
    command: str | list[str] | None = spec("a stdio MCP server to start in the sandbox (a string runs under "
                                           "/bin/sh -c, a list is the argv)", default=None, max_len=65536,
                                           max_items=1024)
    cwd: str | None = spec("the stdio server's working directory (the sandbox's workdir when absent)",
                           default=None, max_len=4096)
    env: dict[str, str] = spec("variables set for the stdio server", factory=dict, max_len=65536, max_items=256)

    def __post_init__(self) -> None:
        if (self.port is None) == (self.command is None):
            raise Invalid("publish either a server serving streamable HTTP ({\"port\": 8000, \"path\": \"/mcp\"}) or "
                          "a stdio server to start ({\"command\": \"python3 server.py\"}): give exactly one of "
                          "'port' and 'command'")
