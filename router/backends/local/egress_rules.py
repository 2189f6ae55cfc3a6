"""Egress allow-lists of local sandboxes as nftables rules: parsing the entries, and writing the rule text.

Pure functions (no kernel calls), so what grove enforces can be read in one place:

- one table ``inet grove_<instance>`` per router; its host-side veths are named ``gv<instance[:5]><slot>``;
- ``input``: nothing from a sandbox's veth reaches a host socket (any address the host owns);
- ``forward``: into a sandbox only conntrack ``established,related``; out of a sandbox first the
  addresses no allow-list can open (any local, broadcast, multicast or anycast address of the host,
  ``0/8``, loopback, link-local with the metadata address, multicast, ``240/4``, grove's own subnet), then
  the sandbox's own chain (its source address and its allow-list), then a reject; no IPv6 at all;
- the guard: a packet entering by an uplink on which grove turned forwarding on, and leaving by a
  non-grove interface, is dropped, so the host forwards nothing it did not forward before;
- ``postrouting``: sandboxes' traffic leaving by a non-grove interface is masqueraded.
"""

from __future__ import annotations

import ipaddress

from grove.core.errors import Invalid
from router.backends import egress
from router.backends.egress import Destination

SUBNET = ipaddress.IPv4Network("10.231.0.0/16")
"""Point-to-point /31 links of sandboxes with egress allowed (host side even, sandbox side odd)."""
NEVER = ("0.0.0.0/8", "127.0.0.0/8", "169.254.0.0/16", "224.0.0.0/4", "240.0.0.0/4")
"""Destinations no allow-list opens (besides every address of the host and grove's subnet)."""
REJECT = "reject with icmpx admin-prohibited"


def parse_allow(entries: tuple[str, ...] | list[str]) -> list[Destination]:
    """The API's entries (:mod:`router.backends.egress`) as this backend enforces them: IPv4 only (local sandboxes
    have no IPv6); no entries means every address. ``Invalid`` naming the first entry it cannot take."""
    if not entries:
        return [Destination(ipaddress.IPv4Network("0.0.0.0/0"), None)]
    parsed = egress.parse_allow(entries)
    for entry, destination in zip(entries, parsed, strict=True):
        if destination.network.version != 4:
            raise Invalid(f"network.allow entry {entry!r}: IPv6 is not supported on the local backend (its "
                          "sandboxes have no IPv6); use IPv4 CIDR[:port]")
    return parsed


def prefix(instance: str) -> str:
    """The name prefix of this router's host-side veths."""
    return f"gv{instance[:5]}"


def table(instance: str) -> str:
    """This router's nftables table (family ``inet``)."""
    return f"grove_{instance}"


def chain(slot: int) -> str:
    """The per-sandbox chain of a slot."""
    return f"sb_{slot:04x}"


def base_rules(instance: str, subnet: ipaddress.IPv4Network = SUBNET) -> str:
    """The table with its base chains, re-declared and refilled atomically (safe to apply again)."""
    t, ifs = table(instance), f'"{prefix(instance)}*"'
    never = ", ".join((*NEVER, str(subnet)))
    return "\n".join([
        f"add table inet {t}",
        f"add map inet {t} sandboxes {{ type ifname : verdict; }}",
        f"add set inet {t} uplinks {{ type ifname; }}",
        f"add chain inet {t} input {{ type filter hook input priority filter; policy accept; }}",
        f"flush chain inet {t} input",
        f"add rule inet {t} input iifname {ifs} {REJECT}",
        f"add chain inet {t} forward {{ type filter hook forward priority filter; policy accept; }}",
        f"flush chain inet {t} forward",
        f"add rule inet {t} forward oifname {ifs} ct state established,related accept",
        f"add rule inet {t} forward oifname {ifs} drop",
        f"add rule inet {t} forward iifname {ifs} meta nfproto ipv6 drop",
        f"add rule inet {t} forward iifname {ifs} fib daddr type {{ local, broadcast, multicast, anycast }} {REJECT}",
        f"add rule inet {t} forward iifname {ifs} ip daddr {{ {never} }} {REJECT}",
        f"add rule inet {t} forward iifname vmap @sandboxes",
        f"add rule inet {t} forward iifname {ifs} {REJECT}",
        f'add rule inet {t} forward iifname @uplinks oifname != "gv*" drop',
        f"add chain inet {t} postrouting {{ type nat hook postrouting priority srcnat; policy accept; }}",
        f"flush chain inet {t} postrouting",
        f'add rule inet {t} postrouting iifname {ifs} oifname != "gv*" masquerade',
    ])


def sandbox_rules(instance: str, slot: int, host_if: str, sandbox_addr: str, allow: list[Destination]) -> str:
    """The sandbox's chain (its own source address, then its allow-list) and its entry in the map."""
    t, c = table(instance), chain(slot)
    lines = [f"add chain inet {t} {c}", f"flush chain inet {t} {c}",
             f"add rule inet {t} {c} ip saddr != {sandbox_addr} drop"]
    for dest in allow:
        if dest.port is None:
            lines.append(f"add rule inet {t} {c} ip daddr {dest.network} accept")
        else:
            for proto in ("tcp", "udp"):
                lines.append(f"add rule inet {t} {c} ip daddr {dest.network} {proto} dport {dest.port} accept")
    lines.append(f'add element inet {t} sandboxes {{ "{host_if}" : jump {c} }}')
    return "\n".join(lines)
