"""API paths → descriptors: absolute ones under the root, relative ones under the workdir.

The promise: an API path resolves inside the executor's root and nowhere else, at the moment it is
opened. Inside a sandbox the root is "/": links are followed as the sandbox itself sees them (an
absolute link means the sandbox's "/"), except the ``/proc`` jumps (``/proc/<pid>/root``, ``fd/N``).
When the executor serves a directory (tests, tools), a link that leads out of it is refused (403).
Either way the kernel checks each component as it opens it (``openat2``), so a link swapped in
between a check and a use cannot redirect the use.
"""

from __future__ import annotations

import errno
import os

from executor.safeopen import RESOLVE_BENEATH, RESOLVE_IN_ROOT, RESOLVE_NO_MAGICLINKS, open_dirs, openat2
from grove.core.errors import BadRequest, Conflict, Forbidden, NotFound

_NOT_A_DIR = (errno.EEXIST, errno.ENOTDIR, errno.ELOOP)  # where a directory should be made or entered


class PathResolver:
    """Maps API paths onto the executor's filesystem, never outside ``root``."""

    def __init__(self, root: str, workdir: str) -> None:
        self._root = os.path.realpath(root)
        self._workdir = workdir if workdir.startswith("/") else "/" + workdir
        scope = RESOLVE_IN_ROOT if self._root == "/" else RESOLVE_BENEATH
        self._resolve = scope | RESOLVE_NO_MAGICLINKS
        self._root_fd = os.open(self._root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)

    def close(self) -> None:
        """Close the root's descriptor (where the process goes on without this resolver: a zygote, which
        must hand no handle on its own root to the sandboxes it forks); resolving fails from then on."""
        if self._root_fd >= 0:
            os.close(self._root_fd)
            self._root_fd = -1

    def api_path(self, path: str) -> str:
        """Normalise an API path to an absolute one (relative paths are under the workdir)."""
        if not isinstance(path, str) or not path:
            raise BadRequest("a non-empty 'path' is required")
        if "\x00" in path:
            raise BadRequest("'path' contains a NUL byte")
        joined = path if path.startswith("/") else os.path.join(self._workdir, path)
        return os.path.normpath(joined).replace("//", "/")

    def resolve(self, path: str) -> str:
        """The filesystem path for an API path, for a command's cwd; ``Forbidden`` if it escapes the root.

        Only for what is handed to the kernel by name later (a command's working directory): files
        are opened with :meth:`open` and its siblings.
        """
        api = self.api_path(path)
        if self._root == "/":
            return api
        full = os.path.join(self._root, api.lstrip("/"))
        real = os.path.realpath(full)
        if real != self._root and not real.startswith(self._root + os.sep):
            raise Forbidden(f"path {path!r} resolves outside the sandbox root")
        return full

    def open(self, api: str, flags: int, mode: int = 0) -> int:
        """Open an (already normalised) API path; 403 if it leads outside the root, 404 if it is missing."""
        try:
            return openat2(self._root_fd, api.lstrip("/") or ".", flags, self._resolve, mode)
        except OSError as exc:
            raise self._error(exc, api) from exc

    def open_dir(self, api: str, *, create: bool) -> int:
        """An ``O_PATH`` descriptor of the directory at ``api`` (made with its parents if ``create``)."""
        try:
            return open_dirs(self._root_fd, _parts(api), self._resolve, create=create)
        except OSError as exc:
            if create and exc.errno in _NOT_A_DIR:
                raise Conflict(f"{api} or a parent of it exists and is not a directory") from exc
            raise self._error(exc, api) from exc

    def open_parent(self, api: str, *, create: bool) -> tuple[int, str]:
        """The parent directory of ``api`` (``O_PATH``, made if ``create``) and the last name in it."""
        parts = _parts(api)
        if not parts:
            raise BadRequest("the sandbox's root directory itself cannot be written or deleted")
        parent = "/" + "/".join(parts[:-1])
        try:
            return open_dirs(self._root_fd, parts[:-1], self._resolve, create=create), parts[-1]
        except OSError as exc:
            if create and exc.errno in _NOT_A_DIR:
                raise Conflict(f"a parent of {api} exists and is not a directory") from exc
            raise self._error(exc, parent, of=api) from exc

    def _error(self, exc: OSError, api: str, of: str | None = None) -> Exception:
        what = api if of is None else f"{api} (parent of {of})"
        if exc.errno == errno.EXDEV:
            return Forbidden(f"path {what!r} resolves outside the sandbox root")
        if isinstance(exc, FileNotFoundError):
            return NotFound(f"no such file or directory: {what}")
        if isinstance(exc, NotADirectoryError):
            return NotFound(f"a parent of {what} is not a directory")
        exc.filename = what
        return exc


def _parts(api: str) -> list[str]:
    return [p for p in api.split("/") if p]
