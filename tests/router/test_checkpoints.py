"""Checkpoints and forks on the local backend (issue 33): real routers, sandboxes, cgroups and disk images."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from grove.client import Grove, Sandbox
from tests.support.router_fixtures import (
    RouterProcess,
    cgroup_procs,
    error_of,
    instance_of,
    router_state,
    wait_for,
    wait_removed,
)

pytestmark = pytest.mark.local_only

SMALL = {"cpu": 0.5, "memory_mb": 256, "disk_mb": 256}


@pytest.fixture(scope="module")
def ck_router(s3_server: Any) -> Iterator[RouterProcess]:
    with router_state(s3=s3_server) as router:
        yield router


@pytest.fixture
def client(ck_router: RouterProcess) -> Iterator[Grove]:
    with ck_router.client() as grove:
        yield grove
    ck_router.delete_all()


def _token(router: RouterProcess, sandbox_id: str) -> str:
    token = json.loads(router.layout.record(sandbox_id).read_text())["token"]
    assert isinstance(token, str)
    return token


def test_fork_children_see_the_parents_files_and_branch_apart(ck_router: RouterProcess, client: Grove) -> None:
    parent = client.create(heartbeat=False, **SMALL)
    parent.write_file("/workspace/shared.txt", "from the parent")
    parent.exec("mkdir -p /workspace/d && echo owned > /workspace/d/f && chmod 4755 /workspace/d/f")
    a, b = parent.fork(2, metadata={"task_id": "t-fork"})
    for child in (a, b):
        assert child.read_file("/workspace/shared.txt") == b"from the parent"
        # Files the parent's root wrote are the child's root's (its own host id range), modes kept.
        assert child.exec("stat -c '%u %a' /workspace/d/f").stdout.strip() == b"0 4755"
        assert child.exec("echo more >> /workspace/d/f").exit_code == 0
        assert child.info["lineage"]["parent"] == parent.id
        assert child.info["lineage"]["kind"] == "fork"
        assert child.info["metadata"]["task_id"] == "t-fork"
    a.write_file("/workspace/shared.txt", "branch a")
    b.write_file("/workspace/only-b.txt", "b")
    parent.write_file("/workspace/later.txt", "after the fork")
    assert parent.read_file("/workspace/shared.txt") == b"from the parent"
    assert b.read_file("/workspace/shared.txt") == b"from the parent"
    assert a.exec("test -e /workspace/only-b.txt").exit_code == 1
    assert parent.exec("test -e /workspace/only-b.txt").exit_code == 1
    assert a.exec("test -e /workspace/later.txt").exit_code == 1
    assert parent.status()["status"] == "ready"  # the parent kept running
    # Each child its own token, cgroups (limits) and network namespace.
    tokens = {_token(ck_router, s.id) for s in (parent, a, b)}
    assert len(tokens) == 3
    instance = instance_of(ck_router.state_dir)
    for child in (a, b):
        limit = Path(f"/sys/fs/cgroup/memory/grove-{instance}/{child.id}/memory.limit_in_bytes")
        assert int(limit.read_text()) == 256 << 20
        assert cgroup_procs(ck_router.state_dir, child.id)
    parent.exec("nohup python3 -m http.server 8123 --bind 127.0.0.1 >/dev/null 2>&1 &")
    wait_for(lambda: parent.exec("python3 -c \"import socket; socket.create_connection(('127.0.0.1', 8123))\"")
             .exit_code == 0, 10, what="the parent's server")
    reach = "python3 -c \"import socket; socket.create_connection(('127.0.0.1', 8123), timeout=2)\""
    assert a.exec(reach).exit_code != 0  # the parent's loopback is not the child's
    # The lineage is in the child's trajectory too, with the step the checkpoint was taken at.
    record = client.request("GET", f"/v1/sandboxes/{a.id}/trajectory")
    lineage = record["sandbox"]["lineage"]
    parent_steps = len(client.request("GET", f"/v1/sandboxes/{parent.id}/trajectory")["steps"])
    assert lineage["checkpoint"] == a.info["lineage"]["checkpoint"]
    assert 0 < lineage["step"] < parent_steps
    assert set(lineage) == {"parent", "step", "checkpoint", "kind"}


def test_a_checkpoint_during_heavy_writes_opens_clean(client: Grove) -> None:
    parent = client.create(heartbeat=False, **SMALL)
    writer = (
        "import sqlite3\n"
        "db = sqlite3.connect('/workspace/w.db', isolation_level=None)\n"
        "db.execute('pragma journal_mode=wal')\n"
        "db.execute('create table if not exists t (i integer, pad blob)')\n"
        "i = 0\n"
        "while True:\n"
        "    db.execute('begin')\n"
        "    db.execute('insert into t values (?, randomblob(4000))', (i,))\n"
        "    db.execute('commit')\n"
        "    i += 1\n"
    )
    parent.write_file("/workspace/writer.py", writer)
    parent.exec("nohup python3 /workspace/writer.py >/dev/null 2>&1 &")
    wait_for(lambda: parent.exec("test -s /workspace/w.db-wal").exit_code == 0, 10, what="the writer's WAL")
    taken = [parent.checkpoint() for _ in range(3)]
    for made in taken:
        child = client.create(heartbeat=False, checkpoint=made["id"])
        check = child.exec("python3 -c \"import sqlite3; db = sqlite3.connect('/workspace/w.db'); "
                           "print(db.execute('pragma integrity_check').fetchone()[0], "
                           "db.execute('select count(*) from t').fetchone()[0])\"")
        ok, rows = check.stdout.split()
        assert check.exit_code == 0 and ok == b"ok" and int(rows) > 0, check
        assert child.info["lineage"]["kind"] == "restore"
        child.close()
    assert parent.exec("pgrep -f writer.py").exit_code == 0  # thawed: still writing
    assert all(0 <= made["frozen_ms"] < 60_000 and made["copy_on_write"] for made in taken)


def test_delete_semantics_and_listing(ck_router: RouterProcess, client: Grove) -> None:
    parent = client.create(heartbeat=False, **SMALL)
    parent.write_file("/workspace/x", "1")
    first, second = parent.checkpoint(), parent.checkpoint()
    assert [c["id"] for c in parent.checkpoints()] == [first["id"], second["id"]]
    got = client.request("GET", f"/v1/sandboxes/{parent.id}/checkpoints/{first['id']}")
    assert got["sandbox_id"] == parent.id and got["step"] <= second["step"]
    parent.delete_checkpoint(first["id"])
    assert [c["id"] for c in parent.checkpoints()] == [second["id"]]
    reply = ck_router.http("GET", f"/v1/sandboxes/{parent.id}/checkpoints/{first['id']}")
    assert reply.status == 404
    child = client.create(heartbeat=False, checkpoint=second["id"])
    parent.close()  # its checkpoints go with it; the child keeps its own copy
    reply = ck_router.http("POST", "/v1/sandboxes", json_body={"checkpoint": second["id"]})
    assert reply.status == 404 and "deleting a sandbox deletes its checkpoints" in error_of(reply)["message"]
    assert child.read_file("/workspace/x") == b"1"
    wait_removed(ck_router.state_dir, parent.id)  # the teardown's passes follow the delete
    leftovers = list((ck_router.layout.sandboxes).glob(f"{parent.id}*"))
    assert leftovers == []


def test_bad_input(ck_router: RouterProcess, client: Grove) -> None:
    parent = client.create(heartbeat=False, **SMALL)
    made = parent.checkpoint()
    reply = ck_router.http("POST", "/v1/sandboxes", json_body={"checkpoint": "ck-0000000000000000"})
    assert reply.status == 404 and "no checkpoint" in error_of(reply)["message"]
    for count in (0, 65):
        reply = ck_router.http("POST", f"/v1/sandboxes/{parent.id}/fork", json_body={"count": count})
        assert reply.status == 422, reply.body  # out of range: the schema's own answer, as for every field
        assert "count" in error_of(reply)["message"]
    reply = ck_router.http("POST", f"/v1/sandboxes/{parent.id}/fork", json_body={"count": 1, "memory": True})
    assert reply.status == 422 and "CRIU" in error_of(reply)["message"]
    other_sandbox = client.create(heartbeat=False, **SMALL)  # the checkpoint is not this sandbox's
    for method in ("GET", "DELETE"):
        reply = ck_router.http(method, f"/v1/sandboxes/{other_sandbox.id}/checkpoints/{made['id']}")
        assert reply.status == 404 and "no checkpoint" in error_of(reply)["message"]
    assert [c["id"] for c in parent.checkpoints()] == [made["id"]]
    reply = ck_router.http("POST", "/v1/sandboxes", json_body={"checkpoint": made["id"], "image": "nope"})
    assert reply.status == 422 and "leave 'image' out" in error_of(reply)["message"]
    # Another project's checkpoint is unknown, exactly as one never taken.
    other = ck_router.member_key("other", "other-user")
    reply = ck_router.http("POST", "/v1/sandboxes", json_body={"checkpoint": made["id"]}, key=other)
    assert reply.status == 404 and "no checkpoint" in error_of(reply)["message"]
    reply = ck_router.http("GET", f"/v1/sandboxes/{parent.id}/checkpoints/{made['id']}", key=other)
    assert reply.status == 404
    assert parent.exec("true").exit_code == 0  # nothing else disturbed


def test_checkpoints_count_toward_the_disk_quota(ck_router: RouterProcess) -> None:
    done = ck_router.cli("key", "add", "quota-user", "--project", "quotaed")
    assert done.returncode == 0, done.stderr.decode()
    key = done.stdout.decode().strip()
    wait_for(lambda: ck_router.http("GET", "/v1/projects", key=key).status == 200, 5, what="the new key taken")
    with Grove(ck_router.url, key) as grove:
        parent: Sandbox = grove.create(heartbeat=False, **SMALL)
        try:
            parent.exec("head -c 40000000 /dev/urandom > /workspace/big")
            first = parent.checkpoint()
            held_mb = first["bytes"] / (1 << 20)
            assert held_mb > 38
            # Room for the sandbox and one such checkpoint, not two.
            limit = int(256 + held_mb * 1.5)
            assert ck_router.cli("project", "set", "quotaed", "--disk-mb", str(limit)).returncode == 0
            quota = lambda: ck_router.http("GET", "/v1/projects/quotaed", key=key).json()["quotas"]["disk_mb"]  # noqa: E731
            wait_for(lambda: quota() == limit, 5, what="the quota taken")
            reply = ck_router.http("POST", f"/v1/sandboxes/{parent.id}/checkpoints", json_body={}, key=key)
            assert reply.status == 429, reply.body
            assert "disk_mb" in error_of(reply)["message"] and "checkpoints" in error_of(reply)["message"]
            assert len(parent.checkpoints()) == 1  # the refused one left nothing
            # A create counts the checkpoints too.
            reply = ck_router.http("POST", "/v1/sandboxes", json_body={"disk_mb": 64}, key=key)
            assert reply.status == 429
            parent.delete_checkpoint(first["id"])
            assert parent.checkpoint()["sandbox_id"] == parent.id  # room again once the first is gone
        finally:
            parent.close()
            ck_router.cli("project", "set", "quotaed", "--disk-mb", "none")


def test_an_idle_sandbox_checkpoints_without_waking(ck_router: RouterProcess, client: Grove) -> None:
    sb = client.create(heartbeat=False, idle_timeout_s=1, **SMALL)
    sb.write_file("/workspace/kept.txt", "before idling")
    wait_for(lambda: sb.status()["status"] == "idle", 15, what="the sandbox to scale to zero")
    made = sb.checkpoint()
    assert made["frozen_ms"] == 0 and made["copy_on_write"]
    assert sb.status()["status"] == "idle"  # not woken for it
    child = client.create(heartbeat=False, checkpoint=made["id"])
    assert child.read_file("/workspace/kept.txt") == b"before idling"


def test_the_cli_takes_lists_forks_restores_and_deletes(ck_router: RouterProcess, client: Grove) -> None:
    sb = client.create(heartbeat=False, **SMALL)
    sb.write_file("/workspace/cli.txt", "via the cli")

    def cli(*args: str) -> str:
        done = ck_router.cli(*args)
        assert done.returncode == 0, done.stderr.decode()
        return done.stdout.decode()

    checkpoint_id = cli("checkpoint", "create", sb.id).strip()
    assert checkpoint_id.startswith("ck-")
    listing = cli("checkpoint", "ls", sb.id)
    assert "CHECKPOINT" in listing and checkpoint_id in listing
    restored = cli("create", "--checkpoint", checkpoint_id).strip()
    assert client.attach(restored).read_file("/workspace/cli.txt") == b"via the cli"
    forked = cli("fork", sb.id, "-n", "2").split()
    assert len(forked) == 2 and all(client.attach(i).read_file("/workspace/cli.txt") == b"via the cli" for i in forked)
    assert "deleted checkpoint" in cli("checkpoint", "rm", sb.id, checkpoint_id)
    assert checkpoint_id not in cli("checkpoint", "ls", sb.id)
    done = ck_router.cli("checkpoint", "rm", sb.id, checkpoint_id)
    assert done.returncode != 0 and b"no checkpoint" in done.stderr


def test_checkpoints_survive_a_router_restart(fresh_router: RouterProcess) -> None:
    with fresh_router.client() as grove:
        sb = grove.create(heartbeat=False, **SMALL)
        sb.write_file("/workspace/x", "kept")
        made = sb.checkpoint()
        fresh_router.stop()
        fresh_router.start()
        assert [c["id"] for c in sb.checkpoints()] == [made["id"]]
        child = grove.create(heartbeat=False, checkpoint=made["id"])
        assert child.read_file("/workspace/x") == b"kept"
