"""The build context: which of its files a ``COPY`` takes (``.dockerignore`` honoured, by Moby's own matcher as
ported in ``e2b-dockerfile-utils``), packed as the tar that goes into the step's sandbox through the archive API,
with a digest of their content for the step's cache key.

A source must stay inside the context: ``..`` out of it, or a symlink on the way that leads out, is refused
(the link itself, as a link, is copied like any file). Nothing under the context is ever followed out of it.
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import os
import posixpath
import stat
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from e2b_dockerfile_utils import PatternMatcher

from grove.core.errors import Invalid


@dataclass(frozen=True)
class Packed:
    """A ``COPY``'s files as a tar to unpack at ``/``, and a digest of what they hold."""

    tar: IO[bytes]
    """A temporary file, at its start (closed by the caller)."""
    digest: str
    """``sha256:`` over every entry's destination, type, mode and content (not its times)."""
    members: int
    """How many entries it holds."""


def directories_tar(paths: list[str], mode: int = 0o755) -> bytes:
    """A tar that makes the absolute directories ``paths`` (parents first) when unpacked at ``/``: directories made
    through the archive API, so the image needs no ``mkdir``."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for path in paths:
            info = tarfile.TarInfo(path.strip("/") or ".")
            info.type, info.mode = tarfile.DIRTYPE, mode
            tf.addfile(info)
    return buf.getvalue()


class BuildContext:
    """A directory whose files ``COPY`` and ``ADD`` take."""

    def __init__(self, root: Path) -> None:
        """``root``: the context directory; its ``.dockerignore`` is read now."""
        self.root = root.resolve()
        if not self.root.is_dir():
            raise Invalid(f"the build context {root} is not a directory")
        ignore = self.root / ".dockerignore"
        try:
            self._ignore = PatternMatcher(ignore.read_text().splitlines() if ignore.is_file() else [])
        except ValueError as exc:
            raise Invalid(f"{ignore}: {exc}") from None

    def ignored(self, rel: str) -> bool:
        """Whether ``.dockerignore`` leaves the context path ``rel`` out."""
        return self._ignore.matches(rel)

    def sent(self, rel: str, is_dir: bool) -> bool:
        """Whether the context sent whole (a remote build's upload) takes the context path ``rel``: not left out by
        ``.dockerignore``, or a directory under which an exception (``!PATTERN``) may take something back."""
        return not self.ignored(rel) or (is_dir and self._ignore.may_match_under(rel))

    def sources(self, patterns: list[str], where: str) -> list[str]:
        """The context paths (relative) the source ``patterns`` name; Invalid for one leaving the context or
        naming nothing."""
        found: list[str] = []
        for pattern in patterns:
            rel = posixpath.normpath(pattern.lstrip("/")) if pattern.strip("/") else "."
            if rel == ".." or rel.startswith("../"):
                raise Invalid(f"{where}: {pattern!r} is outside the build context {self.root}; a COPY takes only "
                              "files under the context directory")
            matches = self._glob(rel) if any(c in rel for c in "*?[") else [rel]
            matches = [m for m in matches if self._inside(m, pattern, where) and (m == "." or not self.ignored(m))]
            if not matches:
                raise Invalid(f"{where}: {pattern!r} names no file of the build context {self.root} "
                              "(or .dockerignore leaves it out)")
            found.extend(matches)
        return found

    def _glob(self, rel: str) -> list[str]:
        parent, name = posixpath.split(rel)
        directory = self.root / parent if parent else self.root
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            return []
        return [posixpath.join(parent, n) if parent else n for n in names if fnmatch.fnmatchcase(n, name)]

    def _inside(self, rel: str, pattern: str, where: str) -> bool:
        """Whether ``rel`` exists; Invalid if reaching it passes a symlink that leads out of the context."""
        if rel == ".":
            return True  # the context itself
        path = self.root / rel
        if not os.path.lexists(path):
            return False
        # The parents are followed as a COPY would follow them; the entry itself is copied as it is.
        parent = path.parent.resolve()
        if parent != self.root and self.root not in parent.parents:
            raise Invalid(f"{where}: {pattern!r} leads out of the build context {self.root} (through a symlink to "
                          f"{parent}); a COPY takes only files under the context directory")
        if path.is_symlink() and path.is_dir() and rel == posixpath.normpath(pattern.lstrip("/")):
            target = path.resolve()
            if target != self.root and self.root not in target.parents:
                raise Invalid(f"{where}: {pattern!r} is a symlink to {target}, outside the build context")
        return True

    def pack(self, sources: list[str], dest: str) -> Packed:
        """The ``sources`` copied to the absolute ``dest`` as Docker does: a directory's contents into ``dest``,
        a file to ``dest`` itself, or into it when ``dest`` ends in ``/`` or there are several sources."""
        into_dir = dest.endswith("/") or len(sources) > 1
        base = dest.strip("/")
        sha = hashlib.sha256()
        tmp = tempfile.TemporaryFile()  # noqa: SIM115  # handed to the caller, who closes it
        count = 0
        with tarfile.open(fileobj=tmp, mode="w", format=tarfile.PAX_FORMAT) as tf:
            for rel in sources:
                path = self.root / rel
                if path.is_dir() and not path.is_symlink():
                    pairs = self._tree(rel, base)
                else:
                    target = posixpath.join(base, posixpath.basename(rel)) if into_dir else base
                    pairs = [(rel, target)]
                for src, arc in pairs:
                    count += self._add(tf, src, arc, sha)
        tmp.seek(0)
        return Packed(tmp, "sha256:" + sha.hexdigest(), count)

    def _tree(self, rel: str, base: str) -> list[tuple[str, str]]:
        """Every entry under the context directory ``rel`` not ignored, with where it goes under ``base``."""
        pairs = [(rel, base)] if base else []
        for top, dirs, files in os.walk(self.root / rel):
            top_rel = posixpath.relpath(Path(top).relative_to(self.root).as_posix() or ".", rel)
            for name in sorted(dirs) + sorted(files):
                src = posixpath.normpath(posixpath.join(rel, top_rel, name))
                if self.ignored(src):
                    if name in dirs and not self._ignore.may_match_under(src):
                        dirs.remove(name)
                    continue
                pairs.append((src, posixpath.normpath(posixpath.join(base, top_rel, name)).lstrip("/")))
            dirs.sort()
        return pairs

    def _add(self, tf: tarfile.TarFile, rel: str, arc: str, sha: Any) -> int:
        path = self.root / rel
        tf.inodes.clear()  # type: ignore[attr-defined]  # every file whole: a hardlink is copied, as Docker does
        info = tf.gettarinfo(str(path), arcname=arc or ".")
        if not (info.isreg() or info.isdir() or info.issym()):
            return 0  # a socket, fifo or device: nothing an image takes
        info.uid = info.gid = 0  # root's, as a COPY makes them
        info.uname = info.gname = ""
        head = f"{arc}\0{info.type!r}\0{stat.S_IMODE(info.mode):o}\0{info.linkname}\0"
        sha.update(head.encode())
        if info.isreg():
            with open(path, "rb") as fh:
                data_sha = hashlib.file_digest(fh, "sha256")
                fh.seek(0)
                tf.addfile(info, fh)
            sha.update(data_sha.digest())
        else:
            tf.addfile(info)
        return 1
