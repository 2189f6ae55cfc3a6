"""Moving the import system to the runtime bundle's place inside a sandbox, once something is imported.

PID 1 is forked from an interpreter that loaded everything from the bundle's host path (in the state dir);
after ``pivot_root`` the bundle is at ``/.grove`` and those paths do not exist. Rewriting ``sys.path`` and
every loaded package's ``__path__`` costs ~2 ms of CPU and ~400 copied memory pages per sandbox start
(each list lives in pages shared with the zygote), and the executor's usual work imports nothing the
zygote has not loaded already. So :func:`remap_on_import` only puts a finder first on ``sys.meta_path``
that does the rewrite when an import is first looked for, then lets the usual finders run.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

PACKAGE_PATHS: list[list[str]] = []
"""The ``__path__`` lists of the zygote's packages, listed once before it forks (see :func:`package_paths`)."""


def package_paths() -> list[list[str]]:
    """The ``__path__`` lists of every loaded package."""
    found: list[list[str]] = []
    for module in list(sys.modules.values()):
        search = getattr(module, "__path__", None)
        if isinstance(search, list):
            found.append(search)
    return found


def remap(host_bundle: str, mount_point: str) -> None:
    """Point the import system at ``mount_point``: sys.path and every loaded package's __path__, in place."""
    host = host_bundle.rstrip("/")

    def moved(paths: list[str]) -> list[str]:
        return [mount_point + p[len(host) :] if p.startswith(host) else p for p in paths]

    sys.path[:] = moved(sys.path)
    # Only package search lists need moving; the zygote lists them once, so each sandbox does not
    # touch (and so copy the memory pages of) every loaded module.
    for search in PACKAGE_PATHS or package_paths():
        search[:] = moved(search)
    sys.path_importer_cache.clear()


class _RemapFirst:
    """A meta path finder that remaps once, on the first import looked for, and finds nothing itself.

    It stays in ``sys.meta_path`` afterwards (a no-op): the import system is iterating that very list
    when it calls us, and removing ourselves would make it skip the next finder. A package's ``__path__``
    handed to us is the list :func:`remap` rewrites in place, so the finders after us see the new paths.
    """

    def __init__(self, host_bundle: str, mount_point: str) -> None:
        self._args: tuple[str, str] | None = (host_bundle, mount_point)
        self._lock = threading.Lock()

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        """Remap if not done yet; the finders after this one do the finding."""
        if self._args is not None:
            with self._lock:
                if self._args is not None:
                    remap(*self._args)
                    self._args = None
        return None


def remap_on_import(host_bundle: str, mount_point: str) -> None:
    """Remap (see :func:`remap`) when something is first imported from now on."""
    sys.meta_path.insert(0, _RemapFirst(host_bundle, mount_point))
