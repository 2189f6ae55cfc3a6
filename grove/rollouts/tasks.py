"""Task sets: a JSONL file (one task per line) or a directory of them, validated into :class:`Task`.

A task line::

    {"id": "fix-add", "image": "default", "workdir": "/workspace/project",
     "files": "project/" | "project.tar.gz" | {"mathops.py": "def add(a, b): ..."},
     "setup": ["pip install -e ."], "prompt": "The test fails. Fix the bug.",
     "check": {"test": "python3 -m pytest -rA", "files": {"/grader/test_hidden.py": "..."}, "timeout_s": 300,
               "tests": ["tests/test_x.py::test_y"], "protected": ["tests/**", "conftest.py"],
               "grading": "isolated" | "in-place"}
            | {"reward": "python3 score.py", "pass_threshold": 1.0}
            | {"judge": "my_judges:rate", "pass_threshold": 0.5},
     "serve": "python3 server.py", "start_url": "http://127.0.0.1:8000/", "desktop": {"width": 1280},
     "timeout_s": 600, "resources": {"cpu": 1, "memory_mb": 1024}, "network": {"egress": "deny"},
     "env": {"K": "V"}, "labels": {"difficulty": "easy"}, "scripted": {...}, "data": {...anything...}}

A task with ``services`` (``[{"name", "image"?, "command", "port", "ready": {"http": PATH}}]``) has them started
and checked healthy before its agent — each in a sibling sandbox on a private network with the agent's, or beside
the agent with ``"in_agent_sandbox": true`` — and queried by its check (:mod:`grove.rollouts.services`).

A **browser task** has ``start_url`` (and optionally ``serve``, the command of its site's server, started in the
background after setup, and ``desktop``, its screen): the agent's sandbox gets a screen with Chromium open at
``start_url`` once the site answers (:mod:`grove.rollouts.browser`). A ``judge`` check grades an attempt by its
trajectory and final screen on the runner's side (:mod:`grove.rollouts.browser.judge`).

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

from grove.rollouts.fields import Fields, TaskFileError
from grove.rollouts.services import Service, check_grading, parse_services

__all__ = ["BROWSER_MEMORY_MB", "GRADING_MODES", "Check", "Task", "TaskFileError", "load_tasks", "parse_check",
           "parse_task"]

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_JUDGE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_KNOWN = {"id", "image", "workdir", "files", "setup", "prompt", "check", "timeout_s", "resources", "network",
          "env", "labels", "scripted", "data", "serve", "start_url", "desktop", "services", "volatile"}
GRADING_MODES = ("isolated", "in-place")
_CHECK_FIELDS = {"test", "reward", "judge", "pass_threshold", "files", "timeout_s", "protected", "tests", "grading"}
_DESKTOP_FIELDS = ("width", "height", "quiet_ms", "cap_ms")
_URL_SCHEMES = ("http://", "https://", "file://", "about:", "data:")
BROWSER_MEMORY_MB = 1536
"""A browser task's sandbox memory, the least it may ask for: Xvfb, a window manager, Chromium and the site."""


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
    ``in-place``: graded in the agent's sandbox once its processes are gone (a task whose outcome is live state);
    ``judge`` for a ``judge`` check (never given: it reads no files)."""
    judge: str | None = None
    """``module:function``, called on the runner's side as ``function(trajectory, final_screenshot) -> reward``
    (:mod:`grove.rollouts.browser.judge`); instead of ``test`` and ``reward``."""


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
    serve: str | None = None
    """A command started in the background in ``workdir`` after setup, before the agent: the task's site."""
    start_url: str | None = None
    """Where the agent's screen opens Chromium, once the site answers there (a browser task)."""
    desktop: dict[str, int] | None = None
    """A browser task's screen (``width``, ``height``, ``quiet_ms``, ``cap_ms``; the create's ``desktop``)."""
    services: tuple[Service, ...] = ()
    """Programs the agent's tools talk to, started before it and queried by the check (:mod:`.services`)."""
    volatile: tuple[str, ...] = ()
    """Regular expressions of commands whose output may differ from run to run: a replay runs them but reports
    them apart (:mod:`artifacts.replay`)."""
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
    f = Fields(raw, where)
    task_id = f.text("id", required=True)
    if not _ID.match(task_id):
        raise TaskFileError(f"{where}: field 'id': {task_id!r} must be 1-128 of [A-Za-z0-9._-], starting alnum")
    start_url, desktop = _start_url(f), _desktop(f)
    browser = bool(start_url) or desktop is not None
    check, services = parse_check(raw.get("check"), where), parse_services(f)
    check_grading(f, services, check.grading)
    return Task(
        id=task_id, prompt=f.text("prompt", required=True), check=check, services=services,
        image=f.text("image") or "default", workdir=f.abspath("workdir") or "/workspace",
        files=f.files(base, files_root), setup=tuple(f.strings("setup")), timeout_s=f.number("timeout_s", 600.0),
        resources=_resources(f, browser=browser), network=f.mapping("network") or None, env=f.string_map("env"),
        labels=f.string_map("labels"), scripted=f.mapping("scripted") or None, serve=f.text("serve") or None,
        start_url=start_url or None, desktop=desktop if desktop is not None else {} if browser else None,
        volatile=_volatile(f), data=f.mapping("data"), raw=dict(raw))


def _volatile(f: Fields) -> tuple[str, ...]:
    marks = tuple(f.list_of_text("volatile"))
    for mark in marks:
        try:
            re.compile(mark)
        except re.error as exc:
            raise f.fail("volatile", f"{mark!r} is not a regular expression: {exc}") from exc
    return marks


def _start_url(f: Fields) -> str:
    url = f.text("start_url")
    if url and not url.startswith(_URL_SCHEMES):
        raise f.fail("start_url", f"must be an http(s), file, about or data URL, got {url!r}")
    if f.raw.get("serve") is not None and not url:
        raise f.fail("serve", "starts the task's site: give 'start_url' too, the page the screen opens once the "
                              "site answers there")
    return url


def _desktop(f: Fields) -> dict[str, int] | None:
    if f.raw.get("desktop") is None:
        return None
    value = f.mapping("desktop")
    for key, item in value.items():
        if key not in _DESKTOP_FIELDS:
            hint = " (the screen opens at 'start_url')" if key in ("browser", "start") else ""
            raise f.fail(f"desktop.{key}", f"is unknown{hint}; known: {', '.join(_DESKTOP_FIELDS)}")
        if isinstance(item, bool) or not isinstance(item, int) or item < 0:
            raise f.fail(f"desktop.{key}", f"must be a whole number of pixels or milliseconds, got {item!r}")
    return dict(value)


def _resources(f: Fields, *, browser: bool) -> dict[str, Any]:
    """The task's resources; a browser task's memory at least :data:`BROWSER_MEMORY_MB` (its default too)."""
    resources = f.resources()
    if browser:
        memory = resources.setdefault("memory_mb", BROWSER_MEMORY_MB)
        if memory < BROWSER_MEMORY_MB:
            raise f.fail("resources.memory_mb", f"must be at least {BROWSER_MEMORY_MB} for a browser task (its "
                                                f"screen runs Xvfb and Chromium), got {memory}")
    return resources


def parse_check(raw: Any, where: str) -> Check:
    """The ``check`` field: exactly one of ``test``, ``reward`` and ``judge``."""
    if not isinstance(raw, dict):
        raise TaskFileError(f"{where}: field 'check' is required: {{\"test\": CMD}} or {{\"reward\": CMD}}")
    unknown = sorted(set(raw) - _CHECK_FIELDS)
    if unknown:
        known = ", ".join(sorted(_CHECK_FIELDS))
        raise TaskFileError(f"{where}: field 'check.{unknown[0]}' is unknown; known: {known}")
    f = Fields(raw, where, prefix="check.")
    test, reward, judge = f.text("test"), f.text("reward"), f.text("judge")
    if sum(map(bool, (test, reward, judge))) != 1:
        raise TaskFileError(f"{where}: field 'check' needs exactly one of 'test' (exit 0 = pass), 'reward' and "
                            "'judge'")
    if judge:
        _check_judge(f, judge)
    grading = f.text("grading") or ("judge" if judge else "isolated")
    if grading not in GRADING_MODES and not judge:
        raise f.fail("grading", f"must be one of {', '.join(GRADING_MODES)}, got {grading!r}")
    tests = tuple(f.list_of_text("tests"))
    if tests and not test:
        raise f.fail("tests", "names the tests whose statuses decide: it goes with 'test' (a command that prints "
                              "them, such as pytest -rA), not with 'reward'")
    return Check(test=test or None, reward=reward or None, pass_threshold=f.number("pass_threshold", 1.0),
                 files=f.string_map("files"), timeout_s=f.number("timeout_s", 600.0),
                 protected=tuple(f.list_of_text("protected")), tests=tests, grading=grading, judge=judge or None)


def _check_judge(f: Fields, judge: str) -> None:
    if not _JUDGE.match(judge):
        raise f.fail("judge", f"must name a function as module:function, got {judge!r}")
    for name, why in (("grading", "a judge grades the trajectory and the final screen on the runner's side, not "
                                  "the sandbox's files"),
                      ("files", "a judge runs on the runner's side: it reads no files in the sandbox"),
                      ("tests", "named tests go with 'test'")):
        if f.raw.get(name) is not None:
            raise f.fail(name, f"does not go with 'judge': {why}")
