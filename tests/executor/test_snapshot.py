"""Executor snapshots through presigned URLs on the real S3 server: SIGTERM, idle timer, restore at start.

Each executor start gets a fresh root directory, like a new container, so what comes back came back
through S3.
"""

from __future__ import annotations

import os
import signal
import time

from artifacts.store import ObjectStore
from tests.support.executor_fixtures import start_executor

KEY = "snapshots/sb-00000000000000ee/workspace.tar.zst"


def snapshot_env(store: ObjectStore, **extra: str) -> dict[str, str]:
    return {"GROVE_EXECUTOR_SNAPSHOT_PUT_URL": store.presign_put(KEY, 600),
            "GROVE_EXECUTOR_SNAPSHOT_GET_URL": store.presign_get(KEY, 600),
            "GROVE_EXECUTOR_SNAPSHOT_DIR": "/work/space", **extra}


def test_sigterm_snapshots_and_the_next_start_restores(object_store: ObjectStore) -> None:
    env = snapshot_env(object_store)
    with start_executor(env=env) as first:
        assert os.path.isdir(first.host_path("/work/space"))  # made at start, though nothing was restored
        client = first.client()
        result = client.run(command="mkdir -p a/b && echo kept > a/b/f.txt && printf '#!/bin/sh\\necho run\\n' > tool"
                                    " && chmod 755 tool && ln -s a/b/f.txt link", cwd="/work/space")
        assert result["exit_code"] == 0, result
        client.close()
        assert not object_store.exists(KEY)  # no idle timer here: nothing until the pod goes away
        first.proc.send_signal(signal.SIGTERM)
        first.proc.wait(timeout=20)
    assert object_store.exists(KEY)

    with start_executor(env=env) as second:
        assert second.root != first.root
        space = second.host_path("/work/space")
        with open(os.path.join(space, "a/b/f.txt")) as fh:
            assert fh.read() == "kept\n"
        assert os.stat(os.path.join(space, "tool")).st_mode & 0o777 == 0o755
        assert os.readlink(os.path.join(space, "link")) == "a/b/f.txt"
        client = second.client()
        assert client.run(command="./tool", cwd="/work/space")["stdout"] == b"run\n"
        client.close()


def test_idle_timer_snapshots_once_per_burst_of_activity(object_store: ObjectStore) -> None:
    env = snapshot_env(object_store, GROVE_EXECUTOR_IDLE_SNAPSHOT_S="0.3")
    with start_executor(env=env) as ex:
        client = ex.client()
        assert client.run(command="echo one > n", cwd="/work/space")["exit_code"] == 0
        deadline = time.monotonic() + 10
        while not object_store.exists(KEY) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert object_store.exists(KEY), ex.log()
        first = object_store.list("snapshots/")[0].etag
        time.sleep(0.8)  # idle, nothing ran: no new upload
        assert object_store.list("snapshots/")[0].etag == first
        assert client.run(command="echo two > n", cwd="/work/space")["exit_code"] == 0
        deadline = time.monotonic() + 10
        while object_store.list("snapshots/")[0].etag == first and time.monotonic() < deadline:
            time.sleep(0.05)
        assert object_store.list("snapshots/")[0].etag != first
        client.close()


def test_a_restore_that_fails_stops_the_start(object_store: ObjectStore) -> None:
    """A workspace that cannot be restored must not come up empty (and later overwrite the snapshot)."""
    object_store.put_bytes(KEY, b"not a tar.zst")
    try:
        with start_executor(env=snapshot_env(object_store)):
            raise AssertionError("the executor started with a workspace it could not restore")
    except RuntimeError as exc:
        assert "not a valid tar + zstd archive" in str(exc)
