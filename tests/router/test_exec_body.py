"""How the router reads an exec's body (router/api/datapath.py read_capped): what has arrived is taken at once,
the rest waited for (up to the body timeout), an empty body is an ordinary bad request."""

from __future__ import annotations

import json
import socket
import time

from grove.client import Sandbox
from tests.support.router_fixtures import RouterProcess, error_of


def _send_in_parts(router: RouterProcess, path: str, body: bytes, pause_s: float) -> tuple[int, bytes]:
    """POST ``body`` over a raw connection: the headers and the first half, a pause, then the rest."""
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {router.key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    half = len(body) // 2
    with socket.create_connection(("127.0.0.1", router.port), timeout=60) as sock:
        sock.sendall(head + body[:half])
        time.sleep(pause_s)
        sock.sendall(body[half:])
        with sock.makefile("rb") as answer:
            status = int(answer.readline().split()[1])
            while answer.readline() not in (b"\r\n", b""):
                pass
            return status, answer.read()


def test_a_body_that_arrives_in_parts_is_read_whole(router: RouterProcess, sandbox: Sandbox) -> None:
    body = json.dumps({"command": ["echo", "x" * 4000]}).encode()
    status, answer = _send_in_parts(router, f"/v1/sandboxes/{sandbox.id}/exec", body, pause_s=0.5)
    assert status == 200, answer[:300]
    assert json.loads(answer)["stdout"] == "x" * 4000 + "\n"


def test_an_empty_exec_body_is_a_400_naming_the_command(router: RouterProcess, sandbox: Sandbox) -> None:
    reply = router.http("POST", f"/v1/sandboxes/{sandbox.id}/exec", body=b"",
                        headers={"Content-Type": "application/json"})
    assert reply.status == 400 and "command" in error_of(reply)["message"]
    assert sandbox.exec("true").exit_code == 0
