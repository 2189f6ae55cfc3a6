"""The ports' shared state in the router app: tunnels' client sessions, traffic counts, the URL signer, and
where the host-named listener is."""

from __future__ import annotations

from dataclasses import dataclass, field

from aiohttp import web

from router.ports.signing import Signer
from router.ports.traffic import Traffic
from router.ports.tunnels import PortClients


@dataclass(frozen=True)
class McpServer:
    """Where a published MCP server listens in its sandbox."""

    port: int
    path: str


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

    def host_url(self, sandbox_id: str, port: int) -> str:
        """The base URL of a port on the host-named listener."""
        return f"http://{sandbox_id}-{port}.{self.domain}:{self.listener.rpartition(':')[2]}"


PORTS = web.AppKey("ports", Ports)


def ports_of(request: web.Request) -> Ports:
    """The app's :class:`Ports`."""
    return request.app[PORTS]
