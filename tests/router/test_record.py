"""The record through a real router on both backends: trajectories, events, artifacts, full outputs, export.

Everything is checked where a training pipeline would find it: in the router's S3 bucket.
"""

from __future__ import annotations

import hashlib
import json
import os
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from artifacts.s3config import S3Config
from artifacts.store import ObjectStore
from grove.client import Grove
from grove.core.errors import NotFound
from tests.support.router_fixtures import RouterProcess, error_of, wait_for


@pytest.fixture(scope="module")
def router(any_router: RouterProcess) -> RouterProcess:
    """This module runs against both backends (local and the Knative stand-in)."""
    return any_router


def s3_of(router: RouterProcess) -> tuple[S3Config, str]:
    """The router's S3 settings and secret: its embedded server's, or the ``--s3`` ones it was given."""
    if "--s3" in router.up_args:
        args = router.up_args
        secret = router.extra_env["GROVE_S3_SECRET_KEY"]
        config = S3Config(endpoint=args[args.index("--s3") + 1], access_key=router.extra_env["GROVE_S3_ACCESS_KEY"],
                          secret_key=secret, bucket=args[args.index("--s3-bucket") + 1])
        return config, secret
    state = json.loads((router.layout.s3 / "grove-s3.json").read_text())
    config = S3Config(endpoint=f"http://127.0.0.1:{state['ports']['s3.port']}", access_key=state["access_key"],
                      secret_key=state["secret_key"])
    return config, state["secret_key"]


@pytest.fixture(scope="module")
def bucket(router: RouterProcess) -> Iterator[ObjectStore]:
    """The router's own bucket, read with its credentials (as a data pipeline would)."""
    store = ObjectStore(s3_of(router)[0])
    yield store
    store.close()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_every_step_is_recorded_and_stored(router: RouterProcess, grove: Grove, bucket: ObjectStore,
                                            tmp_path: Path) -> None:
    meta = {"task_id": "rec/task 1", "model": "m-rec", "harness": "h-rec", "harness_version": "9"}
    sandbox = grove.create(heartbeat=False, metadata=meta)
    events = f"/v1/sandboxes/{sandbox.id}/events"
    grove.request("POST", events, json_body={"kind": "message", "data": {"role": "user", "content": "fix it"}})
    out = sandbox.exec("echo hello; echo oops >&2; exit 3")
    sandbox.write_file("notes.txt", b"abc" * 100)
    assert sandbox.read_file("notes.txt") == b"abc" * 100
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text("x = 1\n")
    sandbox.upload(tmp_path / "pkg", "pkg")
    grove.request("POST", events, json_body={"events": [{"kind": "reward", "data": {"value": 0.5}},
                                                        {"kind": "result", "data": {"result": "pass", "reward": 1}}]})

    live = grove.request("GET", f"/v1/sandboxes/{sandbox.id}/trajectory")
    kinds = [s["type"] if s["type"] != "event" else f"event:{s['kind']}" for s in live["steps"]]
    assert kinds == ["event:message", "exec", "file_write", "file_read", "archive_write", "event:reward",
                     "event:result"], kinds
    step = live["steps"][1]
    assert step["command"] == "echo hello; echo oops >&2; exit 3" and step["exit_code"] == out.exit_code == 3
    assert step["stdout"] == b"hello\n" and step["stdout_sha256"] == sha(b"hello\n")
    assert step["stderr_sha256"] == sha(b"oops\n") and step["timed_out"] is False
    assert live["steps"][2]["size"] == 300 and live["steps"][2]["sha256"] == sha(b"abc" * 100)
    assert live["steps"][3]["sha256"] == sha(b"abc" * 100)
    assert live["sandbox"]["image_digest"] == sandbox.info["image_digest"]
    assert live["sandbox"]["task_id"] == "rec/task 1" and live["sandbox"]["harness_version"] == "9"
    assert live["outcome"] == {"result": "pass", "reward": 1, "reason": None}

    sandbox.close()
    stored = grove.request("GET", f"/v1/trajectories/{sandbox.id}")
    assert stored["steps"] == live["steps"] and stored["outcome"] == live["outcome"]
    assert stored["sandbox"]["ended_at"] and stored["sandbox"]["end_reason"] == "deleted by request"
    for field, value in (("task_id", "rec/task 1"), ("model", "m-rec"), ("harness", "h-rec")):
        found = grove.request("GET", "/v1/trajectories", params={field: value})["trajectories"]
        assert [t["sandbox_id"] for t in found] == [sandbox.id], (field, found)
    key = found[0]["key"]
    assert key.startswith("trajectories/") and key.endswith(f"/{sandbox.id}.msgpack")
    assert bucket.exists(key), f"{key} is not in the router's bucket"


def test_a_reaped_sandbox_is_stored_too(grove: Grove) -> None:
    sandbox = grove.create(heartbeat=False, ttl_s=2, metadata={"task_id": "reaped"})
    sandbox.exec("echo before the end")
    stored = wait_for(lambda: _stored(grove, sandbox.id), timeout=20, what="the reaped sandbox's trajectory")
    assert "ttl" in stored["sandbox"]["end_reason"] and stored["steps"][0]["stdout"] == b"before the end\n"


def _stored(grove: Grove, sandbox_id: str) -> dict[str, Any] | None:
    try:
        record: dict[str, Any] = grove.request("GET", f"/v1/trajectories/{sandbox_id}")
    except NotFound:
        return None
    return record if record["sandbox"].get("ended_at") else None


def test_artifacts_through_presigned_urls_without_secrets_inside(router: RouterProcess, grove: Grove) -> None:
    sandbox = grove.create(heartbeat=False)
    payload = os.urandom(300_000)
    sandbox.write_file("out/model.bin", payload)
    sandbox.write_file("out/log.txt", "done\n")
    answer = grove.request("POST", f"/v1/sandboxes/{sandbox.id}/artifacts",
                           json_body={"paths": ["out/model.bin", "out/log.txt"]})["artifacts"]
    assert [a["key"] for a in answer] == [f"artifacts/{sandbox.id}/workspace/out/model.bin",
                                          f"artifacts/{sandbox.id}/workspace/out/log.txt"]
    assert answer[0]["size"] == len(payload) and answer[0]["sha256"] == sha(payload)
    with urllib.request.urlopen(answer[0]["url"], timeout=30) as resp:  # the presigned GET URL, no credentials
        assert resp.read() == payload
    # Listed and fetched again through the router, which holds the credentials (on Knative: the cluster's
    # S3), verified against the recorded sha256; and a fresh presigned URL on request.
    listed = grove.artifacts.list(sandbox_id=sandbox.id)
    assert [(a.path, a.size, a.sha256) for a in listed] == [
        ("/workspace/out/log.txt", 5, sha(b"done\n")), ("/workspace/out/model.bin", len(payload), sha(payload))]
    assert grove.artifacts.get(sandbox.id, "/workspace/out/model.bin") == payload
    with urllib.request.urlopen(grove.artifacts.url(sandbox.id, "/workspace/out/model.bin"), timeout=30) as resp:
        assert resp.read() == payload
    # A missing path is a clear 404 naming it.
    reply = router.http("POST", f"/v1/sandboxes/{sandbox.id}/artifacts", json_body={"paths": ["nope.bin"]})
    assert reply.status == 404 and "nope.bin" in error_of(reply)["message"]
    reply = router.http("POST", f"/v1/sandboxes/{sandbox.id}/artifacts", json_body={"paths": "x"})
    assert reply.status == 400
    steps = grove.request("GET", f"/v1/sandboxes/{sandbox.id}/trajectory")["steps"]
    assert steps[-1]["type"] == "artifacts" and [i["key"] for i in steps[-1]["items"]] == [a["key"] for a in answer]
    # The sandbox got presigned URLs only: the S3 secret is not in its environment, nor — on the local
    # backend, where the sandbox has its own processes and root (the stand-in's pods share the host's) —
    # in any process's environment or any file it could have been written to.
    secret = s3_of(router)[1]
    found = sandbox.exec(["env"])
    assert found.exit_code == 0 and b"PATH=" in found.stdout and secret.encode() not in found.stdout
    if router.backend == "local":
        found = sandbox.exec(["sh", "-c", "cat /proc/[0-9]*/environ 2>/dev/null; grep -rl -e " + secret +
                              " /etc /root /workspace /tmp /var /run /dev/shm 2>/dev/null; true"])
        assert b"PATH=" in found.stdout and secret.encode() not in found.stdout
    sandbox.close()


def test_a_truncated_output_is_kept_whole_in_s3(grove: Grove, bucket: ObjectStore) -> None:
    sandbox = grove.create(heartbeat=False)
    result = sandbox.exec("head -c 3000000 /dev/zero | tr '\\0' 'y'", max_output_bytes=4096)
    assert result.stdout_truncated and result.stdout_bytes == 3_000_000
    step = grove.request("GET", f"/v1/sandboxes/{sandbox.id}/trajectory")["steps"][-1]
    key = step["stdout_artifact"]
    assert key.startswith(f"artifacts/{sandbox.id}/")
    wait_for(lambda: bucket.exists(key), timeout=20, what="the full output in S3")
    full = bucket.get_bytes(key)
    assert len(full) == 3_000_000 and sha(full) == result.stdout_sha256
    sandbox.close()


def test_bad_events_are_refused_and_nothing_is_appended(router: RouterProcess, grove: Grove) -> None:
    sandbox = grove.create(heartbeat=False)
    path = f"/v1/sandboxes/{sandbox.id}/events"
    for body, status, needle in (
        ({"events": [{"kind": "result", "data": {"result": "great"}}]}, 422, "result"),
        ({"events": [{"kind": "message", "data": {}, "extra": 1}]}, 400, "extra"),
        ({"events": [{"data": {}}]}, 400, "kind"),
        ({"kind": "x" * 100, "data": None}, 422, "kind"),
        ({"events": [{"kind": "reward", "data": 1}, {"kind": "result", "data": {"result": "pass", "reward": "a"}}]},
         422, "reward"),
    ):
        reply = router.http("POST", path, json_body=body)
        assert reply.status == status and needle in error_of(reply)["message"], (body, reply.body)
    assert grove.request("GET", f"/v1/sandboxes/{sandbox.id}/trajectory")["steps"] == []
    sandbox.close()


def test_export_to_chat_messages(router: RouterProcess, grove: Grove, tmp_path: Path) -> None:
    sandbox = grove.create(heartbeat=False, metadata={"task_id": "export-me", "model": "m", "harness": "h"})
    grove.request("POST", f"/v1/sandboxes/{sandbox.id}/events",
                  json_body={"kind": "message", "data": {"role": "user", "content": "list files"}})
    sandbox.exec("ls /")
    grove.request("POST", f"/v1/sandboxes/{sandbox.id}/events",
                  json_body={"kind": "result", "data": {"result": "fail", "reward": 0}})
    sandbox.close()
    out = tmp_path / "sft.jsonl"
    done = router.cli("trajectories", "export", "--task", "export-me", "-o", str(out))
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 1
    roles = [m["role"] for m in lines[0]["messages"]]
    assert roles == ["user", "assistant", "tool"], roles
    assert lines[0]["messages"][1]["tool_calls"][0]["function"]["name"] == "bash"
    assert lines[0]["metadata"]["resolved"] is False and lines[0]["metadata"]["task_id"] == "export-me"
    assert lines[0]["tools"][0]["function"]["name"] == "bash"
