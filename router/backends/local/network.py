"""Networking of local sandboxes with egress allowed: a routed point-to-point veth each, NAT, nftables.

A sandbox with ``egress: deny`` (the default) keeps its empty network namespace and costs nothing here.
One with ``egress: allow`` gets, once its PID 1 runs (before it is reported ready):

- a slot of :data:`~router.backends.local.egress_rules.SUBNET`: a /31, the host side ``gv<instance><slot>``
  (even address), the sandbox side ``eth0`` inside its namespace (odd address, default route via the host
  side); no bridge, so sandboxes share no link and each veth is filtered by its own name;
- its rules in this router's table (:mod:`router.backends.local.egress_rules`), applied atomically by ``nft -f -``;
- forwarding on its host-side veth, and on each uplink the routes to its allowed networks use (return
  traffic enters there). grove turns an uplink's forwarding on only with the guard rule in place, and
  turns it off again when no grove table needs it any longer; an uplink whose forwarding the host's
  admin had already turned on is left alone.

The slot is recorded in ``<sandbox dir>/network.json`` with the PID 1 it was made for, so a restarted
router finds what belongs to whom (:meth:`EgressNetwork.reconcile`). All changes happen under one
host-wide lock, so routers on one host never hand out the same slot. A veth dies with its namespace (when
PID 1 dies); rules and the record are removed by :meth:`EgressNetwork.detach`.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from grove.core.errors import Unavailable
from router.backends.egress import Destination
from router.backends.local import egress_rules as rules
from router.backends.local.egress_rules import SUBNET

LOCK_PATH = Path("/run/grove/network.lock")
RECORD = "network.json"
_SLOTS = SUBNET.num_addresses // 2
_TOOL_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}


@dataclass(frozen=True)
class Link:
    """One sandbox's link, as recorded in its directory."""

    slot: int
    host_if: str
    host_addr: str
    sandbox_addr: str
    pid: int
    start_time: int


class EgressNetwork:
    """The veths and nftables table of one router instance."""

    def __init__(self, instance: str) -> None:
        self.instance = instance
        self.table = rules.table(instance)
        self.prefix = rules.prefix(instance)

    # -- attach and detach (blocking: call them in a thread) ---------------------------------------

    def attach(self, sandbox_dir: Path, pid: int, start_time: int, allow: list[Destination]) -> Link:
        """Give the sandbox whose PID 1 is ``pid`` its veth and rules; record them in its directory."""
        try:
            return self._attach(sandbox_dir, pid, start_time, allow)
        except OSError as exc:  # a sysctl or the record: the caller undoes the rest with detach
            raise Unavailable(f"egress networking of the sandbox failed: {exc}") from exc

    def _attach(self, sandbox_dir: Path, pid: int, start_time: int, allow: list[Destination]) -> Link:
        with host_lock():
            self._detach_locked(sandbox_dir)  # a record left by a start that no longer runs
            state = self._state()
            slot = self._free_slot(state)
            host = SUBNET.network_address + 2 * slot
            link = Link(slot, f"{self.prefix}{slot:04x}", str(host), str(host + 1), pid, start_time)
            flipped = self._uplinks_to_own(self._uplinks(allow), state)
            # The record first: whatever fails below, detach finds it and undoes the rest.
            write_json(sandbox_dir / RECORD, asdict(link))
            # The base chains only with a new table: re-declaring them costs a kernel commit of its own.
            script = [] if state is not None else [rules.base_rules(self.instance)]
            script.append(rules.sandbox_rules(self.instance, slot, link.host_if, link.sandbox_addr, allow))
            script += [f'add element inet {self.table} uplinks {{ "{dev}" }}' for dev in flipped]
            _nft("\n".join(script))
            for dev in flipped:  # the guard rule is in place: forwarding here lets only grove's replies in
                _set_forwarding(dev, "1")
            run_tool(["ip", "-b", "-"], f"link add {link.host_if} type veth peer name eth0 netns {pid}\n"
                                    f"addr add {link.host_addr}/31 dev {link.host_if}\nlink set {link.host_if} up\n")
            if Path("/proc/sys/net/ipv6").is_dir():  # a kernel without IPv6 needs nothing disabled
                _sysctl(f"net/ipv6/conf/{link.host_if}/disable_ipv6", "1")
            _sysctl(f"net/ipv4/conf/{link.host_if}/forwarding", "1")
            inside = (f"addr add {link.sandbox_addr}/31 dev eth0\nlink set eth0 up\n"
                      f"route add default via {link.host_addr} dev eth0\n")
            # Inside: no IPv6 on eth0 (so not even a link-local address), then the address and route.
            v6 = "/proc/sys/net/ipv6/conf/eth0/disable_ipv6"
            run_tool(["nsenter", f"--net=/proc/{pid}/ns/net", "--", "sh", "-c",
                  f"if [ -e {v6} ]; then echo 1 > {v6} || exit 1; fi; exec ip -b -"], inside)
            return link

    def detach(self, sandbox_dir: Path) -> None:
        """Remove the sandbox's veth (if it outlived PID 1) and rules, and its record; absent is fine."""
        if not (sandbox_dir / RECORD).exists():
            return
        with host_lock():
            self._detach_locked(sandbox_dir)

    def _detach_locked(self, sandbox_dir: Path) -> None:
        link = read_link(sandbox_dir)
        if link is None:
            return
        if Path("/sys/class/net", link.host_if).exists():  # PID 1's namespace may not be gone yet
            run_tool(["ip", "link", "del", link.host_if], check=False)
        state = self._state()
        if state is not None:
            self._remove(state, {link.host_if}, {rules.chain(link.slot)})
        (sandbox_dir / RECORD).unlink(missing_ok=True)

    def reconcile(self, sandbox_dirs: list[Path], alive: Callable[[int, int], bool]) -> None:
        """After a restart: detach every recorded link whose PID 1 is gone (``alive(pid, start_time)``),
        and remove rules that no record claims."""
        with host_lock():
            claimed: set[int] = set()
            for sandbox_dir in sandbox_dirs:
                link = read_link(sandbox_dir)
                if link is not None and alive(link.pid, link.start_time):
                    claimed.add(link.slot)
                elif link is not None:
                    self._detach_locked(sandbox_dir)
            state = self._state()
            if state is not None:
                names = {n for n in state["sandboxes"] if _slot(n[len(self.prefix):]) not in claimed}
                chains = {c for c in state["chains"] if c.startswith("sb_") and _slot(c[3:]) not in claimed}
                self._remove(state, names, chains)

    def _remove(self, state: dict[str, list[str]], names: set[str], chains: set[str]) -> None:
        """Remove veths' map entries and chains in one transaction; the whole table if nothing is left
        (and forwarding on the uplinks only this table needed)."""
        left = [n for n in state["sandboxes"] if n not in names]
        left += [c for c in state["chains"] if c.startswith("sb_") and c not in chains]
        if not left:
            sets = self._uplink_sets()
            ours = sets.pop(self.table, set())
            for dev in ours - set().union(*sets.values()):
                with contextlib.suppress(OSError):
                    _set_forwarding(dev, "0")
            _nft(f"delete table inet {self.table}")
            return
        script = [f'delete element inet {self.table} sandboxes {{ "{n}" }}' for n in names if n in state["sandboxes"]]
        script += [f"flush chain inet {self.table} {c}\ndelete chain inet {self.table} {c}"
                   for c in chains if c in state["chains"]]
        if script:
            _nft("\n".join(script))

    # -- helpers ------------------------------------------------------------------------------------

    def _free_slot(self, state: dict[str, list[str]] | None) -> int:
        used = {_slot(name[-4:]) for name in os.listdir("/sys/class/net")
                if name.startswith("gv") and len(name) == len(self.prefix) + 4}
        if state is not None:
            used |= {_slot(c[3:]) for c in state["chains"] if c.startswith("sb_")}
        for slot in range(_SLOTS):
            if slot not in used:
                return slot
        raise Unavailable(f"all {_SLOTS} egress links of {SUBNET} are in use", retry_after=5)

    def _uplinks_to_own(self, uplinks: list[str], state: dict[str, list[str]] | None) -> list[str]:
        """Of the uplinks, those whose forwarding grove turns (or has turned) on: forwarding off now, or on
        because a grove table turned it on. One the host's admin turned on is not grove's to touch."""
        ours = set(state["uplinks"]) if state is not None else set()
        on = [d for d in uplinks if _forwarding(d) == "1" and d not in ours]
        by_grove = set().union(*self._uplink_sets().values()) if on else set()
        return [d for d in uplinks if _forwarding(d) == "0" or d in ours or d in by_grove]

    def _uplinks(self, allow: list[Destination]) -> list[str]:
        """The interfaces of the main table's routes into any allowed network (replies come back there)."""
        out = run_tool(["ip", "-j", "-4", "route", "show", "table", "main"], check=False)
        devs: set[str] = set()
        for route in json.loads(out or "[]"):
            dst, dev = route.get("dst", ""), route.get("dev", "")
            try:
                net = ipaddress.IPv4Network("0.0.0.0/0" if dst == "default" else dst)
            except ValueError:
                continue
            if dev and any(net.overlaps(d.network) for d in allow):
                devs.add(dev)
        return sorted(d for d in devs if d != "lo" and not d.startswith("gv"))

    def _state(self) -> dict[str, list[str]] | None:
        """This router's table: its chains, the veths in its map, its uplinks (None if there is no table)."""
        try:
            proc = subprocess.run(["nft", "-j", "list", "table", "inet", self.table], capture_output=True,
                                  text=True, env=_TOOL_ENV, check=False)
        except FileNotFoundError as exc:
            raise Unavailable("egress networking needs 'nft' (Debian package nftables)") from exc
        if proc.returncode != 0:
            return None
        found: dict[str, list[str]] = {"chains": [], "sandboxes": [], "uplinks": []}
        for item in json.loads(proc.stdout)["nftables"]:
            if "chain" in item:
                found["chains"].append(item["chain"]["name"])
            elif "map" in item and item["map"]["name"] == "sandboxes":
                found["sandboxes"] += [e[0] for e in item["map"].get("elem", [])]
            elif "set" in item and item["set"]["name"] == "uplinks":
                found["uplinks"] += [e for e in item["set"].get("elem", []) if isinstance(e, str)]
        return found

    def _uplink_sets(self) -> dict[str, set[str]]:
        """Per grove table on this host (any router's): the uplinks whose forwarding it turned on."""
        found: dict[str, set[str]] = {}
        out = run_tool(["nft", "-j", "list", "tables", "inet"], check=False)
        for item in json.loads(out or '{"nftables": []}')["nftables"]:
            name = item.get("table", {}).get("name", "")
            if not name.startswith("grove_"):
                continue
            listing = run_tool(["nft", "-j", "list", "set", "inet", name, "uplinks"], check=False)
            found[name] = set()
            for entry in json.loads(listing or '{"nftables": []}')["nftables"]:
                if "set" in entry:
                    found[name] |= {e for e in entry["set"].get("elem", []) if isinstance(e, str)}
        return found


def read_link(sandbox_dir: Path) -> Link | None:
    """The sandbox's recorded link, or None."""
    try:
        return Link(**json.loads((sandbox_dir / RECORD).read_text()))
    except (OSError, ValueError, TypeError):
        return None


@contextlib.contextmanager
def host_lock() -> Iterator[None]:
    """The host-wide lock every change to grove's links and tables happens under (egress and private networks)."""
    LOCK_PATH.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(LOCK_PATH, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def run_tool(argv: list[str], stdin: str | None = None, *, check: bool = True, what: str = "egress networking") -> str:
    """Run a networking tool; its output. ``Unavailable`` (naming ``what`` failed) if it is missing or fails."""
    try:
        proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, env=_TOOL_ENV, check=False)
    except FileNotFoundError as exc:
        raise Unavailable(f"{what} needs {argv[0]!r} (Debian packages iproute2, nftables)") from exc
    if check and proc.returncode != 0:
        raise Unavailable(f"{what}: {' '.join(argv[:4])} failed: {proc.stderr.strip()[:500]}")
    return proc.stdout


def _nft(script: str) -> None:
    run_tool(["nft", "-f", "-"], script + "\n")


def _sysctl(key: str, value: str) -> None:
    with open(f"/proc/sys/{key}", "w", encoding="ascii") as fh:
        fh.write(value)


def _forwarding(dev: str) -> str:
    try:
        return Path(f"/proc/sys/net/ipv4/conf/{dev}/forwarding").read_text().strip()
    except OSError:
        return "?"


def _set_forwarding(dev: str, value: str) -> None:
    _sysctl(f"net/ipv4/conf/{dev}/forwarding", value)


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Replace ``path`` with ``data`` as JSON, atomically."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _slot(text: str) -> int:
    """A slot from its 4 hex digits (-1 for a name that is not one of grove's)."""
    return int(text, 16) if len(text) == 4 and all(c in "0123456789abcdef" for c in text) else -1
