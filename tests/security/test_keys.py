"""API keys on a running router: several at once, added and revoked without a restart, never logged."""

from __future__ import annotations

import re
import time

from router.auth import fingerprint
from tests.support.router_fixtures import RouterProcess, error_of, wait_for


def _status(router: RouterProcess, key: str) -> int:
    return router.http("GET", "/v1/sandboxes", key=key).status


def test_keys_added_and_revoked_on_a_running_router(fresh_router: RouterProcess) -> None:
    router = fresh_router
    added = router.cli("key", "add", "alice", "(laptop)")
    assert added.returncode == 0, added.stderr
    alice = added.stdout.decode().strip()
    bob = router.cli("key", "add", "bob").stdout.decode().strip()
    assert alice.startswith("grove_") and alice != bob
    # Picked up within the reload interval, the environment's key still valid beside them.
    wait_for(lambda: _status(router, alice) == 200 and _status(router, bob) == 200, 5, what="new keys accepted")
    assert _status(router, router.key) == 200

    listed = router.cli("key", "ls").stdout.decode()
    assert re.search(rf"^{fingerprint(alice)}\s+default\s+member\s+alice \(laptop\)$", listed, re.M), listed
    assert fingerprint(bob) in listed
    assert alice not in listed and bob not in listed  # fingerprints only
    assert (router.layout.api_keys).stat().st_mode & 0o077 == 0

    revoked = router.cli("key", "revoke", fingerprint(alice)[:8])
    assert revoked.returncode == 0 and fingerprint(alice) in revoked.stdout.decode(), revoked.stderr
    started = time.monotonic()
    wait_for(lambda: _status(router, alice) == 401, 5, interval=0.05, what="revoked key refused")
    assert time.monotonic() - started < 2.5  # at most one reload interval (plus the test's own latency)
    reply = router.http("GET", "/v1/sandboxes", key=alice)
    assert error_of(reply) == {"code": "unauthorized", "message": "the API key is not valid"}
    assert _status(router, bob) == 200 and _status(router, router.key) == 200

    # Errors of the CLI name the problem; nothing is removed by an unknown or ambiguous fingerprint.
    missing = router.cli("key", "revoke", "ffffffffffff")
    assert missing.returncode != 0 and b"no key" in missing.stderr
    assert router.cli("key", "revoke", "").returncode != 0
    assert _status(router, bob) == 200

    # None of the keys, good or bad, is in the router's log (no access log, errors without the header).
    router.http("GET", "/v1/sandboxes", key="grove_not-a-key-but-secret")
    log = router.log()
    for secret in (alice, bob, router.key, "grove_not-a-key-but-secret"):
        assert secret not in log


def test_file_keys_survive_a_restart_and_follow_the_file(fresh_router: RouterProcess) -> None:
    """Revocation sticks across a restart, and a removed key file revokes every file key."""
    router = fresh_router
    carol = router.cli("key", "add", "carol").stdout.decode().strip()
    wait_for(lambda: _status(router, carol) == 200, 5, what="carol accepted")
    router.stop()
    router.start()
    assert _status(router, carol) == 200
    (router.layout.api_keys).unlink()
    wait_for(lambda: _status(router, carol) == 401, 5, what="carol refused after the file went")
    assert _status(router, router.key) == 200  # GROVE_API_KEY is not in the file: it stays
