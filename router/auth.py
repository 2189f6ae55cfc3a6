"""API keys: the state dir's ``api_keys`` file (mode 0600, one key per line), created with one key on first
start, plus ``GROVE_API_KEY`` if set.

A line is ``KEY [project=NAME] [role=member|admin] [label ...]``: the key's project and role, then a free
label. A line with neither (every line written before projects existed) is an admin of the ``default``
project, which holds everything made before: such a state dir works as it did. ``GROVE_API_KEY`` and the key
``grove up`` creates are admins of ``default`` too; ``grove key add NAME --project P`` makes a member of ``P``
(see :mod:`router.projects.model` for what each may see).

The router re-reads the file when it changes (checked at most once a second), so ``grove key add``
and ``grove key revoke`` take effect on a running router without a restart. Keys are never logged;
``grove key ls`` shows fingerprints, never keys.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from grove.core.errors import Conflict, Invalid, NotFound, Unauthorized
from grove.statedir import StateDir
from router.projects.model import DEFAULT, ROLES, Caller, check_name

RELOAD_INTERVAL_S = 1.0


def fingerprint(key: str) -> str:
    """What names a key in listings and revocations without revealing it."""
    return hashlib.sha256(key.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class KeyEntry:
    """One line of the key file."""

    key: str
    label: str = ""
    project: str = DEFAULT
    role: str = "admin"
    """``admin`` for a line that names no role: every key from before projects was the operator's."""

    def caller(self) -> Caller:
        return Caller(self.project, admin=self.role == "admin", key_id=fingerprint(self.key))

    def line(self) -> str:
        return f"{self.key} project={self.project} role={self.role} {self.label}".rstrip() + "\n"


def _parse(text: str) -> list[KeyEntry]:
    """One entry per non-comment line (a malformed project or role makes the line a member of no project:
    it is skipped, with the key file left as it is)."""
    entries = []
    for line in text.splitlines():
        fields = line.strip().split()
        if not fields or fields[0].startswith("#"):
            continue
        key, rest = fields[0], fields[1:]
        attrs: dict[str, str] = {}
        while rest and rest[0].split("=", 1)[0] in ("project", "role") and "=" in rest[0]:
            name, _, value = rest.pop(0).partition("=")
            attrs[name] = value
        # No role named: a line of before projects (no project either) is the operator's, a project's key a member.
        project = attrs.get("project", DEFAULT)
        role = attrs.get("role", "member" if "project" in attrs else "admin")
        try:
            check_name(project)
        except Invalid:
            continue
        if role not in ROLES:
            continue
        entries.append(KeyEntry(key, " ".join(rest), project, role))
    return entries


def _read(path: Path) -> list[KeyEntry]:
    try:
        return _parse(path.read_text())
    except FileNotFoundError:
        return []


class KeyRing:
    """The router's accepted API keys and the caller each stands for; comparisons are constant-time.

    ``keys`` found in ``key_file`` when the ring is made follow the file from then on (revoking one
    there revokes it here); the others (``GROVE_API_KEY``) stay for the router's life, as admins of the
    default project.
    """

    def __init__(self, keys: list[str], key_file: Path | None = None) -> None:
        self._file = key_file
        in_file = {e.key for e in _read(key_file)} if key_file else set()
        self._static = [(k.encode(), KeyEntry(k).caller()) for k in keys if k and k not in in_file]
        self._keys = list(self._static)
        self._stamp: tuple[int, int, int] | None = None
        self._checked = float("-inf")
        self._refresh(force=True)

    def _refresh(self, *, force: bool = False) -> None:
        if self._file is None:
            return
        now = time.monotonic()
        if not force and now - self._checked < RELOAD_INTERVAL_S:
            return
        self._checked = now
        try:
            st = self._file.stat()
            stamp: tuple[int, int, int] | None = (st.st_ino, st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            stamp = None
        if stamp == self._stamp and not force:
            return
        self._stamp = stamp
        self._keys = self._static + [(e.key.encode(), e.caller()) for e in _read(self._file)]

    def check(self, header: str | None) -> Caller:
        """The caller of ``Bearer <a valid key>``; ``Unauthorized`` otherwise."""
        scheme, _, given = (header or "").partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            raise Unauthorized("missing 'Authorization: Bearer <api key>' header (the key is in the state dir)")
        caller = self.caller(given)
        if caller is None:
            raise Unauthorized("the API key is not valid")
        return caller

    def caller(self, key: str) -> Caller | None:
        """Whom ``key`` stands for now; None if it is not (or no longer) valid."""
        self._refresh()
        raw = key.strip().encode()
        if not raw:
            return None
        found: Caller | None = None
        for known, caller in self._keys:
            if hmac.compare_digest(raw, known):  # every key compared: timing says nothing about which matched
                found = found or caller
        return found

    def caller_by_id(self, key_id: str) -> Caller | None:
        """Whom the key with this fingerprint stands for now (a signed URL acts as the key that minted it);
        None if no valid key has it (revoked since)."""
        self._refresh()
        return next((caller for _, caller in self._keys if caller.key_id == key_id), None)

    def valid(self, key: str) -> bool:
        """Whether ``key`` is accepted now (the viewer asks on every request, so a revoked key's sessions end)."""
        return self.caller(key) is not None


def _write(path: Path, entries: list[KeyEntry]) -> None:
    """Replace the key file atomically (0600 from the start: a key is never world-readable)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".api_keys-")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.writelines(entry.line() for entry in entries)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def new_key() -> str:
    """A fresh random API key."""
    return "grove_" + secrets.token_urlsafe(32)


def add_key(state_dir: Path, label: str = "", *, project: str = DEFAULT, admin: bool = False) -> str:
    """Append a new key to the state dir's key file; returns it (the only time it is shown). A member of
    ``project`` unless ``admin``."""
    check_name(project)
    key = new_key()
    path = StateDir(state_dir).api_keys
    _write(path, [*_read(path), KeyEntry(key, " ".join(label.split()), project, "admin" if admin else "member")])
    return key


def list_keys(state_dir: Path) -> list[tuple[str, str, str, str]]:
    """(fingerprint, project, role, label) of every key in the state dir's key file."""
    return [(fingerprint(e.key), e.project, e.role, e.label) for e in _read(StateDir(state_dir).api_keys)]


def key_projects(state_dir: Path) -> set[str]:
    """Every project some key of the state dir belongs to."""
    return {e.project for e in _read(StateDir(state_dir).api_keys)}


def revoke_key(state_dir: Path, which: str) -> str:
    """Remove the key with this fingerprint (or prefix of one, or the key itself); returns its fingerprint."""
    path = StateDir(state_dir).api_keys
    entries = _read(path)
    hits = [e for e in entries if e.key == which or (which and fingerprint(e.key).startswith(which))]
    if not hits:
        raise NotFound(f"no key {which!r} in {path} (see `grove key ls`)")
    if len(hits) > 1:
        raise Conflict(f"{which!r} matches {len(hits)} keys; give more of the fingerprint")
    _write(path, [e for e in entries if e is not hits[0]])
    return fingerprint(hits[0].key)


def load_or_create(state_dir: Path, override: str | None) -> tuple[list[str], str | None]:
    """The keys to accept, and the new key if one was just created (to print once): an admin of the default
    project, the operator's."""
    path = StateDir(state_dir).api_keys
    if override:
        return [override, *(e.key for e in _read(path))], None
    keys = [e.key for e in _read(path)]
    if keys:
        return keys, None
    key = new_key()
    _write(path, [KeyEntry(key, "created by grove up")])
    return [key], key


def read_key(state_dir: Path) -> str | None:
    """The first key in a state dir (the CLI's fallback when ``GROVE_API_KEY`` is unset)."""
    entries = _read(StateDir(state_dir).api_keys)
    return entries[0].key if entries else None
