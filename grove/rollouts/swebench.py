"""SWE-bench instances as tasks, graded exactly as the ``swebench`` package grades them.

An instance line is a row of a SWE-bench dataset: ``instance_id``, ``repo``, ``version``, ``base_commit``,
``problem_statement``, ``test_patch``, ``FAIL_TO_PASS``, ``PASS_TO_PASS`` (lists, or JSON strings of lists as
the Hugging Face datasets have them), the image (``image``, ``image_name`` or ``docker_image``) and the grading
recipe the datasets carry since swebench 5.0: ``eval_script`` (the reference harness's script for the instance),
``log_parser`` (a parser of the package's ``PARSER_REGISTRY``) and ``eval_type``. grove's extras: ``workdir``
(where the repository is; default ``/testbed`` as in SWE-bench's images), ``files`` (a local copy of the
repository to upload there, for images without it), ``test_cmd``, ``timeout_s``, ``check_timeout_s``,
``resources``, ``env``, ``labels``.

Grading, as the reference harness does it: the grader resets the files the test patch touches to
``base_commit`` and applies the test patch (:func:`patched_files`); then it runs :func:`test_command` — the
instance's eval script less those two steps: its environment, its install step, its test command between the
harness's output markers and the test command's exit code recorded as the harness records it, run by bash with
stderr in stdout as in the harness's log. :func:`statuses` reads the log with the package's ``get_logs_eval``
(the repository's own parser over the marked output; no statuses for a run the harness rejects, such as one
whose tests exited non-zero while reporting no failure) and :func:`verdict` decides as the package does: pass
iff ``RESOLVED_FULL``.

A line's ``test_cmd`` replaces the test command between the markers. A row without ``eval_script`` (a copy of a
dataset made before swebench 5.0) needs ``test_cmd``: swebench 5 keeps no table of test commands by
repository and version; such a row's parser is the package's parser for its repository, or its ``log_parser``.

The package is imported on first use (loading or grading an instance), never when grove is imported.
"""

from __future__ import annotations

import importlib
import json
import re
import shlex
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

from grove.core.errors import Unavailable
from grove.rollouts.fields import Fields, TaskFileError
from grove.rollouts.tasks import Check, Task

_DIFF_FILE = re.compile(r"^diff --git a/(\S+) b/", re.MULTILINE)
_HEREDOC = re.compile(r"<<\s*'?([A-Za-z0-9_]+)'?\s*$")
EVAL_TYPES = ("pass_and_fail", "fail_only")
"""How the package counts a test: ``pass_and_fail`` needs its pass; ``fail_only`` (some JavaScript
repositories, whose parsers report failures only) needs only that it did not fail."""


def from_swebench(raw: dict[str, Any], where: str, *, base: Path, files_root: Path) -> Task:
    """Map one SWE-bench instance to a task."""
    f = Fields(raw, where)
    instance = f.text("instance_id", required=True)
    image = next((raw[k] for k in ("image", "image_name", "docker_image") if raw.get(k)), None)
    if not isinstance(image, str):
        raise TaskFileError(f"{where}: field 'image' is required for a SWE-bench instance "
                            "(the image holding the repository; also read from 'image_name' or 'docker_image')")
    base_commit = f.text("base_commit", required=True)
    workdir = f.abspath("workdir") or "/testbed"
    repo = f.text("repo", required=True)
    eval_script, test_cmd = f.text("eval_script"), f.text("test_cmd")
    if not eval_script and not test_cmd:
        raise TaskFileError(
            f"{where}: field 'eval_script' is required, or 'test_cmd': the swebench package keeps no test command "
            f"for {repo} by version since its 5.0 release; each row of a SWE-bench dataset carries its own "
            "eval_script (this row looks like a copy made before then: export it again from the dataset, or give "
            "the test command as 'test_cmd')")
    try:
        spec: dict[str, Any] = {
            "instance_id": instance, "repo": repo, "version": _version(raw, where), "image": image,
            "base_commit": base_commit, "test_patch": f.text("test_patch", required=True),
            "eval_script": eval_script or None, "test_cmd": test_cmd or None,
            "log_parser": _log_parser(raw, repo, where), "eval_type": _eval_type(raw, repo, where),
            "FAIL_TO_PASS": _test_list(raw, "FAIL_TO_PASS", where),
            "PASS_TO_PASS": _test_list(raw, "PASS_TO_PASS", where),
        }
        test_command(spec)  # a script grove cannot split fails here, at loading, not at the first grade
    except Unavailable as exc:
        raise TaskFileError(f"{where}: {exc.message}") from exc
    except ValueError as exc:
        raise TaskFileError(f"{where}: field 'eval_script' {exc}") from exc
    if not spec["FAIL_TO_PASS"]:
        raise TaskFileError(f"{where}: field 'FAIL_TO_PASS' must name at least one test")
    task_id = re.sub(r"[^A-Za-z0-9._-]", "_", instance)[:128]
    labels = {"repo": repo, "instance_id": instance, **f.string_map("labels")}
    setup = (f"git -C {workdir} reset -q --hard {base_commit} && git -C {workdir} clean -fdq",)
    return Task(
        id=task_id, prompt=f.text("problem_statement", required=True), image=image, workdir=workdir,
        check=Check(test="swebench", swebench=spec, timeout_s=f.number("check_timeout_s", 1800.0)),
        files=f.files(base, files_root), setup=setup, timeout_s=f.number("timeout_s", 1800.0), resources=f.resources(),
        env=f.string_map("env"), labels={k: v for k, v in labels.items() if v}, raw=dict(raw))


def patched_files(test_patch: str) -> list[str]:
    """The files a unified git diff touches."""
    return sorted(set(_DIFF_FILE.findall(test_patch)))


def test_command(spec: dict[str, Any]) -> str:
    """The command to run in the workdir once the test patch is applied (``/bin/sh -c`` runs it).

    Raises ``ValueError`` for an eval script without the steps grove must take out of it or the markers the
    harness reads (:func:`from_swebench` reports it as the line's error at loading)."""
    utils, constants = _package("harness.utils"), _package("harness.constants")
    start, end = f": '{constants.START_TEST_OUTPUT}'", f": '{constants.END_TEST_OUTPUT}'"
    if spec.get("eval_script"):
        lines = _without_patch_steps(utils.parse_eval_script(spec["eval_script"]), spec["base_commit"])
        marked = [i for i, line in enumerate(lines) if line in (start, end)]
        if len(marked) != 2 or lines[marked[0]] != start:
            raise ValueError(f"has no {start} ... {end} pair around its test command, which the harness reads")
        if spec.get("test_cmd"):
            lines = [*lines[: marked[0] + 1], spec["test_cmd"], *lines[marked[1]:]]
    else:
        lines = [start, spec["test_cmd"], end]
    # As the package's own TestSpec: bash, -x tracing the markers into the log, the exit code after the end marker.
    script = "\n".join(["set -uxo pipefail", *utils.record_test_exit_code(lines)])
    return f"/bin/bash -c {shlex.quote(script)} 2>&1"


def statuses(spec: dict[str, Any], log: str) -> dict[str, str]:
    """Test name → status in ``log`` (the output of :func:`test_command`), read as the harness reads its log."""
    grading, types = _package("harness.grading"), _package("types")
    test_spec = types.TestSpec(
        instance_id=spec["instance_id"], image=spec.get("image", ""), eval_script_list=[], repo=spec["repo"],
        version=spec.get("version", ""), FAIL_TO_PASS=spec["FAIL_TO_PASS"], PASS_TO_PASS=spec["PASS_TO_PASS"],
        log_parser=spec["log_parser"], eval_type=spec["eval_type"])
    with tempfile.TemporaryDirectory(prefix="grove-swebench-") as tmp:
        path = Path(tmp, "test_output.txt")
        # get_logs_eval reads a file with the locale's encoding: written with it, what it cannot hold replaced.
        with open(path, "w", errors="replace") as out:
            out.write(log)
        found, _ = grading.get_logs_eval(test_spec, str(path))
    return {str(name): str(status) for name, status in found.items()}


def verdict(statuses: dict[str, str], fail_to_pass: list[str], pass_to_pass: list[str], *,
            eval_type: str = "pass_and_fail") -> dict[str, Any]:
    """Pass iff the package resolves the instance fully; each named test's status and the ones not counted."""
    grading = _package("harness.grading")
    report = grading.get_eval_tests_report(statuses, {"FAIL_TO_PASS": fail_to_pass, "PASS_TO_PASS": pass_to_pass},
                                           eval_type=grading.EvalType(eval_type))
    resolution = str(grading.get_resolution_status(report))
    counted = {*report["FAIL_TO_PASS"]["success"], *report["PASS_TO_PASS"]["success"]}
    f2p = {name: _status(grading, name, statuses) for name in fail_to_pass}
    p2p = {name: _status(grading, name, statuses) for name in pass_to_pass}
    return {"passed": resolution == grading.ResolvedStatus.FULL.value, "resolution": resolution,
            "FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p,
            "failing": {name: status for name, status in {**f2p, **p2p}.items() if name not in counted}}


def _status(grading: ModuleType, name: str, found: dict[str, str]) -> str:
    # The package matches an id truncated mid-parameter by its prefix (SWE-bench issue #290): show what it matched.
    key = grading._resolve_case(name, found)
    return "missing" if key is None else found[key]


def _without_patch_steps(lines: list[str], base_commit: str) -> list[str]:
    """The eval script less its test-file resets and its test-patch heredoc: the grader does both itself."""
    kept: list[str] = []
    applies, i = 0, 0
    while i < len(lines):
        line = lines[i]
        heredoc = _HEREDOC.search(line)
        if heredoc and line.startswith("git apply"):
            try:
                i = lines.index(heredoc.group(1), i + 1) + 1
            except ValueError:
                raise ValueError(f"opens a heredoc ({line!r}) that never ends") from None
            applies += 1
            continue
        if not line.startswith(f"git checkout {base_commit} "):
            kept.append(line)
        i += 1
    if applies != 1:
        raise ValueError(f"has {applies} steps applying a patch from a heredoc ('git apply ... <<EOF'); the "
                         "reference harness's scripts have exactly one, the test patch's, which grove applies itself")
    return kept


def _log_parser(raw: dict[str, Any], repo: str, where: str) -> str:
    registry = _package("harness.log_parsers").PARSER_REGISTRY
    name = raw.get("log_parser")
    if name is None:
        parser = _package("harness.log_parsers.python").MAP_REPO_TO_PARSER_PY.get(repo)
        if parser is None:
            raise TaskFileError(
                f"{where}: field 'log_parser' is required: swebench {_version_of_package()} has no log parser for "
                f"repo {repo!r}; name the one that reads its test command's output, such as parse_log_pytest "
                "(pytest -rA) or parse_log_django (unittest -v)")
        return str(parser.__name__)
    if not isinstance(name, str) or name not in registry:
        raise TaskFileError(f"{where}: field 'log_parser': {name!r} is not a parser of swebench "
                            f"{_version_of_package()}; known: {', '.join(sorted(registry))}")
    return name


def _eval_type(raw: dict[str, Any], repo: str, where: str) -> str:
    value = raw.get("eval_type")
    if value is None:
        # Rows made before swebench 5.0 do not say; the package then decided by repository, as here.
        return "fail_only" if repo in _package("harness.constants").FAIL_ONLY_REPOS else "pass_and_fail"
    if value not in EVAL_TYPES:
        raise TaskFileError(f"{where}: field 'eval_type' must be one of {', '.join(EVAL_TYPES)}, got {value!r}")
    return str(value)


def _version(raw: dict[str, Any], where: str) -> str:
    value = raw.get("version", "")
    if not isinstance(value, str):
        raise TaskFileError(f"{where}: field 'version' must be a string, as SWE-bench datasets have it (\"3.0\"), "
                            f"got {value!r}: a number loses digits (3.10 reads as 3.1)")
    return value


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


def _package(module: str) -> ModuleType:
    """``swebench.<module>``, imported on first use: it pulls in datasets, docker and modal (about a second)."""
    try:
        return importlib.import_module(f"swebench.{module}")
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] != "swebench":
            raise
        raise Unavailable("SWE-bench instances are graded by the swebench package, which is not installed: "
                          "pip install 'grove[swebench]'") from exc


def _version_of_package() -> str:
    return str(importlib.import_module("swebench").__version__)
