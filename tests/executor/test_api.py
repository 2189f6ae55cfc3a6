"""The executor's HTTP surface: auth, the one error shape, and request validation."""

from __future__ import annotations

import json
import os
from typing import Any

import msgpack
import pytest

from tests.support.executor_fixtures import MSGPACK, TOKEN, Client, Reply, RunningExecutor


def _assert_error(reply: Reply, status: int, code: str, *needles: str) -> None:
    assert reply.status == status, (reply.status, reply.body)
    body = reply.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}, body
    assert body["error"]["code"] == code
    for needle in needles:
        assert needle in body["error"]["message"], body["error"]["message"]


def test_healthz_needs_no_token(any_executor: RunningExecutor) -> None:
    client = any_executor.client(token=None)
    reply = client.request("GET", "/healthz")
    assert reply.status == 200 and reply.json() == {"ok": True}
    client.close()


@pytest.mark.parametrize(
    "header",
    [None, "", "Bearer", "Bearer ", "Bearer wrong", f"Basic {TOKEN}", f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}"],
)
def test_bad_or_missing_token_is_401(any_executor: RunningExecutor, header: str | None) -> None:
    client = any_executor.client(token=None)
    headers = {} if header is None else {"Authorization": header}
    calls: tuple[tuple[str, str, bytes | None], ...] = (
        ("POST", "/v1/exec", json.dumps({"command": "echo pwned"}).encode()),
        ("GET", "/v1/files?path=/work", None),
        ("PUT", "/v1/files?path=/work/pwned", b"x"),
        ("GET", "/v1/archive?path=/work", None),
    )
    for method, path, body in calls:
        reply = client.request(method, path, body, headers)
        _assert_error(reply, 401, "unauthorized")
    client.close()
    assert not os.path.exists(any_executor.host_path("/work/pwned"))


def test_token_scheme_is_case_insensitive(client: Client) -> None:
    reply = client.request("GET", "/v1/files/list?path=/work", headers={"Authorization": f"bearer {TOKEN}"})
    assert reply.status == 200


def test_errors_follow_accept(client: Client) -> None:
    reply = client.request("GET", "/v1/files?path=/work/nope", headers={"Accept": MSGPACK})
    assert reply.headers["Content-Type"].startswith(MSGPACK)
    assert msgpack.unpackb(reply.body)["error"]["code"] == "not_found"


def test_unknown_endpoint_is_404(client: Client) -> None:
    _assert_error(client.request("GET", "/v1/nothing-here"), 404, "not_found", "/v1/nothing-here")


def test_wrong_method_is_405(client: Client) -> None:
    _assert_error(client.request("GET", "/v1/exec"), 405, "method_not_allowed", "GET", "/v1/exec")
    _assert_error(client.request("POST", "/v1/files?path=/work/x", b""), 405, "method_not_allowed")


def _raw_exec(client: Client, body: bytes, content_type: str = "application/json") -> Reply:
    return client.request("POST", "/v1/exec", body, {"Content-Type": content_type})


def test_invalid_json_is_400(client: Client) -> None:
    _assert_error(_raw_exec(client, b'{"command": "true"'), 400, "bad_request", "JSON")
    _assert_error(_raw_exec(client, b"\xff\xfe"), 400, "bad_request", "JSON")


def test_invalid_msgpack_is_400(client: Client) -> None:
    _assert_error(_raw_exec(client, b"\xc1\xc1\xc1", MSGPACK), 400, "bad_request", "msgpack")


def test_empty_body_names_the_missing_command(client: Client) -> None:
    _assert_error(_raw_exec(client, b""), 400, "bad_request", "command")


BAD_FIELDS: list[tuple[dict[str, Any], int, str]] = [
    ({"command": "true", "shell": True}, 400, "'shell'"),
    ({"command": 5}, 400, "command"),
    ({"command": []}, 400, "command"),
    ({"command": ["echo", 1]}, 400, "strings"),
    ({"command": ""}, 422, "empty"),
    ({"command": ["echo", "a\x00b"]}, 400, "NUL"),
    ({"command": "echo a\x00b"}, 400, "NUL"),
    ({"command": "true", "cwd": 3}, 400, "cwd"),
    ({"command": "true", "env": ["A=1"]}, 400, "env"),
    ({"command": "true", "env": {"A": 1}}, 400, "env"),
    ({"command": "true", "env": {"A=B": "1"}}, 422, "env"),
    ({"command": "true", "env": {"A": "x\x00y"}}, 400, "NUL"),
    ({"command": "true", "stdin": 12}, 400, "stdin"),
    ({"command": "true", "timeout_s": -1}, 422, "timeout_s"),
    ({"command": "true", "timeout_s": 0}, 422, "timeout_s"),
    ({"command": "true", "timeout_s": 1e12}, 422, "timeout_s"),
    ({"command": "true", "timeout_s": "10"}, 400, "timeout_s"),
    ({"command": "true", "timeout_s": True}, 400, "timeout_s"),
    ({"command": "true", "max_output_bytes": 10}, 422, "max_output_bytes"),
    ({"command": "true", "max_output_bytes": 1 << 40}, 422, "max_output_bytes"),
    ({"command": "true", "max_output_bytes": 1.5}, 400, "max_output_bytes"),
    ({"command": "true", "request_id": ""}, 400, "request_id"),
    ({"command": "true", "request_id": 7}, 400, "request_id"),
]


@pytest.mark.parametrize(("fields", "status", "needle"), BAD_FIELDS)
def test_bad_exec_fields_are_rejected(client: Client, fields: dict[str, Any], status: int, needle: str) -> None:
    code = "bad_request" if status == 400 else "invalid"
    _assert_error(client.exec(**fields), status, code, needle)


def test_non_finite_timeout_is_rejected(client: Client) -> None:
    # A 422 naming the field, as everywhere (issue 29): JSON has no NaN or Infinity, msgpack does.
    _assert_error(_raw_exec(client, b'{"command": "true", "timeout_s": NaN}'), 422, "invalid", "timeout_s")
    _assert_error(_raw_exec(client, b'{"command": "true", "timeout_s": Infinity}'), 422, "invalid", "timeout_s")
    _assert_error(_raw_exec(client, msgpack.packb({"command": "true", "timeout_s": float("nan")}), MSGPACK),
                  422, "invalid", "timeout_s")


def test_body_that_is_not_an_object_is_400(client: Client) -> None:
    _assert_error(_raw_exec(client, b'["true"]'), 400, "bad_request", "object")
    _assert_error(_raw_exec(client, msgpack.packb("true"), MSGPACK), 400, "bad_request", "object")


def test_connection_survives_errors(client: Client) -> None:
    """Errors are ordinary responses: the same keep-alive connection serves the next call."""
    conn = client.connection()
    assert client.exec(command=5).status == 400
    assert client.request("GET", "/v1/nothing").status == 404
    assert client.run(command=["echo", "still"])["stdout"] == b"still\n"
    assert client.connection() is conn
