"""``/v1/exec`` served in front of Flask (executor.exec_route) answers as the Flask routes do: the same bearer
check, error shape, headers and limits; streamed and whole answers. (Idle snapshots count it: test_snapshot.py.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgpack
import pytest
from werkzeug.test import Client, EnvironBuilder, TestResponse, run_wsgi_app

from executor.app import app_shell, create_app
from executor.settings import ExecutorSettings
from tests.support.executor_fixtures import MSGPACK, TOKEN, RunningExecutor

TRUE = json.dumps({"command": ["true"]}).encode()


def _app(tmp_path: Path, **settings: Any) -> Client:
    return Client(create_app(ExecutorSettings(token="tok", root=str(tmp_path), **settings)))


def _error(reply: TestResponse) -> tuple[int, str, dict[str, Any]]:
    body = msgpack.unpackb(reply.data) if reply.mimetype == MSGPACK else reply.get_json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}, body
    return reply.status_code, reply.mimetype, body


@pytest.mark.parametrize("accept", ["application/json", MSGPACK])
@pytest.mark.parametrize("authorization", [None, "Bearer wrong", "Basic tok", "Bearer"])
def test_a_bad_token_is_the_same_401_as_on_the_flask_routes(tmp_path: Path, accept: str,
                                                            authorization: str | None) -> None:
    client = _app(tmp_path)
    headers = {"Accept": accept, **({"Authorization": authorization} if authorization else {})}
    by_exec = client.post("/v1/exec", data=TRUE, headers=headers)
    by_flask = client.get("/v1/files/list?path=/", headers=headers)
    assert _error(by_exec) == _error(by_flask)
    assert by_exec.status_code == 401
    assert by_exec.headers["Content-Length"] == str(len(by_exec.data))


def test_an_unbound_shell_answers_exec_as_its_other_routes(tmp_path: Path) -> None:
    client = Client(app_shell(str(tmp_path)))
    headers = {"Authorization": "Bearer x"}
    by_exec = client.post("/v1/exec", data=TRUE, headers=headers)
    by_flask = client.get("/v1/files/list?path=/", headers=headers)
    assert _error(by_exec) == _error(by_flask)
    assert by_exec.status_code == 503 and by_exec.headers["Retry-After"] == by_flask.headers["Retry-After"] == "1"


def test_the_token_comes_before_the_method(tmp_path: Path) -> None:
    client = _app(tmp_path)
    assert client.get("/v1/exec").status_code == 401
    status, _, body = _error(client.get("/v1/exec", headers={"Authorization": "Bearer tok"}))
    assert status == 405 and body["error"]["code"] == "method_not_allowed" and "GET" in body["error"]["message"]
    # Only the exact path is the thin route's: anything beside it is Flask's, as before.
    assert client.post("/v1/exec/", data=TRUE, headers={"Authorization": "Bearer tok"}).status_code == 404


def test_an_oversized_body_is_413_by_its_length_or_by_what_arrives(tmp_path: Path) -> None:
    client = _app(tmp_path, max_request_bytes=64)
    auth = {"Authorization": "Bearer tok", "Content-Type": "application/json"}
    big = json.dumps({"command": ["echo", "x" * 100]}).encode()
    status, _, body = _error(client.post("/v1/exec", data=big, headers=auth))
    assert status == 413 and body["error"]["code"] == "too_large" and f"{len(big)} bytes exceeds 64" in \
        body["error"]["message"]
    # Sent chunked (no Content-Length, the input ends where the body does): the cap holds on what is read.
    environ = EnvironBuilder("/v1/exec", method="POST", data=big, headers=auth).get_environ()
    del environ["CONTENT_LENGTH"]
    environ["wsgi.input_terminated"] = True
    answer, status_line, _ = run_wsgi_app(client.application, environ)
    body = json.loads(b"".join(answer))
    assert status_line.startswith("413 ") and "exceeds 64 bytes" in body["error"]["message"]
    assert client.post("/v1/exec", data=TRUE, headers=auth).status_code == 200


def test_bad_bodies_are_400_naming_what_is_wrong(tmp_path: Path) -> None:
    client = _app(tmp_path)
    auth = {"Authorization": "Bearer tok"}
    for data, content_type, needle in ((b'{"command": ', "application/json", "JSON"),
                                       (b"\xc1", MSGPACK, "msgpack"),
                                       (b'{"command": "true", "nope": 1}', "application/json", "'nope'")):
        status, _, body = _error(client.post("/v1/exec", data=data, headers={**auth, "Content-Type": content_type}))
        assert status == 400 and needle in body["error"]["message"], body


def test_whole_and_streamed_answers(tmp_path: Path) -> None:
    client = _app(tmp_path)
    auth = {"Authorization": "Bearer tok", "Content-Type": "application/json"}
    body = json.dumps({"command": ["echo", "hi"]}).encode()
    whole = client.post("/v1/exec", data=body, headers=auth)
    assert whole.status_code == 200 and whole.mimetype == "application/json"
    assert whole.headers["Content-Length"] == str(len(whole.data))
    assert whole.get_json()["stdout"] == "hi\n" and whole.get_json()["exit_code"] == 0
    packed = client.post("/v1/exec", data=body, headers={**auth, "Accept": MSGPACK})
    assert packed.mimetype == MSGPACK and msgpack.unpackb(packed.data)["stdout"] == b"hi\n"
    streamed = client.post("/v1/exec?stream=1", data=body, headers=auth)
    assert streamed.mimetype == "application/x-ndjson" and streamed.headers["X-Accel-Buffering"] == "no"
    frames = [json.loads(line) for line in streamed.data.splitlines()]
    assert frames[0]["type"] == "stdout" and frames[-1]["type"] == "result"
    assert frames[-1]["result"]["stdout"] == "hi\n"


def test_a_retried_request_id_gets_the_first_answer(tmp_path: Path) -> None:
    client = _app(tmp_path)
    auth = {"Authorization": "Bearer tok", "Content-Type": "application/json"}
    body = json.dumps({"command": "echo $$", "request_id": "once"}).encode()
    first = client.post("/v1/exec", data=body, headers=auth).get_json()
    again = client.post("/v1/exec", data=body, headers=auth).get_json()
    assert first["stdout"] and again["stdout"] == first["stdout"]  # the same process's pid: run once


def test_a_real_server_keeps_the_connection_across_exec_errors(any_executor: RunningExecutor) -> None:
    conn = any_executor.connect(30)
    try:
        for headers, status in (({"Authorization": "Bearer wrong"}, 401),
                                ({"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}, 200)):
            conn.request("POST", "/v1/exec", body=TRUE, headers=headers)
            reply = conn.getresponse()
            assert reply.status == status and json.loads(reply.read())
            assert not reply.will_close
        # A declared length over the cap is refused before any of the body is read; the server then closes.
        conn.putrequest("POST", "/v1/exec")
        conn.putheader("Authorization", f"Bearer {TOKEN}")
        conn.putheader("Content-Length", str(1 << 40))
        conn.endheaders()
        reply = conn.getresponse()
        assert reply.status == 413 and json.loads(reply.read())["error"]["code"] == "too_large"
    finally:
        conn.close()
