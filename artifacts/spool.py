"""The local spool: one file per waiting trajectory, written so a crash never leaves a torn one."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

from artifacts.trajectory import segment

SUFFIX = ".msgpack"


class Spool:
    """``<dir>/<sandbox_id>.msgpack`` files (the id URL-quoted); callers serialise access per sandbox."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        """Where spooled records live (created on first write)."""

    def path_for(self, sandbox_id: str) -> Path:
        """The spool file of one sandbox."""
        return self.directory / f"{segment(sandbox_id)}{SUFFIX}"

    def write(self, sandbox_id: str, data: bytes) -> Path:
        """Replace the sandbox's spool file atomically and durably: temp file, fsync, rename, fsync dir."""
        self.directory.mkdir(parents=True, exist_ok=True)
        final = self.path_for(sandbox_id)
        # Dot-prefixed so files() never sees a half-written record; random so two writers never share one.
        tmp = self.directory / f".{final.name}.{secrets.token_hex(4)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, final)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        self._sync_dir()  # the rename itself must survive a power loss
        return final

    def read(self, sandbox_id: str) -> bytes | None:
        """The spooled record's bytes, or None."""
        try:
            return self.path_for(sandbox_id).read_bytes()
        except FileNotFoundError:
            return None

    def remove(self, sandbox_id: str) -> None:
        """Forget the sandbox's spool file, if any."""
        with contextlib.suppress(FileNotFoundError):
            self.path_for(sandbox_id).unlink()

    def files(self) -> list[Path]:
        """Spooled records, oldest first."""
        try:
            entries = [e for e in os.scandir(self.directory) if e.name.endswith(SUFFIX) and not e.name.startswith(".")]
        except FileNotFoundError:
            return []
        stamped = []
        for entry in entries:
            with contextlib.suppress(FileNotFoundError):  # flushed meanwhile
                stamped.append((entry.stat().st_mtime_ns, entry.name))
        return [self.directory / name for _, name in sorted(stamped)]

    def quarantine(self, path: Path) -> None:
        """Move a file that can never be uploaded (unreadable, or refused by S3) to ``rejected/``, for a human."""
        bad = self.directory / "rejected"
        bad.mkdir(exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.replace(path, bad / path.name)

    def _sync_dir(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
