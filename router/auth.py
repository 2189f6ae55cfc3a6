"""API keys: the state dir's ``api_keys`` file (mode 0600, one key per line, an optional label after
it), created with one key on first start, plus ``GROVE_API_KEY`` if set.

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
from pathlib import Path

from grove.core.errors import Conflict, NotFound, Unauthorized
from grove.statedir import StateDir

RELOAD_INTERVAL_S = 1.0


def fingerprint(key: str) -> str:
    """What names a key in listings and revocations without revealing it."""
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def _parse(text: str) -> list[tuple[str, str]]:
    """(key, label) per non-comment line."""
    entries = []
    for line in text.splitlines():
        fields = line.strip().split(None, 1)
        if fields and not fields[0].startswith("#"):
            entries.append((fields[0], fields[1] if len(fields) > 1 else ""))
    return entries


def _read(path: Path) -> list[tuple[str, str]]:
    try:
        return _parse(path.read_text())
    except FileNotFoundError:
        return []


class KeyRing:
    """The router's accepted API keys; comparisons are constant-time.

    ``keys`` found in ``key_file`` when the ring is made follow the file from then on (revoking one
    there revokes it here); the others (``GROVE_API_KEY``) stay for the router's life.
    """

    def __init__(self, keys: list[str], key_file: Path | None = None) -> None:
        self._file = key_file
        in_file = {k for k, _ in _read(key_file)} if key_file else set()
        self._static = [k.encode() for k in keys if k and k not in in_file]
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
        self._keys = self._static + [k.encode() for k, _ in _read(self._file)]

    def check(self, header: str | None) -> None:
        """Raise ``Unauthorized`` unless the header is ``Bearer <a valid key>``."""
        scheme, _, given = (header or "").partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            raise Unauthorized("missing 'Authorization: Bearer <api key>' header (the key is in the state dir)")
        if not self.valid(given):
            raise Unauthorized("the API key is not valid")

    def valid(self, key: str) -> bool:
        """Whether ``key`` is accepted now (the viewer asks on every request, so a revoked key's sessions end)."""
        self._refresh()
        raw = key.strip().encode()
        if not raw:
            return False
        found = False
        for known in self._keys:
            found |= hmac.compare_digest(raw, known)  # no early exit: timing says nothing about which key
        return found


def _write(path: Path, entries: list[tuple[str, str]]) -> None:
    """Replace the key file atomically (0600 from the start: a key is never world-readable)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".api_keys-")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.writelines(f"{key} {label}".rstrip() + "\n" for key, label in entries)
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


def add_key(state_dir: Path, label: str = "") -> str:
    """Append a new key to the state dir's key file; returns it (the only time it is shown)."""
    key = new_key()
    path = StateDir(state_dir).api_keys
    _write(path, [*_read(path), (key, " ".join(label.split()))])
    return key


def list_keys(state_dir: Path) -> list[tuple[str, str]]:
    """(fingerprint, label) of every key in the state dir's key file."""
    return [(fingerprint(k), label) for k, label in _read(StateDir(state_dir).api_keys)]


def revoke_key(state_dir: Path, which: str) -> str:
    """Remove the key with this fingerprint (or prefix of one, or the key itself); returns its fingerprint."""
    path = StateDir(state_dir).api_keys
    entries = _read(path)
    hits = [e for e in entries if e[0] == which or (which and fingerprint(e[0]).startswith(which))]
    if not hits:
        raise NotFound(f"no key {which!r} in {path} (see `grove key ls`)")
    if len(hits) > 1:
        raise Conflict(f"{which!r} matches {len(hits)} keys; give more of the fingerprint")
    _write(path, [e for e in entries if e is not hits[0]])
    return fingerprint(hits[0][0])


def load_or_create(state_dir: Path, override: str | None) -> tuple[list[str], str | None]:
    """The keys to accept, and the new key if one was just created (to print once)."""
    path = StateDir(state_dir).api_keys
    if override:
        return [override, *(k for k, _ in _read(path))], None
    keys = [k for k, _ in _read(path)]
    if keys:
        return keys, None
    key = new_key()
    _write(path, [(key, "created by grove up")])
    return [key], key


def read_key(state_dir: Path) -> str | None:
    """The first key in a state dir (the CLI's fallback when ``GROVE_API_KEY`` is unset)."""
    entries = _read(StateDir(state_dir).api_keys)
    return entries[0][0] if entries else None
