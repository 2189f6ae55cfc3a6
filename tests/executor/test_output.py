"""Output of /v1/exec: caps with head+tail, the full-output file, flat memory under a flood, bytes, streaming."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import threading
import time
from typing import Any

import msgpack

from tests.support.executor_fixtures import MSGPACK, Client, RunningExecutor, rss_kib

FLOOD = 200_000_000


def _sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def test_output_at_the_cap_is_whole_and_one_more_byte_truncates(client: Client) -> None:
    whole = client.run(command="head -c 1000 /dev/zero", max_output_bytes=1000)
    assert whole["stdout"] == b"\0" * 1000
    assert whole["stdout_truncated"] is False and whole["stdout_file"] is None
    cut = client.run(command="head -c 1001 /dev/zero >&2", max_output_bytes=1000)
    assert cut["stderr_truncated"] is True and cut["stdout_truncated"] is False
    assert cut["stderr_bytes"] == 1001
    assert cut["stderr_file"] is not None


def test_flood_is_capped_with_head_marker_tail_and_flat_memory(executor: RunningExecutor) -> None:
    """200 MB of stdout: the reply carries head + marker + tail, the file all of it; the worker stays small."""
    (worker,) = executor.worker_pids()
    warm = executor.client()
    warm.run(command="echo warm-up", max_output_bytes=65536)
    rss_before = rss_kib(worker)
    cap = 65536
    outcome: dict[str, Any] = {}

    def flood() -> None:
        c = executor.client(timeout=120)
        outcome["result"] = c.run(
            command=f"echo START; head -c {FLOOD} /dev/zero; echo END", max_output_bytes=cap, timeout_s=60
        )
        c.close()

    rss_peak = rss_before
    small_latencies: list[float] = []
    thread = threading.Thread(target=flood)
    thread.start()
    # While the flood runs: sample the worker's memory and check that small execs still answer quickly.
    while thread.is_alive():
        rss_peak = max(rss_peak, rss_kib(worker))
        t0 = time.monotonic()
        small = warm.run(command=["echo", "small"])
        if thread.is_alive():
            small_latencies.append(time.monotonic() - t0)
        assert small["stdout"] == b"small\n"
        time.sleep(0.02)
    thread.join()
    warm.close()
    rss_after = rss_kib(worker)

    res = outcome["result"]
    total = len(b"START\n") + FLOOD + len(b"END\n")
    assert res["exit_code"] == 0 and res["timed_out"] is False
    assert res["stdout_truncated"] is True
    assert res["stdout_bytes"] == total
    out = res["stdout"]
    assert out.startswith(b"START\n" + b"\0" * (cap // 2 - 6))
    assert out.endswith(b"\0" * (cap // 2 - 4) + b"END\n")
    marker = out[cap // 2 : len(out) - cap // 2]
    match = re.fullmatch(rb"\n\[\.\.\. grove: (\d+) bytes cut of (\d+); full output in (\S+) \.\.\.\]\n", marker)
    assert match, marker
    assert int(match[1]) == total - cap and int(match[2]) == total
    assert match[3].decode() == res["stdout_file"]

    full = executor.host_path(res["stdout_file"])
    assert os.path.realpath(full).startswith(os.path.realpath(executor.root) + os.sep)
    assert os.path.getsize(full) == total
    assert _sha256_file(full) == res["stdout_sha256"]
    os.unlink(full)

    assert small_latencies, "the flood ended before any concurrent exec could overlap it"
    assert max(small_latencies) < 1.0, small_latencies
    growth_mb = (max(rss_peak, rss_after) - rss_before) / 1024
    assert growth_mb < 50, f"executor RSS grew by {growth_mb:.1f} MB during a 200 MB flood"


def test_binary_output_round_trips_through_msgpack(executor: RunningExecutor, client: Client) -> None:
    data = bytes(range(256)) * 4
    with open(executor.host_path("/work/all-bytes.bin"), "wb") as fh:
        fh.write(data)
    res = client.run(command=["cat", "all-bytes.bin"])
    assert res["stdout"] == data
    assert res["stdout_sha256"] == hashlib.sha256(data).hexdigest()


def test_binary_output_in_json_is_text_with_replacements(executor: RunningExecutor, client: Client) -> None:
    data = bytes(range(256))
    with open(executor.host_path("/work/all-bytes-1.bin"), "wb") as fh:
        fh.write(data)
    reply = client.exec(command=["cat", "all-bytes-1.bin"])
    assert reply.status == 200
    assert reply.headers["Content-Type"].startswith("application/json")
    text = reply.json()["stdout"]
    assert text == data.decode("utf-8", "replace")
    assert "\ufffd" in text and text[:128] == data[:128].decode("ascii")


def test_stream_ndjson_chunks_arrive_before_the_result(client: Client) -> None:
    started = time.monotonic()
    resp = client.send(
        "POST",
        "/v1/exec?stream=1",
        json.dumps({"command": "echo a; sleep 0.4; echo b >&2; echo c; exit 5"}).encode(),
        {"Content-Type": "application/json"},
    )
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("application/x-ndjson")
    first = json.loads(resp.readline())
    first_at = time.monotonic() - started
    assert first == {"type": "stdout", "data": "a\n"}
    assert first_at < 0.35, f"first chunk only after {first_at:.2f}s: not streamed"
    frames = [first] + [json.loads(line) for line in resp.read().splitlines()]
    client.close()
    assert [f["type"] for f in frames][-1] == "result"
    assert all(f["type"] in ("stdout", "stderr") for f in frames[:-1])
    assert "".join(f["data"] for f in frames if f["type"] == "stdout") == "a\nc\n"
    assert "".join(f["data"] for f in frames if f["type"] == "stderr") == "b\n"
    result = frames[-1]["result"]
    assert result["exit_code"] == 5 and result["stdout"] == "a\nc\n" and result["stderr"] == "b\n"


def test_stream_msgpack_frames_carry_bytes(client: Client) -> None:
    data = bytes(range(256))
    resp = client.send(
        "POST",
        "/v1/exec?stream=1",
        msgpack.packb({"command": ["cat"], "stdin": data}),
        {"Content-Type": MSGPACK, "Accept": MSGPACK},
    )
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith(MSGPACK)
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(resp.read())
    frames = list(unpacker)
    assert frames[-1]["type"] == "result"
    assert b"".join(f["data"] for f in frames[:-1] if f["type"] == "stdout") == data
    assert frames[-1]["result"]["stdout"] == data


def test_stream_is_capped_like_the_result(client: Client) -> None:
    reply = client.request(
        "POST",
        "/v1/exec?stream=1",
        msgpack.packb({"command": "head -c 1000000 /dev/zero", "max_output_bytes": 1000}),
        {"Content-Type": MSGPACK, "Accept": MSGPACK},
    )
    frames = list(msgpack.Unpacker(io.BytesIO(reply.body), raw=False))
    streamed = sum(len(f["data"]) for f in frames if f["type"] == "stdout")
    assert streamed == 1000
    result = frames[-1]["result"]
    assert result["stdout_truncated"] is True and result["stdout_bytes"] == 1_000_000


def test_stream_reports_start_errors_as_http_errors(client: Client) -> None:
    reply = client.request(
        "POST",
        "/v1/exec?stream=1",
        json.dumps({"command": ["true"], "cwd": "/missing"}).encode(),
        {"Content-Type": "application/json"},
    )
    assert reply.status == 404
    assert reply.json()["error"]["code"] == "not_found"
