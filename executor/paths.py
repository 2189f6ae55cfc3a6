"""API paths → filesystem paths: absolute ones under the root, relative ones under the workdir."""

from __future__ import annotations

import os

from grove.errors import BadRequest, Forbidden


class PathResolver:
    """Maps API paths onto the executor's filesystem, never outside ``root``.

    Inside a sandbox ``root`` is "/" and this is plain path joining. When the executor serves a directory
    (tests, tools), symlinks are resolved and a path that lands outside the root is refused.
    """

    def __init__(self, root: str, workdir: str) -> None:
        self._root = os.path.realpath(root)
        self._workdir = workdir if workdir.startswith("/") else "/" + workdir

    def api_path(self, path: str) -> str:
        """Normalise an API path to an absolute one (relative paths are under the workdir)."""
        if not isinstance(path, str) or not path:
            raise BadRequest("a non-empty 'path' is required")
        if "\x00" in path:
            raise BadRequest("'path' contains a NUL byte")
        joined = path if path.startswith("/") else os.path.join(self._workdir, path)
        return os.path.normpath(joined).replace("//", "/")

    def resolve(self, path: str) -> str:
        """The filesystem path for an API path; ``Forbidden`` if it escapes the root."""
        api = self.api_path(path)
        if self._root == "/":
            return api
        full = os.path.join(self._root, api.lstrip("/"))
        real = os.path.realpath(full)
        if real != self._root and not real.startswith(self._root + os.sep):
            raise Forbidden(f"path {path!r} resolves outside the sandbox root")
        return full
