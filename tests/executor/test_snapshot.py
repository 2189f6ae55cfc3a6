"""Executor snapshots on the real S3 server: SIGTERM, idle timer, restore at start.

Each executor start gets a fresh root directory, like a new container, so what comes back came back
through S3. Uploads go through the router's own broker code (multipart, parts of 5 MiB here), served
on loopback; the restore reads a presigned GET URL.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest

from artifacts.store import ObjectStore
from router.backends.knative.manifest import snapshot_key
from tests.support.executor_fixtures import TOKEN, start_executor
from tests.support.snapshot_broker import INSTANCE, BrokerServer, broker_for

SANDBOX = "sb-00000000000000ee"
KEY = snapshot_key(INSTANCE, SANDBOX)
PART = 5 * 1024 * 1024  # S3's smallest part (SeaweedFS refuses less, as AWS does)


@pytest.fixture
def broker(object_store: ObjectStore) -> Iterator[BrokerServer]:
    with BrokerServer(broker_for(object_store, PART)) as server:
        yield server


def snapshot_env(store: ObjectStore, broker: BrokerServer, **extra: str) -> dict[str, str]:
    return {"GROVE_EXECUTOR_SNAPSHOT_UPLOAD_URL": broker.upload_url(SANDBOX),
            "GROVE_EXECUTOR_SNAPSHOT_UPLOAD_TOKEN": broker.uploads.token(SANDBOX, 64),
            "GROVE_EXECUTOR_SNAPSHOT_GET_URL": store.presign_get(KEY, 600),
            "GROVE_EXECUTOR_SNAPSHOT_DIR": "/work/space", **extra}


def snapshot_logs(log: str) -> list[dict[str, int]]:
    """Each snapshot's log line: its parts, the most bytes it held, the process's peak RSS."""
    return [{"parts": int(m[1]), "held": int(m[2]), "rss_kib": int(m[3])} for m in re.finditer(
        r"in (\d+) parts of \d+ in [\d.]+s, at most (\d+) bytes held, peak RSS (\d+) KiB", log)]


def test_sigterm_snapshots_and_the_next_start_restores(object_store: ObjectStore, broker: BrokerServer) -> None:
    env = snapshot_env(object_store, broker)
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
        small = snapshot_logs(first.log())
    assert object_store.exists(KEY) and len(small) == 1 and small[0]["parts"] == 1

    with start_executor(env=env) as second:
        assert second.root != first.root
        space = second.host_path("/work/space")
        with open(os.path.join(space, "a/b/f.txt")) as fh:
            assert fh.read() == "kept\n"
        assert os.stat(os.path.join(space, "tool")).st_mode & 0o777 == 0o755
        assert os.readlink(os.path.join(space, "link")) == "a/b/f.txt"
        client = second.client()
        assert client.run(command="./tool", cwd="/work/space")["stdout"] == b"run\n"
        # 40 MiB that do not compress: 8 parts, and the executor's memory grows by about one part, not eight.
        big = client.run(command="head -c 40M /dev/urandom > big && sha256sum big", cwd="/work/space")["stdout"]
        client.close()
        second.proc.send_signal(signal.SIGTERM)
        second.proc.wait(timeout=30)
        found = snapshot_logs(second.log())
        assert len(found) == 1, second.log()[-3000:]
        large = found[0]
    assert large["parts"] == 9 and large["held"] <= PART + 2 * 1024 * 1024
    assert (large["rss_kib"] - small[0]["rss_kib"]) * 1024 < 2 * PART + 2 * 1024 * 1024, (small, large)
    assert object_store.incomplete_uploads("snapshots/") == []

    with start_executor(env=env) as third:
        client = third.client()
        assert client.run(command="sha256sum big", cwd="/work/space")["stdout"] == big
        client.close()


def test_idle_timer_snapshots_once_per_burst_of_activity(object_store: ObjectStore, broker: BrokerServer) -> None:
    env = snapshot_env(object_store, broker, GROVE_EXECUTOR_IDLE_SNAPSHOT_S="0.3")
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


def test_an_exec_in_flight_holds_the_idle_snapshot_back(object_store: ObjectStore, broker: BrokerServer) -> None:
    # /v1/exec is answered in front of Flask (executor.exec_route): the idle clock must count it all the same.
    env = snapshot_env(object_store, broker, GROVE_EXECUTOR_IDLE_SNAPSHOT_S="0.3")
    with start_executor(env=env) as ex:
        client = ex.client()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            running = pool.submit(client.run, command="sleep 1.5; echo done > n", cwd="/work/space")
            snapshot_during = False
            while not running.done():
                snapshot_during = snapshot_during or object_store.exists(KEY)
                time.sleep(0.05)
            assert running.result()["exit_code"] == 0
        assert not snapshot_during  # the 0.3 s idle timer did not fire while the exec ran
        deadline = time.monotonic() + 10
        while not object_store.exists(KEY) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert object_store.exists(KEY), ex.log()  # and the exec counted as activity: one once it ended
        client.close()


def test_a_restore_that_fails_serves_only_its_reason(object_store: ObjectStore, broker: BrokerServer) -> None:
    """A workspace that cannot be restored must not come up empty (and later overwrite the snapshot), nor stop
    the start (on Knative: a crash loop): the executor answers its health check, every other call with a 409
    naming the failure, and takes no snapshot, on exit either."""
    object_store.put_bytes(KEY, b"not a tar.zst")
    with start_executor(env=snapshot_env(object_store, broker)) as ex:
        client = ex.client()
        assert client.request("GET", "/healthz").status == 200
        for method, path in (("POST", "/v1/exec"), ("GET", "/v1/files?path=/work/space")):
            reply = client.request(method, path, b'{"command": "true"}' if method == "POST" else None,
                                   {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
            assert reply.status == 409, reply.body
            message = reply.json()["error"]["message"]
            assert "could not be restored" in message and "not a valid tar + zstd archive" in message
        client.close()
    assert object_store.get_bytes(KEY) == b"not a tar.zst"  # the exit took no snapshot over it


def test_a_snapshot_on_request_uploads_now_and_is_refused_without_snapshots(
    object_store: ObjectStore, broker: BrokerServer, client: Any
) -> None:
    """``POST /v1/snapshot`` (a checkpoint on Knative) uploads the workspace at once; an executor without
    snapshots (the local backend's) answers 409 saying why."""
    with start_executor(env=snapshot_env(object_store, broker)) as ex:
        api = ex.client()
        assert api.run(command="echo now > taken.txt", cwd="/work/space")["exit_code"] == 0
        reply = api.request("POST", "/v1/snapshot", b"{}", {"Content-Type": "application/json"})
        assert reply.status == 200, reply.body
        assert reply.json()["reason"] == "checkpoint" and reply.json()["size"] > 0
        assert object_store.exists(KEY)
        api.close()
    reply = client.request("POST", "/v1/snapshot", b"{}", {"Content-Type": "application/json"})
    assert reply.status == 409 and "keeps no snapshots" in reply.json()["error"]["message"]
