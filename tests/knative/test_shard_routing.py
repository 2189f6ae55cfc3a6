"""Two routers, shards ``a`` and ``b``, on one stand-in cluster and one S3 bucket, each told of the other
(``--shard``, ``--peers``, ``GROVE_PEER_SECRET``): ids name their shard, each router lists its own, a call for
the other's sandbox through either router reaches its owner (exec, a streamed exec, files, delete), the owner
enforces the caller's project, a call not signed with the shared secret is refused, one router down is a 503
naming its shard while the other's own sandboxes go on, and the SDK given both URLs spreads creates and calls
each owner directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Iterator

from artifacts.s3server import EmbeddedS3
from grove import AsyncGrove, Grove
from grove.core.errors import NotFound, Unavailable
from grove.core.sandbox_ids import shard_of
from router.projects.model import Caller
from router.shards import signing
from tests.conftest import free_tcp_port
from tests.support.knative_fixtures import Cluster, knative_router_on
from tests.support.router_fixtures import RouterProcess, wait_for
from tests.support.s3_fixtures import new_bucket

IMAGE = "python:3.11-slim"


@contextlib.contextmanager
def _two_shards(cluster: Cluster, s3: EmbeddedS3, secret: str) -> Iterator[tuple[RouterProcess, RouterProcess]]:
    """Routers ``a`` and ``b`` on one bucket, each knowing the other, with one admin key between them (so that
    the SDK, going to each owner directly, is let in by both)."""
    ports = {"a": free_tcp_port(), "b": free_tcp_port()}
    peers = ",".join(f"{name}=http://127.0.0.1:{port}" for name, port in ports.items())
    key, bucket, env = "gk-" + secrets.token_hex(16), new_bucket(), {"GROVE_PEER_SECRET": secret}
    with knative_router_on(cluster, s3, "--shard", "a", "--instance", "shard-a", "--peers", peers,
                           bucket=bucket, port=ports["a"], key=key, env=env) as a, \
            knative_router_on(cluster, s3, "--shard", "b", "--instance", "shard-b", "--peers", peers,
                              bucket=bucket, port=ports["b"], key=key, env=env) as b:
        yield a, b


async def _streamed(url: str, key: str, sandbox_id: str) -> list[tuple[str, object]]:
    async with AsyncGrove(url, key) as grove:
        sandbox = await grove.attach(sandbox_id)
        return [frame async for frame in sandbox.exec_stream("echo one; echo two >&2")]


def test_a_call_for_the_other_shards_sandbox_reaches_it_through_either_router(
        cluster: Cluster, s3_server: EmbeddedS3) -> None:
    secret = secrets.token_hex(32)
    with _two_shards(cluster, s3_server, secret) as (a, b), a.client() as grove_a, b.client() as grove_b:
        mine, theirs = grove_a.create(IMAGE, heartbeat=False), grove_b.create(IMAGE, heartbeat=False)
        assert shard_of(mine.id) == "a" and mine.id.startswith("sb-a-")
        assert shard_of(theirs.id) == "b" and theirs.id.startswith("sb-b-")
        assert a.http("GET", "/healthz").json()["shard"] == "a"

        # Each lists its own; ?shards=all asks the peers too.
        assert [s["id"] for s in grove_a.list()] == [mine.id]
        assert [s["id"] for s in grove_b.list()] == [theirs.id]
        both = grove_a.request("GET", "/v1/sandboxes", params={"shards": "all"})
        assert {s["id"] for s in both["sandboxes"]} == {mine.id, theirs.id}
        assert both["unavailable_shards"] == []

        # b's sandbox through a, and a's through b: exec, files (a streamed upload and download), a streamed exec.
        via_a = grove_a.attach(theirs.id)
        assert via_a.exec("echo from-b; hostname").stdout.startswith(b"from-b\n")
        via_a.write_file("through-a.bin", b"x" * 3_000_000)
        assert theirs.read_file("through-a.bin") == b"x" * 3_000_000  # b's own router sees a's write
        grove_b.attach(mine.id).write_file("through-b.txt", b"b wrote this\n")
        assert mine.read_file("through-b.txt") == b"b wrote this\n"
        frames = asyncio.run(_streamed(a.url, a.key, theirs.id))
        assert ("stdout", b"one\n") in frames and ("stderr", b"two\n") in frames and frames[-1][0] == "result"

        # A WebSocket is not passed on: 421 naming the owner's URL, where the client opens it itself.
        upgrade = {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
                   "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}
        misdirected = a.http("GET", f"/v1/sandboxes/{theirs.id}/pty", headers=upgrade)
        assert misdirected.status == 421 and b.url in misdirected.json()["error"]["message"]

        # The owner enforces the caller's project: a member of another project, let in by a, gets b's 404.
        member = a.member_key("other")
        reply = a.http("POST", f"/v1/sandboxes/{theirs.id}/exec", json_body={"command": "true"}, key=member)
        assert reply.status == 404, reply.body[:300]

        # A call claiming to come from a peer is refused unless signed with the shared secret, and fresh.
        path = f"/v1/sandboxes/{theirs.id}"
        admin = Caller("default", admin=True, key_id="forged")
        forged = b.http("GET", path, auth=False, headers=signing.sign(b"not-the-secret" * 2, "a", "GET", path, admin))
        assert forged.status == 401 and "GROVE_PEER_SECRET" in forged.json()["error"]["message"]
        stale = signing.sign(secret.encode(), "a", "GET", path, admin, now=1.0)
        assert b.http("GET", path, auth=False, headers=stale).status == 401
        fresh = signing.sign(secret.encode(), "a", "GET", path, admin)
        assert b.http("GET", path, auth=False, headers=fresh).json()["id"] == theirs.id

        # A live sandbox's trajectory is its owner's journal: read through the other router, it is passed on.
        live = b.http("GET", f"/v1/trajectories/{mine.id}")
        assert live.status == 200 and live.json()["sandbox"]["id"] == mine.id, live.body[:300]
        assert b"through-b.txt" in live.body

        # A delete through the other router deletes it at its owner; its trajectory, stored by its owner in the
        # shared bucket, is read through either router (trajectory queries read S3, not routers).
        grove_b.request("DELETE", f"/v1/sandboxes/{mine.id}")
        assert grove_a.list() == []
        wait_for(lambda: b.http("GET", f"/v1/trajectories/{mine.id}").status == 200, 60, what="its trajectory")
        reply = b.http("GET", f"/v1/trajectories/{mine.id}")
        assert reply.json()["sandbox"]["id"] == mine.id
        assert b"through-b.txt" in reply.body  # the write b passed on was recorded by its owner, a
        theirs.close()


def test_one_shard_down_is_a_503_naming_it_and_the_other_goes_on(cluster: Cluster, s3_server: EmbeddedS3) -> None:
    with _two_shards(cluster, s3_server, secrets.token_hex(32)) as (a, b), \
            Grove(f"{a.url},{b.url}", a.key) as grove:
        # The SDK given both URLs: creates go to each in turn.
        made = [grove.create(IMAGE, heartbeat=False) for _ in range(2)]
        assert {shard_of(s.id) for s in made} == {"a", "b"}
        on_a, on_b = sorted(made, key=lambda s: str(shard_of(s.id)))
        assert sorted(s["id"] for s in grove.list()) == sorted(s.id for s in made)  # every shard's

        a.stop()
        # The SDK sends b's sandbox's calls to b itself: with a (its first URL) down they still work.
        assert on_b.exec("echo direct").stdout == b"direct\n"
        with b.client() as grove_b:
            reply = b.http("POST", f"/v1/sandboxes/{on_a.id}/exec", json_body={"command": "true"})
            error = reply.json()["error"]
            assert reply.status == 503 and "shard a" in error["message"] and reply.headers["Retry-After"]
            assert grove_b.attach(on_b.id).exec("echo still").stdout == b"still\n"
            listed = grove_b.request("GET", "/v1/sandboxes", params={"shards": "all"})
            assert [s["id"] for s in listed["sandboxes"]] == [on_b.id] and listed["unavailable_shards"] == ["a"]
            assert "a" in listed["shard_errors"], listed  # why: its router refused the connection
            try:
                grove_b.attach(on_a.id)
                raise AssertionError("a sandbox of a shard that is down was reached")
            except Unavailable as exc:
                assert "shard a" in exc.message
            try:
                grove_b.attach("sb-zz-0123456789abcdef")
                raise AssertionError("an id of an unknown shard was reached")
            except NotFound as exc:
                assert "does not know" in exc.message

        # The SDK's creates go to the shard that is up (a refused the connection: nothing of them reached it).
        made += [grove.create(IMAGE, heartbeat=False) for _ in range(2)]
        assert [shard_of(s.id) for s in made[2:]] == ["b", "b"]

        a.start()  # back from its own state dir: its sandbox is there again, through b too
        assert b.http("GET", f"/v1/sandboxes/{on_a.id}").json()["id"] == on_a.id
        assert on_a.exec("echo back").stdout == b"back\n"
        for sandbox in made:
            sandbox.close()
