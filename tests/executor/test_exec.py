"""POST /v1/exec against a real executor: forms, exit codes, stdin, cwd/env, timeouts, concurrency, retries."""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tests.support.executor_fixtures import STRAY, TOKEN, Client, RunningExecutor, processes_running, wait_gone


def test_string_command_runs_in_a_shell(any_executor: RunningExecutor) -> None:
    client = any_executor.client()
    res = client.run(command="echo hello; echo oops >&2; exit 3")
    assert res["exit_code"] == 3
    assert res["stdout"] == b"hello\n"
    assert res["stderr"] == b"oops\n"
    assert res["timed_out"] is False
    assert res["stdout_truncated"] is False and res["stderr_truncated"] is False
    assert 0 <= res["duration_s"] < 5


def test_argv_command_is_not_parsed_by_a_shell(client: Client) -> None:
    res = client.run(command=["echo", "$HOME", "a;b", "'q'"])
    assert res["exit_code"] == 0
    assert res["stdout"] == b"$HOME a;b 'q'\n"


def test_exit_codes(client: Client) -> None:
    assert client.run(command=["true"])["exit_code"] == 0
    assert client.run(command=["false"])["exit_code"] == 1
    assert client.run(command=["sh", "-c", "exit 42"])["exit_code"] == 42


def test_killed_by_signal_is_128_plus_n(client: Client) -> None:
    assert client.run(command="kill -TERM $$")["exit_code"] == 128 + 15
    assert client.run(command="kill -KILL $$")["exit_code"] == 128 + 9
    res = client.run(command=["sh", "-c", "kill -SEGV $$"])
    assert res["exit_code"] == 128 + 11
    assert res["timed_out"] is False


def test_missing_program_is_404(client: Client) -> None:
    reply = client.exec(command=["/no/such/program"])
    assert reply.status == 404
    assert "/no/such/program" in reply.json()["error"]["message"]


def test_stdin_bytes_via_msgpack(client: Client) -> None:
    data = bytes(range(256)) * 1200  # 300 KiB: more than a pipe holds, so writing and reading interleave
    res = client.run(command=["cat"], stdin=data, max_output_bytes=1024 * 1024)
    assert res["stdout"] == data
    assert client.run(command=["wc", "-c"], stdin=data)["stdout"].strip() == str(len(data)).encode()


def test_stdin_text_via_json(client: Client) -> None:
    reply = client.exec(command=["cat"], stdin="héllo\nwörld\n")
    assert reply.status == 200
    assert reply.json()["stdout"] == "héllo\nwörld\n"


def test_no_stdin_reads_eof(client: Client) -> None:
    res = client.run(command=["cat"], timeout_s=5)
    assert res["exit_code"] == 0 and res["stdout"] == b"" and res["timed_out"] is False


def test_cwd_and_env_merge(executor: RunningExecutor, client: Client) -> None:
    os.makedirs(executor.host_path("/work/sub"), exist_ok=True)
    res = client.run(command="pwd; echo $HOME $FOO; env", cwd="/work/sub", env={"FOO": "bar"})
    lines = res["stdout"].decode().splitlines()
    assert lines[0] == os.path.realpath(executor.host_path("/work/sub"))
    assert lines[1] == "/root bar"  # HOME from the sandbox's environment, FOO from the request
    # Nothing of the executor's own environment leaks into commands, its token least of all.
    assert TOKEN not in res["stdout"].decode()
    assert not any(line.startswith("GROVE_") for line in lines)
    # A request's env overrides the sandbox's; a relative cwd is under the workdir.
    res = client.run(command="pwd; echo $HOME", cwd="sub", env={"HOME": "/elsewhere"})
    assert res["stdout"].decode().splitlines()[1] == "/elsewhere"
    assert res["stdout"].decode().splitlines()[0].endswith("/work/sub")


def test_default_cwd_is_the_workdir(executor: RunningExecutor, client: Client) -> None:
    res = client.run(command=["pwd"])
    assert res["stdout"].decode().strip() == os.path.realpath(executor.host_path("/work"))


def test_missing_cwd_is_404(client: Client) -> None:
    reply = client.exec(command=["true"], cwd="/no/such/dir")
    assert reply.status == 404
    assert "/no/such/dir" in reply.json()["error"]["message"]


def test_timeout_kills_background_children_and_keeps_partial_output(executor: RunningExecutor, client: Client) -> None:
    workers = executor.worker_pids()
    started = time.monotonic()
    res = client.run(command=f"sleep {STRAY} & echo before; sleep {STRAY}", timeout_s=1)
    elapsed = time.monotonic() - started
    assert res["timed_out"] is True
    assert res["stdout"] == b"before\n"
    assert res["exit_code"] == 128 + 9
    assert 1.0 <= res["duration_s"] < 3 and elapsed < 3
    assert wait_gone(STRAY, timeout=1) == []
    # The executor itself is untouched: same worker, still answering.
    assert executor.worker_pids() == workers
    assert client.run(command=["echo", "alive"])["stdout"] == b"alive\n"


def test_timeout_kills_a_child_that_escaped_with_setsid(executor: RunningExecutor) -> None:
    """Streamed, so the test can see both sleeps alive before the deadline and gone after it."""
    client = executor.client()
    resp = client.send(
        "POST",
        "/v1/exec?stream=1",
        json.dumps({"command": f"setsid sleep {STRAY} & echo before; sleep {STRAY}", "timeout_s": 1}).encode(),
        {"Content-Type": "application/json"},
    )
    assert resp.status == 200
    first = json.loads(resp.readline())
    assert first == {"type": "stdout", "data": "before\n"}
    deadline = time.monotonic() + 0.5  # let the backgrounded setsid exec its sleep
    while len(alive := processes_running("sleep", STRAY)) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(alive) == 2, alive
    sessions = {_session_of(pid) for pid in alive}
    assert len(sessions) == 2, "one sleep should have left the command's session"
    frames = [json.loads(line) for line in resp.read().splitlines()]
    client.close()
    assert frames[-1]["type"] == "result"
    assert frames[-1]["result"]["timed_out"] is True
    assert wait_gone(STRAY, timeout=1) == []
    assert executor.client().run(command=["true"])["exit_code"] == 0


def _session_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as fh:
        raw = fh.read()
    return int(raw[raw.rfind(b")") + 2 :].split()[3])


def test_executor_healthy_after_timeouts(executor: RunningExecutor, client: Client) -> None:
    assert client.request("GET", "/healthz").status == 200
    assert client.run(command="echo ok")["stdout"] == b"ok\n"


def test_concurrent_execs_overlap(executor: RunningExecutor) -> None:
    def one(_: int) -> dict[str, Any]:
        c = executor.client()
        try:
            return c.run(command=["sleep", "0.5"])
        finally:
            c.close()

    started = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(8)))
    elapsed = time.monotonic() - started
    assert all(r["exit_code"] == 0 for r in results)
    assert elapsed < 2.0, f"8 concurrent 0.5 s sleeps took {elapsed:.2f}s"


def test_retried_request_id_runs_once(executor: RunningExecutor, client: Client) -> None:
    log = executor.host_path("/work/dedup.log")
    request_id = uuid.uuid4().hex
    fields: dict[str, Any] = {
        "command": f"echo ran >> {log}; sleep 0.6; echo done",
        "request_id": request_id,
    }
    replies: dict[str, Any] = {}

    def first() -> None:
        c = executor.client()
        replies["first"] = c.exec(msgpack_out=True, **fields)
        c.close()

    thread = threading.Thread(target=first)
    thread.start()
    time.sleep(0.2)  # the first call is now running; the retry must wait for it, not run again
    replies["second"] = client.exec(msgpack_out=True, **fields)
    thread.join()
    replies["third"] = client.exec(msgpack_out=True, **fields)  # after it finished
    assert {r.status for r in replies.values()} == {200}
    assert replies["first"].body == replies["second"].body == replies["third"].body
    assert replies["first"].json()["request_id"] == request_id
    assert replies["first"].json()["stdout"] == b"done\n"
    with open(log, encoding="utf-8") as fh:
        assert fh.read() == "ran\n"


def test_a_request_id_reused_for_another_command_is_refused(client: Client) -> None:
    request_id = uuid.uuid4().hex
    assert client.run(command="echo first", request_id=request_id)["exit_code"] == 0
    reused = client.exec(command="echo second", request_id=request_id)
    assert reused.status == 409 and "another command" in reused.json()["error"]["message"]
    again = client.exec(command="echo first", request_id=request_id)  # the same command: the first result
    assert again.status == 200 and again.json()["stdout"] == "first\n"


def test_retried_request_id_streamed_gets_the_result(client: Client) -> None:
    request_id = uuid.uuid4().hex
    first = client.run(command="echo once", request_id=request_id)
    reply = client.request(
        "POST",
        "/v1/exec?stream=1",
        json.dumps({"command": "echo once", "request_id": request_id}).encode(),
        {"Content-Type": "application/json"},
    )
    frames = [json.loads(line) for line in reply.body.splitlines()]
    assert frames == [{"type": "result", "result": {**first, "stdout": "once\n", "stderr": ""}}]
