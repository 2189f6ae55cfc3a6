"""An attempt's result as its changes: every change under the task's workdir against the state after setup.

The agent's sandbox is not trusted to grade itself (anything it leaves behind — a ``conftest.py``, a ``.pth``
in site-packages, a shim on ``PATH``, a process — would sit in the grader's path). What it made is taken out
as data instead: a manifest of the workdir right after setup (before the agent ran) and one after the agent
stopped, compared; the content of every file added or modified is read through the file API (binary-safe,
any size up to :data:`MAX_SUBMISSION_BYTES`). :mod:`grove.rollouts.isolated` applies them to a fresh sandbox.

Not part of a submission (:data:`NOT_SUBMITTED`): a repository's ``.git`` (hooks, config, filters) and
``__pycache__`` (bytecode that would shadow the sources): they are left out of both manifests.
"""

from __future__ import annotations

import difflib
import fnmatch
import io
import posixpath
import tarfile
from dataclasses import dataclass, field
from typing import Any

from grove.client import AsyncSandbox
from grove.core.errors import NotFound

NOT_SUBMITTED = (".git", "__pycache__")
"""Names left out of an attempt's changes wherever they appear."""
MAX_SUBMISSION_BYTES = 256 << 20
"""Most bytes of file content an attempt's changes carry; past it, the largest files are dropped (and listed)."""
MAX_DIFF_CHARS = 64 << 10
"""Longest diff of one file kept in the record (the rest is cut, and the cut said)."""
_SNIFF = 8192

Manifest = dict[str, dict[str, Any]]
"""Relative path → the executor's manifest entry (type, mode, size, sha256, target)."""


@dataclass
class FileChange:
    """One changed path under the workdir."""

    path: str
    """Relative to the workdir."""
    status: str
    """``added``, ``modified``, ``deleted`` or ``mode`` (only the permissions changed)."""
    kind: str
    """What is there now (``file``, ``dir``, ``symlink``, ``other``), or was, for a deletion."""
    kind_before: str | None = None
    """What was there before (None for an addition)."""
    mode_before: int | None = None
    mode_after: int | None = None
    size: int | None = None
    sha256: str | None = None
    target: str | None = None
    """A symlink's target."""
    content: bytes | None = field(default=None, repr=False)
    """A file's new content (not recorded as such: the diff and the hash are)."""
    binary: bool = False
    diff: str | None = None
    diff_truncated: bool = False
    applied: bool = False
    dropped: str | None = None
    """Why grading did not take it (``protected``, ``reset by the test patch``, ...); None if it did."""

    def record(self) -> dict[str, Any]:
        """The change as the trajectory records it (the ``changes`` event's ``files``)."""
        return {"path": self.path, "status": self.status, "kind": self.kind, "kind_before": self.kind_before,
                "mode_before": self.mode_before,
                "mode_after": self.mode_after, "size": self.size, "sha256": self.sha256, "target": self.target,
                "binary": self.binary, "diff": self.diff, "diff_truncated": self.diff_truncated,
                "applied": self.applied, "dropped": self.dropped}


def index(entries: list[dict[str, Any]]) -> Manifest:
    """A manifest by path."""
    return {str(e["path"]): e for e in entries}


async def manifest(sandbox: AsyncSandbox, workdir: str) -> Manifest:
    """The workdir as it is now (without what is no part of a submission)."""
    return index(await sandbox.manifest(workdir, skip=NOT_SUBMITTED))


def compare(before: Manifest, after: Manifest) -> list[FileChange]:
    """What changed from ``before`` to ``after``, path by path, in path order."""
    changes: list[FileChange] = []
    for path in sorted(set(before) | set(after)):
        old, new = before.get(path), after.get(path)
        if old is None and new is not None:
            changes.append(_change(path, "added", new, None))
        elif new is None and old is not None:
            changes.append(FileChange(path, "deleted", str(old["type"]), kind_before=str(old["type"]),
                                      mode_before=old.get("mode")))
        elif old is not None and new is not None:
            same_kind = old["type"] == new["type"]
            if not same_kind or old.get("sha256") != new.get("sha256") or old.get("target") != new.get("target"):
                changes.append(_change(path, "modified", new, old))
            elif old.get("mode") != new.get("mode"):
                changes.append(_change(path, "mode", new, old))
    return changes


def _change(path: str, status: str, new: dict[str, Any], old: dict[str, Any] | None) -> FileChange:
    return FileChange(path, status, str(new["type"]), kind_before=str(old["type"]) if old else None,
                      mode_before=old.get("mode") if old else None, mode_after=new.get("mode"),
                      size=new.get("size"), sha256=new.get("sha256"), target=new.get("target"))


async def capture(sandbox: AsyncSandbox, workdir: str, before: Manifest) -> list[FileChange]:
    """The agent's changes against ``before``, with the content of every file added or modified read in."""
    changes = compare(before, await manifest(sandbox, workdir))
    budget = MAX_SUBMISSION_BYTES
    # Smallest first, so that one huge file cannot push every other change out.
    for change in sorted((c for c in changes if c.kind == "file"), key=lambda c: c.size or 0):
        if (change.size or 0) > budget:
            change.dropped = f"too large: the attempt's changes carry at most {MAX_SUBMISSION_BYTES} bytes of files"
            continue
        try:
            change.content = await sandbox.read_file(posixpath.join(workdir, change.path))
        except NotFound:
            change.dropped = "gone before it could be read"
            continue
        budget -= len(change.content)
        change.size = len(change.content)
        change.binary = is_binary(change.content)
    return changes


def is_binary(data: bytes) -> bool:
    """Whether ``data`` is no text a diff can show (a NUL in its head, or not UTF-8)."""
    if b"\0" in data[:_SNIFF]:
        return True
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def drop_protected(changes: list[FileChange], protected: tuple[str, ...], reason: str = "protected") -> None:
    """Mark the changes under any of the ``protected`` globs (relative to the workdir) as dropped."""
    for change in changes:
        if change.dropped is None and any(_matches(change.path, glob) for glob in protected):
            change.dropped = reason


def _matches(path: str, glob: str) -> bool:
    """Whether a relative path falls under a protected glob, as ``.gitignore`` reads one: a glob without a ``/``
    matches that name at any depth; one with a ``/`` is anchored at the workdir; either covers everything under
    a directory it matches (``tests``, ``tests/**``, ``**/conftest.py``, ``setup.cfg``)."""
    glob = glob.strip("/")
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    if "/" not in glob:
        return any(fnmatch.fnmatchcase(part, glob) for part in parts)
    anchored = (glob, glob[3:]) if glob.startswith("**/") else (glob,)
    return any(fnmatch.fnmatchcase(prefix, g) or fnmatch.fnmatchcase(prefix, g.removesuffix("/**"))
               for prefix in prefixes for g in anchored)


def diff(path: str, before: bytes, after: bytes) -> tuple[str, bool]:
    """A unified diff of a text file (cut at :data:`MAX_DIFF_CHARS`), and whether it was cut."""
    lines = difflib.unified_diff(before.decode("utf-8", "replace").splitlines(keepends=True),
                                 after.decode("utf-8", "replace").splitlines(keepends=True),
                                 fromfile=f"a/{path}", tofile=f"b/{path}")
    text = "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)
    return (text[:MAX_DIFF_CHARS], True) if len(text) > MAX_DIFF_CHARS else (text, False)


def as_tar(changes: list[FileChange]) -> bytes:
    """The directories, files and symlinks to put in place, as one tar (owners left to the sandbox's root)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for change in changes:
            info = tarfile.TarInfo(change.path)
            info.mode = change.mode_after if change.mode_after is not None else 0o644
            if change.kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif change.kind == "symlink":
                info.type, info.linkname = tarfile.SYMTYPE, change.target or ""
                tar.addfile(info)
            elif change.kind == "file" and change.content is not None:
                info.size = len(change.content)
                tar.addfile(info, io.BytesIO(change.content))
    return buf.getvalue()
