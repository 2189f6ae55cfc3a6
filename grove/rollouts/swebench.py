"""SWE-bench-format instances as tasks, and how their named tests are read from a test run's output.

An instance line: ``instance_id``, ``repo``, ``base_commit``, ``problem_statement``, ``test_patch``,
``FAIL_TO_PASS``, ``PASS_TO_PASS`` (lists, or JSON strings of lists as the Hugging Face dataset has
them) and the image to use (``image``, ``image_name`` or ``docker_image``). grove's optional extras:
``workdir`` (where the repository is; default ``/testbed`` as in SWE-bench's images), ``files`` (a
local copy of the repository to upload there, for images without it), ``test_cmd`` (default
``python3 -m pytest -rA``), ``timeout_s``, ``resources``, ``labels``.

The check resets the files the test patch touches to ``base_commit``, applies the test patch, runs
``test_cmd`` and reads each named test's status from its output (pytest ``-rA`` summary lines, or
unittest ``-v`` lines). Pass: every FAIL_TO_PASS and PASS_TO_PASS test passed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from grove.rollouts.tasks import Check, Task, TaskFileError, _Fields

_PYTEST = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED)\s+(\S+)")
_UNITTEST = re.compile(r"^(\w+) \(([\w.]+)\)(?:\s.*)?\s\.\.\.\s+(ok|FAIL|ERROR|skipped.*|expected failure)$")
_DIFF_FILE = re.compile(r"^diff --git a/(\S+) b/", re.MULTILINE)
PASSING = ("PASSED", "XFAIL", "ok", "expected failure")


def from_swebench(raw: dict[str, Any], where: str, *, base: Path, files_root: Path) -> Task:
    """Map one SWE-bench instance to a task."""
    f = _Fields(raw, where)
    instance = f.text("instance_id", required=True)
    image = next((raw[k] for k in ("image", "image_name", "docker_image") if raw.get(k)), None)
    if not isinstance(image, str):
        raise TaskFileError(f"{where}: field 'image' is required for a SWE-bench instance "
                            "(the image holding the repository; also read from 'image_name' or 'docker_image')")
    base_commit = f.text("base_commit", required=True)
    workdir = f.abspath("workdir") or "/testbed"
    swebench = {
        "test_patch": f.text("test_patch", required=True),
        "test_cmd": f.text("test_cmd") or "python3 -m pytest -rA",
        "base_commit": base_commit,
        "FAIL_TO_PASS": _test_list(raw, "FAIL_TO_PASS", where),
        "PASS_TO_PASS": _test_list(raw, "PASS_TO_PASS", where),
    }
    if not swebench["FAIL_TO_PASS"]:
        raise TaskFileError(f"{where}: field 'FAIL_TO_PASS' must name at least one test")
    task_id = re.sub(r"[^A-Za-z0-9._-]", "_", instance)[:128]
    labels = {"repo": f.text("repo"), "instance_id": instance, **f.string_map("labels")}
    setup = (f"git -C {workdir} reset -q --hard {base_commit} && git -C {workdir} clean -fdq",)
    return Task(
        id=task_id, prompt=f.text("problem_statement", required=True), image=image, workdir=workdir,
        check=Check(test="swebench", swebench=swebench, timeout_s=f.number("check_timeout_s", 1800.0)),
        files=f.files(base, files_root), setup=setup, timeout_s=f.number("timeout_s", 1800.0), resources=f.resources(),
        env=f.string_map("env"), labels={k: v for k, v in labels.items() if v}, raw=dict(raw))


def _test_list(raw: dict[str, Any], name: str, where: str) -> list[str]:
    value = raw.get(name, [])
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else []
        except json.JSONDecodeError as exc:
            raise TaskFileError(f"{where}: field {name!r} must be a list of test names or a JSON string of one") \
                from exc
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise TaskFileError(f"{where}: field {name!r} must be a list of test names")
    return value


def patched_files(patch: str) -> list[str]:
    """The files a unified git diff touches."""
    return sorted(set(_DIFF_FILE.findall(patch)))


def read_test_statuses(output: str) -> dict[str, str]:
    """Each test's status as the run printed it, under every name SWE-bench might use for it."""
    statuses: dict[str, str] = {}
    for line in output.splitlines():
        line = line.rstrip()
        if m := _PYTEST.match(line):
            statuses[m.group(2)] = m.group(1)
        elif m := _UNITTEST.match(line):
            method, where, status = m.group(1), m.group(2), m.group(3)
            cls = where[: -len(method) - 1] if where.endswith("." + method) else where
            for name in (f"{method} ({where})", f"{method} ({cls})", f"{cls}.{method}"):
                statuses[name] = status
    return statuses


def verdict(statuses: dict[str, str], fail_to_pass: list[str], pass_to_pass: list[str]) -> dict[str, Any]:
    """Pass iff every named test passed; with the tests that did not."""
    failing = {name: statuses.get(name, "missing") for name in [*fail_to_pass, *pass_to_pass]
               if statuses.get(name) not in PASSING}
    return {"passed": not failing, "failing": failing,
            "FAIL_TO_PASS": {n: statuses.get(n, "missing") for n in fail_to_pass},
            "PASS_TO_PASS": {n: statuses.get(n, "missing") for n in pass_to_pass}}
