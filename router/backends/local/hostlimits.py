"""Kernel-wide limits that one sandbox could otherwise exhaust for the whole host.

The open-file table (``fs.file-max``) is one pool for every process on the host. A sandbox pays for each
open file in its own memory cgroup (about 300 bytes), so a 1 GiB sandbox can hold some 3.4 million files:
more than the table of a typical host, which then answers ENFILE to every other sandbox and to every host
process without CAP_SYS_ADMIN. With the table as large as the kernel allows (as systemd sets it on boot),
a sandbox's memory limit is its only bound, and the limit is its own.
"""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger("grove.router")
FILE_MAX = Path("/proc/sys/fs/file-max")
_LARGEST = (1 << 63) - 1


def raise_file_max(path: Path = FILE_MAX) -> int | None:
    """Raise the host's open-file table to the kernel's largest; the value set, or None if it could not be."""
    try:
        if int(path.read_text()) >= _LARGEST:
            return _LARGEST
        path.write_text(str(_LARGEST))
    except (OSError, ValueError) as exc:
        log.warning("could not raise fs.file-max (%s): one sandbox holding many open files may leave the host "
                    "short of file handles; raise it by hand (sysctl fs.file-max=%d)", exc, _LARGEST)
        return None
    log.info("fs.file-max raised to %d: a sandbox's open files are bounded by its own memory limit", _LARGEST)
    return _LARGEST
