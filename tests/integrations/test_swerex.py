"""SWE-ReX's own ``RemoteRuntime`` client, unchanged, driving a grove sandbox through a real router.

The runtime is pointed at ``http://ROUTER/v1/sandboxes/ID/swerex`` with the grove API key as its
``auth_token`` (sent in ``X-API-Key``); the trajectory stored in S3 afterwards holds every call.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest
from swerex.exceptions import CommandTimeoutError, NonZeroExitCodeError, SessionDoesNotExistError
from swerex.runtime.abstract import (
    BashAction,
    BashInterruptAction,
    CloseBashSessionRequest,
    Command,
    CreateBashSessionRequest,
    ReadFileRequest,
    UploadRequest,
    WriteFileRequest,
)
from swerex.runtime.remote import RemoteRuntime

from tests.support.router_fixtures import RouterProcess

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Drive one SWE-ReX call (its client is async)."""
    return asyncio.run(coro)


def runtime(router: RouterProcess, sandbox_id: str, key: str | None = None) -> RemoteRuntime:
    """SWE-ReX's remote runtime on a grove sandbox, exactly as a SWE-agent user would configure it."""
    return RemoteRuntime(host=f"{router.url}/v1/sandboxes/{sandbox_id}/swerex", port=None,
                         auth_token=key or router.key, timeout=10)


def test_remote_runtime_drives_a_sandbox_and_every_call_is_recorded(router: RouterProcess, tmp_path: Path) -> None:
    with router.client() as grove:
        sandbox = grove.create("default", memory_mb=256, metadata={"task_id": "swerex-1", "model": "scripted",
                                                                   "harness": "swe-rex", "harness_version": "1.4"})
        rt = runtime(router, sandbox.id)
        assert run(rt.is_alive()).is_alive
        run(rt.create_session(CreateBashSessionRequest(startup_timeout=10)))

        ok = run(rt.run_in_session(BashAction(command="cd /workspace && mkdir -p src && echo ready", timeout=10)))
        assert (ok.output, ok.exit_code) == ("ready\n", 0)
        silent = run(rt.run_in_session(BashAction(command="pwd; ls /nope", check="silent", timeout=10)))
        assert silent.exit_code == 2 and silent.output.startswith("/workspace\n")
        with pytest.raises(NonZeroExitCodeError):
            run(rt.run_in_session(BashAction(command="grep -q absent /etc/hostname", timeout=10)))
        with pytest.raises(CommandTimeoutError):
            run(rt.run_in_session(BashAction(command="sleep 60", timeout=1)))
        run(rt.run_in_session(BashInterruptAction()))
        assert run(rt.run_in_session(BashAction(command="pwd", timeout=10))).output == "/workspace\n"

        done = run(rt.execute(Command(command="echo out; echo err >&2; exit 5", shell=True)))
        assert (done.stdout, done.stderr, done.exit_code) == ("out\n", "err\n", 5)
        with pytest.raises(CommandTimeoutError):
            run(rt.execute(Command(command=["sleep", "60"], timeout=0.5)))

        run(rt.write_file(WriteFileRequest(path="/workspace/src/app.py", content="print('app')\n")))
        assert run(rt.read_file(ReadFileRequest(path="/workspace/src/app.py"))).content == "print('app')\n"
        project = tmp_path / "project"
        (project / "pkg").mkdir(parents=True)
        (project / "pkg" / "mod.py").write_text("VALUE = 42\n")
        (project / "run.sh").write_text("#!/bin/sh\necho ran\n")
        os.chmod(project / "run.sh", 0o755)
        run(rt.upload(UploadRequest(source_path=str(project), target_path="/workspace/project")))
        run(rt.upload(UploadRequest(source_path=str(project / "pkg" / "mod.py"), target_path="/workspace/one.py")))
        check = run(rt.execute(Command(command="/workspace/project/run.sh && python3 -c 'import mod; print(mod.VALUE)'"
                                               " && cat /workspace/one.py", shell=True, cwd="/workspace/project/pkg")))
        assert check.stdout == "ran\n42\nVALUE = 42\n", check

        run(rt.close_session(CloseBashSessionRequest()))
        with pytest.raises(SessionDoesNotExistError):
            run(rt.run_in_session(BashAction(command="true")))
        run(rt.close())
        grove.request("POST", f"/v1/sandboxes/{sandbox.id}/events",
                      json_body={"kind": "result", "data": {"result": "pass", "reward": 1.0}})
        sandbox.close()
        record = grove.request("GET", f"/v1/trajectories/{sandbox.id}")

    assert record["sandbox"]["harness"] == "swe-rex" and record["sandbox"]["task_id"] == "swerex-1"
    execs = [s for s in record["steps"] if s["type"] == "exec"]
    assert [s["command"] for s in execs][:5] == [
        "cd /workspace && mkdir -p src && echo ready", "pwd; ls /nope", "grep -q absent /etc/hostname", "sleep 60",
        "pwd"]
    assert [s["exit_code"] for s in execs][:3] == [0, 2, 1]
    assert execs[3]["timed_out"] and execs[3]["error"]["class"] == "CommandTimeoutError"
    assert all(s["via"] == "swerex" for s in execs)
    assert execs[5]["stderr"] == "err\n" and execs[5]["exit_code"] == 5 and execs[6]["timed_out"]
    kinds = [s["type"] for s in record["steps"]]
    assert kinds.count("file_upload") == 2 and "file_write" in kinds and "file_read" in kinds
    ops = [s.get("op") for s in record["steps"] if s["type"] == "swerex"]
    assert ops == ["create_session", "interrupt", "close_session", "close"]
    assert record["outcome"]["result"] == "pass" and "infra_errors" not in record["outcome"]


def test_api_key_in_x_api_key_only_on_swerex_routes(router: RouterProcess) -> None:
    with router.client() as grove:
        sandbox = grove.create("default", memory_mb=128)
        try:
            assert not run(runtime(router, sandbox.id, key="not-the-key").is_alive()).is_alive
            with pytest.raises(aiohttp.ClientResponseError) as info:
                run(runtime(router, sandbox.id, key="not-the-key").execute(Command(command=["true"])))
            assert info.value.status == 401
            alive = router.http("GET", f"/v1/sandboxes/{sandbox.id}/swerex/is_alive", auth=False,
                                headers={"X-API-Key": router.key})
            assert alive.status == 200 and alive.json() == {"is_alive": True, "message": ""}
            # Elsewhere the key still belongs in Authorization.
            assert router.http("GET", f"/v1/sandboxes/{sandbox.id}", auth=False,
                               headers={"X-API-Key": router.key}).status == 401
            assert router.http("GET", "/v1/sandboxes/sb-0000000000000000/swerex/is_alive").status == 404
        finally:
            sandbox.close()
