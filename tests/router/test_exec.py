"""Exec through a real router into a real sandbox: argv and shell, exit codes, stdin, timeouts, msgpack, streams."""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import json
import os
import time

import msgpack
import pytest

from grove.client import AsyncGrove, ExecResult, Grove, Sandbox
from tests.support.executor_fixtures import MSGPACK
from tests.support.router_fixtures import RouterProcess, error_of


@pytest.fixture(scope="module")
def router(any_router: RouterProcess) -> RouterProcess:
    """This module runs against both backends (local and the Knative stand-in)."""
    return any_router


def test_shell_string_and_argv(sandbox: Sandbox) -> None:
    r = sandbox.exec("echo $((6*7)) && echo err >&2")
    assert (r.exit_code, r.stdout, r.stderr, r.timed_out) == (0, b"42\n", b"err\n", False)
    assert r.ok and r.duration_s >= 0
    r = sandbox.exec(["printf", "%s|", "a b", "$HOME", "*"])
    assert r.stdout == b"a b|$HOME|*|"  # argv: no shell expansion
    r = sandbox.exec(["python3", "-c", "import sys; print(sys.argv[1:])", "x", "y"])
    assert r.stdout == b"['x', 'y']\n"


@pytest.mark.parametrize("code", [0, 1, 3, 127, 255])
def test_exit_codes(sandbox: Sandbox, code: int) -> None:
    r = sandbox.exec(f"exit {code}")
    assert r.exit_code == code and r.ok is (code == 0)


def test_signal_exit_code_and_missing_program(router: RouterProcess, sandbox: Sandbox) -> None:
    assert sandbox.exec("kill -TERM $$").exit_code == 128 + 15
    reply = router.http("POST", f"/v1/sandboxes/{sandbox.id}/exec", json_body={"command": ["no-such-program"]})
    assert reply.status == 404 and "no-such-program" in error_of(reply)["message"]
    assert sandbox.exec("no-such-program").exit_code == 127  # via the shell it is an exit code


@pytest.mark.local_only  # the stand-in runs pods on the host, without a root of their own
def test_cwd_env_and_workdir(sandbox: Sandbox) -> None:
    assert sandbox.exec("pwd").stdout == b"/workspace\n"
    # A container's usual environment: PATH and HOME are set, ~ works.
    r = sandbox.exec("echo $HOME; cd ~ && pwd; echo $PATH")
    assert r.stdout == b"/root\n/root\n/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n", r.stderr
    assert sandbox.exec("pwd", cwd="/tmp").stdout == b"/tmp\n"
    assert sandbox.exec("echo $GREETING", env={"GREETING": "hello"}).stdout == b"hello\n"
    assert sandbox.exec("echo ${GREETING:-unset}").stdout == b"unset\n"  # env is per call


def test_stdin(sandbox: Sandbox) -> None:
    assert sandbox.exec("tr a-z A-Z", stdin="hello\n").stdout == b"HELLO\n"
    blob = os.urandom(300_000)
    r = sandbox.exec(["sha256sum"], stdin=blob)
    assert r.stdout.split()[0].decode() == hashlib.sha256(blob).hexdigest()
    assert sandbox.exec("cat", stdin=b"").stdout == b""


def test_timeout_keeps_partial_output_and_kills_the_group(sandbox: Sandbox) -> None:
    # A length of sleep no other test uses: the stand-in cluster's pods share the host's processes, where
    # other tests' `sleep 30`s may be running.
    nap = f"30.{os.getpid()}{time.monotonic_ns() % 10**6:06d}"
    started = time.monotonic()
    r = sandbox.exec(f"echo before; sleep {nap} & sleep {nap}; echo never", timeout_s=1)
    assert r.timed_out and not r.ok
    assert r.stdout == b"before\n"
    assert 0.9 < r.duration_s < 5 and time.monotonic() - started < 6
    # The background sleep of the timed-out command's group is gone too.
    left = sandbox.exec(f"ps -eo args | grep -c '^sleep {nap}$' || true").stdout.strip()
    assert left == b"0"
    assert sandbox.exec("echo still here").stdout == b"still here\n"


@pytest.mark.local_only  # the stand-in runs pods on the host, without a root of their own
def test_output_cap(sandbox: Sandbox) -> None:
    r = sandbox.exec("head -c 100000 /dev/zero", max_output_bytes=1000)
    assert r.stdout_truncated and r.stdout_bytes == 100000
    assert r.stdout.startswith(b"\0" * 500) and r.stdout.endswith(b"\0" * 500) and b"99000 bytes cut" in r.stdout
    assert r.stdout_file and sandbox.exec(["wc", "-c", r.stdout_file]).stdout.split()[0] == b"100000"


def test_msgpack_binary_round_trip(router: RouterProcess, sandbox: Sandbox) -> None:
    blob = bytes(range(256)) * 64
    reply = router.http(
        "POST", f"/v1/sandboxes/{sandbox.id}/exec", msgpack_body={"command": ["cat"], "stdin": blob},
        headers={"Accept": MSGPACK},
    )
    assert reply.status == 200 and reply.headers["Content-Type"].startswith(MSGPACK)
    result = msgpack.unpackb(reply.body, raw=False)
    assert result["stdout"] == blob and isinstance(result["stdout"], bytes)
    # The SDK speaks msgpack: invalid UTF-8 survives untouched.
    r = sandbox.exec(["python3", "-c", "import sys; sys.stdout.buffer.write(bytes(range(256)))"])
    assert r.stdout == bytes(range(256))
    # JSON out: text with invalid bytes replaced, still valid JSON.
    reply = router.http("POST", f"/v1/sandboxes/{sandbox.id}/exec",
                        json_body={"command": "printf 'a\\377b'"})
    assert reply.headers["Content-Type"].startswith("application/json")
    assert json.loads(reply.body)["stdout"] == "a\ufffdb"


def test_request_id_never_runs_twice(router: RouterProcess, sandbox: Sandbox) -> None:
    # A relative path: the sandbox's own workdir on either backend.
    body = {"command": "echo x >> once.txt; wc -l < once.txt", "request_id": "exec-once-1"}
    first = router.http("POST", f"/v1/sandboxes/{sandbox.id}/exec", json_body=body)
    second = router.http("POST", f"/v1/sandboxes/{sandbox.id}/exec", json_body=body)
    assert first.status == second.status == 200
    assert first.json()["stdout"] == second.json()["stdout"] == "1\n"
    assert sandbox.exec("wc -l < once.txt").stdout == b"1\n"
    # The trajectory shows the command once, like the sandbox saw it.
    steps = router.http("GET", f"/v1/sandboxes/{sandbox.id}/trajectory").json()["steps"]
    assert [s.get("request_id") for s in steps].count("exec-once-1") == 1


def test_stream_over_the_wire(router: RouterProcess, sandbox: Sandbox) -> None:
    """``?stream=1``: chunks arrive while the command still runs, the result comes last."""
    resp, conn = router.send(
        "POST", f"/v1/sandboxes/{sandbox.id}/exec?stream=1",
        json_body={"command": "echo one; sleep 1; echo two >&2; sleep 0.3; echo three"},
    )
    try:
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("application/x-ndjson")
        started = time.monotonic()
        first = json.loads(resp.readline())
        first_at = time.monotonic() - started
        frames = [first] + [json.loads(line) for line in resp if line.strip()]
        total = time.monotonic() - started
    finally:
        conn.close()
    assert first == {"type": "stdout", "data": "one\n"}
    assert first_at < 0.8 < total  # the first chunk came before the command ended
    assert [f["type"] for f in frames] == ["stdout", "stderr", "stdout", "result"]
    assert frames[-1]["result"]["exit_code"] == 0 and frames[-1]["result"]["stdout"] == "one\nthree\n"


def test_stream_through_the_sdk(router: RouterProcess, sandbox: Sandbox) -> None:
    async def run() -> list[tuple[str, object]]:
        async with AsyncGrove(router.url, router.key) as client:
            handle = await client.attach(sandbox.id)
            return [ev async for ev in handle.exec_stream("for i in 1 2 3; do echo $i; done; exit 4")]

    events = asyncio.run(run())
    out = b"".join(data for kind, data in events if kind == "stdout" and isinstance(data, bytes))
    assert out == b"1\n2\n3\n"
    kind, result = events[-1]
    assert kind == "result" and isinstance(result, ExecResult) and result.exit_code == 4


def test_concurrent_execs_in_one_sandbox(router: RouterProcess, sandbox: Sandbox) -> None:
    async def run() -> list[ExecResult]:
        async with AsyncGrove(router.url, router.key) as client:
            handle = await client.attach(sandbox.id)
            return await asyncio.gather(*(handle.exec(f"sleep 0.5; echo {i}") for i in range(8)))

    started = time.monotonic()
    results = asyncio.run(run())
    assert [r.stdout for r in results] == [f"{i}\n".encode() for i in range(8)]
    assert time.monotonic() - started < 3.5  # they ran side by side, not one after another


def test_exec_errors_pass_through_unchanged(router: RouterProcess, sandbox: Sandbox) -> None:
    path = f"/v1/sandboxes/{sandbox.id}/exec"
    cases = [
        ({"command": "true", "timeout_s": -1}, 422, "timeout_s"),
        ({"command": "true", "timeout_s": "soon"}, 400, "timeout_s"),
        ({"command": "true", "bogus": 1}, 400, "bogus"),
        ({"command": ""}, 422, "command"),
        ({"command": 5}, 400, "command"),
        ({"command": "true", "max_output_bytes": 1}, 422, "max_output_bytes"),
        ({"command": "true", "cwd": "/no/such/dir"}, 404, "/no/such/dir"),
    ]
    for body, status, needle in cases:
        reply = router.http("POST", path, json_body=body)
        assert reply.status == status, (body, reply.body)
        assert needle in error_of(reply)["message"], (body, reply.body)
    reply = router.http("POST", path, b"{not json", headers={"Content-Type": "application/json"})
    assert reply.status == 400 and "JSON" in error_of(reply)["message"]


def test_exec_latency_is_small(sandbox: Sandbox) -> None:
    sandbox.exec("true")
    times = []
    for _ in range(20):
        t = time.monotonic()
        sandbox.exec("true")
        times.append(time.monotonic() - t)
    times.sort()
    assert times[len(times) // 2] < 0.1, times


def test_grove_client_works_from_threads(router: RouterProcess, sandbox: Sandbox) -> None:
    client: Grove
    with router.client() as client:
        handle = client.attach(sandbox.id)
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            outs = list(pool.map(lambda i: handle.exec(f"echo {i}").stdout, range(8)))
    assert outs == [f"{i}\n".encode() for i in range(8)]


@pytest.mark.local_only  # a Knative revision's timeout lowers this sandbox's longest call below the published one
def test_the_published_bounds_are_the_enforced_ones(router: RouterProcess, sandbox: Sandbox) -> None:
    """``/v1/openapi.json`` says how long a command may run and how much output a reply may carry: exactly those
    maxima (and minima) are accepted, and one step past each is a 422 naming the field."""
    spec = router.http("GET", "/v1/openapi.json").json()
    exec_op = spec["paths"]["/v1/sandboxes/{id}/exec"]["post"]
    props = exec_op["requestBody"]["content"]["application/json"]["schema"]["properties"]
    path = f"/v1/sandboxes/{sandbox.id}/exec"
    for name, step in (("timeout_s", 0.5), ("max_output_bytes", 1)):
        lo, hi = props[name]["minimum"], props[name]["maximum"]
        for ok in (lo, hi):
            reply = router.http("POST", path, json_body={"command": ["true"], name: ok})
            # Accepted: it ran (a 1 ms timeout may well end `true` before it exits, and says so).
            assert reply.status == 200 and "exit_code" in reply.json(), (name, ok, reply.body)
        for bad in (hi + step, lo - step if lo - step > 0 else lo / 2):
            reply = router.http("POST", path, json_body={"command": ["true"], name: bad})
            assert reply.status == 422 and name in error_of(reply)["message"], (name, bad, reply.body)
    assert props["timeout_s"]["maximum"] == 86400 and props["max_output_bytes"]["maximum"] == 64 << 20
