"""The artifact index's layout, entries and page tokens (pure logic)."""

from __future__ import annotations

import pytest

from artifacts import catalog
from artifacts.catalog import Query
from grove.core.artifact import Artifact, fetch_route
from grove.core.errors import BadRequest, Invalid

pytestmark = pytest.mark.fast
SHA = "ab" * 32


def entry(**over: object) -> Artifact:
    fields = {"sandbox_id": "sb-0123456789abcdef", "path": "/workspace/out/a b.txt", "size": 3, "sha256": SHA,
              "created_at": 1.5, "key": "artifacts/sb-0123456789abcdef/workspace/out/a%20b.txt"}
    return Artifact(**{**fields, **over})  # type: ignore[arg-type]


def test_paths_are_absolute_and_normalized() -> None:
    assert catalog.normalize_path("workspace/./out//x") == "/workspace/out/x"
    assert catalog.normalize_path("/../../etc/passwd") == "/etc/passwd"
    for bad in ("", "a\0b"):
        with pytest.raises(Invalid):
            catalog.normalize_path(bad)
    assert catalog.artifact_key("sb-1", "/w/a b?.txt") == "artifacts/sb-1/w/a%20b%3F.txt"
    assert fetch_route("sb-1", "/w/a b.txt") == "/v1/artifacts/sb-1/w/a%20b.txt"


def test_an_entry_is_indexed_by_run_task_and_sandbox_with_by_sandbox_last() -> None:
    keys = catalog.entry_keys(entry(task_id="t/1", run_id="r 1"))
    tail = "sb-0123456789abcdef/%2Fworkspace%2Fout%2Fa%20b.txt"
    assert keys == [f"index/artifacts/by-run/r%201/{tail}", f"index/artifacts/by-task/t%2F1/{tail}",
                    f"index/artifacts/by-sandbox/{tail}"]
    assert catalog.entry_keys(entry()) == [f"index/artifacts/by-sandbox/{tail}"]
    assert keys[-1] == catalog.by_sandbox_key("sb-0123456789abcdef", "/workspace/out/a b.txt")


def test_entries_round_trip_and_bad_ones_are_refused() -> None:
    e = entry(kind="stdout", run_id="r", etag="x")
    assert Artifact.from_json(e.to_json()) == e
    assert e.public()["fetch"] == "/v1/artifacts/sb-0123456789abcdef/workspace/out/a%20b.txt"
    for bad in (b"not json", b"[]", b'{"sandbox_id": "x"}'):
        with pytest.raises(Invalid):
            Artifact.from_json(bad)
    with pytest.raises(Invalid, match="kind"):
        entry(kind="movie")
    with pytest.raises(Invalid, match="sha256"):
        entry(sha256="ABC")


def test_a_query_lists_the_narrowest_prefix() -> None:
    assert Query().prefix() == "index/artifacts/by-sandbox/"
    assert Query(sandbox_id="sb-1").prefix() == "index/artifacts/by-sandbox/sb-1/"
    assert Query(task_id="t", sandbox_id="sb-1").prefix() == "index/artifacts/by-task/t/sb-1/"
    assert Query(run_id="r", task_id="t").prefix() == "index/artifacts/by-run/r/"
    assert Query(run_id="r", task_id="t").matches(entry(run_id="r", task_id="t"))
    assert not Query(run_id="r", task_id="t").matches(entry(run_id="r", task_id="u"))


def test_page_tokens_belong_to_their_listing() -> None:
    prefix = Query(run_id="r").prefix()
    token = catalog.page_token(prefix + "sb-1/%2Fx")
    assert catalog.after_key(token, prefix) == prefix + "sb-1/%2Fx"
    for bad in (token + "!!", catalog.page_token("index/artifacts/by-run/other/sb-1/x"), ""):
        with pytest.raises(BadRequest, match="page_token"):
            catalog.after_key(bad, prefix)
