"""The CLI as a new user meets it: commands find the router from the state dir, options after the
subcommand, ``grove down`` (also after a killed router), and a CLI piped into ``head`` ending quietly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator

import pytest

from artifacts.s3proc import live_weed_pid
from grove.runfile import running_router
from sandbox_image.bundle import MANIFEST
from tests.support.router_fixtures import GROVE_BIN, RouterProcess, process_alive, router_state, wait_for

pytestmark = pytest.mark.local_only


def grove_cli(router: RouterProcess, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    """The CLI with only the state dir to go on: no --url, no GROVE_URL; the key as the router has it."""
    env = {k: v for k, v in os.environ.items() if k not in ("GROVE_URL", "GROVE_API_KEY")}
    env["GROVE_API_KEY"] = router.key
    return subprocess.run([GROVE_BIN, *args], env=env, capture_output=True, text=True, timeout=timeout, check=False,
                          stdin=subprocess.DEVNULL)


def stored(router: RouterProcess, sandbox_id: str) -> bool:
    """Whether the router serves a stored trajectory for ``sandbox_id``."""
    return router.http("GET", f"/v1/trajectories/{sandbox_id}").status == 200


@pytest.fixture
def new_user_router() -> Iterator[RouterProcess]:
    """A router on a state dir as a new user's first ``grove up`` finds it: empty, so the router builds its
    runtime bundle itself (the other tests' state dirs start with a copy of the session's)."""
    with router_state(seed=False) as router:
        yield router


def test_commands_find_the_router_serving_the_state_dir(fresh_router: RouterProcess) -> None:
    state = str(fresh_router.state_dir)
    assert running_router(fresh_router.state_dir) is not None
    before = grove_cli(fresh_router, "--state-dir", state, "ls")
    after = grove_cli(fresh_router, "ls", "--state-dir", state)  # the option after the subcommand
    assert before.returncode == 0 and after.returncode == 0, (before.stderr, after.stderr)
    assert before.stdout == after.stdout and before.stdout.startswith("ID")
    again = grove_cli(fresh_router, "up", "--state-dir", state, "--port", "0")
    assert again.returncode == 1 and f"already serves {state}" in again.stderr and "grove --state-dir" in again.stderr


def test_down_deletes_every_sandbox_stores_its_trajectory_and_stops_the_router(
        new_user_router: RouterProcess) -> None:
    fresh_router = new_user_router
    assert json.loads((fresh_router.layout.runtime / MANIFEST).read_text())["stamp"]  # built by `grove up`
    with fresh_router.client() as grove:
        ids = [grove.create(heartbeat=False).id for _ in range(2)]
        grove.attach(ids[0]).exec("echo recorded")
    done = grove_cli(fresh_router, "--state-dir", str(fresh_router.state_dir), "down")
    assert done.returncode == 0, done.stderr
    assert "deleted 2 sandbox(es)" in done.stdout
    assert fresh_router.proc is not None and fresh_router.proc.wait(timeout=30) == 0
    assert "no sandbox running" in fresh_router.log()
    assert not fresh_router.layout.run_file.exists()
    assert live_weed_pid(fresh_router.layout.s3) is None
    fresh_router.start()
    assert fresh_router.live_ids() == set()
    assert all(stored(fresh_router, sandbox_id) for sandbox_id in ids)


def test_down_after_a_killed_router_stops_its_sandboxes_and_its_s3_server(fresh_router: RouterProcess) -> None:
    with fresh_router.client() as grove:
        sandbox_id = grove.create(heartbeat=False).id
    weed = live_weed_pid(fresh_router.layout.s3)
    assert weed is not None
    fresh_router.stop(signal.SIGKILL)
    assert process_alive(weed)  # what a killed router leaves behind
    done = grove_cli(fresh_router, "--state-dir", str(fresh_router.state_dir), "down")
    assert done.returncode == 0, done.stderr
    assert "deleted 1 sandbox(es)" in done.stdout
    wait_for(lambda: not process_alive(weed), 30, what="the orphaned S3 server to stop")
    nothing = grove_cli(fresh_router, "--state-dir", str(fresh_router.state_dir), "down")
    assert nothing.returncode == 0 and "nothing runs" in nothing.stdout
    fresh_router.start()
    assert fresh_router.live_ids() == set() and stored(fresh_router, sandbox_id)


def test_a_stopped_router_says_how_many_sandboxes_keep_running(fresh_router: RouterProcess) -> None:
    with fresh_router.client() as grove:
        grove.create(heartbeat=False)
    fresh_router.stop()
    log = fresh_router.log()
    assert "1 sandbox(es) keep running" in log and f"grove --state-dir {fresh_router.state_dir} down" in log
    fresh_router.start()


def test_a_cli_piped_into_head_ends_quietly() -> None:
    proc = subprocess.Popen([GROVE_BIN, "knative", "manifest"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the first write, as `head` is once it has its lines
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=30) != 0
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_up_on_a_state_dir_too_long_for_sandbox_sockets_says_so_before_it_starts(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """Every local sandbox listens on ``<state>/sandboxes/<id>/executor.sock``: on a state dir past the kernel's
    socket-path limit each create used to fail alike with "AF_UNIX path too long". ``grove up`` refuses it."""
    state = tmp_path_factory.mktemp("long") / ("d" * 80)
    done = subprocess.run([GROVE_BIN, "--state-dir", str(state), "up", "--port", "0"], capture_output=True,
                          text=True, timeout=120, check=False, stdin=subprocess.DEVNULL)
    assert done.returncode != 0, done.stdout
    assert "too long a path" in done.stderr and "choose a shorter --state-dir" in done.stderr, done.stderr
    assert not (state / "sandboxes").exists() and running_router(state) is None
