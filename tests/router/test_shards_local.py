"""Two local routers on one machine (their own state dirs), shards ``a`` and ``b``: a call for the other's
sandbox through either reaches its owner, and a call with a wrong peer signature is refused."""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Iterator

from artifacts.s3server import EmbeddedS3
from grove.core.sandbox_ids import shard_of
from router.projects.model import Caller
from router.shards import signing
from tests.conftest import free_tcp_port
from tests.support.killed_client import kill_a_client_mid_command
from tests.support.router_fixtures import RouterProcess, router_state, wait_for


@contextlib.contextmanager
def two_shards(s3_server: EmbeddedS3) -> Iterator[tuple[RouterProcess, RouterProcess]]:
    """Routers of shards ``a`` and ``b``, peers of each other, one API key for both."""
    secret = secrets.token_hex(32)
    with router_state(start=False, s3=s3_server) as a, router_state(start=False, s3=s3_server) as b:
        a.port, b.port, b.key = free_tcp_port(), free_tcp_port(), a.key
        peers = f"a={a.url},b={b.url}"
        for name, router in (("a", a), ("b", b)):
            router.up_args += ("--shard", name, "--peers", peers)
            router.extra_env["GROVE_PEER_SECRET"] = secret
            router.start()
        yield a, b


def test_two_local_routers_reach_each_others_sandboxes(s3_server: EmbeddedS3) -> None:
    with two_shards(s3_server) as (a, b), a.client() as grove_a, b.client() as grove_b:
        theirs = grove_b.create(heartbeat=False)
        assert shard_of(theirs.id) == "b"
        via_a = grove_a.attach(theirs.id)
        via_a.write_file("note.txt", b"written through a\n")
        assert via_a.exec("cat note.txt").stdout == b"written through a\n"
        assert theirs.read_file("note.txt") == b"written through a\n"
        assert [s["id"] for s in grove_a.list()] == []

        path = f"/v1/sandboxes/{theirs.id}"
        wrong = signing.sign(b"0" * 32, "a", "GET", path, Caller("default", admin=True, key_id="x"))
        refused = b.http("GET", path, auth=False, headers=wrong)
        assert refused.status == 401 and "GROVE_PEER_SECRET" in refused.json()["error"]["message"]

        grove_a.request("DELETE", path)
        assert grove_b.list() == []


def test_a_client_killed_mid_command_through_a_peer_is_gone_there_too(s3_server: EmbeddedS3) -> None:
    """The peer that forwarded the call lets go of the owner's connection when its caller dies, so the owner
    reaps the sandbox by its heartbeat timeout (it kept it to the command's end, here 600 s)."""
    with two_shards(s3_server) as (a, b), b.client() as grove_b:
        theirs = grove_b.create(heartbeat=False, heartbeat_timeout_s=5)
        killed = kill_a_client_mid_command(a.url, a.key, theirs)
        info = wait_for(lambda: (s := b.http("GET", f"/v1/sandboxes/{theirs.id}").json())["status"] == "deleted"
                        and s, 20, 0.2, "the sandbox reaped by its heartbeat timeout")
        assert "heartbeat" in str(info["end_reason"]), info
        assert time.monotonic() - killed < 15
        assert "Traceback" not in a.log() + b.log()
