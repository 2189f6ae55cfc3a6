"""The stand-in cluster's Service network: DNS names and ClusterIPs that a router subprocess really dials.

On a cluster a Service has a ClusterIP and a DNS name ``<service>.<namespace>.svc.cluster.local``; kube-proxy
sends each TCP connection to one of the Service's endpoints, chosen when the connection opens, and the
connection stays there. Here a ClusterIP is a loopback address of its own (127/8 is all loopback) with a TCP
forwarder on port 80 that asks, per connection, where to go; the DNS is a hosts file; and a process sees it
by running in a private mount namespace with that file over ``/etc/hosts`` (:meth:`ServiceNetwork.wrap`),
so its own resolver (glibc's ``getaddrinfo``) finds the names, the real client connects to the address, and
the Host header is whatever the client sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
Pick = Callable[[], "tuple[str, int] | None"]
"""Where a new connection goes (an endpoint's address and port), or None: the Service has no endpoint."""


async def on_own_address(listen: Callable[[str], Awaitable[T]]) -> tuple[str, T]:
    """``listen(address)`` on a loopback address of its own, like a pod IP or a ClusterIP; (address, result)."""
    for _ in range(50):
        address = f"127.{secrets.randbelow(254) + 1}.{secrets.randbelow(254) + 1}.{secrets.randbelow(253) + 2}"
        try:
            return address, await listen(address)
        except OSError:  # taken (another pod, another test)
            continue
    raise RuntimeError("no free loopback address")


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()


class ServiceNetwork:
    """ClusterIPs on port 80 by name, and the hosts file that is the cluster's DNS for them."""

    def __init__(self, scratch: Path) -> None:
        self.hosts = scratch / "hosts"
        self.hosts.write_text(Path("/etc/hosts").read_text())  # localhost and the rest resolve as before
        self._ips: dict[str, str] = {}
        self._servers: dict[str, asyncio.Server] = {}
        self._links: set[asyncio.Task[None]] = set()

    def wrap(self) -> tuple[str, ...]:
        """An argv prefix that runs a command with this network's DNS (root: a mount namespace of its own).
        ``unshare`` and ``sh`` exec it, so its PID is the command's."""
        return ("unshare", "--mount", "--propagation", "private", "--",
                "sh", "-c", 'mount --bind "$0" /etc/hosts && exec "$@"', str(self.hosts))

    def ip_of(self, name: str) -> str | None:
        """The ClusterIP a name resolves to (the Service may be gone since)."""
        return self._ips.get(name)

    async def expose(self, name: str, pick: Pick) -> str:
        """Serve ``name`` on a ClusterIP:80 forwarding each connection to ``pick()``'s endpoint.

        A name keeps its address once it has one (a Service made again under the same name resolves as
        before): the hosts file is only ever appended to, in place, since the bind mount holds its inode.
        """
        async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            target = pick()
            if target is None:  # no endpoint: kube-proxy rejects the connection
                writer.close()
                return
            try:
                up_reader, up_writer = await asyncio.open_connection(*target)
            except OSError:
                writer.close()
                return
            links = [asyncio.ensure_future(_pipe(reader, up_writer)), asyncio.ensure_future(_pipe(up_reader, writer))]
            self._links.update(links)
            try:
                await asyncio.wait(links, return_when=asyncio.FIRST_COMPLETED)  # either side closing ends both
            finally:
                for link in links:
                    link.cancel()
                    self._links.discard(link)
                for end in (writer, up_writer):
                    end.close()

        await self.withdraw(name)
        if (address := self._ips.get(name)) is not None:
            self._servers[name] = await asyncio.start_server(connected, address, 80)
            return address
        address, self._servers[name] = await on_own_address(lambda a: asyncio.start_server(connected, a, 80))
        self._ips[name] = address
        with self.hosts.open("a") as hosts:
            hosts.write(f"{address}\t{name}\n")
        return address

    async def withdraw(self, name: str) -> None:
        """The Service is gone: its ClusterIP takes no new connection."""
        if (server := self._servers.pop(name, None)) is not None:
            server.close()

    async def close(self) -> None:
        """Stop every ClusterIP and cut every forwarded connection."""
        for name in list(self._servers):
            await self.withdraw(name)
        for link in list(self._links):
            link.cancel()
        await asyncio.gather(*self._links, return_exceptions=True)
