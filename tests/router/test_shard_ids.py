"""Sandbox ids that name their shard, and a router's shard settings: what is accepted, and the errors for what
is not."""

from __future__ import annotations

import pytest

from grove.core.errors import Invalid, Unauthorized
from grove.core.sandbox_ids import LONGEST_ID, new_id, shard_of
from router.backends.knative.manifest import policy_name, secret_name
from router.projects.model import Caller
from router.records.registry import SAFE_ID_RE
from router.shards import signing
from router.shards.config import ShardConfig, parse_peers

SECRET = b"s" * 32


def test_ids_name_their_shard_and_the_default_shard_keeps_the_old_shape() -> None:
    old, sharded = new_id(), new_id("east1")
    assert len(old) == len("sb-0123456789abcdef") and shard_of(old) == "default"
    assert sharded.startswith("sb-east1-") and shard_of(sharded) == "east1"
    assert shard_of("sb-east1-xyz") is None and shard_of("../etc") is None
    for sandbox_id in (old, sharded, LONGEST_ID):
        assert SAFE_ID_RE.fullmatch(sandbox_id)
    # Within DNS-1123's 63 for every Kubernetes name made of an id (the revision's private Service is longest).
    for name in (LONGEST_ID, f"{LONGEST_ID}-00001-private", secret_name(LONGEST_ID), policy_name(LONGEST_ID)):
        assert len(name) <= 63, name


@pytest.mark.parametrize(("text", "says"), [
    ("b", "must look like NAME=URL"),
    ("B=http://x:1", "1-12 lower-case letters and digits"),
    ("b=http://x:1,b=http://y:1", "twice"),
])
def test_bad_peers_are_refused_with_what_to_write(text: str, says: str) -> None:
    with pytest.raises(Invalid, match=says):
        parse_peers(text)


def test_peers_need_a_shared_secret_and_urls() -> None:
    with pytest.raises(Invalid, match="GROVE_PEER_SECRET"):
        ShardConfig("a", {"a": "http://a:1", "b": "http://b:1"})
    with pytest.raises(Invalid, match="base URL"):
        ShardConfig("a", {"b": "b:8470"}, SECRET)
    with pytest.raises(Invalid, match="shard name"):
        ShardConfig("Shard-A")
    assert ShardConfig("a", {"a": "http://a:1", "b": "http://b:1/"}, SECRET).others == {"b": "http://b:1"}


def test_a_peer_signature_holds_only_for_what_it_signed() -> None:
    caller = Caller("team-1", admin=False, key_id="abc")
    headers = signing.sign(SECRET, "a", "POST", "/v1/sandboxes/sb-b-0123456789abcdef/exec", caller)
    assert signing.verify(SECRET, headers, "POST", "/v1/sandboxes/sb-b-0123456789abcdef/exec") == caller
    with pytest.raises(Unauthorized, match="not signed"):  # another path
        signing.verify(SECRET, headers, "DELETE", "/v1/sandboxes/sb-b-0123456789abcdef")
    with pytest.raises(Unauthorized, match="not signed"):  # a caller changed on the way
        signing.verify(SECRET, {**headers, signing.CALLER: "project=default;admin=1;key=abc"}, "POST",
                       "/v1/sandboxes/sb-b-0123456789abcdef/exec")
    with pytest.raises(Unauthorized, match="no peers"):
        signing.verify(None, headers, "POST", "/v1/sandboxes/sb-b-0123456789abcdef/exec")
