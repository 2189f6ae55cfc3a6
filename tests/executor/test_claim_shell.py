"""A claim binds the spare shell a zygote built ahead (no routes built on the claimed sandbox's first call), and
still nothing of the app before it survives: not its token, not its dedup cache; a later claim builds anew."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from flask import Flask
from werkzeug.test import Client

from executor.app import app_shell
from executor.serve import ExecutorServer
from executor.settings import ExecutorSettings


def _token_of(shell: Flask) -> bytes:
    token: bytes = shell.extensions["grove.executor"].get().token
    return token


def _exec(client: Client, token: str, command: str, request_id: str) -> Any:
    return client.post("/v1/exec", json={"command": ["/bin/sh", "-c", command], "request_id": request_id},
                       headers={"Authorization": f"Bearer {token}"})


def _claim(client: Client, bearer: str, token: str) -> int:
    reply = client.post("/v1/claim", data=json.dumps({"token": token, "env": {}, "workdir": "/"}),
                        headers={"Authorization": f"Bearer {bearer}"})
    return reply.status_code


def test_a_claim_binds_the_spare_shell_and_keeps_nothing_of_the_app_before(tmp_path: Path) -> None:
    first, spare = app_shell(str(tmp_path)), app_shell(str(tmp_path))
    server = ExecutorServer(ExecutorSettings(token="pool-token", root=str(tmp_path)), "127.0.0.1:0",
                            app_shell=first, claim_shell=spare)
    client = Client(server.load())
    before = _exec(client, "pool-token", "echo before", "r-1")
    assert before.status_code == 200 and before.get_json()["stdout"] == "before\n"
    assert _token_of(first) == b"pool-token"

    assert _claim(client, "pool-token", "user-token") == 200
    # The same request id again: a new app's dedup cache has never seen it, so the command runs.
    after = _exec(client, "user-token", "echo after", "r-1")
    assert after.status_code == 200 and after.get_json()["stdout"] == "after\n"
    assert _token_of(spare) == b"user-token"
    assert _exec(client, "pool-token", "true", "r-2").status_code == 401

    # A second claim has no spare left: it builds a whole app, and reuses neither shell.
    assert _claim(client, "user-token", "next-token") == 200
    again = _exec(client, "next-token", "echo again", "r-1")
    assert again.status_code == 200 and again.get_json()["stdout"] == "again\n"
    assert (_token_of(first), _token_of(spare)) == (b"pool-token", b"user-token")
    assert _exec(client, "user-token", "true", "r-3").status_code == 401


def test_without_a_spare_shell_a_claim_builds_the_app_anew(tmp_path: Path) -> None:
    first = app_shell(str(tmp_path))
    server = ExecutorServer(ExecutorSettings(token="pool-token", root=str(tmp_path)), "127.0.0.1:0", app_shell=first)
    client = Client(server.load())
    assert _exec(client, "pool-token", "true", "r-1").status_code == 200
    assert _claim(client, "pool-token", "user-token") == 200
    assert _exec(client, "user-token", "echo fresh", "r-1").get_json()["stdout"] == "fresh\n"
    assert _token_of(first) == b"pool-token"
