"""The import system follows the bundle to its place inside a sandbox on the first import, not before."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sandbox_image import importpaths

pytestmark = pytest.mark.fast

# Run in a fresh interpreter: the check moves a package and rewrites sys.path. "pkg" is imported from
# the host path, the directory is moved (as pivot_root moves the bundle), then: nothing is remapped until
# something is imported; the first import, of a builtin module never loaded before, remaps and still finds
# it (a finder that removed itself while the import system iterates sys.meta_path would make it skip the
# builtin importer); a submodule of the moved package and a new top-level module import from the new place.
_CHILD = textwrap.dedent(
    """
    import os, sys
    # Only the interpreter's own finders, as in the runtime bundle (a venv puts its own ones first).
    sys.meta_path[:] = [f for f in sys.meta_path if f.__module__.startswith("_frozen_importlib")]
    host, moved = sys.argv[1], sys.argv[2]
    sys.path.insert(0, host)
    import pkg
    from sandbox_image import importpaths
    importpaths.PACKAGE_PATHS[:] = importpaths.package_paths()
    os.rename(host, moved)
    importpaths.remap_on_import(host, moved)
    assert sys.path[0] == host and pkg.__path__ == [host + "/pkg"], "remapped before any import"
    assert "_symtable" not in sys.modules and "_symtable" in sys.builtin_module_names
    import _symtable
    assert sys.path[0] == moved and pkg.__path__ == [moved + "/pkg"], (sys.path[0], pkg.__path__)
    import pkg.sub
    import top
    print(pkg.sub.VALUE, top.VALUE, _symtable.__spec__.origin)
    """
)


def _tree(root: Path) -> None:
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "sub.py").write_text("VALUE = 'sub'\n")
    (root / "top.py").write_text("VALUE = 'top'\n")


def test_remap_happens_on_first_import(tmp_path: Path) -> None:
    host, moved = tmp_path / "host", tmp_path / "moved"
    _tree(host)
    repo = Path(importpaths.__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(repo)!r})\n{_CHILD}", str(host), str(moved)],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["sub", "top", "built-in"]


def test_remap_moves_only_the_host_prefix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    search = ["/host/bundle/lib/python3.11/pkg", "/elsewhere/pkg"]
    monkeypatch.setattr(sys, "path", ["/host/bundle/lib/python3.11", "/other"])
    monkeypatch.setattr(importpaths, "PACKAGE_PATHS", [search])
    monkeypatch.setattr(sys, "path_importer_cache", {"/host/bundle/lib/python3.11": None})
    importpaths.remap("/host/bundle/", "/.grove")
    assert sys.path == ["/.grove/lib/python3.11", "/other"]
    assert search == ["/.grove/lib/python3.11/pkg", "/elsewhere/pkg"]
    assert sys.path_importer_cache == {}
