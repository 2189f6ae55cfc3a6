"""Two local routers on one machine (their own state dirs), shards ``a`` and ``b``: a call for the other's
sandbox through either reaches its owner, and a call with a wrong peer signature is refused."""

from __future__ import annotations

import secrets

from artifacts.s3server import EmbeddedS3
from grove.core.sandbox_ids import shard_of
from router.projects.model import Caller
from router.shards import signing
from tests.conftest import free_tcp_port
from tests.support.router_fixtures import router_state


def test_two_local_routers_reach_each_others_sandboxes(s3_server: EmbeddedS3) -> None:
    secret = secrets.token_hex(32)
    with router_state(start=False, s3=s3_server) as a, router_state(start=False, s3=s3_server) as b:
        a.port, b.port, b.key = free_tcp_port(), free_tcp_port(), a.key
        peers = f"a={a.url},b={b.url}"
        for name, router in (("a", a), ("b", b)):
            router.up_args += ("--shard", name, "--peers", peers)
            router.extra_env["GROVE_PEER_SECRET"] = secret
            router.start()
        with a.client() as grove_a, b.client() as grove_b:
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
