"""Private networks of local sandboxes: the members of one group (``network.group``) share a link, and nothing else.

A group of a project gets a *hub*: a network namespace the router owns (``ip netns add grove-<instance>-<hash>``,
never a host interface), holding one bridge ``br0`` with no address, and an nftables ``bridge`` table that
forwards only ARP and IPv4 between :data:`SUBNET` addresses (no IPv6, nothing else). Each member sandbox, once its
PID 1 runs, gets a veth: ``p<n>`` on the hub's bridge, ``grp0`` inside its namespace with ``10.232.0.<n>/24``.
The hub has no other interface and no route: a member reaches the other members and nothing more through it, and
no sandbox outside the group (nor the host) reaches a member through it. The group's name is the project's: two
projects using one name get two hubs (the hub's name hashes the project with the group).

The member's link is recorded in ``<sandbox dir>/private_net.json``; :meth:`PrivateNetworks.leave` deletes its veth
and, with the group's last member, the hub. All changes happen under the egress networking's host-wide lock.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from grove.core.errors import Unavailable
from router.backends.local.network import host_lock, run_tool, write_json

SUBNET = ipaddress.IPv4Network("10.232.0.0/24")
"""Addresses of a group's members (each group its own hub, so every group uses the same /24)."""
RECORD = "private_net.json"
NETNS_DIR = Path("/run/netns")
_MEMBERS = SUBNET.num_addresses - 2


@dataclass(frozen=True)
class Member:
    """One sandbox's place in its group, as recorded in its directory."""

    hub: str
    """The hub's network namespace (``/run/netns/<hub>``)."""
    port: str
    """The hub-side veth on the bridge."""
    address: str
    """The sandbox's address in the group."""


def hub_prefix(instance: str) -> str:
    """The name prefix of this router's hubs."""
    return f"grove-{instance}-"


def hub_name(instance: str, group: str) -> str:
    """The hub of ``group`` (the project-qualified group name)."""
    return hub_prefix(instance) + hashlib.sha256(group.encode()).hexdigest()[:12]


def guard_rules() -> str:
    """The hub's bridge filter: ARP, and IPv4 from and to the group's addresses; everything else dropped."""
    return "\n".join([
        "add table bridge guard",
        "add chain bridge guard forward { type filter hook forward priority filter; policy drop; }",
        "flush chain bridge guard forward",
        "add rule bridge guard forward ether type arp accept",
        f"add rule bridge guard forward ip saddr {SUBNET} ip daddr {SUBNET} accept",
    ])


class PrivateNetworks:
    """The hubs of one router instance, and their members' links."""

    def __init__(self, instance: str) -> None:
        self.instance = instance

    def join(self, sandbox_dir: Path, pid: int, group: str) -> Member:
        """Put the sandbox whose PID 1 is ``pid`` on ``group``'s hub (made if new); record it in its directory."""
        try:
            with host_lock():
                return self._join(sandbox_dir, pid, group)
        except OSError as exc:
            raise Unavailable(f"the private network of the sandbox failed: {exc}") from exc

    def _join(self, sandbox_dir: Path, pid: int, group: str) -> Member:
        self._leave_locked(sandbox_dir)  # a record left by a start that no longer runs
        _check_no_overlap()
        hub = hub_name(self.instance, group)
        if not (NETNS_DIR / hub).exists():
            _run(["ip", "netns", "add", hub])
            _run(["ip", "-n", hub, "-b", "-"], "link add br0 type bridge\nlink set br0 up\n")
            _run(["ip", "netns", "exec", hub, "nft", "-f", "-"], guard_rules() + "\n")
        n = _free_member(hub)
        member = Member(hub, f"p{n}", str(SUBNET.network_address + n))
        write_json(sandbox_dir / RECORD, asdict(member))  # first: whatever fails below, leave undoes it
        _run(["ip", "-n", hub, "-b", "-"], f"link add {member.port} type veth peer name grp0 netns {pid}\n"
                                           f"link set {member.port} master br0\nlink set {member.port} up\n")
        v6 = "/proc/sys/net/ipv6/conf/grp0/disable_ipv6"
        _run(["nsenter", f"--net=/proc/{pid}/ns/net", "--", "sh", "-c",
              f"if [ -e {v6} ]; then echo 1 > {v6} || exit 1; fi; exec ip -b -"],
             f"addr add {member.address}/{SUBNET.prefixlen} dev grp0\nlink set grp0 up\nlink set lo up\n")
        return member

    def leave(self, sandbox_dir: Path) -> None:
        """Remove the sandbox's veth, its record, and its hub if it was the last member; absent is fine."""
        if not (sandbox_dir / RECORD).exists():
            return
        with host_lock():
            self._leave_locked(sandbox_dir)

    def _leave_locked(self, sandbox_dir: Path) -> None:
        member = read_member(sandbox_dir)
        if member is None:
            (sandbox_dir / RECORD).unlink(missing_ok=True)
            return
        if (NETNS_DIR / member.hub).exists():
            _run(["ip", "-n", member.hub, "link", "del", member.port], check=False)  # gone with PID 1 is fine
            if not _ports(member.hub):
                _run(["ip", "netns", "del", member.hub], check=False)
        (sandbox_dir / RECORD).unlink(missing_ok=True)

    def reconcile(self) -> None:
        """Delete this router's hubs that have no member left (their sandboxes ended while no router ran)."""
        if not NETNS_DIR.is_dir():
            return
        with host_lock():
            for hub in self.hubs():
                if not _ports(hub):
                    _run(["ip", "netns", "del", hub], check=False)

    def hubs(self) -> list[str]:
        """This router's hubs on the host."""
        if not NETNS_DIR.is_dir():
            return []
        return sorted(n for n in os.listdir(NETNS_DIR) if n.startswith(hub_prefix(self.instance)))


def _run(argv: list[str], stdin: str | None = None, *, check: bool = True) -> str:
    return run_tool(argv, stdin, check=check, what="the private network")


def read_member(sandbox_dir: Path) -> Member | None:
    """The sandbox's recorded place in its group, or None."""
    try:
        return Member(**json.loads((sandbox_dir / RECORD).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _ports(hub: str) -> list[str]:
    """The member veths on the hub's bridge (a veth whose sandbox ended is gone with its namespace)."""
    out = _run(["ip", "-n", hub, "-j", "link", "show", "master", "br0"], check=False)
    return [link["ifname"] for link in json.loads(out or "[]")]


def _free_member(hub: str) -> int:
    used = {int(name[1:]) for name in _ports(hub) if name[1:].isdigit()}
    for n in range(1, _MEMBERS + 1):
        if n not in used:
            return n
    raise Unavailable(f"a private network holds at most {_MEMBERS} sandboxes", retry_after=5)


def _check_no_overlap() -> None:
    """Refuse when the host routes :data:`SUBNET` itself: a member could not tell the group from the host's net."""
    out = _run(["ip", "-j", "-4", "route", "show", "table", "main"], check=False)
    for route in json.loads(out or "[]"):
        dst = route.get("dst", "")
        if dst and dst != "default" and ipaddress.IPv4Network(dst, strict=False).overlaps(SUBNET):
            raise Unavailable(f"this host routes {dst}, which overlaps grove's private networks ({SUBNET}); "
                              "private groups cannot work here until that route goes")
