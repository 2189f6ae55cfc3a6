"""A snapshot's GET URL outlives neither a long-lived sandbox nor a long-lived pool member, against the stand-in
cluster and the real S3 server.

The URL in the sandbox's Secret is presigned when the sandbox (or pool member) is made. Here it is replaced by
one that has expired — signed by grove's own store, with the router's bucket and credentials, as the fill
made the real one — and the sandbox scales to zero: the woken pod must still get its files back (it asks the
router for a fresh URL, with its upload token). When nothing can restore them, the pod must not crash-loop nor
come up empty (and overwrite the good snapshot with nothing): it serves, and every call says what happened.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator

import pytest

from artifacts.s3server import EmbeddedS3
from artifacts.store import ObjectStore
from grove.client.sync import Grove, Sandbox
from grove.core.errors import Conflict, Forbidden
from router.backends.knative.manifest import secret_name, snapshot_key
from tests.knative.test_router import bucket_store
from tests.support.knative_fixtures import INSTANCE, NAMESPACE, Cluster
from tests.support.router_fixtures import RouterProcess

IMAGE = "python:3.11-slim"


@pytest.fixture
def store(knative_router: RouterProcess, s3_server: EmbeddedS3) -> Iterator[ObjectStore]:
    """The router's bucket, with the router's own credentials."""
    found = bucket_store(knative_router, s3_server)
    try:
        yield found
    finally:
        found.close()


def _set_secret(cluster: Cluster, sandbox_id: str, **values: str) -> None:
    """Change keys of the sandbox's Secret in the API, as time (or an operator) would."""
    secret = cluster.api.objects[("secrets", NAMESPACE)][secret_name(sandbox_id)]
    data = {**secret["data"], **{k: base64.b64encode(v.encode()).decode() for k, v in values.items()}}
    cluster.api.put("secrets", NAMESPACE, {**secret, "data": data})


def _expired_url(store: ObjectStore, sandbox_id: str) -> str:
    url = store.presign_get(snapshot_key(INSTANCE, sandbox_id), 1)
    time.sleep(2.5)
    with pytest.raises(Forbidden):  # S3 itself refuses it: the URL has expired
        from artifacts.presigned import download_via_presigned

        download_via_presigned(url).close()
    return url


def _scaled_to_zero(grove: Grove, cluster: Cluster, content: bytes) -> Sandbox:
    """A sandbox with ``kept.txt`` in its workspace, scaled to zero (its snapshot taken)."""
    sb = grove.create(IMAGE, heartbeat=False)
    sb.write_file("kept.txt", content)
    cluster.knative.scale_to_zero(sb.id)
    return sb


def test_a_wake_restores_through_a_fresh_url_when_the_secrets_one_expired(
        knative_router: RouterProcess, cluster: Cluster, store: ObjectStore) -> None:
    with knative_router.client() as grove:
        sb = _scaled_to_zero(grove, cluster, b"still here\n")
        assert store.exists(snapshot_key(INSTANCE, sb.id))
        _set_secret(cluster, sb.id, **{"snapshot-get-url": _expired_url(store, sb.id)})

        assert sb.read_file("kept.txt") == b"still here\n"
        assert cluster.knative.services[sb.id].starts == 2
        sb.close()


def test_a_restore_that_cannot_succeed_is_a_clear_state_not_a_crash_loop(
        knative_router: RouterProcess, cluster: Cluster, store: ObjectStore) -> None:
    with knative_router.client() as grove:
        sb = _scaled_to_zero(grove, cluster, b"the good snapshot\n")
        good = store.stat(snapshot_key(INSTANCE, sb.id)).etag
        # Neither the URL (expired) nor the router (a token that is not the sandbox's) can give the files back.
        _set_secret(cluster, sb.id, **{"snapshot-get-url": _expired_url(store, sb.id),
                                       "snapshot-upload-token": "1.not-the-token"})

        with pytest.raises(Conflict, match="could not be restored") as refused:
            sb.read_file("kept.txt")
        assert "delete" in refused.value.message
        with pytest.raises(Conflict, match="could not be restored"):
            sb.exec("echo hi")
        assert cluster.knative.services[sb.id].starts == 2  # it started once and stays up: no crash loop

        # Going away, it does not replace the good snapshot with its empty workspace.
        cluster.knative.scale_to_zero(sb.id)
        assert store.stat(snapshot_key(INSTANCE, sb.id)).etag == good
        sb.close()
