"""Project definitions on disk: ``<state>/projects/<name>.json``, one per project, written atomically.

The CLI writes them (``grove project create|set|rm``, ``grove key add --project``) on the state dir, as it
writes API keys; a running router re-reads the folder when it changes (checked at most once a second), so
a new quota holds without a restart. A project with no file has no quotas and no retention.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import time
from pathlib import Path

from grove.core.errors import Conflict, GroveError, NotFound
from grove.statedir import StateDir
from router.projects.model import DEFAULT, Project, check_name

log = logging.getLogger("grove.router")
RELOAD_INTERVAL_S = 1.0


class ProjectFiles:
    """The state dir's project definitions, cached and re-read when the folder changes."""

    def __init__(self, state_dir: Path) -> None:
        self.dir = StateDir(state_dir).projects
        self._cache: dict[str, Project] = {}
        self._stamp: tuple[int, ...] | None = None
        self._checked = float("-inf")

    def get(self, name: str) -> Project:
        """A project's definition (one with no quotas if it has no file)."""
        return self.all().get(name) or Project(name)

    def all(self) -> dict[str, Project]:
        """Every defined project by name (re-read when the folder changed, at most once a second)."""
        now = time.monotonic()
        if now - self._checked >= RELOAD_INTERVAL_S:
            self._checked = now
            stamp = self._folder_stamp()
            if stamp != self._stamp:
                self._stamp = stamp
                self._cache = self._read_all()
        return dict(self._cache)

    def refresh(self) -> None:
        """Read again at the next lookup (after this process wrote a definition)."""
        self._checked = float("-inf")

    def save(self, project: Project) -> None:
        """Write a definition atomically (0600, like everything in the state dir)."""
        check_name(project.name)
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".project-")
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(project.to_dict(), fh, indent=1)
                fh.write("\n")
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.dir / f"{project.name}.json")
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        self.refresh()

    def create(self, project: Project) -> Project:
        """Define a new project (``Conflict`` if it exists)."""
        if (self.dir / f"{check_name(project.name)}.json").exists():
            raise Conflict(f"project {project.name} exists; change it with `grove project set`")
        project = Project(project.name, project.quotas, project.retention_days, project.created_at or time.time())
        self.save(project)
        return project

    def remove(self, name: str) -> None:
        """Forget a project's definition (its keys and objects are the caller's to deal with first)."""
        if name == DEFAULT:
            raise Conflict("the default project cannot be removed (it holds what was made before projects)")
        try:
            (self.dir / f"{check_name(name)}.json").unlink()
        except FileNotFoundError:
            raise NotFound(f"no project {name!r} (see `grove project ls`)") from None
        self.refresh()

    def _folder_stamp(self) -> tuple[int, ...] | None:
        try:
            st = self.dir.stat()
        except FileNotFoundError:
            return None
        stamps = [st.st_ino, st.st_mtime_ns]
        with contextlib.suppress(FileNotFoundError):
            for entry in sorted(os.scandir(self.dir), key=lambda e: e.name):
                if entry.name.endswith(".json"):
                    est = entry.stat()
                    stamps += [est.st_ino, est.st_mtime_ns, est.st_size]
        return tuple(stamps)

    def _read_all(self) -> dict[str, Project]:
        found: dict[str, Project] = {}
        if not self.dir.is_dir():
            return found
        for path in sorted(self.dir.glob("*.json")):
            try:
                project = Project.from_dict(json.loads(path.read_text()))
            except (OSError, ValueError, GroveError) as exc:
                message = exc.message if isinstance(exc, GroveError) else str(exc)
                log.error("ignoring unreadable project definition %s: %s", path, message)
                continue
            if project.name != path.stem:
                log.error("ignoring project definition %s: it names project %r", path, project.name)
                continue
            found[project.name] = project
        return found
