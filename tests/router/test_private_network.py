"""Private networks between sandboxes (``network.group``) on a real local router: members reach each other, no one
else does (not a sandbox outside the group, not another project's group of the same name), and the hub, veths and
records go with the last member."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
from collections.abc import Iterator

import pytest

from grove.client import Grove, Sandbox
from router.backends.local.private_net import RECORD
from tests.router.test_cli_state import grove_cli
from tests.router.test_isolation import CONNECT
from tests.support.router_fixtures import RouterProcess, cgroup_procs, error_of, leaks, private_hubs, wait_for

SERVE = "python3 -m http.server 8080 --bind 0.0.0.0"


def _group() -> dict[str, str]:
    return {"group": "g-" + secrets.token_hex(4)}


def _address(sandbox: Sandbox) -> str:
    address = sandbox.status()["network"]["address"]
    assert isinstance(address, str)
    return address


def _connect(sandbox: Sandbox, address: str, port: int = 8080) -> str:
    return sandbox.exec(["python3", "-c", CONNECT, address, str(port)], timeout_s=20).stdout.decode().strip()


def _serving(sandbox: Sandbox) -> None:
    sandbox.processes.start(SERVE)
    wait_for(lambda: _connect(sandbox, "127.0.0.1") == "connected", 20, what="the http server in the sandbox")


@pytest.fixture
def group_pair(router: RouterProcess) -> Iterator[tuple[Grove, Sandbox, Sandbox, dict[str, str]]]:
    """Two sandboxes of one fresh group, ``service`` serving on port 8080; deleted at the end."""
    network = _group()
    with router.client() as client:
        service = client.create(network=network, heartbeat=False)
        agent = client.create(network=network, heartbeat=False)
        try:
            _serving(service)
            yield client, service, agent, network
        finally:
            agent.close()
            service.close()


def test_members_reach_each_other_and_only_on_the_group(group_pair: tuple[Grove, Sandbox, Sandbox,
                                                                          dict[str, str]]) -> None:
    _, service, agent, network = group_pair
    assert service.status()["network"]["group"] == network["group"]
    address = _address(service)
    assert address.startswith("10.232.0.") and address != _address(agent)
    agent.exec(["/bin/sh", "-c", f"echo '{address} office' >> /etc/hosts"])
    fetched = agent.exec(["python3", "-c", "import urllib.request as u; print(u.urlopen("
                                           "'http://office:8080/', timeout=5).status)"], timeout_s=20)
    assert fetched.stdout.strip() == b"200", fetched.stderr
    # The group is all the link reaches: no route beyond its /24, no IPv6 on it.
    assert _connect(agent, "10.232.1.1") == "error 101 Network is unreachable"
    assert _connect(agent, "8.8.8.8") == "error 101 Network is unreachable"
    interfaces = agent.exec("cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '").stdout.split()
    assert sorted(interfaces) == [b"grp0", b"lo"]
    assert agent.exec("cat /proc/sys/net/ipv6/conf/grp0/disable_ipv6").stdout.strip() in (b"1", b"")
    # Its port is all a member shares: the server's process and its files stay in its own sandbox.
    service.exec("echo secret > /workspace/state.txt")
    assert agent.exec(["pgrep", "-f", "http.server"]).exit_code == 1
    assert agent.exec(["test", "-e", "/workspace/state.txt"]).exit_code == 1


def test_a_sandbox_outside_the_group_cannot_reach_a_member(
        router: RouterProcess, group_pair: tuple[Grove, Sandbox, Sandbox, dict[str, str]]) -> None:
    client, service, _, network = group_pair
    address = _address(service)
    outsider = client.create(heartbeat=False)  # no group at all
    other_group = client.create(network=_group(), heartbeat=False)  # a group of its own
    try:
        assert _connect(outsider, address) == "error 101 Network is unreachable"
        assert "address" not in outsider.status()["network"]
        assert _connect(other_group, address) != "connected"
    finally:
        outsider.close()
        other_group.close()
    # Another project naming the same group gets a hub of its own: it does not reach this one's members.
    key = router.member_key("other-" + secrets.token_hex(3), "other-member")
    with router.client(key=key) as stranger:
        intruder = stranger.create(network=network, heartbeat=False)
        try:
            assert _connect(intruder, address) != "connected"
            assert len(private_hubs(router.state_dir)) == 2
        finally:
            intruder.close()


def test_the_hub_goes_with_the_last_member(router: RouterProcess) -> None:
    network = _group()
    before = set(private_hubs(router.state_dir))
    with router.client() as client:
        first = client.create(network=network, heartbeat=False)
        second = client.create(network=network, heartbeat=False)
        hubs = set(private_hubs(router.state_dir)) - before
        assert len(hubs) == 1
        (hub,) = hubs
        ports = subprocess.run(["ip", "-n", hub, "-o", "link", "show", "master", "br0"], capture_output=True,
                               text=True, check=True).stdout
        assert ports.count("master br0") == 2
        records = [router.layout.sandboxes / s.id / RECORD for s in (first, second)]
        assert all(r.exists() for r in records)
        first.close()
        assert set(private_hubs(router.state_dir)) - before == {hub}  # the second member still uses it
        second.close()
        assert set(private_hubs(router.state_dir)) == before
        assert not any(r.exists() for r in records)


def test_a_malformed_group_is_refused(router: RouterProcess) -> None:
    reply = router.http("POST", "/v1/sandboxes", json_body={"network": {"group": "Bad Name!"}})
    assert reply.status == 400
    assert "network.group 'Bad Name!' must be 1-63 of a-z, 0-9 and '-'" in error_of(reply)["message"]


def test_a_pool_cannot_hold_a_group(router: RouterProcess) -> None:
    reply = router.http("POST", "/v1/pools", json_body={"name": "grouped", "size": 0, "network": _group()})
    assert reply.status == 400
    assert "a warm pool's members cannot share a private network" in error_of(reply)["message"]


def test_down_after_a_killed_router_removes_every_group(fresh_router: RouterProcess) -> None:
    with fresh_router.client() as client:
        for network in (_group(), _group()):
            client.create(network=network, heartbeat=False)
            client.create(network={**network, "egress": "allow"}, heartbeat=False)
    assert len(private_hubs(fresh_router.state_dir)) == 2
    fresh_router.stop(signal.SIGKILL)
    assert len(private_hubs(fresh_router.state_dir)) == 2  # the sandboxes still run, and so do their groups
    done = grove_cli(fresh_router, "--state-dir", str(fresh_router.state_dir), "down")
    assert done.returncode == 0, done.stderr
    assert "deleted 4 sandbox(es)" in done.stdout
    assert private_hubs(fresh_router.state_dir) == [] and leaks(fresh_router.state_dir) == []


def test_a_restarted_router_removes_groups_whose_sandboxes_died_while_it_was_down(fresh_router: RouterProcess) -> None:
    with fresh_router.client() as client:
        ids = [client.create(network=_group(), heartbeat=False).id for _ in range(2)]
    fresh_router.stop(signal.SIGKILL)
    for sandbox_id in ids:  # the sandboxes die with no router to see it: their hubs are left without members
        for pid in cgroup_procs(fresh_router.state_dir, sandbox_id):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    wait_for(lambda: all(not cgroup_procs(fresh_router.state_dir, i) for i in ids), 30, what="the sandboxes to die")
    assert len(private_hubs(fresh_router.state_dir)) == 2
    fresh_router.start()
    wait_for(lambda: private_hubs(fresh_router.state_dir) == [], 30, what="the restarted router to remove the hubs")
