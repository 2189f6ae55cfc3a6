"""The API's egress allow-list entries, parsed once for every backend.

An entry is ``ADDRESS[/PREFIX][:PORT]``: an IPv4 address or network, optionally one port (TCP and UDP).
IPv6 networks are written ``ADDRESS/PREFIX[:PORT]`` or ``[ADDRESS[/PREFIX]]:PORT``. Host bits set under
the prefix (``10.0.0.1/8``) are a mistake worth naming, not something to round away. What a backend
cannot enforce (the local backend has no IPv6) it refuses in its own ``check``.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from grove.core.errors import Invalid

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class Destination:
    """One allow-list entry: a network and, optionally, one TCP and UDP port."""

    network: IPNetwork
    port: int | None


def parse_allow(entries: tuple[str, ...] | list[str]) -> list[Destination]:
    """Each entry as a Destination, in order; ``Invalid`` naming the first bad one."""
    return [parse_entry(entry) for entry in entries]


def parse_entry(entry: str) -> Destination:
    """One ``ADDRESS[/PREFIX][:PORT]`` entry; ``Invalid`` naming it and what is wrong."""
    if not isinstance(entry, str):
        raise Invalid(f"network.allow entry {entry!r} is not a string")
    text, port = _split_port(entry)
    try:
        network = ipaddress.ip_network(text, strict=True)
    except ValueError as exc:
        raise Invalid(f"network.allow entry {entry!r} is not an address or network with an optional :port "
                      f"(e.g. '198.51.100.0/24:443'): {exc}") from exc
    return Destination(network, port)


def _split_port(entry: str) -> tuple[str, int | None]:
    if entry.startswith("["):  # [v6-address(/prefix)]:port
        inside, bracket, rest = entry[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise Invalid(f"network.allow entry {entry!r}: write an IPv6 entry with a port as [ADDRESS]:PORT")
        return inside, _port(rest[1:], entry) if rest else None
    head, slash, tail = entry.partition("/")
    if slash:  # the prefix ends the address: a ':' after it starts the port
        prefix, colon, raw = tail.partition(":")
        return f"{head}/{prefix}", _port(raw, entry) if colon else None
    if entry.count(":") == 1:  # an IPv4 address and a port
        address, _, raw = entry.partition(":")
        return address, _port(raw, entry)
    return entry, None  # an address (IPv6 without a port has several ':')


def _port(raw: str, entry: str) -> int:
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= 65535:
        raise Invalid(f"network.allow entry {entry!r} has a bad port {raw!r} (1-65535)")
    return int(raw)
