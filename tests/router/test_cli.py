"""The ``grove`` CLI against a real router: create, ls, exec (exit codes propagate), cp both ways, rm."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.support.router_fixtures import RouterProcess


@pytest.fixture(scope="module")
def router(any_router: RouterProcess) -> RouterProcess:
    """This module runs against both backends (local and the Knative stand-in)."""
    return any_router


def _ok(done: subprocess.CompletedProcess[bytes]) -> str:
    """stdout of a CLI run that must have succeeded."""
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
    return done.stdout.decode()


def test_create_ls_exec_rm(router: RouterProcess) -> None:
    sandbox_id = _ok(router.cli("create", "--task", "cli-task", "--env", "GREETING=hi", "--memory-mb", "256",
                                "--disk-mb", "512")).strip()
    assert re.fullmatch(r"sb-[0-9a-f]{16}", sandbox_id)
    listing = _ok(router.cli("ls"))
    assert sandbox_id in listing and "cli-task" in listing and "ready" in listing
    rows = json.loads(_ok(router.cli("ls", "--json", "--label", "task_id=cli-task")))
    assert [r["id"] for r in rows] == [sandbox_id] and rows[0]["resources"]["memory_mb"] == 256
    assert rows[0]["resources"]["disk_mb"] == 512
    assert json.loads(_ok(router.cli("ls", "--json", "--label", "task_id=other"))) == []

    done = router.cli("exec", sandbox_id, "--", "echo", "hi")
    assert done.returncode == 0 and done.stdout == b"hi\n"
    done = router.cli("exec", sandbox_id, "--", "sh", "-c", "echo $GREETING; echo oops >&2; exit 7")
    assert done.returncode == 7 and done.stdout == b"hi\n" and done.stderr == b"oops\n"
    done = router.cli("exec", sandbox_id, "--", "echo $((1+2)) | tr 3 x")  # one word: a shell command
    assert done.returncode == 0 and done.stdout == b"x\n"
    done = router.cli("exec", sandbox_id, "--timeout", "1", "--", "echo start; sleep 10")
    assert done.returncode != 0 and done.stdout == b"start\n" and b"timed out" in done.stderr

    assert _ok(router.cli("rm", sandbox_id)).strip() == f"deleted {sandbox_id}"
    assert sandbox_id not in _ok(router.cli("ls"))
    done = router.cli("exec", sandbox_id, "--", "true")
    assert done.returncode == 1 and b"was deleted" in done.stderr


@pytest.mark.local_only  # the stand-in runs pods on the host, without a root of their own
def test_cp_both_ways(router: RouterProcess, tmp_path: Path) -> None:
    sandbox_id = _ok(router.cli("create")).strip()
    local = tmp_path / "in.txt"
    local.write_bytes(b"payload \x00\xff\n")
    os.chmod(local, 0o640)
    _ok(router.cli("cp", str(local), f"{sandbox_id}:/workspace/in.txt"))
    done = router.cli("exec", sandbox_id, "--", "stat -c %a /workspace/in.txt; od -c /workspace/in.txt | head -1")
    assert done.stdout.startswith(b"640\n"), done.stdout
    _ok(router.cli("exec", sandbox_id, "--", "cp /workspace/in.txt /workspace/out.txt"))
    _ok(router.cli("cp", f"{sandbox_id}:/workspace/out.txt", str(tmp_path / "out.txt")))
    assert (tmp_path / "out.txt").read_bytes() == b"payload \x00\xff\n"

    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "a").write_text("A")
    (tree / "b").write_text("B")
    _ok(router.cli("cp", str(tree), f"{sandbox_id}:/workspace/tree"))
    assert _ok(router.cli("exec", sandbox_id, "--", "cat /workspace/tree/sub/a /workspace/tree/b")) == "AB"
    _ok(router.cli("exec", sandbox_id, "--", "echo C > /workspace/tree/c"))
    _ok(router.cli("cp", f"{sandbox_id}:/workspace/tree", str(tmp_path / "back")))
    assert (tmp_path / "back" / "sub" / "a").read_text() == "A" and (tmp_path / "back" / "c").read_text() == "C\n"

    done = router.cli("cp", str(local), str(tmp_path / "x"))
    assert done.returncode == 2 and b"SANDBOX_ID:/path" in done.stderr
    done = router.cli("cp", f"{sandbox_id}:/no/such", str(tmp_path / "y"))
    assert done.returncode == 1 and b"/no/such" in done.stderr
    _ok(router.cli("rm", sandbox_id))


@pytest.mark.local_only  # a cluster pulls images at run time: an unknown one is not a create error there
def test_cli_errors_are_one_line(router: RouterProcess) -> None:
    done = router.cli("ls", key="wrong")
    assert done.returncode == 1 and done.stderr.startswith(b"grove: ") and b"Traceback" not in done.stderr
    done = router.cli("exec", "sb-0123456789abcdef", "--", "true")
    assert done.returncode == 1 and b"no sandbox" in done.stderr
    done = router.cli("create", "--image", "missing-image")
    assert done.returncode == 1 and b"missing-image" in done.stderr and b"Traceback" not in done.stderr
    done = router.cli("rm", "nope")
    assert done.returncode == 1 and b"not a sandbox id" in done.stderr
