"""The user-space walk (:mod:`executor.walkopen`) against the kernel's own ``openat2`` on this machine, which has
it: for every tricky path — links absolute and relative, out of the root, loops, ``..`` above the start, a file
used as a directory, procfs's magic links — both open the same file or both refuse with the same errno."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from executor.safeopen import RESOLVE_BENEATH, RESOLVE_IN_ROOT, RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS, openat2
from executor.walkopen import walk_open

SCOPES = {"beneath": RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS, "in-root": RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS,
          "no-symlinks": RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS}
PATHS = ["a/b/file", "a/../a/b/file", "./a/./b/", "..", "../outside.txt", "/etc/passwd", "abs/file", "rel/file",
         "up/outside.txt", "up", "loop", "loop/x", "a/b/file/x", "missing", "a/missing/x", "dangling", "rel",
         "a/b/../../rel/../a/b/file", "chain/file", "self", "a/b/dotdot/b/file", "", "."]
FLAGS = {"read": os.O_RDONLY, "path": os.O_PATH, "dir": os.O_PATH | os.O_DIRECTORY}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    top = tmp_path_factory.mktemp("walk")
    (top / "outside.txt").write_text("outside")
    base = top / "root"
    (base / "a" / "b").mkdir(parents=True)
    (base / "a" / "b" / "file").write_text("inside")
    (base / "etc").mkdir()
    (base / "etc" / "passwd").write_text("the sandbox's own")
    links = {"abs": "/a/b", "rel": "a/b", "up": "../../..", "loop": "loop", "dangling": "nowhere",
             "chain": "rel", "self": ".", "a/b/dotdot": ".."}
    for name, target in links.items():
        os.symlink(target, base / name)
    fd = os.open(base, os.O_PATH | os.O_DIRECTORY)
    yield fd
    os.close(fd)


def _outcome(opener: object, *args: object) -> tuple[str, object]:
    try:
        fd = opener(*args)  # type: ignore[operator]
    except OSError as exc:
        return "error", errno.errorcode.get(exc.errno or 0, exc.errno)
    st = os.fstat(fd)
    os.close(fd)
    return "opened", (st.st_dev, st.st_ino)


@pytest.mark.parametrize("scope", SCOPES)
@pytest.mark.parametrize("flags", FLAGS)
def test_the_walk_opens_what_openat2_opens_and_refuses_what_it_refuses(root: int, scope: str, flags: str) -> None:
    differ = {}
    for path in PATHS:
        kernel = _outcome(openat2, root, path, FLAGS[flags], SCOPES[scope])
        walked = _outcome(walk_open, root, path, FLAGS[flags], SCOPES[scope])
        if kernel != walked:
            differ[path] = (kernel, walked)
    assert not differ


def test_procfs_magic_links_are_refused_like_openat2(tmp_path: Path) -> None:
    proc = os.open("/proc/self", os.O_PATH | os.O_DIRECTORY)
    keep = os.open(tmp_path, os.O_RDONLY)
    try:
        for path in (f"fd/{keep}", "root", "cwd", "exe", f"fd/{keep}/x"):
            for scope in (RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS):
                assert _outcome(openat2, proc, path, os.O_PATH, scope) == ("error", "ELOOP"), path
                assert _outcome(walk_open, proc, path, os.O_PATH, scope) == ("error", "ELOOP"), path
    finally:
        os.close(keep)
        os.close(proc)


def test_a_create_through_a_link_lands_where_openat2_puts_it(tmp_path: Path) -> None:
    for name, opener in (("kernel", openat2), ("walk", walk_open)):
        base = tmp_path / name
        (base / "d").mkdir(parents=True)
        os.symlink("d/new", base / "dangling")
        os.symlink("/d/abs", base / "absolute")
        fd = os.open(base, os.O_PATH | os.O_DIRECTORY)
        try:
            flags = os.O_WRONLY | os.O_CREAT
            os.close(opener(fd, "dangling", flags, RESOLVE_IN_ROOT, 0o600))
            os.close(opener(fd, "absolute", flags, RESOLVE_IN_ROOT, 0o600))
            with pytest.raises(OSError) as refused:
                opener(fd, "absolute", flags, RESOLVE_BENEATH, 0o600)
            assert refused.value.errno == errno.EXDEV
            with pytest.raises(FileExistsError):
                opener(fd, "dangling", flags | os.O_EXCL, RESOLVE_IN_ROOT, 0o600)
        finally:
            os.close(fd)
        assert sorted(p.name for p in (base / "d").iterdir()) == ["abs", "new"], name
