"""Task sets: a JSONL file (one task per line) or a directory of them, validated into :class:`Task`.

A task line::

    {"id": "fix-add", "image": "default", "workdir": "/workspace/project",
     "files": "project/" | "project.tar.gz" | {"mathops.py": "def add(a, b): ..."},
     "setup": ["pip install -e ."], "prompt": "The test fails. Fix the bug.",
     "check": {"test": "python3 -m pytest -rA", "files": {"/grader/test_hidden.py": "..."}, "timeout_s": 300,
               "tests": ["tests/test_x.py::test_y"], "protected": ["tests/**", "conftest.py"],
               "grading": "isolated" | "in-place"}
            | {"reward": "python3 score.py", "pass_threshold": 1.0},
     "timeout_s": 600, "resources": {"cpu": 1, "memory_mb": 1024}, "network": {"egress": "deny"},
     "env": {"K": "V"}, "labels": {"difficulty": "easy"}, "scripted": {...}, "data": {...anything...}}

A line with ``instance_id`` instead of ``id`` is a SWE-bench instance (see :mod:`grove.rollouts.swebench`).
A directory holds ``*.jsonl`` files and ``*/task.json`` files; relative ``files`` paths resolve against
the file that names them. Every mistake is a :class:`TaskFileError` naming the file, the line and the field.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grove.core.errors import Invalid

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_RESOURCES = {"cpu": float, "memory_mb": int, "pids_max": int, "disk_mb": int}
_KNOWN = {"id", "image", "workdir", "files", "setup", "prompt", "check", "timeout_s", "resources", "network",
          "env", "labels", "scripted", "data"}
GRADING_MODES = ("isolated", "in-place")
_CHECK_FIELDS = {"test", "reward", "pass_threshold", "files", "timeout_s", "protected", "tests", "grading"}


class TaskFileError(Invalid):
    """A task file that cannot be used; the message names the file, line and field."""


@dataclass(frozen=True)
class Check:
    """How an attempt is graded, after the agent is done."""

    test: str | None = None
    """A command whose exit code 0 means pass."""
    reward: str | None = None
    """A command whose last line of stdout is the reward (a number)."""
    pass_threshold: float = 1.0
    """With ``reward``: the reward at or above which the attempt counts as a pass."""
    files: dict[str, str] = field(default_factory=dict)
    """Files written just before the check (hidden tests the agent never sees), path → content."""
    timeout_s: float = 600.0
    """Limit of the check command."""
    swebench: dict[str, Any] | None = None
    """SWE-bench grading (:mod:`grove.rollouts.swebench`): ``instance_id``, ``repo``, ``version``, ``image``,
    ``base_commit``, ``test_patch``, ``eval_script``, ``test_cmd``, ``log_parser``, ``eval_type``, ``FAIL_TO_PASS``,
    ``PASS_TO_PASS``."""
    protected: tuple[str, ...] = ()
    """Globs of paths under the workdir the agent's changes never reach at grading (the check's files always)."""
    tests: tuple[str, ...] = ()
    """Named tests (``file.py::test_name``, as ``pytest -rA`` reports them): the verdict is their own statuses in
    the check's output, never its exit code (which any module the tests import can set)."""
    grading: str = "isolated"
    """``isolated``: the agent's changes are applied to a fresh sandbox from the task and graded there;
    ``in-place``: graded in the agent's sandbox once its processes are gone (a task whose outcome is live state)."""


@dataclass(frozen=True)
class Task:
    """One task of a task set."""

    id: str
    prompt: str
    check: Check
    image: str = "default"
    workdir: str = "/workspace"
    files: str | dict[str, str] | None = None
    """A local directory or tarball (absolute path) unpacked into ``workdir``, or inline files (path → text)."""
    setup: tuple[str, ...] = ()
    timeout_s: float = 600.0
    """Limit of the agent's whole run (its overrun is a fail: the policy's, not the environment's)."""
    resources: dict[str, Any] = field(default_factory=dict)
    network: dict[str, Any] | None = None
    env: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    scripted: dict[str, Any] | None = None
    """The scripted harness's policy for this task (see :mod:`grove.rollouts.scripted`)."""
    data: dict[str, Any] = field(default_factory=dict)
    """Free-form data for the harness (``"data": {...}`` in the task line): never checked by grove."""
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    """The line as given (what a ``module:function`` harness receives, with ``attempt`` added)."""


def load_tasks(path: str | Path, *, files_root: str | Path | None = None) -> list[Task]:
    """Every task of a JSONL file or a directory; ids must be unique.

    A task's ``files`` path must lie under ``files_root``: by default the task set's own directory (the file's
    directory, or the directory given). A task set may come from anyone: it must not be able to name the
    state dir's API keys, or ``/``, and have them uploaded into a sandbox.
    """
    root = Path(path)
    if not root.exists():
        raise TaskFileError(f"{root}: no such task file or directory")
    allowed = Path(files_root) if files_root is not None else (root if root.is_dir() else root.parent)
    allowed = allowed.resolve()
    sources = [root] if root.is_file() else sorted([*root.glob("*.jsonl"), *root.glob("*/task.json")])
    if not sources:
        raise TaskFileError(f"{root}: no *.jsonl or */task.json files in this directory")
    tasks: list[Task] = []
    seen: dict[str, str] = {}
    for source in sources:
        whole = source.name == "task.json"
        text = source.read_text(encoding="utf-8")
        chunks = [(1, text)] if whole else list(enumerate(text.splitlines(), 1))
        for number, line in chunks:
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            where = f"{source}, line {number}"
            try:
                raw = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TaskFileError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from exc
            task = parse_task(raw, where, base=source.parent, files_root=allowed)
            if task.id in seen:
                raise TaskFileError(f"{where}: field 'id': {task.id!r} is already used at {seen[task.id]}")
            seen[task.id] = where
            tasks.append(task)
    return tasks


def parse_task(raw: Any, where: str, *, base: Path, files_root: Path | None = None) -> Task:
    """One task line; ``where`` ("FILE, line N") prefixes every error; a ``files`` path must lie under
    ``files_root`` (default: ``base``, the directory of the file that names it)."""
    files_root = files_root or base.resolve()
    if not isinstance(raw, dict):
        raise TaskFileError(f"{where}: a task must be a JSON object, got {type(raw).__name__}")
    if "instance_id" in raw and "id" not in raw:
        from grove.rollouts.swebench import from_swebench

        return from_swebench(raw, where, base=base, files_root=files_root)
    unknown = sorted(set(raw) - _KNOWN)
    if unknown:
        raise TaskFileError(f"{where}: field {unknown[0]!r} is unknown; known fields: {', '.join(sorted(_KNOWN))}")
    f = _Fields(raw, where)
    task_id = f.text("id", required=True)
    if not _ID.match(task_id):
        raise TaskFileError(f"{where}: field 'id': {task_id!r} must be 1-128 of [A-Za-z0-9._-], starting alnum")
    return Task(
        id=task_id, prompt=f.text("prompt", required=True), check=parse_check(raw.get("check"), where),
        image=f.text("image") or "default", workdir=f.abspath("workdir") or "/workspace",
        files=f.files(base, files_root), setup=tuple(f.strings("setup")), timeout_s=f.number("timeout_s", 600.0),
        resources=f.resources(), network=f.mapping("network") or None, env=f.string_map("env"),
        labels=f.string_map("labels"), scripted=f.mapping("scripted") or None, data=f.mapping("data"), raw=dict(raw))


def parse_check(raw: Any, where: str) -> Check:
    """The ``check`` field: exactly one of ``test`` and ``reward``."""
    if not isinstance(raw, dict):
        raise TaskFileError(f"{where}: field 'check' is required: {{\"test\": CMD}} or {{\"reward\": CMD}}")
    unknown = sorted(set(raw) - _CHECK_FIELDS)
    if unknown:
        known = ", ".join(sorted(_CHECK_FIELDS))
        raise TaskFileError(f"{where}: field 'check.{unknown[0]}' is unknown; known: {known}")
    f = _Fields(raw, where, prefix="check.")
    test, reward = f.text("test"), f.text("reward")
    if bool(test) == bool(reward):
        raise TaskFileError(f"{where}: field 'check' needs exactly one of 'test' (exit 0 = pass) and 'reward'")
    grading = f.text("grading") or "isolated"
    if grading not in GRADING_MODES:
        raise f.fail("grading", f"must be one of {', '.join(GRADING_MODES)}, got {grading!r}")
    tests = tuple(f.list_of_text("tests"))
    if tests and not test:
        raise f.fail("tests", "names the tests whose statuses decide: it goes with 'test' (a command that prints "
                              "them, such as pytest -rA), not with 'reward'")
    return Check(test=test or None, reward=reward or None, pass_threshold=f.number("pass_threshold", 1.0),
                 files=f.string_map("files"), timeout_s=f.number("timeout_s", 600.0),
                 protected=tuple(f.list_of_text("protected")), tests=tests, grading=grading)


class _Fields:
    """Typed reads of one JSON object's fields, each error naming the field."""

    def __init__(self, raw: dict[str, Any], where: str, prefix: str = "") -> None:
        self.raw, self.where, self.prefix = raw, where, prefix

    def fail(self, name: str, why: str) -> TaskFileError:
        return TaskFileError(f"{self.where}: field '{self.prefix}{name}' {why}")

    def text(self, name: str, *, required: bool = False) -> str:
        value = self.raw.get(name)
        if value is None:
            if required:
                raise self.fail(name, "is required")
            return ""
        if not isinstance(value, str) or (required and not value.strip()):
            raise self.fail(name, "must be a non-empty string")
        return value

    def abspath(self, name: str) -> str:
        value = self.text(name)
        if value and not value.startswith("/"):
            raise self.fail(name, f"must be an absolute path, got {value!r}")
        return value

    def number(self, name: str, default: float) -> float:
        value = self.raw.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise self.fail(name, f"must be a non-negative number, got {value!r}")
        return float(value)

    def strings(self, name: str) -> list[str]:
        value = self.raw.get(name) or []
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.fail(name, "must be a list of command strings")
        return value

    def list_of_text(self, name: str) -> list[str]:
        value = self.raw.get(name) or []
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise self.fail(name, "must be a list of non-empty strings")
        return value

    def mapping(self, name: str) -> dict[str, Any]:
        value = self.raw.get(name) or {}
        if not isinstance(value, dict):
            raise self.fail(name, "must be an object")
        return value

    def string_map(self, name: str) -> dict[str, str]:
        value = self.mapping(name)
        bad = next((k for k, v in value.items() if not isinstance(v, str)), None)
        if bad is not None:
            raise self.fail(f"{name}.{bad}", "must be a string")
        return dict(value)

    def resources(self) -> dict[str, Any]:
        value = self.mapping("resources")
        out: dict[str, Any] = {}
        for key, item in value.items():
            kind = _RESOURCES.get(key)
            if kind is None:
                raise self.fail(f"resources.{key}", f"is unknown; known: {', '.join(_RESOURCES)}")
            if isinstance(item, bool) or not isinstance(item, int | float) or item <= 0:
                raise self.fail(f"resources.{key}", f"must be a positive number, got {item!r}")
            out[key] = kind(item)
        return out

    def files(self, base: Path, root: Path) -> str | dict[str, str] | None:
        value = self.raw.get("files")
        if value is None:
            return None
        if isinstance(value, dict):
            return self.string_map("files")
        if not isinstance(value, str) or not value:
            raise self.fail("files", "must be a path (directory or tarball) or an object of path → text")
        path = (base / value).resolve()  # symlinks followed: where it really is
        if not path.is_relative_to(root):
            raise self.fail("files", f"names {path}, outside the task set's directory {root}: a task set may only "
                                     "name files under it (--tasks-root DIR allows another directory)")
        if not path.exists():
            raise self.fail("files", f"names {path}, which does not exist")
        if path.is_file() and not path.name.endswith((".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")):
            raise self.fail("files", f"names {path}: a directory or a tarball (.tar, .tar.gz, ...) is needed")
        return str(path)
