"""A pre-projects state directory upgrades in place.

The state dir is made by grove's own code of commit 64f5738, the last before projects (19c6188): that commit's
tree, run with this venv's Python, starts the router, which makes sandboxes (one left running), a warm pool,
artifacts, a stored trajectory, a run file and a request id, and its CLI adds a key. That router is then stopped
as a user stops it to upgrade (SIGTERM to its PID: its sandboxes run on, as tests/router/test_restart.py shows)
and today's router starts on the same state dir. Everything of before must be the ``default`` project's and be
where it was; a new project sees none of it and keeps its own under ``projects/<name>/`` in the bucket.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from artifacts.s3config import S3Config
from artifacts.store import ObjectStore
from router.auth import fingerprint
from tests.support.executor_fixtures import Reply
from tests.support.router_fixtures import GROVE_BIN, RouterProcess, cgroup_procs, router_state, wait_for

OLD_COMMIT = "64f5738"
"""The last commit before projects: its code makes the state dir this test upgrades."""
REPO = Path(__file__).resolve().parents[2]
TASK, RUN, POOL = "upgrade-task", "upgrade-run", "warm"
KEEP = {"request_id": "upgrade-keep", "metadata": {"task_id": TASK, "labels": {"run_id": RUN}}}
"""The create of the sandbox left running (a retry sends the same body)."""
SMALL = {"cpu": 0.5, "memory_mb": 256, "pids_max": 128, "disk_mb": 256}
PID1_START = "cut -d' ' -f22 /proc/1/stat"
"""The start time of a sandbox's PID 1: it changes whenever the sandbox restarts."""
OLD_RUN_FILE, BETA_RUN_FILE = b'{"made_by": "64f5738"}', b'{"made_by": "beta"}'


def _old_tree(dest: Path) -> Path:
    """Commit 64f5738's files under ``dest`` (``git archive``); fails saying how to get the history if the
    repository lacks it (a shallow clone, a copy without .git)."""
    probe = subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{OLD_COMMIT}^{{commit}}"],
                           capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        shallow = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--is-shallow-repository"],
                                 capture_output=True, text=True, check=False).stdout.strip()
        fix = {"true": f"the clone is shallow; fetch full history: git -C {REPO} fetch --unshallow",
               "false": f"fetch full history: git -C {REPO} fetch origin (the commit is on main)"}.get(
            shallow, "run the tests in a git clone of grove with its full history (not a copy without .git, not "
                     "git clone --depth); in a shallow clone, fetch full history: git fetch --unshallow")
        pytest.fail(f"this test makes its state dir with grove's code of commit {OLD_COMMIT} (the last before "
                    f"projects), and {REPO} has no such commit ({probe.stderr.strip() or 'git cat-file failed'}). "
                    f"Fix: {fix}", pytrace=False)
    archive = subprocess.Popen(["git", "-C", str(REPO), "archive", OLD_COMMIT], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    assert archive.stdout is not None
    untar = subprocess.run(["tar", "-x", "-C", str(dest)], stdin=archive.stdout, capture_output=True, check=False)
    archive.stdout.close()
    _, err = archive.communicate(timeout=60)
    assert archive.returncode == 0 and untar.returncode == 0, (err, untar.stderr)
    return dest


@pytest.fixture
def old_tree() -> Iterator[Path]:
    """Commit 64f5738's tree in a temporary directory (removed at the end)."""
    with tempfile.TemporaryDirectory(prefix="gt-old-") as tmp:
        yield _old_tree(Path(tmp))


@dataclass(frozen=True)
class Before:
    """What the old router made, as it answered."""

    second_key: str
    """A key the old ``grove key add`` made."""
    kept_id: str
    """The sandbox left running (created with :data:`KEEP`)."""
    kept_status: int
    """The old router's status for a retry of :data:`KEEP`."""
    pid1: str
    """The kept sandbox's PID 1 start time."""
    ended_id: str
    """The sandbox deleted, its trajectory stored."""
    artifacts: dict[str, tuple[str, bytes]]
    """Sandbox id → its artifact's path and bytes."""
    members: set[str]
    """The warm pool's member."""
    procs: dict[str, list[int]]
    """The host PIDs of the kept sandbox and the pool's member."""
    objects: dict[str, bytes]
    """The bucket."""


def _ok(reply: Reply, status: int = 200) -> Any:
    """The JSON of a reply that must have ``status``."""
    assert reply.status == status, (reply.status, reply.body[:1000])
    return reply.json() if reply.body else None


def _exec(router: RouterProcess, sandbox_id: str, command: str, key: str | None = None) -> str:
    """A command's stdout (it must succeed)."""
    ran = _ok(router.http("POST", f"/v1/sandboxes/{sandbox_id}/exec", json_body={"command": command}, key=key))
    assert ran["exit_code"] == 0, ran
    return str(ran["stdout"])


def _bucket(router: RouterProcess) -> dict[str, bytes]:
    """Every object of the state dir's embedded S3 bucket with its bytes (read behind the router's back, with
    the credentials it keeps in the state dir; only while a router, hence its S3 server, runs)."""
    state = json.loads((router.layout.s3 / "grove-s3.json").read_text())
    config = S3Config(endpoint=f"http://127.0.0.1:{state['ports']['s3.port']}", access_key=state["access_key"],
                      secret_key=state["secret_key"])
    with ObjectStore(config) as store:
        return {info.key: store.get_bytes(info.key) for info in store.list("")}


def _pool_members(router: RouterProcess) -> set[str]:
    """The pool's unclaimed members as their records on disk say."""
    records = (json.loads(path.read_text()) for path in router.layout.records.glob("sb-*.json"))
    return {record["id"] for record in records if record.get("pool") == POOL}


def _procs(router: RouterProcess, ids: set[str]) -> dict[str, list[int]]:
    """Each sandbox's host PIDs (its cgroup's): they change if it was restarted, and are gone if it stopped."""
    return {sid: sorted(cgroup_procs(router.state_dir, sid)) for sid in ids}


def _stored(router: RouterProcess, sandbox_id: str, key: str | None = None) -> bool:
    """Whether a deleted sandbox's trajectory has gone to S3 (its journal is gone and the listing shows it)."""
    if router.layout.journal(sandbox_id).exists():
        return False
    listed = router.http("GET", f"/v1/trajectories?task_id={TASK}", key=key)
    return listed.status == 200 and sandbox_id in json.dumps(listed.json())


def _fetch_artifacts(router: RouterProcess, before: Before) -> None:
    for sandbox_id, (path, data) in before.artifacts.items():
        fetched = router.http("GET", f"/v1/artifacts/{sandbox_id}{path}")
        assert (fetched.status, fetched.body) == (200, data), (fetched.status, fetched.body[:500])


def _make_old_state(router: RouterProcess, old_tree: Path) -> Before:
    """Run commit 64f5738's router and CLI on the router's state dir, make one of everything, stop it."""
    old_env = {"PYTHONPATH": str(old_tree), "GROVE_API_KEY": ""}
    # The grove script imports as ``-P`` does (no working directory on sys.path): the old tree must come first.
    probe = "import artifacts, executor, grove, router, sandbox_image; print(artifacts, executor, grove, router, " \
            "sandbox_image)"
    where = subprocess.run([sys.executable, "-P", "-c", probe], env={**old_env, "PATH": "/usr/bin:/bin"},
                           capture_output=True, text=True, check=True)
    assert where.stdout.count(f"from '{old_tree}/") == 5, where.stdout
    router.extra_env = dict(old_env)  # no GROVE_API_KEY: the old router makes its key, as on a first start
    router.start()
    router.key = router.layout.api_keys.read_text().split()[0]
    cli_env = {k: v for k, v in os.environ.items() if k not in ("GROVE_API_KEY", "GROVE_URL")}
    added = subprocess.run([GROVE_BIN, "--state-dir", str(router.state_dir), "key", "add", "ci", "runner"],
                           env={**cli_env, **old_env}, capture_output=True, text=True, timeout=60, check=False)
    assert added.returncode == 0, added.stderr
    second_key = added.stdout.strip()
    # Lines as every key file before projects has them, ``KEY label``: the old code wrote them.
    lines = router.layout.api_keys.read_text().splitlines()
    assert lines == [f"{router.key} created by grove up", f"{second_key} ci runner"], lines
    assert not router.layout.projects.exists(), "the old code knows no projects"

    kept_id = _ok(router.http("POST", "/v1/sandboxes", json_body=KEEP), 201)["id"]
    _exec(router, kept_id, f"echo {kept_id} > /dev/shm/alive; echo kept > /workspace/kept.txt")
    _ok(router.http("POST", f"/v1/sandboxes/{kept_id}/artifacts", json_body={"paths": ["/workspace/kept.txt"]}))
    ended_id = _ok(router.http("POST", "/v1/sandboxes", json_body={
        "request_id": "upgrade-ended", "metadata": {"task_id": TASK, "labels": {"run_id": RUN}}}), 201)["id"]
    assert _exec(router, ended_id, "echo recorded > /workspace/out.txt; echo done-before") == "done-before\n"
    _ok(router.http("POST", f"/v1/sandboxes/{ended_id}/artifacts", json_body={"paths": ["/workspace/out.txt"]}))
    _ok(router.http("DELETE", f"/v1/sandboxes/{ended_id}"))
    _ok(router.http("POST", "/v1/pools", json_body={"name": POOL, "size": 1, "resources": SMALL}), 201)
    _ok(router.http("PUT", f"/v1/runs/{RUN}/files/results.json", OLD_RUN_FILE), 201)
    wait_for(lambda: _ok(router.http("GET", f"/v1/pools/{POOL}"))["ready"] == 1, 60, what="the pool's member")
    wait_for(lambda: _stored(router, ended_id), 30, what="the ended sandbox's trajectory in S3")

    retried = router.http("POST", "/v1/sandboxes", json_body=KEEP)
    assert retried.json()["id"] == kept_id, retried.body
    objects = _bucket(router)
    artifacts = {kept_id: ("/workspace/kept.txt", b"kept\n"), ended_id: ("/workspace/out.txt", b"recorded\n")}
    assert {f"artifacts/{sid}{path}" for sid, (path, _) in artifacts.items()} <= set(objects), sorted(objects)
    assert objects[f"runs/{RUN}/results.json"] == OLD_RUN_FILE
    assert not any(k.startswith("projects/") for k in objects), sorted(objects)
    members = _pool_members(router)
    assert len(members) == 1, members
    before = Before(second_key, kept_id, retried.status, _exec(router, kept_id, PID1_START), ended_id, artifacts,
                    members, _procs(router, {kept_id, *members}), objects)
    _fetch_artifacts(router, before)  # the old router reads them so; the new must too
    assert all(before.procs.values()), before.procs

    assert router.stop() == 0
    assert _procs(router, set(before.procs)) == before.procs, "a sandbox stopped with the old router"
    return before


def test_a_pre_projects_state_dir_upgrades_in_place(old_tree: Path) -> None:
    with router_state(start=False, seed=False) as router:
        before = _make_old_state(router, old_tree)
        router.extra_env = {"GROVE_API_KEY": ""}  # only the key file's keys, as a plain `grove up` after an upgrade
        router.start()
        claimed_id = _check_default_project(router, before)
        _check_new_project(router, before, claimed_id)


def _check_default_project(router: RouterProcess, before: Before) -> str:
    """Everything of before is the default project's, as it was; returns the pool's claimed member."""
    kept_id = before.kept_id
    # The old keys work, as admins of default (an admin may name another project; a member may not).
    for key in (router.key, before.second_key):
        listed = _ok(router.http("GET", "/v1/sandboxes", key=key))["sandboxes"]
        assert [(s["id"], s["status"], s.get("project")) for s in listed] == [(kept_id, "ready", "default")], listed
    _ok(router.http("GET", "/v1/sandboxes", headers={"X-Grove-Project": "beta"}))
    shown = router.cli("key", "ls")
    assert shown.returncode == 0, shown.stderr
    rows = [line.split(None, 3) for line in shown.stdout.decode().splitlines()[1:]]
    assert rows == [[fingerprint(router.key), "default", "admin", "created by grove up"],
                    [fingerprint(before.second_key), "default", "admin", "ci runner"]], shown.stdout.decode()

    # The running sandbox was re-adopted as it was (same processes, same PID 1) and answers exec.
    assert _procs(router, set(before.procs)) == before.procs, "a sandbox restarted"
    assert _exec(router, kept_id, f"cat /dev/shm/alive /workspace/kept.txt; {PID1_START}") == (
        f"{kept_id}\nkept\n{before.pid1}")
    # A retried create with an old request id is the old sandbox.
    retried = router.http("POST", "/v1/sandboxes", json_body=KEEP)
    assert (retried.status, retried.json().get("id")) == (before.kept_status, kept_id), retried.body

    # The stored trajectory, the artifacts and the run file are read where the old router put them.
    trajectory = json.dumps(_ok(router.http("GET", f"/v1/trajectories/{before.ended_id}")))
    assert before.ended_id in trajectory and "done-before" in trajectory, trajectory[:2000]
    listed = json.dumps(_ok(router.http("GET", f"/v1/trajectories?task_id={TASK}")))
    assert before.ended_id in listed, listed
    _fetch_artifacts(router, before)
    by_task = _ok(router.http("GET", f"/v1/artifacts?task_id={TASK}"))["artifacts"]
    assert sorted((a["sandbox_id"], a["path"]) for a in by_task) == sorted(
        (sid, path) for sid, (path, _) in before.artifacts.items()), by_task
    run_file = router.http("GET", f"/v1/runs/{RUN}/files/results.json")
    assert (run_file.status, run_file.body) == (200, OLD_RUN_FILE), run_file.body[:500]
    run_files = _ok(router.http("GET", f"/v1/runs/{RUN}/files"))["files"]
    assert [f["key"] for f in run_files] == [f"runs/{RUN}/results.json"], run_files

    # The pool is still there, its member re-adopted, and claimable.
    pools = _ok(router.http("GET", "/v1/pools"))["pools"]
    assert [(p["name"], p["size"]) for p in pools] == [(POOL, 1)], pools
    wait_for(lambda: _ok(router.http("GET", f"/v1/pools/{POOL}"))["ready"] == 1, 30, what="the pool's member")
    assert _pool_members(router) == before.members, "the old pool's member was not re-adopted"
    claimed = _ok(router.http("POST", "/v1/sandboxes", json_body={"pool": POOL}), 201)
    assert claimed["id"] in before.members, (claimed, before.members)
    assert _exec(router, claimed["id"], "echo claimed") == "claimed\n"
    return str(claimed["id"])


def _check_new_project(router: RouterProcess, before: Before, claimed_id: str) -> None:
    """A member of a new project sees nothing of before, and its own objects go under ``projects/beta/``."""
    made = router.cli("key", "add", "x", "--project", "beta")
    assert made.returncode == 0, made.stderr
    beta = made.stdout.decode().strip()
    wait_for(lambda: router.http("GET", "/v1/sandboxes", key=beta).status == 200, 5, what="the new key to work")
    _check_sees_nothing(router, beta, before, claimed_id)

    live: list[str] = []
    try:
        mine = _ok(router.http("POST", "/v1/sandboxes", key=beta, json_body=KEEP), 201)["id"]
        live.append(mine)
        assert mine not in (before.kept_id, claimed_id), "request ids are a project's own"
        _exec(router, mine, "echo beta > /workspace/out.txt", key=beta)
        _ok(router.http("POST", f"/v1/sandboxes/{mine}/artifacts", key=beta, json_body={"paths": ["out.txt"]}))
        _ok(router.http("PUT", f"/v1/runs/{RUN}/files/results.json", BETA_RUN_FILE, key=beta), 201)
        _ok(router.http("DELETE", f"/v1/sandboxes/{mine}", key=beta))
        live.clear()
        wait_for(lambda: _stored(router, mine, key=beta), 30, what="beta's trajectory in S3")
    finally:
        for sandbox_id in live:
            router.http("DELETE", f"/v1/sandboxes/{sandbox_id}", key=beta)

    objects = _bucket(router)
    assert {k: v for k, v in objects.items() if k in before.objects} == before.objects, "an old object moved"
    added = sorted(set(objects) - set(before.objects))
    assert added and all(k.startswith("projects/beta/") for k in added), added
    assert any(k.startswith("projects/beta/trajectories/") and mine in k for k in added), added
    assert objects[f"projects/beta/artifacts/{mine}/workspace/out.txt"] == b"beta\n", added
    assert objects[f"projects/beta/runs/{RUN}/results.json"] == BETA_RUN_FILE, added
    # Each project reads its own file of one run and name; an admin reads beta's by naming the project.
    assert router.http("GET", f"/v1/runs/{RUN}/files/results.json").body == OLD_RUN_FILE
    assert router.http("GET", f"/v1/runs/{RUN}/files/results.json", key=beta).body == BETA_RUN_FILE
    named = router.http("GET", f"/v1/runs/{RUN}/files/results.json", headers={"X-Grove-Project": "beta"})
    assert named.body == BETA_RUN_FILE
    # The default project's listings are as they were: nothing of beta's is in them.
    listed = json.dumps(_ok(router.http("GET", f"/v1/trajectories?task_id={TASK}")))
    assert before.ended_id in listed and mine not in listed, listed
    by_task = _ok(router.http("GET", f"/v1/artifacts?task_id={TASK}"))["artifacts"]
    assert {a["sandbox_id"] for a in by_task} == set(before.artifacts), by_task


def _check_sees_nothing(router: RouterProcess, beta: str, before: Before, claimed_id: str) -> None:
    """Every object made before the upgrade is missing from a ``beta`` member's lists or 404 to it, and it may
    not name the default project."""
    def get(path: str, **kw: Any) -> Reply:
        return router.http("GET", path, key=beta, **kw)

    assert _ok(get("/v1/sandboxes"))["sandboxes"] == []
    assert _ok(get("/v1/pools"))["pools"] == []
    assert _ok(get("/v1/trajectories"))["trajectories"] == []
    assert _ok(get(f"/v1/trajectories?task_id={TASK}"))["trajectories"] == []
    assert _ok(get(f"/v1/artifacts?task_id={TASK}"))["artifacts"] == []
    assert _ok(get(f"/v1/runs/{RUN}/files"))["files"] == []
    ended_path = before.artifacts[before.ended_id][0]
    not_found = {
        "sandbox": get(f"/v1/sandboxes/{before.kept_id}"),
        "claimed sandbox": get(f"/v1/sandboxes/{claimed_id}"),
        "exec": router.http("POST", f"/v1/sandboxes/{before.kept_id}/exec", key=beta, json_body={"command": "true"}),
        "pool": get(f"/v1/pools/{POOL}"),
        "claim": router.http("POST", "/v1/sandboxes", key=beta, json_body={"pool": POOL}),
        "live trajectory": get(f"/v1/trajectories/{before.kept_id}"),
        "stored trajectory": get(f"/v1/trajectories/{before.ended_id}"),
        "artifact": get(f"/v1/artifacts/{before.ended_id}{ended_path}"),
        "sandbox's artifacts": get(f"/v1/sandboxes/{before.kept_id}/artifacts"),
        "run file": get(f"/v1/runs/{RUN}/files/results.json"),
    }
    seen = {what: (r.status, r.body[:300]) for what, r in not_found.items() if r.status != 404}
    assert not seen, seen
    assert get("/v1/sandboxes", headers={"X-Grove-Project": "default"}).status == 403
