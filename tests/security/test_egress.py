"""Egress allow-lists on the local backend, attacked through a real router.

"The internet" is a network namespace these tests make: a veth from the host, TEST-NET addresses
(198.51.100.2 and .3) and the metadata address 169.254.169.254, with TCP listeners on three ports and
UDP echo on two, logging every connection and datagram. The metadata address is routed there only for
packets from grove's sandbox subnet (a policy rule), so the host's own metadata route is untouched and a
blocked attempt is grove's rule at work, not a missing route. Everything the tests make is removed at
the end, also when a test fails. Two runs of this module at once on one host would share those
addresses: the fixture refuses to start when 198.51.100.2 is already routed.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from grove.client import Grove, Sandbox
from router.backends.local import egress_rules
from tests.support.router_fixtures import (
    RouterProcess,
    cgroup_procs,
    egress_table_exists,
    egress_veths,
    error_of,
    instance_of,
    wait_for,
)

# Reads its router's embedded S3 port (that server is one more loopback service a sandbox must not reach).
pytestmark = [pytest.mark.skipif(os.geteuid() != 0, reason="needs root (namespaces, veths, nftables)"),
              pytest.mark.embedded_s3]

HOST_SIDE, SERVER, OTHER, METADATA = "198.51.100.1", "198.51.100.2", "198.51.100.3", "169.254.169.254"
PORT, OTHER_PORT, METADATA_PORT = 8080, 9090, 80
_RULE_TABLE = "2317"
_SERVER = r"""
import socket, sys, threading
def log(*parts):
    print(*parts, flush=True)
def tcp(port):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port)); s.listen(64)
    while True:
        c, peer = s.accept()
        log("tcp", c.getsockname()[0], port, peer[0])
        c.sendall(b"hello from %d\n" % port); c.close()
def udp(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("0.0.0.0", port))
    while True:
        data, peer = s.recvfrom(2048)
        log("udp", port, peer[0], data.decode(errors="replace"))
        s.sendto(b"echo " + data, peer)
for p in (8080, 9090, 80):
    threading.Thread(target=tcp, args=(p,), daemon=True).start()
for p in (8080, 9090):
    threading.Thread(target=udp, args=(p,), daemon=True).start()
log("ready")
threading.Event().wait()
"""
PROBE = r"""
import socket, sys
args = sys.argv[1:]
for proto, host, port in zip(args[0::3], args[1::3], args[2::3]):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    kind = socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM
    s = socket.socket(family, kind)
    s.settimeout(1.5)
    try:
        if proto == "tcp":
            s.connect((host, int(port)))
            s.settimeout(0.5)
            try:
                banner = s.recv(100).decode().strip().replace(" ", "_") or "-"
            except socket.timeout:
                banner = "-"
            print(proto, host, port, "connected", banner)
        else:
            s.sendto(b"probe", (host, int(port)))
            print(proto, host, port, "reply", s.recv(100).decode().strip().replace(" ", "_"))
    except socket.timeout:
        print(proto, host, port, "timeout")
    except OSError as e:
        print(proto, host, port, "error", e.errno)
    finally:
        s.close()
"""
EHOSTUNREACH, ENETUNREACH = "113", "101"


@dataclass
class Internet:
    """The tests' stand-in for the internet, and what its listeners saw."""

    netns: str
    veth: str
    log_path: Path

    def seen(self) -> list[str]:
        """Every connection and datagram the listeners logged."""
        return [line for line in self.log_path.read_text().splitlines() if line != "ready"]


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


@pytest.fixture(scope="module")
def internet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Internet]:
    """A network namespace holding TEST-NET servers and a metadata listener, routed from the host."""
    tag = secrets.token_hex(3)
    net = Internet(f"grove-egress-{tag}", f"gteg{tag}", tmp_path_factory.mktemp("internet") / "server.log")
    server: subprocess.Popen[bytes] | None = None
    taken = _ip("-4", "route", "show", "table", "all", "to", "match", SERVER).stdout.split("\n")
    if any(line and not line.startswith(("default", "broadcast", "local")) for line in taken):
        pytest.fail(f"{SERVER} is already routed on this host (another run of this module?): {taken}")
    try:
        _ip("netns", "add", net.netns)
        _ip("link", "add", net.veth, "type", "veth", "peer", "name", "eth0", "netns", net.netns)
        _ip("addr", "add", f"{HOST_SIDE}/24", "dev", net.veth)
        _ip("link", "set", net.veth, "up")
        inside = (f"addr add {SERVER}/24 dev eth0\naddr add {OTHER}/24 dev eth0\naddr add {METADATA}/32 dev lo\n"
                  f"link set lo up\nlink set eth0 up\nroute add default via {HOST_SIDE}\n")
        subprocess.run(["ip", "-n", net.netns, "-b", "-"], input=inside, text=True, check=True)
        # Only packets from grove's sandboxes see this route to the metadata address.
        _ip("route", "add", f"{METADATA}/32", "via", SERVER, "dev", net.veth, "table", _RULE_TABLE)
        _ip("rule", "add", "from", str(egress_rules.SUBNET), "to", f"{METADATA}/32", "lookup", _RULE_TABLE)
        with open(net.log_path, "wb") as log:
            server = subprocess.Popen(["ip", "netns", "exec", net.netns, sys.executable, "-c", _SERVER],
                                      stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_for(lambda: "ready" in net.log_path.read_text(), 10, what="the test internet's listeners")
        yield net
    finally:
        if server is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=10)
        _ip("rule", "del", "from", str(egress_rules.SUBNET), "to", f"{METADATA}/32", "lookup", _RULE_TABLE,
            check=False)
        _ip("route", "flush", "table", _RULE_TABLE, check=False)
        _ip("link", "del", net.veth, check=False)
        _ip("netns", "del", net.netns, check=False)
        assert not Path("/sys/class/net", net.veth).exists(), f"could not remove {net.veth}"


def probe(sb: Sandbox, *targets: tuple[str, str, int]) -> dict[tuple[str, str, int], list[str]]:
    """Try each (proto, host, port) from inside the sandbox; the outcome words per target."""
    argv = [word for proto, host, port in targets for word in (proto, host, str(port))]
    r = sb.exec(["python3", "-c", PROBE, *argv], timeout_s=60)
    assert r.exit_code == 0, r.stderr
    found: dict[tuple[str, str, int], list[str]] = {}
    for line in r.stdout.decode().splitlines():
        proto, host, port, *outcome = line.split()
        found[(proto, host, int(port))] = outcome
    assert len(found) == len(targets), r.stdout
    return found


def assert_blocked(outcome: list[str], what: object) -> None:
    """Refused by grove's reject rule (or, when the host rate-limits its ICMP errors, never answered)."""
    assert outcome in (["error", EHOSTUNREACH], ["timeout"]), (what, outcome)


def link_of(router: RouterProcess, sb: Sandbox) -> dict[str, object]:
    """The sandbox's recorded egress link."""
    data: dict[str, object] = json.loads((router.layout.sandbox(sb.id) / "network.json").read_text())
    return data


def nft_table(router: RouterProcess) -> str:
    """The router's nftables table as text ('' when it has none)."""
    argv = ["nft", "list", "table", "inet", egress_rules.table(instance_of(router.state_dir))]
    return subprocess.run(argv, capture_output=True, text=True, check=False).stdout


def s3_port(router: RouterProcess) -> int:
    """The port of the router's embedded S3 server."""
    data = json.loads((router.layout.s3 / "grove-s3.json").read_text())
    return int(data["ports"]["s3.port"])


def host_addresses() -> list[str]:
    """Every IPv4 address of this host but loopback."""
    out = json.loads(_ip("-j", "-4", "addr", "show").stdout)
    return sorted(a["local"] for link in out for a in link.get("addr_info", []) if not a["local"].startswith("127."))


# -- bad input -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("entry", [
    "10.0.0.0/33", "10.0.0.1/8", "1.2.3.4:0", "1.2.3.4:65536", "1.2.3.4:", "1.2.3.4:80x", "256.1.1.1",
    " 1.2.3.4", "01.2.3.4", "example.com", "::1", "2001:db8::/32", "[2001:db8::1]:80", "1.2.3.4/24:80", "",
])
def test_bad_allow_entries_are_refused_naming_the_entry(router: RouterProcess, entry: str) -> None:
    before = router.live_ids()
    body = {"network": {"egress": "allow", "allow": ["198.51.100.2/32", entry]}}
    reply = router.http("POST", "/v1/sandboxes", json_body=body)
    assert reply.status == 422, reply.body
    err = error_of(reply)
    assert repr(entry) in err["message"], err
    if ":" in entry and entry.count(":") > 1:
        assert "IPv6" in err["message"], err
    assert router.live_ids() == before


# -- what an allow-list opens, and what it never opens -------------------------------------------------------


def test_allowed_destination_and_port_only(router: RouterProcess, internet: Internet) -> None:
    with router.client() as client:
        sb = client.create(heartbeat=False, network={"egress": "allow", "allow": [f"{SERVER}/32:{PORT}"]})
        try:
            seen_before = len(internet.seen())
            got = probe(sb, ("tcp", SERVER, PORT), ("udp", SERVER, PORT), ("tcp", SERVER, OTHER_PORT),
                        ("udp", SERVER, OTHER_PORT), ("tcp", OTHER, PORT), ("tcp", METADATA, METADATA_PORT))
            assert got[("tcp", SERVER, PORT)] == ["connected", f"hello_from_{PORT}"]
            assert got[("udp", SERVER, PORT)] == ["reply", "echo_probe"]
            for target in (("tcp", SERVER, OTHER_PORT), ("tcp", OTHER, PORT), ("tcp", METADATA, METADATA_PORT)):
                assert_blocked(got[target], target)
            assert got[("udp", SERVER, OTHER_PORT)] in (["timeout"], ["error", EHOSTUNREACH]), got
            # Only the two allowed attempts arrived, both from the host's address (masqueraded).
            assert internet.seen()[seen_before:] == [f"tcp {SERVER} {PORT} {HOST_SIDE}",
                                                     f"udp {PORT} {HOST_SIDE} probe"]
        finally:
            sb.close()


def test_allow_all_still_cannot_reach_the_host_metadata_or_other_sandboxes(
    router: RouterProcess, internet: Internet
) -> None:
    with router.client() as client:
        a = client.create(heartbeat=False, network={"egress": "allow", "allow": ["0.0.0.0/0"]})
        b = client.create(heartbeat=False, network={"egress": "allow", "allow": ["0.0.0.0/0"]})
        try:
            b_addr, a_gateway = str(link_of(router, b)["sandbox_addr"]), str(link_of(router, a)["host_addr"])
            b.exec("python3 -m http.server 8765 --bind 0.0.0.0 >/dev/null 2>&1 & sleep 0.5", timeout_s=10)
            assert probe(b, ("tcp", b_addr, 8765))[("tcp", b_addr, 8765)][0] == "connected"  # b serves
            # Proof the metadata address is routable from the sandbox's side: only the rule stops it.
            route = _ip("route", "get", METADATA, "from", str(link_of(router, a)["sandbox_addr"]), "iif",
                        str(link_of(router, a)["host_if"])).stdout
            assert internet.veth in route, route
            seen_before = len(internet.seen())
            open_ = [("tcp", SERVER, PORT), ("tcp", SERVER, OTHER_PORT), ("tcp", OTHER, PORT)]
            closed = [("tcp", "127.0.0.1", router.port), ("tcp", "127.0.0.1", s3_port(router)),
                      ("tcp", a_gateway, router.port), ("tcp", HOST_SIDE, router.port),
                      ("tcp", b_addr, 8765), ("tcp", METADATA, METADATA_PORT), ("udp", METADATA, PORT),
                      ("tcp", "169.254.1.1", 80), ("tcp", "0.0.0.0", router.port)]
            closed += [("tcp", address, router.port) for address in host_addresses()]
            closed = list(dict.fromkeys(closed))  # the host's addresses include the test veth's
            got = probe(a, *open_, *closed, ("tcp", "2001:db8::1", PORT), ("tcp", "::1", router.port))
            assert [got[t][0] for t in open_] == ["connected"] * 3, got
            for target in closed:
                if target[1] == "127.0.0.1":  # the sandbox's own loopback: nothing listens there
                    assert got[target] == ["error", "111"], (target, got[target])
                elif target[0] == "udp":
                    assert got[target] in (["timeout"], ["error", EHOSTUNREACH]), (target, got[target])
                elif target[1] == "0.0.0.0":  # means "this host" — the sandbox's own
                    assert got[target][0] == "error", (target, got[target])
                else:
                    assert_blocked(got[target], target)
            for target in (("tcp", "2001:db8::1", PORT), ("tcp", "::1", router.port)):
                assert got[target][0] == "error", (target, got[target])  # no IPv6 route, no IPv6 at all
            assert got[("tcp", "2001:db8::1", PORT)] == ["error", ENETUNREACH]
            # The listeners saw exactly the three allowed connections: nothing to the metadata address.
            seen = internet.seen()[seen_before:]
            assert sorted(seen) == sorted(f"tcp {h} {p} {HOST_SIDE}" for _, h, p in open_), seen
            # No IPv6 address at all inside, not even link-local.
            assert a.exec("cat /proc/net/if_inet6 | grep -v ' lo$' || true").stdout.strip() in (b"",), "ipv6"
        finally:
            a.close()
            b.close()


def test_the_sandbox_cannot_change_its_network(router: RouterProcess, internet: Internet) -> None:
    with router.client() as client:
        sb = client.create(heartbeat=False, network={"egress": "allow", "allow": [f"{SERVER}/32:{PORT}"]})
        try:
            before = sb.exec("cat /proc/net/route; ip -4 -o addr").stdout
            for command in ("ip addr add 198.51.100.50/24 dev eth0", "ip route add 10.0.0.0/8 dev eth0",
                            "ip route del default", "ip link set eth0 down", "ip link add x type dummy",
                            "nft add table inet grove_evil", "echo 1 > /proc/sys/net/ipv4/ip_forward",
                            "echo 0 > /proc/sys/net/ipv6/conf/eth0/disable_ipv6"):
                r = sb.exec(command)
                assert r.exit_code != 0, (command, r.stdout, r.stderr)
                # Refused for want of a capability, a read-only /proc/sys, or (nft) because seccomp allows no
                # netfilter netlink socket at all.
                refusals = (b"not permitted", b"Read-only", b"Protocol not supported")
                assert any(why in r.stderr for why in refusals), (command, r.stderr)
            assert sb.exec("cat /proc/net/route; ip -4 -o addr").stdout == before
            # Raw sockets need CAP_NET_RAW over the network namespace, which the host's user namespace
            # owns: root inside cannot forge packets at all.
            refused = sb.exec(["python3", "-c", "import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, 255)"])
            assert refused.exit_code != 0 and b"PermissionError" in refused.stderr, refused.stderr
            # Should one be forged anyway (here: by a host process in the sandbox's network namespace), a
            # forged source address is dropped on the way out.
            seen_before = len(internet.seen())
            spoof = (
                "import socket, struct\n"
                "def csum(b):\n"
                "    b += b'\\0' * (len(b) % 2); s = sum(struct.unpack('!%dH' % (len(b) // 2), b))\n"
                "    s = (s >> 16) + (s & 0xffff); return ~(s + (s >> 16)) & 0xffff\n"
                "src, dst, data = socket.inet_aton('198.51.100.77'), socket.inet_aton('198.51.100.2'), b'spoofed'\n"
                "udp = struct.pack('!HHHH', 4444, 8080, 8 + len(data), 0) + data\n"
                "ip = struct.pack('!BBHHHBBH4s4s', 0x45, 0, 20 + len(udp), 1, 0, 64, 17, 0, src, dst)\n"
                "ip = ip[:10] + struct.pack('!H', csum(ip)) + ip[12:]\n"
                "s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)\n"
                "for _ in range(3): s.sendto(ip + udp, ('198.51.100.2', 0))\n"
                "print('sent')\n"
            )
            pid = cgroup_procs(router.state_dir, sb.id)[0]
            r = subprocess.run(["nsenter", f"--net=/proc/{pid}/ns/net", sys.executable, "-c", spoof],
                               capture_output=True, timeout=30)
            assert r.stdout == b"sent\n", r.stderr
            got = probe(sb, ("udp", SERVER, PORT))  # a genuine datagram after them, as a marker
            assert got[("udp", SERVER, PORT)] == ["reply", "echo_probe"]
            assert internet.seen()[seen_before:] == [f"udp {PORT} {HOST_SIDE} probe"]
        finally:
            sb.close()


def test_deny_sandboxes_still_reach_nothing(router: RouterProcess, internet: Internet) -> None:
    with router.client() as client:
        allowed = client.create(heartbeat=False, network={"egress": "allow", "allow": ["0.0.0.0/0"]})
        denied = client.create(heartbeat=False)
        try:
            assert not (router.layout.sandbox(denied.id) / "network.json").exists()
            dev = denied.exec("cat /proc/net/dev").stdout.decode()
            assert [line.split(":")[0].strip() for line in dev.splitlines() if ":" in line] == ["lo"], dev
            got = probe(denied, ("tcp", SERVER, PORT), ("udp", SERVER, PORT), ("tcp", METADATA, METADATA_PORT),
                        ("tcp", str(link_of(router, allowed)["sandbox_addr"]), 8765))
            assert all(outcome == ["error", ENETUNREACH] for outcome in got.values()), got
        finally:
            allowed.close()
            denied.close()


# -- lifecycle: scale to zero, restart, orphans, delete ---------------------------------------------------------


def _gone(router: RouterProcess, host_if: str, slot: int) -> bool:
    return not Path("/sys/class/net", host_if).exists() and egress_rules.chain(slot) not in nft_table(router)


def test_scale_to_zero_resume_and_delete_leave_no_veth_and_no_rule(
    fresh_router: RouterProcess, internet: Internet
) -> None:
    router = fresh_router
    forwarding = Path(f"/proc/sys/net/ipv4/conf/{internet.veth}/forwarding")
    assert forwarding.read_text().strip() == "0"
    with router.client() as client:
        sb = client.create(heartbeat=False, idle_timeout_s=1,
                           network={"egress": "allow", "allow": [f"{SERVER}/32:{PORT}"]})
        link = link_of(router, sb)
        host_if, slot = str(link["host_if"]), int(str(link["slot"]))
        assert egress_veths(router.state_dir) == [host_if]
        assert f"jump {egress_rules.chain(slot)}" in nft_table(router)
        assert forwarding.read_text().strip() == "1"  # replies come back through the uplink
        wait_for(lambda: client.attach(sb.id).info["status"] == "idle", 30, what="scale to zero")
        assert _gone(router, host_if, slot), nft_table(router)
        assert not egress_table_exists(router.state_dir)  # its last sandbox stopped: the table went too
        assert forwarding.read_text().strip() == "0"  # and grove turned the uplink's forwarding off again
        got = probe(sb, ("tcp", SERVER, PORT), ("tcp", SERVER, OTHER_PORT))  # resumes it
        assert got[("tcp", SERVER, PORT)][0] == "connected"
        assert_blocked(got[("tcp", SERVER, OTHER_PORT)], OTHER_PORT)
        link = link_of(router, sb)
        host_if, slot = str(link["host_if"]), int(str(link["slot"]))
        sb.close()
        assert _gone(router, host_if, slot)
        assert not egress_veths(router.state_dir) and not egress_table_exists(router.state_dir)
        assert forwarding.read_text().strip() == "0"


def test_router_restart_keeps_networking_and_collects_orphans(
    fresh_router: RouterProcess, internet: Internet
) -> None:
    router = fresh_router
    client: Grove
    with router.client() as client:
        kept = client.create(heartbeat=False, network={"egress": "allow", "allow": [f"{SERVER}/32:{PORT}"]})
        orphan = client.create(heartbeat=False, network={"egress": "allow", "allow": [f"{SERVER}/32"]})
        orphan_link = link_of(router, orphan)
    assert router.stop() == 0
    # close() left both sandboxes' networking in place.
    assert len(egress_veths(router.state_dir)) == 2 and egress_table_exists(router.state_dir)
    (router.layout.record(orphan.id)).unlink()  # the router forgets one
    router.start()
    assert _gone(router, str(orphan_link["host_if"]), int(str(orphan_link["slot"]))), nft_table(router)
    with router.client() as client:
        sb = client.attach(kept.id)
        got = probe(sb, ("tcp", SERVER, PORT), ("tcp", SERVER, OTHER_PORT))
        assert got[("tcp", SERVER, PORT)][0] == "connected"
        assert_blocked(got[("tcp", SERVER, OTHER_PORT)], OTHER_PORT)
        sb.close()
    deadline = time.monotonic() + 10
    while egress_veths(router.state_dir) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not egress_veths(router.state_dir) and not egress_table_exists(router.state_dir)


BYSTANDER_SIDE, BYSTANDER = "203.0.113.1", "203.0.113.2"


@contextlib.contextmanager
def bystander_network(log_path: Path) -> Iterator[str]:
    """A second test network (203.0.113.0/24) behind the host, with a TCP listener logging connections."""
    tag = secrets.token_hex(3)
    netns, veth = f"grove-bystander-{tag}", f"gtby{tag}"
    server: subprocess.Popen[bytes] | None = None
    try:
        _ip("netns", "add", netns)
        _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns)
        _ip("addr", "add", f"{BYSTANDER_SIDE}/24", "dev", veth)
        _ip("link", "set", veth, "up")
        inside = (f"addr add {BYSTANDER}/24 dev eth0\nlink set lo up\nlink set eth0 up\n"
                  f"route add default via {BYSTANDER_SIDE}\n")
        subprocess.run(["ip", "-n", netns, "-b", "-"], input=inside, text=True, check=True)
        with open(log_path, "wb") as log:
            server = subprocess.Popen(["ip", "netns", "exec", netns, sys.executable, "-c", _SERVER],
                                      stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_for(lambda: "ready" in log_path.read_text(), 10, what="the bystander's listener")
        yield netns
    finally:
        if server is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=10)
        _ip("link", "del", veth, check=False)
        _ip("netns", "del", netns, check=False)


def test_an_uplink_with_forwarding_on_forwards_nothing_but_grove_replies(
    router: RouterProcess, internet: Internet, tmp_path: Path
) -> None:
    forwarding = Path(f"/proc/sys/net/ipv4/conf/{internet.veth}/forwarding")
    with router.client() as client, bystander_network(tmp_path / "bystander.log"):
        sb = client.create(heartbeat=False, network={"egress": "allow", "allow": [f"{SERVER}/32:{PORT}"]})
        try:
            assert forwarding.read_text().strip() == "1"  # grove turned it on for the replies
            # The kernel would now route a packet from "the internet" on to the bystander network ...
            route = _ip("route", "get", BYSTANDER, "from", SERVER, "iif", internet.veth).stdout
            assert "dev gtby" in route, route
            # ... but grove's guard drops it: the host forwards nothing it did not forward before. (UDP: one
            # datagram is enough to arrive; no reply, which the bystander's own link would not forward, needed.)
            send = (f"import socket, time\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
                    f"for _ in range(3):\n    s.sendto(b'through', ('{BYSTANDER}', {PORT})); time.sleep(0.2)\n")
            subprocess.run(["ip", "netns", "exec", internet.netns, sys.executable, "-c", send], check=True, timeout=30)
            time.sleep(0.5)
            assert (tmp_path / "bystander.log").read_text().split() == ["ready"]
            assert probe(sb, ("tcp", SERVER, PORT))[("tcp", SERVER, PORT)][0] == "connected"  # replies still pass
        finally:
            sb.close()
