"""``POST /v1/claim`` on a pod that started after its Secret was patched: the claim is authorised by its own
body (the claimant's token is the pod's already) and changes nothing; any other caller is refused."""

from __future__ import annotations

import json
from pathlib import Path

from werkzeug.test import Client

from executor.serve import ExecutorServer
from executor.settings import ExecutorSettings


def _client(tmp_path: Path, token: str, env: dict[str, str]) -> Client:
    return Client(ExecutorServer(ExecutorSettings(token=token, root=str(tmp_path), env=env), "127.0.0.1:0").load())


def _claim(client: Client, bearer: str, token: str, env: dict[str, str]) -> tuple[int, dict[str, object]]:
    reply = client.post("/v1/claim", data=json.dumps({"token": token, "env": env, "workdir": "/"}),
                        headers={"Authorization": f"Bearer {bearer}"})
    return reply.status_code, reply.get_json()


def test_a_claim_carrying_the_pods_own_token_is_accepted_as_done(tmp_path: Path) -> None:
    env = {"TASK": "x"}
    client = _client(tmp_path, "user-token", env)
    status, body = _claim(client, "pool-token", "user-token", env)
    assert (status, body) == (200, {"ok": True, "already": True})
    assert client.post("/v1/exec", json={"command": ["true"]},
                       headers={"Authorization": "Bearer pool-token"}).status_code == 401
    assert client.post("/v1/exec", json={"command": ["true"]},
                       headers={"Authorization": "Bearer user-token"}).status_code == 200


def test_a_claim_with_neither_token_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    client = _client(tmp_path, "user-token", {})
    status, body = _claim(client, "pool-token", "attacker-token", {"A": "b"})
    assert status == 401 and "not valid" in str(body)
    status, _ = _claim(client, "", "", {})
    assert status == 401
    bad = client.post("/v1/claim", data=b"not json", headers={"Authorization": "Bearer nope"})
    assert bad.status_code == 401  # a caller without a token learns nothing about the body
    assert client.post("/v1/exec", json={"command": ["true"]},
                       headers={"Authorization": "Bearer user-token"}).status_code == 200
    assert client.post("/v1/exec", json={"command": ["true"]},
                       headers={"Authorization": "Bearer attacker-token"}).status_code == 401


def test_the_pool_token_still_claims_a_pod_that_has_it(tmp_path: Path) -> None:
    client = _client(tmp_path, "pool-token", {})
    assert _claim(client, "pool-token", "user-token", {"T": "1"}) == (200, {"ok": True})
    assert client.post("/v1/exec", json={"command": ["true"]},
                       headers={"Authorization": "Bearer user-token"}).status_code == 200
