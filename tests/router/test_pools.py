"""Warm pools through a real router: a claim gets a fresh, clean sandbox with its own token, env, workdir and
trajectory; pools refill, resize, delete, survive a restart, and stop when their image is removed."""

from __future__ import annotations

import json
import re
import signal
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from grove.client import Grove
from grove.core.errors import Conflict, NotFound
from tests.support.imagetools import make_busybox_rootfs
from tests.support.router_fixtures import RouterProcess, cgroup_procs, wait_for

# Not the API's defaults, so that other creates on the shared router never match these pools by spec.
SMALL = {"cpu": 0.5, "memory_mb": 256, "pids_max": 128, "disk_mb": 256}
# Files a sandbox could have been left with, and PID 1 with its children (where anything left running
# by the filling would be, orphans included): one shell, this command's.
SNAPSHOT = "ls -A /tmp /dev/shm /job /root 2>&1; ps -e -o ppid=,comm= | awk '$1 <= 1 {print $2}' | sort"


def _members(router: RouterProcess, pool: str) -> dict[str, dict[str, Any]]:
    """The pool's unclaimed members as their records on disk say (the API never shows them)."""
    found = {}
    for path in router.layout.records.glob("sb-*.json"):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # being replaced right now
        if record.get("pool") == pool:
            found[record["id"]] = record
    return found


def _ready(grove: Grove, name: str, count: int, timeout: float = 90) -> dict[str, Any]:
    return dict(wait_for(lambda: (p := grove.pool(name))["ready"] == count and p["starting"] == 0 and p,
                         timeout, what=f"pool {name} at {count} ready"))


def _executor(router: RouterProcess, sandbox_id: str, token: str, path: str, body: dict[str, Any]) -> int:
    """POST straight to a sandbox's executor socket with a token; the HTTP status."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(30)
        sock.connect(str(router.layout.sandboxes / sandbox_id / "executor.sock"))
        data = json.dumps(body).encode()
        sock.sendall(f"POST {path} HTTP/1.0\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
                     f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
        status = sock.makefile("rb").readline()
    return int(status.split()[1])


def test_claim_is_a_fresh_clean_sandbox(router: RouterProcess, grove: Grove) -> None:
    shown = grove.create_pool("clean", size=2, resources=SMALL)
    assert shown["size"] == 2 and shown["resources"] == SMALL
    _ready(grove, "clean", 2)
    members = _members(router, "clean")
    assert len(members) == 2
    # Hidden until claimed: not listed, not reachable by id.
    assert not set(members) & {s["id"] for s in grove.list()}
    with pytest.raises(NotFound):
        grove.attach(next(iter(members)))

    sb = grove.create(pool="clean", env={"CLAIM": "mine"}, workdir="/job",
                      metadata={"task_id": "pool-task"}, heartbeat=False)
    assert sb.id in members, "the create did not claim a pool member"
    assert sb.info["status"] == "ready" and sb.info["resources"] == SMALL
    r = sb.exec("echo $CLAIM; pwd")
    assert r.stdout == b"mine\n/job\n", r.stderr

    # The pool token no longer opens the executor (nor claims it again); the claim's token does.
    old_token = members[sb.id]["token"]
    new_token = json.loads(router.layout.record(sb.id).read_text())["token"]
    assert new_token != old_token
    assert _executor(router, sb.id, old_token, "/v1/exec", {"command": "true"}) == 401
    assert _executor(router, sb.id, old_token, "/v1/claim", {"token": "x", "env": {}, "workdir": "/"}) == 401
    assert _executor(router, sb.id, new_token, "/v1/exec", {"command": "true"}) == 200

    # Nothing of the filling: the same files and processes as a sandbox made fresh for the same request.
    # (pids_max off by one: a create matching the pool's spec exactly would claim the other member)
    fresh = grove.create(env={"CLAIM": "mine"}, workdir="/job", heartbeat=False, **{**SMALL, "pids_max": 129})
    assert fresh.id not in members
    assert sb.exec(SNAPSHOT).stdout == fresh.exec(SNAPSHOT).stdout
    # The pool's egress policy (deny): no interface but loopback, as in a fresh sandbox.
    assert sb.exec("cat /proc/net/dev | tail -n +3 | cut -d: -f1").stdout.split() == [b"lo"]

    # The trajectory starts at the claim, with the claim's metadata.
    meta = grove.request("GET", f"/v1/sandboxes/{sb.id}/trajectory")["sandbox"]
    assert meta["task_id"] == "pool-task" and meta["env_keys"] == ["CLAIM"] and meta["workdir"] == "/job"

    # A claim asking for another policy is refused by name rather than handed the pool's.
    with pytest.raises(Conflict, match="network"):
        grove.create(pool="clean", network={"egress": "allow", "allow": ["10.0.0.0/8"]}, heartbeat=False)
    with pytest.raises(NotFound, match="no pool 'nope'"):
        grove.create(pool="nope", heartbeat=False)
    sb.close()
    fresh.close()


def test_pool_refills_after_claims_and_matches_by_spec(router: RouterProcess, grove: Grove) -> None:
    grove.create_pool("refill", size=2, resources={**SMALL, "memory_mb": 300})
    _ready(grove, "refill", 2)
    first = set(_members(router, "refill"))
    # A create naming no pool but asking exactly for its spec claims too.
    a = grove.create(heartbeat=False, **{**SMALL, "memory_mb": 300})
    b = grove.create(pool="refill", heartbeat=False)
    assert {a.id, b.id} == first
    shown = _ready(grove, "refill", 2)
    refilled = set(_members(router, "refill"))
    assert shown["claims"] == 2 and not refilled & first
    # A retried claim (same request_id, same body) is the same sandbox, not a second claim.
    body = {"pool": "refill", "request_id": "claim-once", "env": {"K": "v"}}
    once = router.http("POST", "/v1/sandboxes", json_body=body)
    again = router.http("POST", "/v1/sandboxes", json_body=body)
    assert once.status == again.status == 201, once.body
    assert once.json()["id"] == again.json()["id"] and once.json()["id"] in refilled
    assert grove.pool("refill")["claims"] == 3
    for sandbox_id in (a.id, b.id, once.json()["id"]):
        grove.attach(sandbox_id).close()


def test_claim_answers_at_once_and_a_failed_hand_over_fails_its_first_call(router: RouterProcess,
                                                                           grove: Grove) -> None:
    """A claim is answered before its executor took the claim's token (the first call waits for that); when
    the hand-over fails, the sandbox is failed with the reason, which its first call answers."""
    grove.create_pool("broken", size=1, resources={**SMALL, "memory_mb": 340})
    _ready(grove, "broken", 1)
    (member,) = _members(router, "broken")
    # PID 1 runs on, so the member stays in the pool, but nothing answers its executor's socket any more.
    (router.layout.sandboxes / member / "executor.sock").unlink()
    sb = grove.create(pool="broken", heartbeat=False)
    assert sb.id == member and sb.info["status"] == "ready"
    with pytest.raises(Conflict, match=f"sandbox {member} failed: claiming pool member: .*executor did not answer"):
        sb.exec("true")
    assert grove.attach(sb.id).info["status"] == "failed"
    trajectory = grove.request("GET", f"/v1/sandboxes/{sb.id}/trajectory")
    assert trajectory["outcome"]["result"] == "infra_error"
    assert "claiming pool member" in trajectory["outcome"]["reason"]
    sb.close()
    grove.delete_pool("broken")


def test_resize_and_delete(router: RouterProcess, grove: Grove) -> None:
    grove.create_pool("sized", size=1, resources={**SMALL, "memory_mb": 320})
    _ready(grove, "sized", 1)
    assert grove.resize_pool("sized", 3)["size"] == 3
    _ready(grove, "sized", 3)
    grove.resize_pool("sized", 1)
    _ready(grove, "sized", 1)
    # The shrunk members' record files go behind the answer (their removal is logged, not waited for).
    wait_for(lambda: len(_members(router, "sized")) == 1, 10, what="the surplus members' records removed")
    kept = grove.create(pool="sized", heartbeat=False)
    assert [p["name"] for p in grove.pools()].count("sized") == 1
    done = router.cli("pool", "rm", "sized")
    assert done.returncode == 0, done.stderr.decode()
    with pytest.raises(NotFound, match="no pool 'sized'"):
        grove.pool("sized")
    wait_for(lambda: not _members(router, "sized"), 30, what="the unclaimed members gone")
    assert not (router.layout.root / "pools" / "sized.json").exists()
    # The claimed sandbox is its user's: the pool's deletion leaves it alone.
    assert kept.exec("echo still").stdout == b"still\n"
    kept.close()


def test_a_pool_deleted_while_a_member_starts_leaves_nothing(router: RouterProcess, grove: Grove) -> None:
    # Each delete lands at another point of the filler's first start: before its record exists, while its
    # journal is made, while its executor starts, once it is ready. None may leave a member running.
    def stray() -> list[str]:
        live = router.live_ids()
        # A deleted member's files go in the teardown's passes after its delete: one with processes runs.
        return sorted(p.name for p in router.layout.sandboxes.iterdir()
                      if p.name not in live and cgroup_procs(router.state_dir, p.name))

    for n, delay in enumerate((0, 0, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0)):
        name = f"brief-{n}"
        grove.create_pool(name, size=1, resources=SMALL)
        time.sleep(delay)
        grove.delete_pool(name)
        assert not stray(), f"pool {name} deleted {delay} s after it was made left a member running"
        wait_for(lambda pool=name: not _members(router, pool), 10, what=f"pool {name}'s member records removed")
    time.sleep(1.5)  # a start the delete had missed would have finished by now
    assert not stray(), "a member started after its pool was deleted"
    wait_for(lambda: not [p for p in router.layout.sandboxes.iterdir() if p.name not in router.live_ids()], 30,
             what="the deleted members' files removed")


def test_cli_pool_commands(router: RouterProcess, grove: Grove) -> None:
    done = router.cli("pool", "create", "cli-pool", "--size", "1", "--cpu", "0.5", "--memory-mb", "340")
    assert done.returncode == 0, done.stderr.decode()
    _ready(grove, "cli-pool", 1)
    listing = router.cli("pool", "ls").stdout.decode()
    assert re.search(r"^cli-pool\s+default\s+1\s+1\s+0\s+0", listing, re.M), listing
    assert json.loads(router.cli("pool", "get", "cli-pool", "--json").stdout)["ready"] == 1
    assert router.cli("pool", "resize", "cli-pool", "0").returncode == 0
    _ready(grove, "cli-pool", 0)
    claimed = router.cli("create", "--pool", "cli-pool")  # empty: a fresh sandbox with the pool's spec
    assert claimed.returncode == 0, claimed.stderr.decode()
    info = grove.attach(claimed.stdout.decode().strip()).info
    assert info["resources"]["memory_mb"] == 340 and grove.pool("cli-pool")["misses"] == 1
    bad = router.cli("pool", "create", "Bad_Name")
    assert bad.returncode != 0 and b"lower-case" in bad.stderr
    assert router.cli("pool", "rm", "cli-pool").returncode == 0
    grove.attach(info["id"]).close()


def test_pool_whose_image_is_removed(router: RouterProcess, grove: Grove, tmp_path: Path) -> None:
    done = router.cli("image", "import", "pooled-bb", str(make_busybox_rootfs(tmp_path / "rootfs")))
    assert done.returncode == 0, done.stderr.decode()
    grove.create_pool("bb", "pooled-bb", size=1, resources=SMALL)
    _ready(grove, "bb", 1)
    assert router.cli("image", "rm", "pooled-bb").returncode == 0
    shown = wait_for(lambda: (p := grove.pool("bb"))["error"] and p["ready"] == 0 and p, 30,
                     what="the pool to notice its image is gone")
    assert "pooled-bb" in shown["error"]
    wait_for(lambda: not _members(router, "bb"), 30, what="the stale member deleted")
    with pytest.raises(NotFound, match="pooled-bb"):
        grove.create(pool="bb", heartbeat=False)
    grove.delete_pool("bb")


def test_restart_readopts_a_pool(fresh_router: RouterProcess) -> None:
    router = fresh_router
    with router.client() as grove:
        grove.create_pool("kept", size=2, resources=SMALL)
        _ready(grove, "kept", 2)
        before = set(_members(router, "kept"))
        router.stop()
        router.start()
        shown = _ready(grove, "kept", 2)
        assert shown["size"] == 2 and set(_members(router, "kept")) == before, "members were not re-adopted"
        sb = grove.create(pool="kept", env={"X": "after"}, heartbeat=False)
        assert sb.id in before and sb.exec("echo $X").stdout == b"after\n"
        sb.close()


def test_a_restart_before_a_batch_claims_journal_header_writes_it_from_its_record(fresh_router: RouterProcess) -> None:
    # A batch's claims are answered once their records are in the log; their journals' headers follow.
    # A router killed in between leaves the claimed member's journal as it was made ahead (empty): the
    # restarted router must write the header from the record, or the trajectory would be stored as an
    # unclaimed member's (not at all).
    router = fresh_router
    with router.client() as grove:
        grove.create_pool("header", size=1, resources=SMALL)
        _ready(grove, "header", 1)
        [sb] = grove.create_many(1, pool="header", metadata={"task_id": "t-1", "labels": {"run": "r"}},
                                 heartbeat=False)
        assert sb.exec("true").exit_code == 0  # handed over
        journal = router.layout.journals / f"{sb.id}.msgpack"
        router.stop(signal.SIGKILL)
        journal.write_bytes(b"")  # the window: the claim durable, its journal's header not written yet
        router.start()
        assert sb.exec("echo after").stdout == b"after\n"
        record = router.http("GET", f"/v1/sandboxes/{sb.id}/trajectory").json()
        assert record["sandbox"]["id"] == sb.id and record["sandbox"]["task_id"] == "t-1"
        assert record["sandbox"]["labels"] == {"run": "r"}
        assert [s["command"] for s in record["steps"] if s.get("type") == "exec"] == ["echo after"]
        sb.close()
        stored = wait_for(lambda: (r := router.http("GET", f"/v1/trajectories/{sb.id}")).status == 200 and r, 30,
                          what="the claimed sandbox's trajectory stored")
        assert stored.json()["sandbox"]["task_id"] == "t-1"
        grove.delete_pool("header")
