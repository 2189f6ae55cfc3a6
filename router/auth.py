"""API keys: created on first start in the state dir (mode 0600), or given by ``GROVE_API_KEY``."""

from __future__ import annotations

import hmac
import os
import secrets
from pathlib import Path

from grove.errors import Unauthorized

KEY_FILE = "api_keys"


class KeyRing:
    """The router's accepted API keys; comparisons are constant-time."""

    def __init__(self, keys: list[str]) -> None:
        self._keys = [k.encode() for k in keys if k]

    def check(self, header: str | None) -> None:
        """Raise ``Unauthorized`` unless the header is ``Bearer <a valid key>``."""
        scheme, _, given = (header or "").partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            raise Unauthorized("missing 'Authorization: Bearer <api key>' header (the key is in the state dir)")
        raw = given.strip().encode()
        valid = False
        for key in self._keys:
            valid |= hmac.compare_digest(raw, key)  # no early exit: timing says nothing about which key
        if not valid:
            raise Unauthorized("the API key is not valid")


def load_or_create(state_dir: Path, override: str | None) -> tuple[list[str], str | None]:
    """The keys to accept, and the new key if one was just created (to print once)."""
    if override:
        return [override], None
    path = state_dir / KEY_FILE
    if path.exists():
        keys = [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]
        if keys:
            return keys, None
    key = "grove_" + secrets.token_urlsafe(32)
    state_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(key + "\n")
    os.chmod(path, 0o600)
    return [key], key


def read_key(state_dir: Path) -> str | None:
    """The first key in a state dir (the CLI's fallback when ``GROVE_API_KEY`` is unset)."""
    path = state_dir / KEY_FILE
    if not path.exists():
        return None
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            return line.strip()
    return None
