"""Typed reads of a task line's fields, each mistake a :class:`TaskFileError` naming the file, line and field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from grove.core.errors import Invalid

RESOURCES = {"cpu": float, "memory_mb": int, "pids_max": int, "disk_mb": int}
"""The ``resources`` a task may ask for, and their types."""


class TaskFileError(Invalid):
    """A task file that cannot be used; the message names the file, line and field."""


class Fields:
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
            kind = RESOURCES.get(key)
            if kind is None:
                raise self.fail(f"resources.{key}", f"is unknown; known: {', '.join(RESOURCES)}")
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
