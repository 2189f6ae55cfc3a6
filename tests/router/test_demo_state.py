"""``make demo`` keeps its state in the checkout it runs from (two checkouts on one machine never share a router's
state dir), and says how to look at that state (CLI and viewer) and how to remove it — advice that works."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from router.auth import read_key
from tests.support.router_fixtures import GROVE_BIN, force_cleanup, leaks

pytestmark = pytest.mark.local_only

REPO = Path(__file__).resolve().parents[2]


def test_make_demo_keeps_its_state_in_the_checkout() -> None:
    done = subprocess.run(["make", "-n", "demo"], cwd=REPO, capture_output=True, text=True, timeout=60, check=True)
    assert f'-m grove.demo --state-dir "{REPO}/.state/demo"' in done.stdout, done.stdout
    assert "/.state/" in (REPO / ".gitignore").read_text().splitlines()  # and git leaves it alone


def test_the_demo_runs_on_its_checkouts_state_and_says_how_to_look_and_to_clean_up() -> None:
    checkout = Path(tempfile.mkdtemp(prefix="gt-"))  # another checkout, as `make demo` runs in it (a short path)
    state = checkout / ".state" / "demo"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GROVE_")}
    try:
        done = subprocess.run([sys.executable, "-m", "grove.demo", "--tasks", "1"], cwd=checkout, env=env,
                              capture_output=True, text=True, timeout=600, check=False, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert "starting a router (local backend, state dir .state/demo)" in done.stdout
        key = read_key(state)
        assert key is not None
        tail = done.stdout[done.stdout.index("the demo's state stays in .state/demo"):]
        assert f"{GROVE_BIN} --state-dir .state/demo up --port 8471" in tail
        assert f"{GROVE_BIN} --state-dir .state/demo trajectories ls --run " in tail
        assert f"viewer: http://127.0.0.1:8471/ui/, log in with the demo's API key {key}" in tail
        assert f"to clean up: {GROVE_BIN} --state-dir .state/demo down" in tail and "then rm -rf .state/demo" in tail

        # The advice, followed: nothing is left running, and the state dir goes.
        down = subprocess.run([GROVE_BIN, "--state-dir", ".state/demo", "down"], cwd=checkout, env=env,
                              capture_output=True, text=True, timeout=120, check=False)
        assert down.returncode == 0 and "nothing runs on" in down.stdout, down.stdout + down.stderr
        assert leaks(state) == []
        shutil.rmtree(state)
    finally:
        force_cleanup(state)
        shutil.rmtree(checkout, ignore_errors=True)


def test_a_state_dir_too_long_for_sandbox_sockets_is_refused_with_a_way_out(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 80)
    done = subprocess.run([sys.executable, "-m", "grove.demo", "--state-dir", str(deep)], capture_output=True,
                          text=True, timeout=60, check=False, stdin=subprocess.DEVNULL)
    assert done.returncode == 1 and "too long a path for the Unix sockets" in done.stderr, done.stderr
    assert "choose a shorter --state-dir (or GROVE_DEMO_STATE_DIR)" in done.stderr and not deep.exists()
