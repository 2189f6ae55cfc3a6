"""Batch creates (``POST /v1/sandboxes/batch``, the SDK's ``create_many``) through a real router: each item
goes the single create's way (pool claims, fresh starts, request ids) and is answered on its own."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from http.client import HTTPConnection
from typing import Any

import pytest

from grove.client import AsyncGrove, Grove
from grove.client.batch import batch_ask, batch_bodies
from grove.core.errors import BadRequest, BatchFailed, Invalid, NotFound
from grove.core.schema import parse
from router.api.batch_items import Template, items_of
from router.models import CreateRequest, Metadata
from tests.support.router_fixtures import RouterProcess, error_of, wait_for

BATCH = "/v1/sandboxes/batch"
# Not the API's defaults, so no other create on the shared router matches the pool by spec.
POOL_RESOURCES = {"cpu": 0.5, "memory_mb": 288, "pids_max": 128, "disk_mb": 256}


def _batch(router: RouterProcess, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    reply = router.http("POST", BATCH, json_body={"sandboxes": items}, timeout=120)
    assert reply.status == 200, reply.body[:1000]
    answers: list[dict[str, Any]] = reply.json()["sandboxes"]
    assert len(answers) == len(items)
    return answers


def _filled_pool(router: RouterProcess, grove: Grove, name: str, size: int) -> set[str]:
    """A pool of ``size`` made and filled; its members' ids, from their records (the API never shows them)."""
    grove.create_pool(name, size=size, resources=POOL_RESOURCES)
    wait_for(lambda: (p := grove.pool(name))["ready"] == size and p["starting"] == 0, 90, what=f"pool {name} filled")
    return {path.stem for path in router.layout.records.glob("sb-*.json")
            if json.loads(path.read_text()).get("pool") == name}


def test_batch_of_plain_creates(router: RouterProcess, grove: Grove) -> None:
    answers = _batch(router, [{"memory_mb": 256, "env": {"N": str(i)}, "metadata": {"task_id": f"t{i}"}}
                              for i in range(3)])
    assert [a["status"] for a in answers] == ["ready"] * 3
    assert [a["metadata"]["task_id"] for a in answers] == ["t0", "t1", "t2"]  # request order
    assert len({a["id"] for a in answers}) == 3
    assert {a["id"] for a in answers} <= router.live_ids()
    for i, answer in enumerate(answers):
        assert grove.attach(answer["id"]).exec("echo $N").stdout == f"{i}\n".encode()


def test_batch_claims_what_the_pool_has_and_starts_the_rest(router: RouterProcess, grove: Grove) -> None:
    members = _filled_pool(router, grove, "batchpool", 2)
    answers = _batch(router, [{"pool": "batchpool", "env": {"I": str(i)}} for i in range(3)])
    assert [a["status"] for a in answers] == ["ready"] * 3
    assert all(a["resources"] == POOL_RESOURCES for a in answers)
    ids = {a["id"] for a in answers}
    assert len(ids & members) == 2, "the batch did not claim both ready members"
    shown = grove.pool("batchpool")
    assert (shown["claims"], shown["misses"]) == (2, 1)
    for i, answer in enumerate(answers):
        assert grove.attach(answer["id"]).exec("echo $I").stdout == f"{i}\n".encode()
    # Members' journals are made ahead, empty (a claim only writes into its own); the claims' hold their
    # trajectories, and the unclaimed members' (the refill) go with them, with nothing stored.
    journals = router.layout.journals
    assert all((journals / f"{i}.msgpack").stat().st_size > 0 for i in ids)
    wait_for(lambda: (p := grove.pool("batchpool"))["ready"] == 2 and p["starting"] == 0, 90, what="pool refilled")
    refilled = {p.stem for p in router.layout.records.glob("sb-*.json")
                if json.loads(p.read_text()).get("pool") == "batchpool"}
    assert len(refilled) == 2
    assert all((journals / f"{m}.msgpack").stat().st_size == 0 for m in refilled)
    grove.delete_pool("batchpool")
    assert {p.stem for p in journals.glob("sb-*.msgpack")} == ids
    assert all(router.http("GET", f"/v1/trajectories/{m}").status == 404 for m in refilled)


def test_items_alike_but_for_request_ids_claim_as_a_group(router: RouterProcess, grove: Grove) -> None:
    # create_many's shape: one body, each item with its own request id. They are claimed together (one
    # record write for all); what the group cannot serve goes the single create's way, each item answered
    # as a create of its own would be.
    members = _filled_pool(router, grove, "grouppool", 3)
    body = {"pool": "grouppool", "metadata": {"labels": {"batch": "group"}}}
    items = [{**body, "request_id": f"group-{i}"} for i in range(4)]
    items += [{**body, "request_id": "group-1"}, {**body, "request_id": "x" * 201}, {**body}]
    answers = _batch(router, items)
    assert answers[5]["error"]["code"] == "invalid" and "sandboxes[5].request_id" in answers[5]["error"]["message"]
    made = answers[:5] + answers[6:]
    assert [a["status"] for a in made] == ["ready"] * 6, answers
    ids = [a["id"] for a in made]
    assert ids[4] == ids[1], "a request id twice in one batch is one sandbox"
    assert set(ids[:3]) == members, "the group did not claim the pool's members"
    assert ids[3] not in members and ids[5] not in members  # the pool ran dry: started afresh
    shown = grove.pool("grouppool")
    assert (shown["claims"], shown["misses"]) == (3, 2)  # each create the pool could not serve, once
    for i, sandbox_id in enumerate(ids[:4]):
        # The group's record files and journal headers are written behind the answer (the log has the
        # records before it): wait for them.
        path = router.layout.records / f"{sandbox_id}.json"
        record = wait_for(lambda path=path: (r := json.loads(path.read_text()))["pool"] is None and r, 10,
                          what=f"{path.name} written as claimed")
        assert record["request"]["request_id"] == f"group-{i}"
        assert record["request"]["metadata"]["labels"] == {"batch": "group"}
        journal = router.layout.journals / f"{sandbox_id}.msgpack"
        wait_for(lambda journal=journal: journal.stat().st_size > 0, 10, what=f"{journal.name} begun")
        assert grove.attach(sandbox_id).exec("echo ok").stdout == b"ok\n"
    again = _batch(router, items[:5])
    assert [a["id"] for a in again] == ids[:5], "a retried batch must return the same sandboxes"
    grove.delete_pool("grouppool")
    for sandbox_id in set(ids):
        grove.attach(sandbox_id).close()
    assert not set(ids) & router.live_ids()


def test_a_bad_item_gets_its_own_error_and_the_others_are_made(router: RouterProcess, grove: Grove) -> None:
    before = router.live_ids()
    answers = _batch(router, [{"memory_mb": 256}, {"cpu": "two"}, {"pool": "no-such-pool"}, 7,
                              {"memory_mb": 256, "workdir": "relative"}, {"memory_mb": 256, "metadata": {"x": 1}}])
    good = [answers[0]]
    assert answers[0]["status"] == "ready"
    codes = [a["error"]["code"] for a in answers[1:]]
    assert codes == ["bad_request", "not_found", "bad_request", "invalid", "bad_request"], answers
    assert "sandboxes[1].cpu" in answers[1]["error"]["message"]
    assert "no-such-pool" in answers[2]["error"]["message"]
    assert "sandboxes[3] must be an object" in answers[3]["error"]["message"]
    assert "sandboxes[5].metadata" in answers[5]["error"]["message"]
    assert router.live_ids() - before == {a["id"] for a in good}  # nothing half-made for the bad ones
    assert grove.attach(answers[0]["id"]).exec("true").exit_code == 0


def test_a_shared_answer_is_the_plain_answer_given_once(router: RouterProcess, grove: Grove) -> None:
    # "shared": the fields every record has alike once, each record with only what differs: merged, each
    # is the record the plain answer gives (error items whole), whatever the batch mixes.
    items = [{"memory_mb": 256, "metadata": {"task_id": "a"}}, {"cpu": "two"}, {"memory_mb": 256},
             {"memory_mb": 288, "metadata": {"task_id": "a"}}]
    reply = router.http("POST", BATCH, json_body={"sandboxes": items, "shared": True}, timeout=120)
    assert reply.status == 200, reply.body[:500]
    body = reply.json()
    shared, answers = body["shared"], body["sandboxes"]
    assert answers[1]["error"]["code"] == "bad_request" and set(answers[1]) == {"error"}
    assert shared["status"] == "ready" and shared["image"] == "default" and "id" not in shared
    assert "resources" not in shared and "metadata" not in shared  # they differ between the records
    records = [{**shared, **answer} for answer in answers if "id" in answer]
    for record in records:
        plain = router.http("GET", f"/v1/sandboxes/{record['id']}").json()
        assert {k: v for k, v in record.items() if k != "last_activity"} == \
            {k: v for k, v in plain.items() if k != "last_activity"}
    assert [r["resources"]["memory_mb"] for r in records] == [256, 256, 288]
    assert [r["metadata"]["task_id"] for r in records] == ["a", None, "a"]
    for record in records:
        grove.attach(record["id"]).close()
    bad = router.http("POST", BATCH, json_body={"sandboxes": [{}], "shared": "yes"})
    assert bad.status == 400 and "'shared' must be true or false" in error_of(bad)["message"]


def test_a_template_batch_is_its_items_each_with_its_request_id(router: RouterProcess, grove: Grove) -> None:
    # {"template", "request_ids"}: what create_many(n) sends. Item i is the template with request_ids[i],
    # answered as that item in the list form would be: claimed as a group, a request id twice one sandbox,
    # a bad id its own error, a retry (plain or streamed) the same sandboxes.
    members = _filled_pool(router, grove, "tplpool", 2)
    template = {"pool": "tplpool", "metadata": {"labels": {"batch": "template"}}}
    # "tpl 1/é" and "bad\x00id" are not of the plain kind the router checks quickly: the field's own check
    # takes the first (spaces and other characters are fine) and refuses the second.
    request_ids: list[Any] = ["tpl-0", "tpl 1/é", "tpl-2", "tpl 1/é", 7, "x" * 201, "bad\x00id"]
    reply = router.http("POST", BATCH, json_body={"template": template, "request_ids": request_ids}, timeout=120)
    assert reply.status == 200, reply.body[:1000]
    answers = reply.json()["sandboxes"]
    assert len(answers) == 7
    for i in (4, 5, 6):
        assert answers[i]["error"]["code"] in ("bad_request", "invalid"), answers[i]
        assert f"request_ids[{i}]" in answers[i]["error"]["message"]
    assert "must be a string" in answers[4]["error"]["message"]
    too_long = answers[5]["error"]["message"]
    assert too_long.startswith("request_ids[5]: ") and "longer than 200" in too_long, too_long
    assert "NUL byte" in answers[6]["error"]["message"], answers[6]
    made = answers[:4]
    assert [a["status"] for a in made] == ["ready"] * 4, answers
    ids = [a["id"] for a in made]
    assert ids[3] == ids[1], "a request id twice in one batch is one sandbox"
    assert set(ids[:2]) == members and ids[2] not in members  # the pool ran dry: started afresh
    assert all(a["metadata"]["labels"] == {"batch": "template"} and a["resources"] == POOL_RESOURCES for a in made)
    shown = grove.pool("tplpool")
    assert (shown["claims"], shown["misses"]) == (2, 1)
    for i, sandbox_id in enumerate(ids[:3]):
        path = router.layout.records / f"{sandbox_id}.json"
        record = wait_for(lambda path=path: (r := json.loads(path.read_text()))["pool"] is None and r, 10,
                          what=f"{path.name} written as claimed")
        assert record["request"]["request_id"] == request_ids[i]
        assert grove.attach(sandbox_id).exec("echo ok").stdout == b"ok\n"
    again = _batch_template(router, template, request_ids[:3])
    assert [a["id"] for a in again] == ids[:3], "a retried batch must return the same sandboxes"
    # Only plain ids (checked as a whole when all are new and unique): used before, or twice in one batch,
    # each still finds its one sandbox.
    plain = _batch_template(router, template, ["tpl-2", "tpl-0"])
    assert [a["id"] for a in plain] == [ids[2], ids[0]]
    twice = _batch_template(router, template, ["tpl-dup", "tpl-dup"])
    assert twice[0]["status"] == "ready" and twice[0]["id"] == twice[1]["id"] not in ids
    ids.append(twice[0]["id"])
    streamed = router.http("POST", BATCH, json_body={"template": template, "request_ids": request_ids[:3],
                                                     "stream": True}, timeout=120)
    parts = [json.loads(line) for line in streamed.body.splitlines()]
    assert parts[-1] == {"done": 3}
    assert sorted((item["index"], item["id"]) for part in parts[:-1] for item in part["sandboxes"]) == \
        list(enumerate(ids[:3]))
    grove.delete_pool("tplpool")
    for sandbox_id in set(ids):
        grove.attach(sandbox_id).close()
    assert not set(ids) & router.live_ids()


def _batch_template(router: RouterProcess, template: dict[str, Any], request_ids: list[Any]) -> list[dict[str, Any]]:
    reply = router.http("POST", BATCH, json_body={"template": template, "request_ids": request_ids}, timeout=120)
    assert reply.status == 200, reply.body[:1000]
    answers: list[dict[str, Any]] = reply.json()["sandboxes"]
    return answers


def test_a_batch_of_the_wrong_shape_is_refused_whole(router: RouterProcess) -> None:
    before = router.live_ids()
    over = router.http("POST", BATCH, json_body={"sandboxes": [{}] * 1001})
    assert over.status == 400
    message = error_of(over)["message"]
    assert "1,001" in message and "at most 1,000" in message and "split" in message
    for body in ({"sandboxes": []}, {"sandboxes": {}}, {"sandboxes": [{}], "wait": False}, [{}]):
        assert router.http("POST", BATCH, json_body=body).status == 400, body
    # The template form: each mistake named, nothing made, and a bad template is the whole call's error
    # (streamed too: refused before the answer begins).
    for body, said in (({"template": {}, "request_ids": []}, "'request_ids' is empty"),
                       ({"template": {}, "request_ids": "a"}, "'request_ids' must be a list"),
                       ({"request_ids": ["a"]}, "'template' must be a create body"),
                       ({"template": {"request_id": "a"}, "request_ids": ["a"]}, "must not carry a 'request_id'"),
                       ({"template": {}, "request_ids": ["a"], "sandboxes": [{}]}, "not both"),
                       ({"template": {"cpu": "lots"}, "request_ids": ["a"]}, "template"),
                       ({"template": {"cpu": "lots"}, "request_ids": ["a"], "stream": True}, "template"),
                       ({"template": {}, "request_ids": ["a"] * 1001}, "'request_ids' has 1,001 items")):
        reply = router.http("POST", BATCH, json_body=body)
        assert reply.status == 400 and said in error_of(reply)["message"], (body, reply.body[:300])
    assert router.live_ids() == before


def test_a_retried_batch_returns_the_same_sandboxes_even_after_a_disconnect(router: RouterProcess,
                                                                            grove: Grove) -> None:
    items = [{"memory_mb": 256, "request_id": f"retry-batch-{i}", "metadata": {"labels": {"batch": "retry"}}}
             for i in range(3)]
    # The client goes away once the router took the batch up, before the answer: the creates still finish
    # and their sandboxes stay the router's (listed, deletable).
    conn = HTTPConnection("127.0.0.1", router.port, timeout=30)
    conn.request("POST", BATCH, body=json.dumps({"sandboxes": items}).encode(),
                 headers={"Authorization": f"Bearer {router.key}", "Content-Type": "application/json"})
    wait_for(lambda: grove.list({"batch": "retry"}), 60, interval=0.01, what="the batch taken up")
    conn.close()
    listed = wait_for(lambda: (found := grove.list({"batch": "retry"})) and len(found) == 3 and
                      all(s["status"] == "ready" for s in found) and found, 60, what="the batch's sandboxes")
    again = _batch(router, items)
    assert {a["id"] for a in again} == {s["id"] for s in listed}
    # The same request_id with another body is that item's conflict, not the batch's.
    changed = _batch(router, [items[0], {**items[1], "memory_mb": 300}])
    assert changed[0]["id"] == again[0]["id"] and changed[1]["error"]["code"] == "conflict"
    assert len(grove.list({"batch": "retry"})) == 3


def test_sdk_create_many(router: RouterProcess, grove: Grove) -> None:
    made = grove.create_many(2, memory_mb=256, request_id="sdk-many", metadata={"labels": {"batch": "sdk"}})
    assert [sb.exec("echo hi").stdout for sb in made] == [b"hi\n", b"hi\n"]
    assert [sb.id for sb in grove.create_many(2, memory_mb=256, request_id="sdk-many",
                                              metadata={"labels": {"batch": "sdk"}})] == [sb.id for sb in made]
    with pytest.raises(BatchFailed) as failed:
        grove.create_many([{"memory_mb": 256}, {"pool": "no-such-pool"}], heartbeat=False)
    assert set(failed.value.created) == {0} and isinstance(failed.value.errors[1], NotFound)
    kept = failed.value.created[0]
    assert kept.id in router.live_ids()  # made, handed over to the caller, never lost with the error
    kept.close()
    assert kept.id not in router.live_ids()
    for sb in made:
        sb.close()

    async def run() -> list[str]:
        async with AsyncGrove(router.url, router.key) as client:
            sandboxes = await client.create_many([{"env": {"K": "a"}}, {"env": {"K": "b"}}], memory_mb=256)
            outputs = [(await sb.exec("echo $K")).stdout.decode() for sb in sandboxes]
            for sb in sandboxes:
                await sb.close()
            return outputs

    assert asyncio.run(run()) == ["a\n", "b\n"]


@pytest.mark.fast
def test_batch_bodies_and_shape() -> None:
    bodies = batch_bodies(3, "default", {"pool": "p", "request_id": "r", "env": {"A": "1"}})
    assert [b["request_id"] for b in bodies] == ["r-0", "r-1", "r-2"]
    assert all("image" not in b and b["pool"] == "p" for b in bodies)  # a claim's image is its pool's
    mixed = batch_bodies([{"cpu": 2.0}, {"request_id": "own", "image": "other"}], "img", {"cpu": 1.0})
    assert mixed[0]["cpu"] == 2.0 and mixed[0]["image"] == "img" and len(mixed[0]["request_id"]) == 32
    assert mixed[1] == {"image": "other", "cpu": 1.0, "request_id": "own"}
    for wrong in (0, [], True, "3"):
        with pytest.raises(Invalid):
            batch_bodies(wrong, "default", {})  # type: ignore[arg-type]
    assert items_of({"sandboxes": [{}]}) == [{}]
    # A count of alike sandboxes is sent as one template and a request id each; the same fields as the
    # bodies batch_bodies makes, with a given request_id's items numbered alike.
    ask = batch_ask(3, "default", {"pool": "p", "request_id": "r", "env": {"A": "1"}})
    assert ask.bodies is None and ask.template == {"pool": "p", "env": {"A": "1"}}
    assert ask.call([0, 2]) == {"template": {"pool": "p", "env": {"A": "1"}}, "request_ids": ["r-0", "r-2"]}
    parsed = items_of(ask.call([0, 1, 2]))
    assert isinstance(parsed, Template) and len(parsed) == 3
    assert [parsed.req.with_request_id(rid) for rid in parsed.request_ids] == [parse(CreateRequest, b) for b in bodies]
    fresh = batch_ask(2, "img", {"cpu": 1.0})
    assert fresh.template == {"image": "img", "cpu": 1.0} and len(set(fresh.request_ids)) == 2
    assert all(len(rid) == 32 for rid in fresh.request_ids)
    listed = batch_ask([{"cpu": 2.0}], "img", {})
    assert listed.template is None and listed.call([0]) == {"sandboxes": listed.bodies}
    # A batch's items share their parsed create but for the request id: the clone is the dataclass's own.
    base = CreateRequest(pool="p", env={"A": "1"}, metadata=Metadata(labels={"k": "v"}))
    assert base.with_request_id("r-1") == dataclasses.replace(base, request_id="r-1")
    assert base.request_id is None and base.with_request_id(None) == base
    # The summary every answer and claim builds by hand is what the reflective copy would give.
    req = CreateRequest(metadata=Metadata(task_id="t", labels={"k": "v"}))
    assert req.summary()["metadata"] == dataclasses.asdict(req.metadata)
    assert req.summary()["metadata"]["labels"] is not req.metadata.labels
    for shape in ([], {"sandboxes": None}, {"sandboxes": []}, {"sandboxes": [{}] * 1001}, {"x": 1}):
        with pytest.raises(BadRequest):
            items_of(shape)
