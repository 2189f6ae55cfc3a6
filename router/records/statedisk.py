"""A full state disk: recognising it, and the one message that tells a person what to do about it.

The router keeps its records, journals, spool, API keys, images and sandbox layers under its state dir.
When that filesystem fills (ENOSPC) or a quota runs out (EDQUOT), every write there fails the same way;
this module turns that ``OSError`` into :class:`~grove.core.errors.InsufficientStorage` (507), so callers see
"free space under <state dir>" instead of a 500 with a traceback. The error middleware and the lifecycle
code call :func:`storage_error`; nothing else needs to know the errnos.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from grove.core.errors import InsufficientStorage

NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})


def is_no_space(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) is a write that failed for lack of disk space."""
    return isinstance(exc, InsufficientStorage) or _no_space_cause(exc) is not None


def storage_error(exc: BaseException, state_dir: Path) -> InsufficientStorage | None:
    """The 507 to answer for ``exc`` if it is a full (or over-quota) state disk; None otherwise."""
    if isinstance(exc, InsufficientStorage):
        return exc
    cause = _no_space_cause(exc)
    if cause is None:
        return None
    what = f" writing {cause.filename}" if cause.filename else ""
    return InsufficientStorage(
        f"the router's state disk is full ({os.strerror(cause.errno or errno.ENOSPC)}{what}); "
        f"free space under {state_dir} ({_free(state_dir)}) and retry"
    )


def _no_space_cause(exc: BaseException) -> OSError | None:
    seen: BaseException | None = exc
    for _ in range(16):  # a chain can loop back on itself
        if seen is None:
            break
        if isinstance(seen, OSError) and seen.errno in NO_SPACE:
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _free(path: Path) -> str:
    try:
        st = os.statvfs(path)
    except OSError:
        return "free space unknown"
    return f"{st.f_bavail * st.f_frsize // 1024} KiB free of {st.f_blocks * st.f_frsize // 1024} KiB"
