"""What a new user tripped over in the ``grove`` CLI, each against a real router: trajectories by run and outcome,
artifacts pushed and fetched by relative path, labels, readable times, pools that say what they made and keep
their claim counts, ``down`` stopping pool members, a busy port, a missing router, and Ctrl-C of a rollout run."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from grove.client import Grove
from router.auth import load_or_create
from tests.rollouts.runs import write_tasks
from tests.support.router_fixtures import GROVE_BIN, RouterProcess, leaks, new_state_dir, wait_for

pytestmark = pytest.mark.local_only

# Not the API's defaults, so that other creates on the shared router never claim from these pools.
SMALL = {"cpu": 0.5, "memory_mb": 200, "pids_max": 99, "disk_mb": 300}


def _ok(done: subprocess.CompletedProcess[bytes]) -> str:
    """stdout of a CLI run that must have succeeded."""
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
    return done.stdout.decode()


def _state_cli(state: Path, *args: str, key: str | None = None, prefix: tuple[str, ...] = (),
               timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    """The CLI with only a state dir to go on (no --url, no GROVE_URL), under ``prefix`` (e.g. ``unshare``)."""
    env = {k: v for k, v in os.environ.items() if k not in ("GROVE_URL", "GROVE_API_KEY")}
    if key is not None:
        env["GROVE_API_KEY"] = key
    return subprocess.run([*prefix, GROVE_BIN, "--state-dir", str(state), *args], env=env, capture_output=True,
                          text=True, timeout=timeout, check=False, stdin=subprocess.DEVNULL)


def _stored(grove: Grove, run_id: str, count: int) -> list[dict[str, Any]]:
    """The run's stored trajectories once all ``count`` are listed."""
    def listed() -> list[dict[str, Any]]:
        items = grove.request("GET", "/v1/trajectories", params={"task_id": f"task-{run_id}"})["trajectories"]
        return items if len(items) == count else []
    return list(wait_for(listed, 60, what=f"{count} stored trajectories of {run_id}"))


def test_trajectories_get_and_ls_export_by_run_and_outcome(router: RouterProcess, grove: Grove,
                                                           tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    runs = {f"a-{tag}": ["pass", "fail"], f"b-{tag}": ["pass"]}
    made: dict[str, tuple[str, str]] = {}
    for run_id, outcomes in runs.items():
        for outcome in outcomes:
            sb = grove.create(heartbeat=False, metadata={"task_id": f"task-{tag}", "labels": {"run_id": run_id}})
            sb.exec("echo hi")
            grove.request("POST", f"/v1/sandboxes/{sb.id}/events",
                          json_body={"kind": "result", "data": {"result": outcome, "reward": float(outcome == "pass")}})
            sb.close()
            made[sb.id] = (run_id, outcome)
    _stored(grove, tag, len(made))

    some = next(iter(made))
    record = json.loads(_ok(router.cli("trajectories", "get", some)))
    assert record["sandbox"]["id"] == some and record["outcome"]["result"] == made[some][1]

    def listed(*options: str) -> set[str]:
        rows = _ok(router.cli("trajectories", "ls", "--task", f"task-{tag}", *options)).splitlines()
        assert rows[0].split()[:2] == ["SANDBOX", "CREATED"], rows[0]
        return {row.split()[0] for row in rows[1:]}

    assert listed() == set(made)
    assert listed("--run", f"a-{tag}") == {s for s, (r, _) in made.items() if r == f"a-{tag}"}
    assert listed("--run", f"a-{tag}", "--outcome", "pass") == {
        s for s, (r, o) in made.items() if r == f"a-{tag}" and o == "pass"}
    assert listed("--outcome", "fail") == {s for s, (_, o) in made.items() if o == "fail"}
    assert listed("--run", "no-such-run") == set()

    out = tmp_path / "sft.jsonl"
    done = router.cli("trajectories", "export", "--task", f"task-{tag}", "--run", f"a-{tag}", "--outcome", "fail",
                      "-o", str(out))
    assert done.returncode == 0 and b"exported 1 trajectories" in done.stderr, done.stderr
    [line] = out.read_text().splitlines()
    assert json.loads(line)["metadata"]["result"] == "fail"

    bad = router.cli("trajectories", "ls", "--outcome", "won")
    assert bad.returncode == 2 and b"pass" in bad.stderr and b"infra_error" in bad.stderr


def test_artifacts_push_and_get_by_the_path_the_push_took(router: RouterProcess, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    sandbox_id = _ok(router.cli("create", "--label", f"team={tag}", "--label", "run_id=r-1")).strip()
    [row] = json.loads(_ok(router.cli("ls", "--json", "--label", f"team={tag}")))
    assert row["id"] == sandbox_id and row["metadata"]["labels"] == {"team": tag, "run_id": "r-1"}
    bad = router.cli("create", "--label", "no-equals-sign")
    assert bad.returncode == 1 and b"--label takes K=V" in bad.stderr

    _ok(router.cli("exec", sandbox_id, "--", "mkdir -p out && printf 'forty-two' > out/answer.txt"))
    pushed = _ok(router.cli("artifacts", "push", sandbox_id, "out/answer.txt"))
    assert re.match(r"stored /workspace/out/answer\.txt  9 bytes  sha256 [0-9a-f]{64}$", pushed.strip()), pushed

    _ok(router.cli("artifacts", "get", sandbox_id, "out/answer.txt", "-o", str(tmp_path / "live.txt")))
    assert (tmp_path / "live.txt").read_text() == "forty-two"
    _ok(router.cli("rm", sandbox_id))
    # Deleted: the workdir the relative path is resolved against comes from its trajectory now.
    wait_for(lambda: router.http("GET", f"/v1/trajectories/{sandbox_id}").status == 200, 60, what="stored")
    done = router.cli("artifacts", "get", sandbox_id, "out/answer.txt", "-o", "-")
    assert done.returncode == 0 and done.stdout == b"forty-two", done.stderr
    assert _ok(router.cli("artifacts", "get", sandbox_id, "/workspace/out/answer.txt", "-o", "-")) == "forty-two"

    missing = router.cli("artifacts", "get", sandbox_id, "out/nope.txt", "-o", str(tmp_path / "x"))
    assert missing.returncode == 1
    assert f"no stored artifact /workspace/out/nope.txt; `grove artifacts ls --sandbox {sandbox_id}`".encode() in (
        missing.stderr), missing.stderr
    assert b"/v1/" not in missing.stderr


def test_ls_shows_times_a_person_reads(router: RouterProcess, grove: Grove) -> None:
    sandbox = grove.create(heartbeat=False)
    listing = _ok(router.cli("ls"))
    header, *rows = listing.splitlines()
    assert "CREATED (UTC)" in header and "AGE" in header and "IDLE" in header
    [row] = [r for r in rows if r.startswith(sandbox.id)]
    created = time.strftime("%Y-%m-%d", time.gmtime(sandbox.info["created_at"]))
    assert re.search(rf"{created} \d\d:\d\d:\d\d +\d+s +\d+s$", row), row


def test_pool_create_says_what_it_made(router: RouterProcess, grove: Grove) -> None:
    done = router.cli("pool", "create", "said", "--size", "1", "--cpu", "0.5", "--memory-mb", "200", "--pids-max",
                      "99", "--disk-mb", "300")
    made = _ok(done)
    assert made.startswith("created pool said: 1 sandbox(es) of image default kept ready, each cpu=0.5 "
                           "memory=200MiB pids=99 disk=300MiB, no egress, workdir /workspace\n"), made
    assert "`grove create --pool said`" in made
    assert json.loads(_ok(router.cli("pool", "get", "said", "--json")))["resources"] == SMALL
    as_json = json.loads(_ok(router.cli("pool", "create", "said-json", "--size", "0", "--json")))
    assert as_json["name"] == "said-json" and as_json["size"] == 0
    grove.delete_pool("said")
    grove.delete_pool("said-json")


def test_a_pools_claims_count_on_across_restarts(fresh_router: RouterProcess) -> None:
    router = fresh_router
    with router.client() as grove:
        grove.create_pool("counted", size=1, resources=SMALL)
        wait_for(lambda: grove.pool("counted")["ready"] == 1, 90, what="the pool filled")
        grove.create(pool="counted", heartbeat=False).close()
        grove.resize_pool("counted", 0)
        grove.create(pool="counted", heartbeat=False).close()  # nothing ready: a miss
        assert {k: grove.pool("counted")[k] for k in ("claims", "misses")} == {"claims": 1, "misses": 1}
        router.stop()
        router.start()
        assert {k: grove.pool("counted")[k] for k in ("claims", "misses")} == {"claims": 1, "misses": 1}
        # Killed outright: what was counted a second before is kept.
        grove.resize_pool("counted", 1)
        wait_for(lambda: grove.pool("counted")["ready"] == 1, 90, what="the pool refilled")
        grove.create(pool="counted", heartbeat=False).close()
        time.sleep(2.5)
        router.stop(signal.SIGKILL)
        router.start()
        assert grove.pool("counted")["claims"] == 2
        listing = _ok(router.cli("pool", "ls"))
        assert re.search(r"^counted\s+default\s+1\s+\d+\s+\d+\s+2\s", listing, re.M), listing
        # A pool made anew under the same name counts from zero.
        grove.delete_pool("counted")
        assert grove.create_pool("counted", size=0, resources=SMALL)["claims"] == 0
        grove.delete_pool("counted")


def test_down_stops_pool_members_too_and_the_next_up_refills_the_pool(fresh_router: RouterProcess) -> None:
    router = fresh_router
    with router.client() as grove:
        grove.create_pool("warm", size=2, resources=SMALL)
        wait_for(lambda: grove.pool("warm")["ready"] == 2, 90, what="the pool filled")
        grove.create(heartbeat=False)
    done = _state_cli(router.state_dir, "down", key=router.key)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("grove down: stopped the 2 unclaimed sandbox(es) of warm pool warm (the pool stays "
                               "defined: the next `grove up` refills it to 2"), lines
    assert lines[1:] == ["grove down: deleted 1 sandbox(es) (trajectories stored)",
                         f"grove down: stopped the router (pid {router.proc.pid if router.proc else 0}) and its "
                         "embedded S3 server"]
    assert router.proc is not None and router.proc.wait(timeout=30) == 0
    assert leaks(router.state_dir) == []  # no executor, cgroup, mount or loop device of a member is left
    router.start()
    with router.client() as grove:
        assert grove.pool("warm")["size"] == 2
        wait_for(lambda: grove.pool("warm")["ready"] == 2, 90, what="the pool refilled after down and up")
        grove.delete_pool("warm")


def test_a_busy_port_is_one_clear_error(router: RouterProcess) -> None:
    state = new_state_dir()
    try:
        started = time.monotonic()
        done = _state_cli(state, "up", "--port", str(router.port))
        assert done.returncode == 1 and time.monotonic() - started < 20
        assert done.stderr.startswith(f"grove: port {router.port} on 127.0.0.1 is in use by another program")
        assert "--port N" in done.stderr and "--port 0" in done.stderr
        assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr
        # Nothing was made before the port was known to be free: a first start's key is made and shown later.
        assert not (state / "api_keys").exists()
    finally:
        shutil.rmtree(state)


def test_with_no_router_on_the_state_dir_the_cli_says_so() -> None:
    state = new_state_dir()
    # A network namespace of its own, so that nothing (another router of this host) can answer on the default port.
    isolated = ("unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$0" "$@"')
    try:
        never = _state_cli(state, "ls", prefix=isolated)
        assert never.returncode == 1 and never.stderr == (
            f"grove: no router runs on the state dir {state}, nor ever did (it holds no API key); start one with "
            f"`grove --state-dir {state} up`, or name a running router with --url or $GROVE_URL\n")
        load_or_create(state, None)  # as a router that ran there and stopped leaves it
        stopped = _state_cli(state, "ls", prefix=isolated)
        assert stopped.returncode == 1 and stopped.stderr == (
            f"grove: no router runs on the state dir {state}, and none answers at http://127.0.0.1:8470 (the default "
            f"URL, tried for want of one); start one with `grove --state-dir {state} up`, or name a running router "
            "with --url or $GROVE_URL\n")
    finally:
        shutil.rmtree(state)


def test_ctrl_c_of_a_rollout_run_stops_it_for_a_rerun_to_resume(router: RouterProcess, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:6]
    tasks = write_tasks(tmp_path / "tasks.jsonl", ("easy", "hard", "medium", "easy"), prefix=f"cc-{tag}",
                        think_s=1.0)
    out = tmp_path / "run"
    argv = [GROVE_BIN, "--url", router.url, "rollouts", "run", str(tasks), "--harness", "scripted", "--attempts",
            "2", "--concurrency", "4", "--out", str(out), "--no-upload"]
    env = {**os.environ, "GROVE_API_KEY": router.key}
    # As a terminal delivers it: SIGINT at its default (a test runner in the background may have it ignored).
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    journal = out / "journal.jsonl"
    wait_for(lambda: journal.exists() and journal.read_text().count('"e":"sandbox"') >= 2, 60,
             what="attempts running in sandboxes")
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    err = stderr.decode()
    assert proc.returncode == 130, err
    assert err.rstrip().endswith(f"grove rollouts: interrupted; rerun the same command to resume ({out} keeps what "
                                 "is done)"), err
    assert "Traceback" not in err and "Unclosed" not in err and "aiohttp" not in err, err

    again = subprocess.run(argv, env=env, capture_output=True, timeout=300, check=False, stdin=subprocess.DEVNULL)
    assert again.returncode == 0, again.stderr.decode()[-2000:]
    status = subprocess.run([GROVE_BIN, "rollouts", "status", str(out)], capture_output=True, text=True, check=True)
    assert "attempts finished: 8" in status.stdout and "state: finished" in status.stdout, status.stdout
    run_id = json.loads((out / "run.json").read_text())["run_id"]
    with router.client() as grove:
        assert grove.list({"run_id": run_id}) == []  # what the stop left, the resume deleted
