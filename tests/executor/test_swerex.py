"""The executor's SWE-ReX protocol (``/swerex/...``) on a real executor: sessions on a pty, one-off commands,
files, uploads, and the exception transfer SWE-ReX's client relies on."""

from __future__ import annotations

import io
import json
import os
import time
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.executor_fixtures import STRAY, Client, Reply, processes_with, wait_gone
from tests.support.router_fixtures import wait_for


def call(client: Client, name: str, body: Any = None, *, status: int = 200) -> dict[str, Any]:
    """POST a JSON body to /swerex/<name>; insist on ``status``; the decoded answer."""
    reply = client.request("POST", f"/swerex/{name}", json.dumps(body or {}).encode(),
                           {"Content-Type": "application/json"})
    assert reply.status == status, (reply.status, reply.body[:800])
    data: dict[str, Any] = reply.json()
    return data


def transferred(data: dict[str, Any]) -> str:
    """The exception class a 511 answer transfers."""
    assert set(data) == {"swerexception"}, data
    assert set(data["swerexception"]) == {"message", "class_path", "traceback", "extra_info"}
    return str(data["swerexception"]["class_path"])


@pytest.fixture
def session(client: Client) -> Iterator[str]:
    """A fresh named session, closed afterwards."""
    name = f"s-{uuid.uuid4().hex[:8]}"
    assert call(client, "create_session", {"session": name, "startup_timeout": 5})["session_type"] == "bash"
    yield name
    client.request("POST", "/swerex/close_session", json.dumps({"session": name}).encode(),
                   {"Content-Type": "application/json"})


def run(client: Client, session: str, command: str, **fields: Any) -> dict[str, Any]:
    """run_in_session with ``check="silent"`` unless told otherwise."""
    return call(client, "run_in_session", {"session": session, "command": command, "check": "silent",
                                           "timeout": 10, **fields})


def test_is_alive_and_auth(client: Client, executor: Any) -> None:
    assert client.request("GET", "/swerex/is_alive").json() == {"is_alive": True, "message": ""}
    anonymous = executor.client(token=None)
    try:
        assert anonymous.request("GET", "/swerex/is_alive").status == 401
    finally:
        anonymous.close()


def test_session_keeps_state_and_reports_exit_codes(client: Client, session: str) -> None:
    first = run(client, session, "cd /tmp && export GREETING=hello && echo started")
    assert first == {"output": "started\n", "exit_code": 0, "failure_reason": "", "expect_string": "SHELLPS1PREFIX",
                     "session_type": "bash"}
    assert run(client, session, 'pwd; echo "$GREETING"')["output"] == "/tmp\nhello\n"
    assert run(client, session, "ls /no-such-dir")["exit_code"] == 2
    assert run(client, session, "printf 'no newline'")["output"] == "no newline"
    heredoc = run(client, session, "cat <<'EOF'\nline 1\n  line 2\nEOF\necho after")
    assert heredoc["output"] == "line 1\n  line 2\nafter\n" and heredoc["exit_code"] == 0
    assert run(client, session, "false", check="ignore")["exit_code"] is None


def test_session_errors_transfer_swerex_exceptions(client: Client, session: str) -> None:
    failed = call(client, "run_in_session", {"session": session, "command": "echo out; exit_code_7() { return 7; };"
                                             " exit_code_7", "check": "raise"}, status=511)
    assert transferred(failed) == "swerex.exceptions.NonZeroExitCodeError"
    assert failed["swerexception"]["extra_info"]["exit_code"] == 7
    syntax = call(client, "run_in_session", {"session": session, "command": "echo 'unterminated"}, status=511)
    assert transferred(syntax) == "swerex.exceptions.BashIncorrectSyntaxError"
    assert "bash_stderr" in syntax["swerexception"]["extra_info"]
    missing = call(client, "run_in_session", {"session": "nope", "command": "true"}, status=511)
    assert transferred(missing) == "swerex.exceptions.SessionDoesNotExistError"
    twice = call(client, "create_session", {"session": session}, status=511)
    assert transferred(twice) == "swerex.exceptions.SessionExistsError"
    assert call(client, "run_in_session", {"command": 5}, status=400)["error"]["code"] == "bad_request"


def test_timeout_kills_the_foreground_job_and_the_session_lives_on(client: Client, session: str) -> None:
    run(client, session, "MARK=kept")
    started = time.monotonic()
    timed_out = call(client, "run_in_session", {"session": session, "command": f"echo begun; sleep {STRAY}",
                                                "timeout": 1}, status=511)
    assert time.monotonic() - started < 6
    assert transferred(timed_out) == "swerex.exceptions.CommandTimeoutError"
    assert timed_out["swerexception"]["extra_info"]["output"] == "begun\n"
    assert wait_gone(STRAY) == []
    # A builtin loop runs in the shell itself: it is interrupted, not the shell killed.
    call(client, "run_in_session", {"session": session, "command": "while :; do :; done", "timeout": 1}, status=511)
    interrupted = call(client, "run_in_session", {"session": session, "action_type": "bash_interrupt"})
    assert interrupted["exit_code"] == 0
    assert run(client, session, 'echo "$MARK"')["output"] == "kept\n"


def test_interactive_program(client: Client, session: str) -> None:
    started = run(client, session, "python3 -q", is_interactive_command=True, expect=[">>> "])
    assert started["expect_string"] == ">>> "
    assert run(client, session, "print(6 * 7)", is_interactive_command=True, expect=[">>> "])["output"] == "42"
    assert run(client, session, "quit()", is_interactive_quit=True)["expect_string"] == "SHELLPS1PREFIX"
    assert run(client, session, "echo back")["output"] == "back\n"


def test_exit_ends_the_session_and_close_kills_its_jobs(client: Client) -> None:
    call(client, "create_session", {"session": "exits"})
    gone = run(client, "exits", "exit 4")
    assert gone["exit_code"] == 4 and "exited" in gone["failure_reason"]
    assert transferred(run_raw(client, "exits", "true")) == "swerex.exceptions.SessionDoesNotExistError"
    call(client, "create_session", {"session": "jobs"})
    try:
        # A plain background job, and one that forks away into a session of its own.
        run(client, "jobs", f"sleep {STRAY} & setsid sleep {STRAY} &")
        wait_for(lambda: len(processes_with(f"sleep {STRAY}")) == 2, 5, what="both jobs")
    finally:
        assert call(client, "close_session", {"session": "jobs"}) == {"session_type": "bash"}
    assert wait_gone(STRAY) == []


@pytest.mark.parametrize("blank", ["", "\n", "  "])
def test_an_empty_command_under_a_shell_runs_as_on_swerexs_own_server(client: Client, blank: str) -> None:
    assert call(client, "execute", {"command": blank, "shell": True}) == {"stdout": "", "stderr": "", "exit_code": 0}


def test_an_empty_command_without_a_shell_is_refused(client: Client) -> None:
    for empty in ("", []):
        refused = call(client, "execute", {"command": empty}, status=422)
        assert "'command' is empty" in refused["error"]["message"]


def run_raw(client: Client, session: str, command: str) -> dict[str, Any]:
    """run_in_session expecting a transferred exception."""
    return call(client, "run_in_session", {"session": session, "command": command}, status=511)


def test_execute_like_subprocess_run(client: Client) -> None:
    both = call(client, "execute", {"command": "echo out; echo err >&2; exit 3", "shell": True})
    assert both == {"stdout": "out\n", "stderr": "err\n", "exit_code": 3}
    merged = call(client, "execute", {"command": ["sh", "-c", "echo a; echo b >&2; echo c"],
                                      "merge_output_streams": True})
    assert merged == {"stdout": "a\nb\nc\n", "stderr": "", "exit_code": 0}
    env = call(client, "execute", {"command": "echo $ONLY_HERE", "shell": True, "env": {"ONLY_HERE": "yes"}})
    assert env["stdout"] == "yes\n"
    failed = call(client, "execute", {"command": ["false"], "check": True}, status=511)
    assert transferred(failed) == "swerex.exceptions.NonZeroExitCodeError"
    missing = call(client, "execute", {"command": ["no-such-program-here"]}, status=511)
    assert transferred(missing) == "builtins.FileNotFoundError"
    slow = call(client, "execute", {"command": f"sleep {STRAY} & sleep {STRAY}", "shell": True, "timeout": 0.5},
                status=511)
    assert transferred(slow) == "swerex.exceptions.CommandTimeoutError"
    assert wait_gone(STRAY) == []


def test_files_and_uploads(client: Client, executor: Any) -> None:
    assert call(client, "write_file", {"path": "/work/dir/hello.txt", "content": "héllo\n"}) == {}
    assert call(client, "read_file", {"path": "/work/dir/hello.txt"}) == {"content": "héllo\n"}
    missing = call(client, "read_file", {"path": "/work/none.txt"}, status=511)
    assert transferred(missing) == "builtins.FileNotFoundError"
    # A bad path is the caller's error, re-raised by the client as the builtin — not a 500 of the executor.
    under_a_file = call(client, "write_file", {"path": "/work/dir/hello.txt/x", "content": ""}, status=511)
    assert transferred(under_a_file) in ("builtins.FileExistsError", "builtins.NotADirectoryError")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        info = zipfile.ZipInfo("pkg/run.sh")
        info.external_attr = 0o755 << 16
        zf.writestr(info, "#!/bin/sh\necho ran\n")
        zf.writestr("../../escape.txt", "kept inside")
    assert upload(client, buf.getvalue(), "/work/up", unzip=True).status == 200
    assert os.access(executor.host_path("/work/up/pkg/run.sh"), os.X_OK)
    assert Path(executor.host_path("/work/up/escape.txt")).read_text() == "kept inside"
    assert upload(client, b"single file", "/work/one/file.bin", unzip=False).status == 200
    assert Path(executor.host_path("/work/one/file.bin")).read_bytes() == b"single file"
    assert upload(client, b"not a zip", "/work/bad", unzip=True).status == 511


def upload(client: Client, data: bytes, target: str, *, unzip: bool) -> Reply:
    """A multipart upload shaped like SWE-ReX's client sends it."""
    boundary = uuid.uuid4().hex
    parts = [
        (b'Content-Disposition: form-data; name="file"; filename="x.zip"\r\n'
         b"Content-Type: application/zip\r\n\r\n" + data),
        b'Content-Disposition: form-data; name="target_path"\r\n\r\n' + target.encode(),
        b'Content-Disposition: form-data; name="unzip"\r\n\r\n' + (b"true" if unzip else b"false"),
    ]
    body = b"".join(b"--" + boundary.encode() + b"\r\n" + p + b"\r\n" for p in parts) + f"--{boundary}--\r\n".encode()
    return client.request("POST", "/swerex/upload", body, {"Content-Type": f"multipart/form-data; boundary={boundary}"})
