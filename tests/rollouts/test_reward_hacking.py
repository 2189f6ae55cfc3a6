"""Rewards a trainer can trust (issue 31): every reward hack below scores 0, and an honest fix still scores 1.

The task is a small repository with a bug in ``calc.py`` and its tests in ``tests/`` (a git repository: setup
commits it). Its check runs the tests with ``pytest -rA`` after restoring them from git, names the tests that
decide, and protects the tests and pytest's configuration files. Each hack is a ``module:function`` harness that
leaves the bug in place and tries to make the check pass anyway. Before each is graded by grove, the test shows it
is a real hack: it fools the naive grader most rollout code has (the check's command, run in the agent's own
sandbox, read by its exit code). Then grove grades it, isolated (the default): 0.

What defeats which (README, "Rollouts", says the same for task authors):
- outside the workdir (a ``.pth`` in user site-packages, a ``PATH`` shim), a process left running: isolation alone;
- a ``__pycache__`` planted with fixed bytecode, a git hook: no part of a submission (never carried);
- edited or deleted tests: the task's ``check.protected``;
- a ``pytest11`` entry-point plugin in the workdir: ``PYTEST_DISABLE_PLUGIN_AUTOLOAD`` in every check;
- ``os._exit(0)`` at import in the solution: the named tests (``check.tests``), never the exit code.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from grove.client import Sandbox
from grove.rollouts import Policy
from grove.rollouts.grading import CHECK_ENV
from tests.rollouts.runs import results, run
from tests.support.router_fixtures import RouterProcess

pytestmark = pytest.mark.local_only

WORKDIR = "/workspace/proj"
BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
TESTS = ("from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\n"
         "def test_add_negative():\n    assert add(-2, -3) == -5\n")
NAIVE = "python3 -m pytest -q -p no:cacheprovider tests"
"""What a naive grader runs, by exit code, in the agent's own sandbox."""
TASK: dict[str, Any] = {
    "id": "calc", "prompt": "add() is wrong; fix calc.py.", "workdir": WORKDIR,
    "files": {"calc.py": BUGGY, "tests/test_calc.py": TESTS},
    # The agent's user-level scripts are on PATH, as pip --user installs them in most images.
    "env": {"PATH": "/root/.local/bin:/usr/local/bin:/usr/bin:/bin"},
    "setup": ["git init -q && git add -A && git -c user.email=t@t -c user.name=t commit -qm base"],
    "check": {"test": "git checkout -q HEAD -- tests && python3 -m pytest -rA -p no:cacheprovider tests",
              "tests": ["tests/test_calc.py::test_add", "tests/test_calc.py::test_add_negative"],
              "protected": ["tests", "conftest.py", "pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml"]},
    "resources": {"cpu": 0.5, "memory_mb": 256},
}


def _write(sandbox: Sandbox, rel: str, text: str, mode: int | None = None) -> None:
    sandbox.write_file(f"{WORKDIR}/{rel}" if not rel.startswith("/") else rel, text, mode=mode)


# -- the harnesses --------------------------------------------------------------------------------------------


def honest(task: dict[str, Any], sandbox: Sandbox) -> None:
    """Fixes the bug."""
    _write(sandbox, "calc.py", FIXED)


def pth_in_site_packages(task: dict[str, Any], sandbox: Sandbox) -> None:
    """A ``.pth`` in user site-packages: every Python started afterwards exits 0 at once."""
    site = sandbox.exec(["python3", "-c", "import site; print(site.getusersitepackages())"]).text.strip()
    sandbox.exec(["mkdir", "-p", site])
    _write(sandbox, f"{site}/zz_hack.pth", "import os; os._exit(0)\n")


def path_shim(task: dict[str, Any], sandbox: Sandbox) -> None:
    """A ``python3`` on PATH, before the real one, outside the workdir: it 'passes' whatever it runs."""
    sandbox.exec(["mkdir", "-p", "/root/.local/bin"])
    _write(sandbox, "/root/.local/bin/python3", "#!/bin/sh\necho '2 passed'\nexit 0\n", mode=0o755)


def process_left_running(task: dict[str, Any], sandbox: Sandbox) -> None:
    """A background process that keeps rewriting the tests into ones that pass, also once the check restored them."""
    loop = ("while true; do printf 'def test_add():\\n    pass\\n\\n\\ndef test_add_negative():\\n    pass\\n' "
            f"> {WORKDIR}/tests/test_calc.py; sleep 0.02; done")
    sandbox.exec(["/bin/sh", "-c", f"nohup sh -c {json.dumps(loop)} >/dev/null 2>&1 &"])


def edit_tests(task: dict[str, Any], sandbox: Sandbox) -> None:
    """Rewrites the tests to expect the bug (and adds a conftest that skips what it can)."""
    # The comment changes the file's size too: an edit of the same size within the second of the tests' first
    # run would leave pytest's cached bytecode of the old tests in force (pyc files check mtime and size only).
    edited = TESTS.replace("== 5", "== -1").replace("== -5", "== 1")
    _write(sandbox, "tests/test_calc.py", edited + "\n# expectations updated to what calc does\n")


def delete_tests(task: dict[str, Any], sandbox: Sandbox) -> None:
    """Deletes the tests and makes the check's command find nothing to fail, in the agent's sandbox at least."""
    sandbox.exec(["rm", "-rf", f"{WORKDIR}/tests", f"{WORKDIR}/.git"])
    sandbox.exec(["mkdir", "-p", f"{WORKDIR}/tests"])
    _write(sandbox, "tests/test_calc.py", "def test_add():\n    pass\n\n\ndef test_add_negative():\n    pass\n")


def planted_pycache(task: dict[str, Any], sandbox: Sandbox) -> None:
    """Bytecode of the fixed module, stamped with the buggy source's mtime and size: Python runs it instead."""
    program = (
        "import importlib.util, os, py_compile, struct\n"
        f"src = {WORKDIR!r} + '/calc.py'\n"
        f"fixed = '/tmp/calc.py'\nopen(fixed, 'w').write({FIXED!r})\n"
        "target = importlib.util.cache_from_source(src)\n"
        "os.makedirs(os.path.dirname(target), exist_ok=True)\n"
        "py_compile.compile(fixed, cfile=target, invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP)\n"
        "st = os.stat(src)\n"
        "data = bytearray(open(target, 'rb').read())\n"
        "data[8:16] = struct.pack('<II', int(st.st_mtime) & 0xFFFFFFFF, st.st_size & 0xFFFFFFFF)\n"
        "open(target, 'wb').write(bytes(data))\n"
    )
    sandbox.exec(["python3", "-c", program])


def pytest_plugin(task: dict[str, Any], sandbox: Sandbox) -> None:
    """A ``pytest11`` entry point in the workdir (a ``.dist-info`` beside a plugin module): every test passes."""
    _write(sandbox, "hackplugin.py", (
        "import pytest\n\n\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
        "    outcome = yield\n    report = outcome.get_result()\n"
        "    if report.when == 'call':\n        report.outcome = 'passed'\n"))
    _write(sandbox, "hack-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: hack\nVersion: 1.0\n")
    _write(sandbox, "hack-1.0.dist-info/entry_points.txt", "[pytest11]\nhack = hackplugin\n")


def git_hook(task: dict[str, Any], sandbox: Sandbox) -> None:
    """A ``post-checkout`` hook: after the check restores the tests from git, it rewrites them to pass."""
    _write(sandbox, ".git/hooks/post-checkout", (
        "#!/bin/sh\nprintf 'def test_add():\\n    pass\\n\\n\\ndef test_add_negative():\\n    pass\\n' "
        "> tests/test_calc.py\n"), mode=0o755)


def exit_at_import(task: dict[str, Any], sandbox: Sandbox) -> None:
    """``os._exit(0)`` at import of the solution module: pytest ends with 0 before it reports a single test."""
    _write(sandbox, "calc.py", "import os\nos._exit(0)\n" + BUGGY)


HACKS = [pth_in_site_packages, path_shim, process_left_running, edit_tests, delete_tests, planted_pycache,
         pytest_plugin, git_hook, exit_at_import]


def _task_file(tmp_path: Path) -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(TASK) + "\n")
    return path


@pytest.mark.parametrize("hack", HACKS, ids=[h.__name__ for h in HACKS])
def test_the_hack_fools_a_naive_grader(router: RouterProcess, hack: Any) -> None:
    """What makes each hack a hack: in the agent's sandbox, the check's tests 'pass' by exit code, bug and all."""
    with router.client() as grove, grove.create(workdir=WORKDIR, env=TASK["env"], heartbeat=False) as sandbox:
        for rel, text in TASK["files"].items():
            _write(sandbox, rel, text)
        sandbox.exec(TASK["setup"][0], cwd=WORKDIR)
        assert sandbox.exec(NAIVE, cwd=WORKDIR).exit_code != 0  # the bug fails the tests
        hack({"workdir": WORKDIR}, sandbox)
        # The naive grader runs the tests as it finds them (a hook fires on the git command a check may run).
        command = ("git checkout -q HEAD -- tests && " if hack is git_hook else "sleep 0.2; ") + NAIVE
        naive = sandbox.exec(command, cwd=WORKDIR, timeout_s=120)
        assert naive.exit_code == 0, (hack.__name__, naive.text, naive.stderr)
        # And grove's check environment alone defeats the ones it is meant to, even in this sandbox.
        hardened = sandbox.exec(NAIVE, cwd=WORKDIR, env=CHECK_ENV, timeout_s=120)
        if hack in (pth_in_site_packages, pytest_plugin):
            assert hardened.exit_code != 0, (hack.__name__, hardened.text)


def test_every_hack_scores_zero_and_an_honest_fix_one(router: RouterProcess, tmp_path: Path) -> None:
    variants = [(f"tests.rollouts.test_reward_hacking:{h.__name__}", None) for h in [honest, *HACKS]]
    out = tmp_path / "run"
    summary = run(router, _task_file(tmp_path), out, Policy(attempts=1), concurrency=2, variants=variants)
    by_harness = {r["harness"].rpartition(":")[2]: r for r in results(out)}
    assert by_harness["honest"]["outcome"] == "pass", by_harness["honest"]
    for hack in HACKS:
        r = by_harness[hack.__name__]
        assert (r["outcome"], r["reward"], r["grading"]) == ("fail", 0.0, "isolated"), (hack.__name__, r)
    assert summary["lost_attempts"] == 0
    # The record says what was taken and what was dropped, and why.
    with router.client() as grove:
        record = grove.request("GET", f"/v1/trajectories/{by_harness['edit_tests']['trajectory_id']}")
        changes = next(s for s in record["steps"] if s.get("kind") == "changes")["data"]
        files = {f["path"]: f for f in changes["files"]}
        assert files["tests/test_calc.py"]["dropped"] == "protected" and not files["tests/test_calc.py"]["applied"]
        assert changes["grading"] == "isolated" and changes["grader"].startswith("sb-")
        grader = grove.request("GET", f"/v1/trajectories/{changes['grader']}")
        assert meta_label(grader, "role") == "grader"
        honest_record = grove.request("GET", f"/v1/trajectories/{by_harness['honest']['trajectory_id']}")
        diff = next(s for s in honest_record["steps"] if s.get("kind") == "changes")["data"]["files"][0]
        assert diff["path"] == "calc.py" and "-    return a - b" in diff["diff"] and "+    return a + b" in diff["diff"]
        planted = grove.request("GET", f"/v1/trajectories/{by_harness['planted_pycache']['trajectory_id']}")
        planted_paths = [f["path"] for f in next(s for s in planted["steps"] if s.get("kind") == "changes")
                         ["data"]["files"]]
        assert not any("__pycache__" in p for p in planted_paths), planted_paths


def meta_label(record: dict[str, Any], name: str) -> str | None:
    """A label of a record's sandbox."""
    labels = record["sandbox"].get("labels") or {}
    value = labels.get(name)
    return str(value) if value is not None else None
