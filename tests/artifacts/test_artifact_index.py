"""The artifact index and the retention rules on the real embedded S3 server (weed mini)."""

from __future__ import annotations

import pytest
from minio.commonconfig import ENABLED, Filter
from minio.lifecycleconfig import Expiration, LifecycleConfig, Rule

from artifacts import catalog, retention
from artifacts.artifact_index import ArtifactIndex
from artifacts.catalog import Query
from artifacts.retention import Retention
from artifacts.store import ObjectStore
from grove.core.artifact import Artifact
from grove.core.errors import Invalid, NotFound


def entry(sandbox: str, path: str, **over: object) -> Artifact:
    fields = {"sandbox_id": sandbox, "path": path, "key": catalog.artifact_key(sandbox, path), "size": 1,
              "sha256": "0" * 64, "created_at": 1.0}
    return Artifact(**{**fields, **over})  # type: ignore[arg-type]


def test_pages_by_every_index(object_store: ObjectStore) -> None:
    index = ArtifactIndex(object_store)
    for sandbox, task, run in (("sb-a", "t1", "r1"), ("sb-b", "t2", "r1"), ("sb-c", "t1", None)):
        for i in range(5):
            index.record(entry(sandbox, f"/w/f{i}", task_id=task, run_id=run))

    def walk(query: Query, limit: int) -> list[list[tuple[str, str]]]:
        out, token = [], None
        while True:
            page = index.page(query, limit, token)
            out.append([(e.sandbox_id, e.path) for e in page.entries])
            if page.next_token is None:
                return out
            token = page.next_token

    by_run = walk(Query(run_id="r1"), 3)
    assert [len(p) for p in by_run] == [3, 3, 3, 1]
    assert [x for p in by_run for x in p] == [(s, f"/w/f{i}") for s in ("sb-a", "sb-b") for i in range(5)]
    assert [len(p) for p in walk(Query(task_id="t1"), 5)] == [5, 5]
    assert [len(p) for p in walk(Query(sandbox_id="sb-c"), 10)] == [5]
    assert [x for p in walk(Query(run_id="r1", task_id="t2"), 2) for x in p] == [("sb-b", f"/w/f{i}") for i in range(5)]
    assert sum(len(p) for p in walk(Query(), 7)) == 15
    assert walk(Query(run_id="nothing"), 3) == [[]]
    assert index.entry("sb-b", "/w/f3").task_id == "t2"
    with pytest.raises(NotFound, match="/w/nope"):
        index.entry("sb-b", "/w/nope")
    with pytest.raises(Invalid):
        index.page(Query(), 0)
    # An object in the index that grove did not write is skipped, not fatal to the listing.
    object_store.put_bytes("index/artifacts/by-sandbox/sb-c/zzz", b"garbage")
    assert len([x for p in walk(Query(sandbox_id="sb-c"), 2) for x in p]) == 5


def test_retention_rules_are_set_read_back_and_leave_other_rules_alone(object_store: ObjectStore) -> None:
    mine = Rule(ENABLED, rule_filter=Filter(prefix="scratch/"), rule_id="operator-scratch",
                expiration=Expiration(days=1))
    object_store.set_lifecycle(LifecycleConfig([mine]))
    assert retention.apply(object_store, Retention(artifacts_days=7, trajectories_days=365))
    assert retention.read(object_store) == {
        "grove-artifacts": ("artifacts/", 7), "grove-artifact-index": ("index/artifacts/", 7),
        "grove-trajectories": ("trajectories/", 365), "grove-trajectory-index": ("index/by-", 365),
    }
    assert not retention.apply(object_store, Retention(artifacts_days=7))  # already so: not rewritten
    # 0 removes grove's artifact rules (kept for ever); None leaves the trajectory rules as they are.
    assert retention.apply(object_store, Retention(artifacts_days=0))
    assert set(retention.read(object_store)) == {"grove-trajectories", "grove-trajectory-index"}
    config = object_store.lifecycle()
    assert config is not None and "operator-scratch" in {r.rule_id for r in config.rules}
    with pytest.raises(Invalid, match="retention"):
        Retention(artifacts_days=-1)
