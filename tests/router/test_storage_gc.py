"""Storage that cleans itself (issue 32): what each project holds, and collection past each project's retention
that never takes what a live sandbox owns, nor another project's, nor anything newer.

One router for the module (its embedded S3, no scheduled passes) with two projects of their own retention:
``gca`` keeps things :data:`R_S` seconds, ``gcb`` a day; the default project has none. Everything a test collects
or keeps was made by grove in the test (sandboxes, pushes, truncated outputs stored whole, run files), and every
check is made where a pipeline would: through the API, the CLI, and in the router's bucket.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from artifacts.s3config import S3Config
from artifacts.store import ObjectStore
from router.housekeeping.usage import StorageUsage
from router.projects.files import ProjectFiles
from router.projects.model import Project
from tests.support.executor_fixtures import Reply
from tests.support.imagetools import make_busybox_rootfs
from tests.support.router_fixtures import RouterProcess, router_state, wait_for

TAG = secrets.token_hex(3)
R_DAYS = 0.0001
R_S = R_DAYS * 86400  # 8.64 s: what is made before a wait of this long is past gca's retention, what after is not
ALL = {"X-Grove-Project": "*"}
KINDS = ("trajectories", "artifacts", "outputs", "runs")
PREFIXES = ("trajectories/", "index/by-", "artifacts/", "index/artifacts/", "runs/")
"""Where the default project's things are in the bucket (another project's: all of ``projects/<name>/``)."""


@pytest.fixture(scope="module")
def router() -> Iterator[RouterProcess]:
    """This module's router: projects gca (retention R_S) and gcb (a day); no scheduled passes."""
    with router_state(start=False) as r:
        files = ProjectFiles(r.state_dir)
        files.save(Project("gca", retention_days=R_DAYS))
        files.save(Project("gcb", retention_days=1.0))
        r.up_args = ("--gc-interval-h", "0")
        r.start()
        try:
            yield r
        finally:
            for sandbox in r.http("GET", "/v1/sandboxes", headers=ALL).json().get("sandboxes", []):
                r.http("DELETE", f"/v1/sandboxes/{sandbox['id']}")


@pytest.fixture(scope="module")
def bucket(router: RouterProcess) -> Iterator[ObjectStore]:
    """The router's bucket, with its embedded server's credentials (grove's own, behind its back)."""
    state = json.loads((router.layout.s3 / "grove-s3.json").read_text())
    store = ObjectStore(S3Config(endpoint=f"http://127.0.0.1:{state['ports']['s3.port']}",
                                 access_key=state["access_key"], secret_key=state["secret_key"]))
    yield store
    store.close()


def ok(reply: Reply, status: int = 200) -> Any:
    assert reply.status == status, (reply.status, reply.body[:500])
    return reply.json() if reply.body else None


def things(router: RouterProcess, key: str, run: str, *, end: bool = True) -> str:
    """A sandbox of the key's project that leaves everything a sandbox stores: a pushed file, a truncated
    command's full output, its trajectory (when ``end``); and a file of its rollout run."""
    meta = {"task_id": f"task-{TAG}", "model": f"model-{TAG}", "harness": f"harness-{TAG}", "labels": {"run_id": run}}
    sid = str(ok(router.http("POST", "/v1/sandboxes", json_body={"metadata": meta}, key=key), 201)["id"])
    ok(router.http("POST", f"/v1/sandboxes/{sid}/exec", key=key, json_body={
        "command": f"echo {sid} > /workspace/out.txt; yes {sid} | head -c 50000", "max_output_bytes": 1024}))
    ok(router.http("POST", f"/v1/sandboxes/{sid}/artifacts", json_body={"paths": ["out.txt"]}, key=key))
    wait_for(lambda: {a["kind"] for a in ok(router.http("GET", f"/v1/sandboxes/{sid}/artifacts", key=key))[
        "artifacts"]} == {"file", "stdout"}, 30, what=f"{sid}'s full output stored")
    ok(router.http("PUT", f"/v1/runs/{run}/files/summary.json", json.dumps({"run": run}).encode(), key=key), 201)
    if end:
        ok(router.http("DELETE", f"/v1/sandboxes/{sid}", key=key))
        wait_for(lambda: not router.layout.journal(sid).exists(), 30, what=f"{sid}'s trajectory stored")
    return sid


def listing(bucket: ObjectStore) -> dict[str, int]:
    """Every key of the bucket and its size."""
    return {info.key: info.size for info in bucket.list("")}


def part(found: dict[str, int], project: str) -> dict[str, int]:
    """The keys of one project's things in a listing (the default project's: under its kinds' prefixes)."""
    if project == "default":
        return {k: v for k, v in found.items() if k.startswith(PREFIXES)}
    return {k: v for k, v in found.items() if k.startswith(f"projects/{project}/")}


def check_report(report: dict[str, Any], found: dict[str, int]) -> None:
    """The report's figures are what S3 lists, project by project and kind by kind."""
    for shown in report["projects"]:
        mine = part(found, shown["project"])
        inner = {re.sub(r"^projects/[^/]+/", "", k): v for k, v in mine.items()}
        assert shown["stored_bytes"] == sum(mine.values()), shown
        assert sum(t["bytes"] for t in shown["kinds"].values()) == sum(mine.values()), shown
        records = [k for k in inner if k.startswith("trajectories/") and k.endswith(".msgpack")]
        runs = [k for k in inner if k.startswith("runs/")]
        assert shown["kinds"]["trajectories"]["count"] == len(records), shown
        assert shown["kinds"]["runs"]["count"] == len(runs), shown
        assert shown["kinds"]["runs"]["bytes"] == sum(inner[k] for k in runs), shown
        assert shown["kinds"]["artifacts"]["count"] + shown["kinds"]["outputs"]["count"] == len(
            [k for k in inner if k.startswith("artifacts/")]), shown


def area(key: str) -> str:
    """Which part of a project's keys ``key`` is in (``index/by-task``, ``index/artifacts/by-run``, ``runs``)."""
    parts = re.sub(r"^projects/[^/]+/", "", key).split("/")
    return "/".join(parts[:3] if parts[:2] == ["index", "artifacts"] else parts[:2] if parts[0] == "index" else
                    parts[:1])


def removed(result: dict[str, Any], project: str) -> dict[str, list[str]]:
    """The owners' ids a pass removed (or would remove) of one project, per kind."""
    shown = next(p for p in result["projects"] if p["project"] == project)
    return {kind: shown["removed"][kind]["ids"] for kind in KINDS}


def test_gc_removes_exactly_what_is_past_retention_and_owned_by_nothing_live(
    router: RouterProcess, bucket: ObjectStore
) -> None:
    gca, gcb = router.member_key("gca", "gca-member"), router.member_key("gcb", "gcb-member")
    runs = {name: f"{name}-{TAG}" for name in ("old", "live", "new", "b", "d")}
    old = things(router, gca, runs["old"])
    live = things(router, gca, runs["live"], end=False)
    other = things(router, gcb, runs["b"])
    default = things(router, router.key, runs["d"])
    made = time.monotonic()
    # The report's figures are S3's, before a pass too.
    check_report(ok(router.http("GET", "/v1/storage", headers=ALL)), listing(bucket))
    time.sleep(max(0.0, made + R_S + 1.5 - time.monotonic()))  # S3 stamps whole seconds: past R_S by a margin
    new = things(router, gca, runs["new"])

    before = listing(bucket)
    dry = ok(router.http("POST", "/v1/storage/gc", json_body={"dry_run": True}, headers=ALL))
    assert listing(bucket) == before, "a dry run removed something"
    assert dry["dry_run"] is True
    expected = {"trajectories": [old], "artifacts": [old], "outputs": [old], "runs": [runs["old"]]}
    assert removed(dry, "gca") == expected
    # gcb's as old are within its day, and the default project has no retention at all.
    assert removed(dry, "gcb") == {kind: [] for kind in KINDS}
    assert removed(dry, "default") == {kind: [] for kind in KINDS}
    gca_dry = next(p for p in dry["projects"] if p["project"] == "gca")
    # The live sandbox's pushed file and full output, and its run's file: as old, kept for it.
    assert gca_dry["kept_live"]["items"] == 3, gca_dry

    doomed = {k: v for k, v in part(before, "gca").items() if old in k or f"/runs/{runs['old']}/" in k}
    # Every place the old sandbox's things were: its record, each trajectory index, the bytes of its pushed file
    # and its full output, each artifact index of both; and its run's file.
    assert {area(k) for k in doomed} == {
        "trajectories", "index/by-id", "index/by-task", "index/by-model", "index/by-harness", "artifacts",
        "index/artifacts/by-sandbox", "index/artifacts/by-task", "index/artifacts/by-run", "runs"}
    assert len([k for k in doomed if area(k).startswith("index/artifacts/")]) == 6
    assert gca_dry["bytes_freed"] == sum(doomed.values())

    done = ok(router.http("POST", "/v1/storage/gc", json_body={"dry_run": False}, headers=ALL))
    assert done["dry_run"] is False and removed(done, "gca") == expected
    assert done["bytes_freed"] == sum(doomed.values()) == dry["bytes_freed"]
    after = listing(bucket)
    assert set(after) == set(before) - set(doomed), sorted(set(before) - set(after) ^ set(doomed))
    for kept in (live, new, other, default):
        assert any(kept in k for k in after), kept
    for run in ("live", "new", "b", "d"):
        assert any(f"runs/{runs[run]}/" in k for k in after), run
    report = ok(router.http("GET", "/v1/storage", headers=ALL))
    check_report(report, after)
    assert {"default", "gca", "gcb"} <= {p["project"] for p in report["projects"]}
    stored = ok(router.http("GET", "/v1/storage", key=gca))["projects"][0]["stored_bytes"]
    assert stored == sum(part(after, "gca").values())

    # The CLI says the same; a member key sees and collects its own project only.
    cli = router.cli("storage", "report", "--json", "--all")
    assert cli.returncode == 0, cli.stderr
    assert {p["project"]: p["stored_bytes"] for p in json.loads(cli.stdout)["projects"]} == {
        p["project"]: p["stored_bytes"] for p in report["projects"]}
    text = router.cli("storage", "gc", "--dry-run", "--all")
    assert text.returncode == 0 and b"gca: would remove nothing" in text.stdout, text.stdout + text.stderr
    mine = ok(router.http("POST", "/v1/storage/gc", json_body={"dry_run": False}, key=gcb))
    assert [p["project"] for p in mine["projects"]] == ["gcb"] and mine["host"] is None
    assert [p["project"] for p in ok(router.http("GET", "/v1/storage", key=gcb))["projects"]] == ["gcb"]
    assert ok(router.http("GET", "/v1/storage", key=gcb))["host"] is None
    assert router.http("POST", "/v1/storage/gc", json_body={}, key=gcb).status == 400  # dry_run must be said

    # Once the live sandbox ends, its old pushed file and full output stay with its new record (a record keeps
    # what it names); its run's file, as old and now labelling no live sandbox, goes.
    ok(router.http("DELETE", f"/v1/sandboxes/{live}", key=gca))
    wait_for(lambda: not router.layout.journal(live).exists(), 30, what="the live sandbox's trajectory stored")
    again = ok(router.http("POST", "/v1/storage/gc", json_body={"dry_run": False}, key=gca))
    assert removed(again, "gca") == {"trajectories": [], "artifacts": [], "outputs": [], "runs": [runs["live"]]}
    assert {area(k) for k in listing(bucket) if live in k} >= {"trajectories", "artifacts", "index/artifacts/by-run"}


def _image(tmp: Path, name: str, mark: str) -> Path:
    root = make_busybox_rootfs(tmp / name)
    (root / "mark").write_text(mark)
    return root


def _imported(router: RouterProcess, name: str, source: Path, *more: str) -> str:
    done = router.cli("image", "import", name, str(source), *more)
    assert done.returncode == 0, done.stderr
    found = re.search(rb"(sha256:[0-9a-f]{64})", done.stdout)
    assert found, done.stdout
    return found.group(1).decode()


def test_images_nothing_uses_are_collected_and_a_live_sandboxs_kept(router: RouterProcess, tmp_path: Path) -> None:
    retired = router.layout.images / ".retired"
    x1 = _imported(router, f"gcx-{TAG}", _image(tmp_path, "x1", "x1"))
    with router.client() as client:
        sandbox = client.create(f"gcx-{TAG}", heartbeat=False)
        try:
            # Replaced while the sandbox uses it: the old version is kept for the sandbox; replaced while no
            # sandbox uses it: nothing does (`grove image import --force` collects nothing itself).
            _imported(router, f"gcx-{TAG}", _image(tmp_path, "x2", "x2"), "--force")
            y1 = _imported(router, f"gcy-{TAG}", _image(tmp_path, "y1", "y1"))
            _imported(router, f"gcy-{TAG}", _image(tmp_path, "y2", "y2"), "--force")
            assert {p.name for p in retired.iterdir()} >= {x1[7:], y1[7:]}
            images = ok(router.http("GET", "/v1/storage", headers=ALL))["host"]["images"]
            assert images["unused"] >= 1 and images["unused_bytes"] > 0, images

            dry = ok(router.http("POST", "/v1/storage/gc", json_body={"dry_run": True}, headers=ALL))
            listed = {p["id"] for p in dry["host"]["images"]["removed"]}
            assert f"retired {y1}" in listed and f"retired {x1}" not in listed, listed
            assert (retired / y1[7:]).is_dir(), "a dry run removed an image"
            done = ok(router.http("POST", "/v1/storage/gc", json_body={"dry_run": False}, headers=ALL))
            assert {p["id"] for p in done["host"]["images"]["removed"]} == listed
            assert not (retired / y1[7:]).exists() and (retired / x1[7:]).is_dir()
            assert sandbox.exec("cat /mark").stdout == b"x1"  # still on the version it was made from
            images = ok(router.http("GET", "/v1/storage", headers=ALL))["host"]["images"]
            assert images["unused"] == 0 and images["unused_bytes"] == 0, images
        finally:
            sandbox.close()
    assert router.cli("image", "rm", f"gcx-{TAG}", f"gcy-{TAG}").returncode == 0


def test_the_router_collects_by_itself_every_interval() -> None:
    # Retention 2.6 s, a pass every 10.8 s (the router's log keeps one line of a kind per 10 s: passes closer
    # together than that would have their lines merged).
    days = 0.00003
    with router_state(start=False) as r:
        ProjectFiles(r.state_dir).save(Project("gcp", retention_days=days))
        r.up_args = ("--gc-interval-h", "0.003")
        r.start()
        key = r.member_key("gcp", "gcp-member")
        sid = things(r, key, f"p-{TAG}")
        wanted = ("trajectories 1 (1 sandbox)", "artifacts 1 (1 sandbox)", "outputs 1 (1 sandbox)", "runs 1 (1 run)")

        def logged() -> str:
            """What the scheduled passes said they removed of gcp (the run's file may go a pass before the rest:
            it was written before the sandbox ended)."""
            lines = re.findall(r"storage gc \(scheduled\): project gcp: removed .*", r.log())
            return "\n".join(lines) if all(any(w in line for line in lines) for w in wanted) else ""

        wait_for(logged, 30, what="scheduled passes removing gcp's things")
        listed = ok(r.http("GET", "/v1/storage", key=key))["projects"][0]
        assert listed["stored_bytes"] == 0 and listed["kinds"]["trajectories"]["count"] == 0, listed
        assert r.http("GET", f"/v1/trajectories/{sid}", key=key).status == 404


def test_the_stored_bytes_figure_is_measured_when_missing_or_stale() -> None:
    asked: list[str] = []
    usage = StorageUsage(asked.append, max_age_s=0.3)
    assert usage.bytes("p") is None and asked == ["p"]  # before the first measurement: asked for one
    assert usage.bytes("p") is None and asked == ["p"]  # asked once, not at every read
    usage.record("p", 1234)
    assert usage.bytes("p") == 1234 and asked == ["p"]
    time.sleep(0.35)
    assert usage.bytes("p") == 1234 and asked == ["p", "p"]  # stale: the old figure, and a new measurement asked
    assert usage.bytes("q") is None and asked == ["p", "p", "q"]
