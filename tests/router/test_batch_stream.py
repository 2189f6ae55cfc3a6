"""A streamed batch create (``"stream": true``, the SDK's ``create_as_ready``) through a real router: each
item answered once, as the plain answer gives it, part by part; a stream cut mid-answer loses nothing."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from grove.client import AsyncGrove, Grove
from grove.client.aio import AsyncSandbox, FirstBeats
from grove.core.errors import GroveError
from tests.support.router_fixtures import RouterProcess, error_of, wait_for

BATCH = "/v1/sandboxes/batch"
# Not the API's defaults (nor test_batch.py's pools'), so no other create on the shared router matches it.
POOL_RESOURCES = {"cpu": 0.5, "memory_mb": 320, "pids_max": 128, "disk_mb": 256}


def _record(shared: dict[str, Any], item: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in {**shared, **item}.items() if k not in ("index", "last_activity")}


def test_a_streamed_answer_gives_each_item_as_the_plain_answer_would(router: RouterProcess, grove: Grove) -> None:
    grove.create_pool("streampool", size=3, resources=POOL_RESOURCES)
    wait_for(lambda: (p := grove.pool("streampool"))["ready"] == 3 and p["starting"] == 0, 90, what="pool filled")
    # Four alike claims (the pool has three: the fourth starts fresh), a bad item, a plain create.
    items: list[dict[str, Any]] = [{"pool": "streampool", "metadata": {"task_id": "s"}, "request_id": f"stream-{i}"}
                                   for i in range(4)]
    items += [{"cpu": "two"}, {"memory_mb": 256, "metadata": {"task_id": "plain"}}]
    reply = router.http("POST", BATCH, json_body={"sandboxes": items, "stream": True}, timeout=120)
    assert reply.status == 200, reply.body[:500]
    assert reply.headers["Content-Type"].startswith("application/x-ndjson")
    parts = [json.loads(line) for line in reply.body.splitlines()]
    assert parts[-1] == {"done": len(items)}
    answers: dict[int, dict[str, Any]] = {}
    for part in parts[:-1]:
        for item in part["sandboxes"]:
            assert item["index"] not in answers, f"item {item['index']} answered twice"
            answers[item["index"]] = _record(part["shared"], item)
    assert sorted(answers) == list(range(len(items)))
    # Of the four alike claims, more than half are answered in the first part (the batch's median in it).
    claimed = [[item["index"] for item in part["sandboxes"] if "id" in item] for part in parts[:-1]]
    assert next(indexes for indexes in claimed if indexes) == [0, 1, 2], parts
    assert answers[4] == {"error": answers[4]["error"]} and answers[4]["error"]["code"] == "bad_request"
    assert "sandboxes[4].cpu" in answers[4]["error"]["message"]
    made = [answers[i] for i in (0, 1, 2, 3, 5)]
    for record in made:  # each is the record the API shows for it
        shown = router.http("GET", f"/v1/sandboxes/{record['id']}").json()
        assert record == {k: v for k, v in shown.items() if k != "last_activity"}
    assert [r["metadata"]["task_id"] for r in made] == ["s"] * 4 + ["plain"]
    assert all(r["resources"] == POOL_RESOURCES for r in made[:4])
    shown = grove.pool("streampool")
    assert (shown["claims"], shown["misses"]) == (3, 1)
    # The same batch again: the same sandboxes, found by their request ids, nothing new.
    again = router.http("POST", BATCH, json_body={"sandboxes": items[:4], "stream": True}, timeout=120)
    ids = {item["id"] for line in again.body.splitlines() for item in json.loads(line).get("sandboxes", [])}
    assert ids == {answers[i]["id"] for i in range(4)}
    for record in made:
        assert grove.attach(record["id"]).exec("true").exit_code == 0
        grove.attach(record["id"]).close()
    grove.delete_pool("streampool")
    bad = router.http("POST", BATCH, json_body={"sandboxes": [{}], "stream": "yes"})
    assert bad.status == 400 and "'stream' must be true or false" in error_of(bad)["message"]


class CuttingProxy:
    """A real TCP proxy on loopback that forwards the router's answer up to its first chunk of body (a
    chunked answer's first part), then closes both connections: a stream cut mid-answer, once. Later
    connections are forwarded whole."""

    def __init__(self, port: int) -> None:
        self._upstream = port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.connections = 0
        self.cut = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._one, args=(client, self.cut == 0), daemon=True).start()
            if self.cut == 0:
                self.cut = 1

    def _one(self, client: socket.socket, cut: bool) -> None:
        with client, socket.create_connection(("127.0.0.1", self._upstream)) as upstream:
            threading.Thread(target=_pipe, args=(client, upstream), daemon=True).start()
            if not cut:
                _pipe(upstream, client)
                return
            raw = b""
            while b"\r\n\r\n" not in raw or not _first_chunk_end(raw):
                data = upstream.recv(65536)
                if not data:
                    break
                raw += data
            end = _first_chunk_end(raw)
            client.sendall(raw[:end] if end else raw)
            with contextlib.suppress(OSError):
                client.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._listener.close()


def _first_chunk_end(raw: bytes) -> int | None:
    """Where the first chunk of a chunked body ends in ``raw`` (headers included), once it is all there."""
    head_end = raw.find(b"\r\n\r\n")
    if head_end < 0:
        return None
    at = head_end + 4
    line_end = raw.find(b"\r\n", at)
    if line_end < 0:
        return None
    size = int(raw[at:line_end].split(b";")[0], 16)
    end = line_end + 2 + size + 2
    return end if len(raw) >= end else None


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)


@pytest.fixture
def cutting_proxy(router: RouterProcess) -> Iterator[CuttingProxy]:
    proxy = CuttingProxy(router.port)
    yield proxy
    proxy.close()


def test_a_stream_cut_mid_answer_is_resent_for_what_it_had_not_given(router: RouterProcess, grove: Grove,
                                                                     cutting_proxy: CuttingProxy) -> None:
    labels = {"batch": "cut-stream"}

    async def run() -> tuple[list[tuple[int, AsyncSandbox | GroveError]], set[str]]:
        async with AsyncGrove(f"http://127.0.0.1:{cutting_proxy.port}", router.key) as client:
            got = [pair async for pair in client.create_as_ready(
                4, memory_mb=256, heartbeat=False, request_id="cut-stream", metadata={"labels": labels})]
            listed = {record["id"] for record in await client.list(labels)}
            for _, sandbox in got:
                assert not isinstance(sandbox, GroveError), sandbox
                await sandbox.close()
            return got, listed

    # Alike plain creates: each its own part (no pool), so the first part leaves before the rest exist.
    got, listed = asyncio.run(run())
    assert cutting_proxy.cut == 1 and cutting_proxy.connections >= 2, "the stream was not cut and resent"
    assert sorted(i for i, _ in got) == [0, 1, 2, 3]  # each item given once
    ids = [sandbox.id for _, sandbox in got if not isinstance(sandbox, GroveError)]
    assert len(set(ids)) == 4
    # The resend found the sandboxes the cut call had made (request ids): four made in all, no more.
    assert listed == set(ids)
    assert not grove.list(labels)


def test_the_sync_client_gives_each_sandbox_as_it_comes_and_may_stop_early(grove: Grove) -> None:
    labels = {"batch": "sync-as-ready"}
    got = list(grove.create_as_ready(2, memory_mb=256, request_id="sync-as-ready", metadata={"labels": labels}))
    assert sorted(i for i, _ in got) == [0, 1]
    for _, sandbox in got:
        assert not isinstance(sandbox, GroveError), sandbox
        assert sandbox.exec("echo ok").stdout == b"ok\n"
    # Stopping after the first: the rest are made all the same, and the same call finds all of them.
    stream = grove.create_as_ready(2, memory_mb=256, request_id="sync-as-ready", metadata={"labels": labels})
    _, first = next(stream)
    stream.close()
    assert not isinstance(first, GroveError) and first.id in {sandbox.id for _, sandbox in got}
    for _, sandbox in got:
        assert not isinstance(sandbox, GroveError)
        sandbox.close()
    assert not grove.list(labels)


def test_parts_are_given_whole_and_their_sandboxes_beat_on_one_timer(router: RouterProcess, grove: Grove) -> None:
    grove.create_pool("partspool", size=3, resources=POOL_RESOURCES)
    wait_for(lambda: (p := grove.pool("partspool"))["ready"] == 3 and p["starting"] == 0, 90, what="pool filled")

    async def run() -> None:
        async with AsyncGrove(router.url, router.key) as client:
            parts = [part async for part in client.create_in_parts(3, pool="partspool", heartbeat_timeout_s=5,
                                                                     request_id="in-parts")]
            # Three alike claims: the first part holds two (the median), the second the last; each whole.
            assert [[i for i, _ in part] for part in parts] == [[0, 1], [2]]
            (_, a), (_, b) = parts[0]
            (_, c), = parts[1]
            assert isinstance(a, AsyncSandbox) and isinstance(b, AsyncSandbox) and isinstance(c, AsyncSandbox)
            # A part's first beats share one timer: the client holds one per part, not one per sandbox.
            assert isinstance(a._heartbeat, FirstBeats) and a._heartbeat is b._heartbeat is not c._heartbeat
            assert len(client._heartbeats) == 2
            shown = {sb.id: (await sb.status())["last_activity"] for sb in (b, c)}
            await a.close()  # leaves its part's timer: the other member still beats
            assert a._heartbeat is None and len(client._heartbeats) == 2
            await asyncio.sleep(2.5)  # a beat every 5 / 3 s: each has beaten once (a status is no activity)
            for sb in (b, c):
                assert (await sb.status())["last_activity"] > shown[sb.id] + 1.0, f"{sb.id} did not beat"
                assert not isinstance(sb._heartbeat, FirstBeats)  # on timers of its own after the first beat
                await sb.close()
            assert not client._heartbeats

    asyncio.run(run())
    grove.delete_pool("partspool")
    # The synchronous client gives the same parts.
    labels = {"batch": "sync-parts"}
    parts = list(grove.create_in_parts(2, memory_mb=256, request_id="sync-parts", metadata={"labels": labels}))
    assert sorted(i for part in parts for i, _ in part) == [0, 1]
    for part in parts:
        for _, sandbox in part:
            assert not isinstance(sandbox, GroveError), sandbox
            assert sandbox.exec("echo ok").stdout == b"ok\n"
            sandbox.close()
    assert not grove.list(labels)
