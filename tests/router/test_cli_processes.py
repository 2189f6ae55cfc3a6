"""``grove proc`` and ``grove ps`` against a real router, on both backends (local and the Knative stand-in: the
executor does the work, so background processes run there the same way)."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.support.router_fixtures import RouterProcess


@pytest.fixture(scope="module")
def router(any_router: RouterProcess) -> RouterProcess:
    """This module runs against both backends."""
    return any_router


def _ok(done: subprocess.CompletedProcess[bytes]) -> str:
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
    return done.stdout.decode()


def test_start_ps_logs_kill_wait(router: RouterProcess) -> None:
    sandbox_id = _ok(router.cli("create")).strip()
    try:
        pid = int(_ok(router.cli("proc", "start", sandbox_id, "--env", "WHO=grove", "--",
                                 "for i in 1 2 3; do echo hello $WHO $i; sleep 0.2; done; exit 5")))
        assert _ok(router.cli("proc", "logs", sandbox_id, str(pid), "-f")) == \
            "hello grove 1\nhello grove 2\nhello grove 3\n"
        done = router.cli("proc", "wait", sandbox_id, str(pid))
        assert done.returncode == 5  # the process's own exit code
        listing = _ok(router.cli("ps", sandbox_id))
        assert str(pid) in listing and "exited" in listing and "hello" in listing

        sleeper = int(_ok(router.cli("proc", "start", sandbox_id, "--", "sleep", "300")))
        assert json.loads(_ok(router.cli("proc", "get", sandbox_id, str(sleeper))))["status"] == "running"
        done = router.cli("proc", "wait", sandbox_id, str(sleeper), "--timeout", "0.3")
        assert done.returncode == 124 and b"still runs" in done.stderr
        _ok(router.cli("proc", "kill", sandbox_id, str(sleeper), "-s", "KILL"))
        assert router.cli("proc", "wait", sandbox_id, str(sleeper)).returncode == 137
        rows = json.loads(_ok(router.cli("proc", "ls", sandbox_id, "--json")))
        assert [(r["pid"], r["status"]) for r in rows] == [(pid, "exited"), (sleeper, "exited")]

        done = router.cli("proc", "kill", sandbox_id, "999999")
        assert done.returncode == 1 and b"no background process 999999" in done.stderr
    finally:
        router.cli("rm", sandbox_id)
