"""The ``user`` an exec runs as: a name or id from the sandbox's own ``/etc/passwd`` and ``/etc/group``.

Accepted forms, as ``docker run --user`` takes them: ``name``, ``uid``, ``name:group``, ``uid:gid`` (and
mixes). A name must exist in the sandbox's files; a bare numeric id need not (its home is ``/``). The
files are parsed here rather than through NSS: the runtime bundle carries no NSS modules, and the
image's own libc may differ from the bundle's.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass

from executor.paths import PathResolver
from grove.core.errors import Forbidden, Invalid, NotFound

MAX_ID = 65535
"""Ids a sandbox has: its user namespace maps 65,536 of them (``nobody`` is 65534)."""
MAX_ACCOUNT_FILE = 4 * 1024 * 1024
"""Largest ``/etc/passwd`` or ``/etc/group`` read (real ones are a few KiB)."""


@dataclass(frozen=True)
class RunAs:
    """Who a command runs as."""

    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str
    name: str | None


def account_file(paths: PathResolver, api: str, user: str) -> str:
    """The text of the sandbox's ``api`` (``/etc/passwd``, ``/etc/group``); "" if it has none.

    The sandbox controls these files: one that is a FIFO, a device, a link out of the root or huge is
    refused with a 422 naming it, and opening never blocks, so a lookup cannot outlast the command's timeout.
    """
    why = f"cannot look up user {user!r}: the sandbox's {api}"
    try:
        fd = paths.open(api, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except NotFound:
        return ""  # an image without the file: numeric ids still work
    except (Forbidden, OSError) as exc:  # a link out of the root, a loop, ...; a kernel without openat2 is a 503
        reason = exc.message if isinstance(exc, Forbidden) else exc.strerror
        raise Invalid(f"{why} cannot be opened ({reason})") from None
    with os.fdopen(fd, "rb") as fh:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a device or socket"
            raise Invalid(f"{why} is not a regular file but {kind}; make it an ordinary file or give a numeric id")
        data = fh.read(MAX_ACCOUNT_FILE + 1)
    if len(data) > MAX_ACCOUNT_FILE:
        raise Invalid(f"{why} is larger than {MAX_ACCOUNT_FILE} bytes")
    return data.decode("utf-8", errors="replace")


def parse_spec(value: str) -> tuple[str, str | None]:
    """Split ``user[:group]``; raise Invalid on a malformed one (before anything is looked up)."""
    parts = value.split(":")
    if len(parts) > 2 or not all(parts):
        raise Invalid(f"'user' must be 'name', 'uid', 'name:group' or 'uid:gid', got {value!r}")
    return parts[0], parts[1] if len(parts) == 2 else None


def resolve(value: str, passwd: str, group: str) -> RunAs:
    """``value`` against the text of the sandbox's passwd and group files."""
    user_part, group_part = parse_spec(value)
    users = _table(passwd, 7)
    groups = _table(group, 4)
    entry = _find(users, user_part)
    if entry is None:
        if not _numeric(user_part):
            raise Invalid(f"no user {user_part!r} in the sandbox's /etc/passwd; give a name from it or a numeric uid")
        uid, gid, home, name = _id(user_part, "uid"), _id(user_part, "uid"), "/", None
    else:
        uid, gid, home, name = _id(entry[2], "uid"), _id(entry[3], "gid"), entry[5] or "/", entry[0]
    if group_part is not None:
        gentry = _find(groups, group_part)
        if gentry is None:
            if not _numeric(group_part):
                raise Invalid(
                    f"no group {group_part!r} in the sandbox's /etc/group; give a name from it or a numeric gid"
                )
            gid = _id(group_part, "gid")
        else:
            gid = _id(gentry[2], "gid")
    extra: tuple[int, ...] = ()
    if name is not None and group_part is None:
        extra = tuple(sorted({_id(g[2], "gid") for g in groups if name in g[3].split(",") and g[2].isdigit()} - {gid}))
    return RunAs(uid, gid, extra, home, name)


def _table(text: str, width: int) -> list[list[str]]:
    rows = []
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            fields = line.split(":")
            rows.append(fields + [""] * (width - len(fields)))
    return rows


def _find(rows: list[list[str]], key: str) -> list[str] | None:
    by_name = next((r for r in rows if r[0] == key), None)
    if by_name is not None or not key.isdigit():
        return by_name
    return next((r for r in rows if r[2] == key), None)


def _numeric(text: str) -> bool:
    return re.fullmatch(r"-?[0-9]+", text) is not None


def _id(text: str, what: str) -> int:
    if not text.isdigit() or not 0 <= int(text) <= MAX_ID:
        raise Invalid(f"{what} {text!r} must be a number between 0 and {MAX_ID} (the ids a sandbox has)")
    return int(text)
