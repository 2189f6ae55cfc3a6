"""An app shell built ahead (as the local backend's zygote does) serves one sandbox once bound, and only then."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from werkzeug.test import Client

from executor.app import app_shell, bind
from executor.serve import ExecutorServer
from executor.settings import ExecutorSettings


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _exec_true(client: Client, token: str) -> int:
    reply = client.post("/v1/exec", json={"command": ["true"]}, headers=_auth(token))
    return reply.status_code


def test_an_unbound_shell_serves_only_healthz(tmp_path: Path) -> None:
    client = Client(app_shell(str(tmp_path)))
    assert client.get("/healthz").status_code == 200
    refused = client.post("/v1/exec", json={"command": ["true"]}, headers=_auth("anything"))
    assert refused.status_code == 503
    assert "not configured" in refused.get_json()["error"]["message"]
    assert client.post("/swerex/execute", json={"command": "true"}, headers=_auth("x")).status_code == 503


def test_a_bound_shell_serves_with_its_settings_once(tmp_path: Path) -> None:
    shell = app_shell(str(tmp_path))
    Client(shell).get("/healthz")  # warmed before the bind, as in the zygote
    app = bind(shell, ExecutorSettings(token="tok-a", root=str(tmp_path)))
    client = Client(app)
    assert _exec_true(client, "tok-a") == 200
    assert _exec_true(client, "tok-b") == 401
    with pytest.raises(RuntimeError, match="bound already"):
        bind(shell, ExecutorSettings(token="tok-b", root=str(tmp_path)))


def test_a_shell_for_another_root_is_refused(tmp_path: Path) -> None:
    (tmp_path / "other").mkdir()
    with pytest.raises(ValueError, match="cannot serve root"):
        bind(app_shell(str(tmp_path)), ExecutorSettings(token="t", root=str(tmp_path / "other")))


def test_the_server_uses_its_shell_for_the_first_app_only(tmp_path: Path) -> None:
    shell = app_shell(str(tmp_path))
    settings = ExecutorSettings(token="pool-token", root=str(tmp_path))
    server = ExecutorServer(settings, "127.0.0.1:0", app_shell=shell)
    client = Client(server.load())
    assert _exec_true(client, "pool-token") == 200
    assert shell.extensions["grove.executor"].get().token == b"pool-token"  # the shell is what served
    claim = {"token": "user-token", "env": {}, "workdir": "/"}
    assert client.post("/v1/claim", data=json.dumps(claim), headers=_auth("pool-token")).status_code == 200
    # The claim's app is built anew: the shell keeps the pool's settings and the new token alone works.
    assert _exec_true(client, "user-token") == 200
    assert _exec_true(client, "pool-token") == 401
    assert shell.extensions["grove.executor"].get().token == b"pool-token"
