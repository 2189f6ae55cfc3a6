"""The real ``e2b`` SDK (sync and async), unchanged, against grove's E2B endpoint on a real router: only the
environment variables a user sets point it at grove. The sandbox's trajectory holds every call."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from e2b import AsyncSandbox, CommandExitException, Sandbox
from e2b.exceptions import AuthenticationException, NotFoundException, SandboxException

from tests.support.router_fixtures import RouterProcess, wait_for


def steps_of(router: RouterProcess, sandbox_id: str) -> list[dict[str, Any]]:
    reply = router.http("GET", f"/v1/sandboxes/{sandbox_id}/trajectory")
    assert reply.status == 200, reply.body[:300]
    steps: list[dict[str, Any]] = reply.json()["steps"]
    return steps


def test_sync_sdk_commands_files_timeout_and_kill(router: RouterProcess, e2b_env: None) -> None:
    sbx = Sandbox.create("base", timeout=120, metadata={"run": "e2b-1"}, envs={"GREETING": "hello"})
    assert sbx.sandbox_id.startswith("sb-") and sbx.is_running()
    seen: list[str] = []
    result = sbx.commands.run("echo $GREETING; echo oops >&2", on_stdout=seen.append)
    assert (result.stdout, result.stderr, result.exit_code) == ("hello\n", "oops\n", 0)
    assert seen == ["hello\n"]

    with pytest.raises(CommandExitException) as failed:
        sbx.commands.run("echo partial; exit 3")
    assert failed.value.exit_code == 3 and failed.value.stdout == "partial\n"

    # A background command fed on stdin, listed, then killed.
    handle = sbx.commands.run("while read line; do echo got:$line; echo $line > /workspace/seen; done",
                              background=True, stdin=True)
    sbx.commands.send_stdin(handle.pid, "one\n")
    wait_for(lambda: sbx.files.exists("/workspace/seen"), 20, what="the background command's line")
    assert handle.pid in [p.pid for p in sbx.commands.list()]
    assert sbx.commands.kill(handle.pid)
    with pytest.raises(CommandExitException) as killed:
        handle.wait()
    assert killed.value.stdout == "got:one\n"
    assert not sbx.commands.kill(handle.pid)  # gone: envd's not-found answers False

    sbx.files.write("/workspace/notes/a.txt", "alpha")
    assert sbx.files.read("/workspace/notes/a.txt") == "alpha"
    assert sbx.files.exists("/workspace/notes/a.txt") and not sbx.files.exists("/workspace/nope")
    assert sbx.files.make_dir("/workspace/notes/sub") and not sbx.files.make_dir("/workspace/notes/sub")
    moved = sbx.files.rename("/workspace/notes/a.txt", "/workspace/notes/b.txt")
    assert moved.name == "b.txt"
    names = sorted(e.name for e in sbx.files.list("/workspace/notes"))
    assert names == ["b.txt", "sub"]
    sbx.set_timeout(600)
    info = sbx.get_info()
    assert (info.end_at - info.started_at).total_seconds() > 590 and info.metadata == {"run": "e2b-1"}
    again = Sandbox.connect(sbx.sandbox_id)
    assert again.commands.run("ls /workspace/notes").stdout == "b.txt\nsub\n"
    again.files.remove("/workspace/notes/b.txt")
    assert not sbx.files.exists("/workspace/notes/b.txt")

    steps = steps_of(router, sbx.sandbox_id)
    commands = [s["command"] for s in steps if s["type"] == "exec" and s["via"] == "e2b"]
    assert ["/bin/bash", "-l", "-c", "echo $GREETING; echo oops >&2"] in commands
    first = next(s for s in steps if s.get("command") == ["/bin/bash", "-l", "-c", "echo $GREETING; echo oops >&2"])
    assert first["exit_code"] == 0 and first["stdout"] == "hello\n"
    assert any(s["type"] == "process_signal" for s in steps)
    files = {(s["type"], s["path"]) for s in steps if s["type"].startswith("file_")}
    assert {("file_write", "/workspace/notes/a.txt"), ("file_read", "/workspace/notes/a.txt"),
            ("file_list", "/workspace/notes"), ("file_delete", "/workspace/notes/b.txt")} <= files
    assert ["mv", "-T", "--", "/workspace/notes/a.txt", "/workspace/notes/b.txt"] in commands

    sbx.kill()
    with pytest.raises(NotFoundException):
        sbx.get_info()
    with pytest.raises(SandboxException):
        sbx.commands.run("true")


def test_async_sdk_create_run_background_and_files(router: RouterProcess, e2b_env: None) -> None:
    async def scenario() -> None:
        sbx = await AsyncSandbox.create(timeout=60)
        out: list[str] = []
        result = await sbx.commands.run("printf 'a\\nb\\n'", on_stdout=out.append)
        assert result.stdout == "a\nb\n" and result.exit_code == 0 and "".join(out) == "a\nb\n"
        handle = await sbx.commands.run("cat", background=True, stdin=True)
        await sbx.commands.send_stdin(handle.pid, "ping\n")
        await sbx.commands.close_stdin(handle.pid)
        done = await handle.wait()
        assert done.stdout == "ping\n" and done.exit_code == 0
        slow = await sbx.commands.run("sleep 60", background=True)
        assert await sbx.commands.kill(slow.pid)
        with pytest.raises(CommandExitException):
            await slow.wait()
        await sbx.files.write("/workspace/x.bin", b"\x00\x01binary")
        assert await sbx.files.read("/workspace/x.bin", format="bytes") == bytearray(b"\x00\x01binary")
        assert [e.name for e in await sbx.files.list("/workspace")] == ["x.bin"]
        await sbx.set_timeout(120)
        await sbx.kill()
        with pytest.raises(NotFoundException):
            await sbx.get_info()

    asyncio.run(scenario())


def test_wrong_key_and_foreign_sandbox_refused(router: RouterProcess, e2b_env: None,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    sbx = Sandbox.create(timeout=60)
    monkeypatch.setenv("E2B_API_KEY", "gk-not-a-key")
    with pytest.raises(AuthenticationException):
        Sandbox.create(timeout=60)
    with pytest.raises(AuthenticationException):
        Sandbox.connect(sbx.sandbox_id)
    assert Sandbox.connect(sbx.sandbox_id, api_key=router.key).commands.run("echo still").stdout == "still\n"
    # A key sent as grove's bearer token instead of E2B's header is the envd token handed back.
    made = router.http("POST", "/e2b/v2/sandboxes", json_body={"templateID": "base", "timeout": 30})
    assert made.status == 201 and made.json()["envdAccessToken"] == router.key
    assert made.json()["envdVersion"] == "0.5.7"
    assert router.http("DELETE", f"/e2b/sandboxes/{made.json()['sandboxID']}").status == 204
    unsupported = router.http("POST", f"/e2b/sandboxes/{sbx.sandbox_id}/pause",
                              headers={"X-API-KEY": router.key}, auth=False)
    assert unsupported.status == 404 and "not supported" in unsupported.json()["message"]
    refused = router.http("POST", "/e2b/sandbox/process.Process/List", json_body={}, auth=False,
                          headers={"X-Access-Token": "gk-wrong", "E2b-Sandbox-Id": sbx.sandbox_id})
    assert refused.status == 401
    sbx.kill()


def test_bad_input_answers_e2b_errors_a_person_can_act_on(router: RouterProcess, e2b_env: None) -> None:
    key = {"X-API-KEY": router.key}
    unknown = router.http("POST", "/e2b/v2/sandboxes", json_body={"templateID": "no-such-template"}, headers=key,
                          auth=False)
    assert unknown.status in (404, 422) and "no-such-template" in unknown.json()["message"]
    assert set(unknown.json()) == {"code", "message"} and unknown.json()["code"] == unknown.status
    for body, word in (({"templateID": "base", "timeout": 0}, "timeout"), ({"templateID": "base", "x": 1}, "x"),
                       ({"timeout": 30}, "templateID"), ({"templateID": "base", "mcp": {"a": 1}}, "mcp")):
        reply = router.http("POST", "/e2b/v2/sandboxes", json_body=body, headers=key, auth=False)
        assert reply.status in (400, 422) and word in reply.json()["message"], (body, reply.body[:300])
    sbx = Sandbox.create(timeout=60)
    envd = {"X-Access-Token": router.key, "E2b-Sandbox-Id": sbx.sandbox_id}
    garbled = router.http("POST", "/e2b/sandbox/filesystem.Filesystem/Stat", b"{not json", auth=False,
                          headers={**envd, "Content-Type": "application/json"})
    assert garbled.status == 400 and garbled.json()["code"] == "invalid_argument"
    missing = router.http("POST", "/e2b/sandbox/filesystem.Filesystem/Stat", json_body={"path": "/nope"},
                          headers=envd, auth=False)
    assert missing.status == 404 and missing.json() == {"code": "not_found", "message": "path '/nope' does not exist"}
    nothing = router.http("POST", "/e2b/sandbox/filesystem.Filesystem/Watch", json_body={}, headers=envd, auth=False)
    assert nothing.status == 501 and nothing.json()["code"] == "unimplemented"
    with pytest.raises(SandboxException, match="not found"):
        sbx.commands.send_stdin(424242, "x")
    assert sbx.commands.run("echo fine").stdout == "fine\n"  # nothing else disturbed
    sbx.kill()
