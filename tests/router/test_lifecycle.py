"""Lifecycle through a real router: create, list with label filters, get, heartbeat, delete, idempotency."""

from __future__ import annotations

import concurrent.futures
import time

import pytest

from grove.client import Grove
from grove.core.errors import Conflict, NotFound
from tests.support.router_fixtures import RouterProcess, error_of, wait_for


@pytest.fixture(scope="module")
def router(any_router: RouterProcess) -> RouterProcess:
    """This module runs against both backends (local and the Knative stand-in)."""
    return any_router


def test_create_get_list_delete(router: RouterProcess, grove: Grove) -> None:
    before = time.time()
    sb = grove.create(metadata={"task_id": "t-1", "model": "m", "harness": "h", "labels": {"split": "a"}})
    info = sb.info
    assert info["id"].startswith("sb-") and info["status"] == "ready"
    assert info["image"] == "default" and info["image_digest"].startswith("sha256:")
    assert before - 1 < info["created_at"] <= info["ready_at"] <= time.time() + 1
    assert info["metadata"]["task_id"] == "t-1" and info["metadata"]["labels"] == {"split": "a"}
    assert "token" not in info

    got = router.http("GET", f"/v1/sandboxes/{sb.id}")
    assert got.status == 200 and got.json()["id"] == sb.id and got.json()["status"] == "ready"
    assert [s["id"] for s in grove.list()] == [sb.id]

    gone = router.http("DELETE", f"/v1/sandboxes/{sb.id}")
    assert gone.status == 200 and gone.json()["status"] == "deleted"
    assert gone.json()["end_reason"] == "deleted by request"
    after = router.http("GET", f"/v1/sandboxes/{sb.id}")
    assert after.status == 200 and after.json()["status"] == "deleted" and after.json()["ended_at"]
    assert grove.list() == []
    # Data calls on a deleted sandbox are a conflict, not a 404: the id was real.
    for method, path in (("POST", "/exec"), ("GET", "/files?path=/etc/hostname"), ("GET", "/files/list"),
                         ("GET", "/archive?path=/tmp"), ("POST", "/heartbeat")):
        reply = router.http(method, f"/v1/sandboxes/{sb.id}{path}", json_body={"command": "true"}
                            if method == "POST" and path == "/exec" else {} if method == "POST" else None)
        assert reply.status == 409, (method, path, reply.body)
        assert "was deleted" in error_of(reply)["message"]
    with pytest.raises(Conflict):
        sb.exec("true")
    again = router.http("DELETE", f"/v1/sandboxes/{sb.id}")
    assert again.status == 409 and error_of(again)["code"] == "conflict"
    sb.close()  # the SDK's close is idempotent


def test_list_label_filters(router: RouterProcess, grove: Grove) -> None:
    a = grove.create(metadata={"task_id": "task-a", "model": "m1", "labels": {"split": "train", "run": "7"}})
    b = grove.create(metadata={"task_id": "task-b", "model": "m1", "labels": {"split": "test", "run": "7"}})

    def ids(labels: dict[str, str]) -> list[str]:
        return sorted(s["id"] for s in grove.list(labels))

    assert ids({}) == sorted([a.id, b.id])
    assert ids({"split": "train"}) == [a.id]
    assert ids({"run": "7"}) == sorted([a.id, b.id])
    assert ids({"run": "7", "split": "test"}) == [b.id]
    assert ids({"task_id": "task-a"}) == [a.id]  # metadata fields filter like labels
    assert ids({"model": "m1"}) == sorted([a.id, b.id])
    assert ids({"split": "nope"}) == []
    assert ids({"nolabel": "x"}) == []
    reply = router.http("GET", "/v1/sandboxes?label=novalue")
    assert reply.status == 400 and "key=value" in error_of(reply)["message"]
    reply = router.http("GET", "/v1/sandboxes?status=ready")
    assert sorted(s["id"] for s in reply.json()["sandboxes"]) == sorted([a.id, b.id])
    a.close()
    assert ids({"run": "7"}) == [b.id]


def test_create_without_wait_is_pending_then_ready(router: RouterProcess, grove: Grove) -> None:
    reply = router.http("POST", "/v1/sandboxes", json_body={"wait": False})
    assert reply.status == 201, reply.body
    info = reply.json()
    assert info["status"] == "pending" and info["ready_at"] is None

    def settled() -> str | None:
        status: str = router.http("GET", f"/v1/sandboxes/{info['id']}").json()["status"]
        return None if status == "pending" else status

    assert wait_for(settled, 30, 0.02, "the sandbox to leave pending") == "ready"
    assert grove.attach(info["id"]).exec("echo up").stdout == b"up\n"


def test_exec_on_a_pending_sandbox_waits_for_it(router: RouterProcess, grove: Grove) -> None:
    reply = router.http("POST", "/v1/sandboxes", json_body={"wait": False})
    sandbox_id = reply.json()["id"]
    ran = router.http("POST", f"/v1/sandboxes/{sandbox_id}/exec", json_body={"command": "echo early"})
    assert ran.status == 200 and ran.json()["stdout"] == "early\n"


def test_delete_while_pending(router: RouterProcess, grove: Grove) -> None:
    sandbox_id = router.http("POST", "/v1/sandboxes", json_body={"wait": False}).json()["id"]
    gone = router.http("DELETE", f"/v1/sandboxes/{sandbox_id}")
    assert gone.status == 200 and gone.json()["status"] == "deleted"
    assert grove.list() == []


def test_idempotent_create_by_request_id(router: RouterProcess, grove: Grove) -> None:
    body = {"request_id": "req-lifecycle-1", "metadata": {"task_id": "idem"}}
    first = router.http("POST", "/v1/sandboxes", json_body=body)
    second = router.http("POST", "/v1/sandboxes", json_body=body)
    assert first.status == second.status == 201
    assert first.json()["id"] == second.json()["id"]
    via_sdk = grove.create(request_id="req-lifecycle-1", metadata={"task_id": "idem"})  # the same body, spelled out
    assert via_sdk.id == first.json()["id"]
    assert len(grove.list()) == 1
    # The same id for another body is a client bug (another task would get this one's sandbox): a 409.
    other = router.http("POST", "/v1/sandboxes", json_body={**body, "metadata": {"task_id": "other"}})
    assert other.status == 409 and "another body" in other.json()["error"]["message"]
    assert len(grove.list()) == 1
    # Once deleted, the request id is free again: a new create makes a new sandbox.
    via_sdk.close()
    third = router.http("POST", "/v1/sandboxes", json_body=body)
    assert third.status == 201 and third.json()["id"] != first.json()["id"]


def test_concurrent_creates_with_one_request_id_make_one_sandbox(router: RouterProcess, grove: Grove) -> None:
    body = {"request_id": "req-race", "wait": True}
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(lambda _: router.http("POST", "/v1/sandboxes", json_body=body), range(4)))
    assert {r.status for r in replies} == {201}
    assert len({r.json()["id"] for r in replies}) == 1
    assert len(grove.list()) == 1


def test_unknown_and_malformed_ids(router: RouterProcess, grove: Grove) -> None:
    for method in ("GET", "DELETE"):
        reply = router.http(method, "/v1/sandboxes/sb-0123456789abcdef")
        assert reply.status == 404 and error_of(reply) == {
            "code": "not_found", "message": "no sandbox sb-0123456789abcdef"}
    reply = router.http("POST", "/v1/sandboxes/sb-0123456789abcdef/exec", json_body={"command": "true"})
    assert reply.status == 404 and error_of(reply)["code"] == "not_found"
    for bad in ("nope", "sb-XYZ", "sb-0123456789abcdeff"):
        reply = router.http("GET", f"/v1/sandboxes/{bad}")
        assert reply.status == 404
        message = error_of(reply)["message"]
        assert "is not a sandbox id" in message and "sb-0123456789abcdef" in message
    with pytest.raises(NotFound, match="not a sandbox id"):
        grove.attach("garbage")


def test_heartbeat(router: RouterProcess, grove: Grove) -> None:
    sb = grove.create(heartbeat=False)
    t0 = sb.status()["last_activity"]
    time.sleep(0.05)
    reply = router.http("POST", f"/v1/sandboxes/{sb.id}/heartbeat", json_body={})
    assert reply.status == 200 and reply.json()["status"] == "ready" and reply.json()["last_activity"] > t0
    empty = router.http("POST", f"/v1/sandboxes/{sb.id}/heartbeat")  # no body at all is fine too
    assert empty.status == 200
    bad = router.http("POST", f"/v1/sandboxes/{sb.id}/heartbeat", json_body={"x": 1})
    assert bad.status == 400 and "'x'" in error_of(bad)["message"]


def test_heartbeats_alone_keep_a_sandbox_and_its_processes_warm(router: RouterProcess, grove: Grove) -> None:
    """The promise on both backends: no API call and no heartbeat this long, scale to zero; heartbeats
    alone keep it up (on Knative the autoscaler sees only requests, so each heartbeat makes one)."""
    sb = grove.create(heartbeat=False, idle_timeout_s=2)
    # A process and a file outside the workspace: neither would outlive the pod (only the workspace is
    # snapshotted), so finding both later proves the same pod served throughout.
    started = sb.exec("echo here > ../warm-marker && sleep 600 </dev/null >/dev/null 2>&1 & echo $!")
    pid = started.stdout.decode().strip()
    until = time.monotonic() + 4  # twice the idle timeout (and the stand-in autoscaler's window, scaled)
    while time.monotonic() < until:
        sb.heartbeat()
        time.sleep(0.1)  # the stand-in's autoscaler window is 6 s scaled by 0.05: 0.3 s without traffic
    assert sb.status()["status"] == "ready"
    assert sb.exec(f"kill {pid} && cat ../warm-marker").stdout == b"here\n"  # the same pod, its process alive
    wait_for(lambda: sb.status()["status"] == "idle", timeout=8)  # silence: scaled to zero after all
    sb.close()


@pytest.mark.local_only  # the stand-in runs pods on the host, without a root of their own
def test_two_sandboxes_are_independent(router: RouterProcess, grove: Grove) -> None:
    a, b = grove.create(), grove.create()
    assert a.id != b.id
    a.exec("echo a > /workspace/who")
    b.exec("echo b > /workspace/who")
    a.close()
    assert b.exec("cat /workspace/who").stdout == b"b\n"
    assert b.status()["status"] == "ready"


def test_healthz(router: RouterProcess) -> None:
    reply = router.http("GET", "/healthz", auth=False)
    assert reply.status == 200 and reply.json()["ok"] is True and reply.json()["backend"] == router.backend
