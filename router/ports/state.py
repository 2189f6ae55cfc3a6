"""The ports' shared state in the router app: tunnels' client sessions, traffic counts, the URL signer, and
where the host-named listener is."""

from __future__ import annotations

from dataclasses import dataclass, field

from aiohttp import web

from router.ports.signing import Signer
from router.ports.stdio_mcp import StdioMcp
from router.ports.traffic import Traffic
from router.ports.tunnels import PortClients


@dataclass(frozen=True)
class McpServer:
    """A published MCP server: where it listens in its sandbox, or the bridge to its stdio."""

    port: int | None
    path: str
    stdio: StdioMcp | None = None
    """A stdio server's bridge (:mod:`router.ports.stdio_mcp`); None for one serving HTTP on ``port``."""


@dataclass
class Ports:
    """Everything the port, terminal and MCP handlers share."""

    clients: PortClients
    traffic: Traffic
    signer: Signer
    domain: str
    """The domain of the host-named listener's names (``{id}-{port}.<domain>``)."""
    listener: str = ""
    """``host:port`` of the host-named listener, once it listens."""
    mcp: dict[str, dict[str, McpServer]] = field(default_factory=dict)
    """The MCP servers published in each sandbox, by name (:mod:`router.api.mcp`)."""

    async def close_mcp(self) -> None:
        """End every stdio MCP bridge (the router is stopping; their processes see their stdin close)."""
        for servers in self.mcp.values():
            for server in servers.values():
                if server.stdio is not None:
                    await server.stdio.close()

    def host_url(self, sandbox_id: str, port: int) -> str:
        """The base URL of a port on the host-named listener."""
        return f"http://{sandbox_id}-{port}.{self.domain}:{self.listener.rpartition(':')[2]}"


PORTS = web.AppKey("ports", Ports)


def ports_of(request: web.Request) -> Ports:
    """The app's :class:`Ports`."""
    return request.app[PORTS]
