"""Egress NetworkPolicy rules of a sandbox with ``egress: allow``, and what no entry opens by being wide.

The entries are the API's (:mod:`router.backends.egress`: ``CIDR[:port]``, TCP and UDP, as on the local backend).
An ``allow`` without entries means the internet, not the cluster: every address except the private and
shared ranges (RFC 1918, RFC 6598's 100.64/10, IPv6 unique-local ``fc00::/7``, where the cloud's IPv6
metadata ``fd00:ec2::254`` lives), link-local (the metadata address 169.254.169.254), and the cluster's own
pod, service and node CIDRs (``KnativeOptions.cluster_cidrs``). A wide entry (``0.0.0.0/0:443``) gets the
same exceptions; an entry inside one of those ranges (``10.1.2.0/24``) opens exactly it, because it was
listed on purpose. Link-local is the exception to that: like the local backend's ``NEVER`` set, no entry
opens it (the node's metadata service hands out the node's credentials).
"""

from __future__ import annotations

import ipaddress
from typing import Any

from grove.core.errors import Invalid
from router.backends.egress import IPNetwork, parse_allow

PRIVATE = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7")
"""Private and shared ranges: closed unless an entry lies inside one."""
NEVER = ("169.254.0.0/16", "fe80::/10")
"""Link-local, cloud metadata included: no entry opens it."""
EVERYWHERE = ("0.0.0.0/0", "::/0")


def check(entries: tuple[str, ...] | list[str]) -> None:
    """``Invalid`` naming an entry that cannot be opened (malformed, or inside link-local)."""
    for entry, destination in zip(entries, parse_allow(entries), strict=True):
        if any(destination.network.subnet_of(n) for n in _nets(NEVER, destination.network.version)):  # type: ignore[arg-type]
            raise Invalid(f"network.allow entry {entry!r} is link-local (cloud metadata lives there): no "
                          "sandbox may reach it")


def rules(entries: tuple[str, ...], cluster_cidrs: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """NetworkPolicy egress rules: one per destination (all of the internet when none is listed), each
    with the closed ranges it contains as exceptions, and cluster DNS so names resolve."""
    check(entries)
    destinations = parse_allow(entries or EVERYWHERE)
    closed = (*PRIVATE, *cluster_cidrs, *NEVER)
    out: list[dict[str, Any]] = []
    for destination in destinations:
        block: dict[str, Any] = {"cidr": str(destination.network)}
        if excepts := exceptions(destination.network, closed):
            block["except"] = excepts
        rule: dict[str, Any] = {"to": [{"ipBlock": block}]}
        if destination.port is not None:
            rule["ports"] = [{"protocol": proto, "port": destination.port} for proto in ("TCP", "UDP")]
        out.append(rule)
    out.append({
        "to": [{
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
        }],
        "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
    })
    return out


def exceptions(network: IPNetwork, closed: tuple[str, ...]) -> list[str]:
    """The closed ranges strictly inside ``network`` (NetworkPolicy requires each ``except`` to be), without
    those another one already covers; none when ``network`` itself lies inside a closed range."""
    nets = _nets(closed, network.version)
    if any(network.subnet_of(n) for n in nets):  # type: ignore[arg-type]
        return []  # listed on purpose: exactly this range is opened
    inside = [n for n in nets if n != network and n.subnet_of(network)]  # type: ignore[arg-type]
    kept = [n for n in inside if not any(o != n and n.subnet_of(o) for o in inside)]  # type: ignore[arg-type]
    return [str(n) for n in sorted(set(kept), key=lambda n: (n.network_address, n.prefixlen))]


def _nets(cidrs: tuple[str, ...], version: int) -> list[IPNetwork]:
    parsed = [ipaddress.ip_network(c, strict=False) for c in cidrs]
    return [n for n in parsed if n.version == version]
