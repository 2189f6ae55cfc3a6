"""The viewer's login sessions: a server-side table keyed by a random id that only the cookie carries.

A session holds the API key it was opened with (in memory, as the key ring does), so every request
asks the key ring again and a revoked key's sessions end at once. Each session has its own CSRF token
(a synchroniser token): a state-changing request must echo it, which a page of another origin cannot
read. Sessions live in the router's memory: a restart logs everyone out, which is the safe direction.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

COOKIE = "grove_session"
LIFETIME_S = 12 * 3600.0
"""A session ends this long after login, however busy."""
IDLE_S = 2 * 3600.0
"""A session ends after this long without a request."""
MAX_SESSIONS = 1000


@dataclass
class Session:
    """One logged-in browser."""

    id: str
    key: str
    csrf: str
    created: float
    seen: float = field(default=0.0)

    def csrf_ok(self, given: str | None) -> bool:
        """Whether ``given`` is this session's CSRF token (constant-time)."""
        return bool(given) and hmac.compare_digest(str(given).encode(), self.csrf.encode())


class Sessions:
    """id → :class:`Session`; ``key_valid`` is the key ring's check, asked on every lookup."""

    def __init__(self, key_valid: Callable[[str], bool], *, clock: Callable[[], float] = time.time) -> None:
        self._valid = key_valid
        self._clock = clock
        self._table: dict[str, Session] = {}

    def open(self, key: str) -> Session | None:
        """A new session for a valid key; None (and nothing stored) for an invalid one."""
        if not self._valid(key):
            return None
        now = self._clock()
        self._expire(now)
        while len(self._table) >= MAX_SESSIONS:  # the oldest goes first (dicts keep insertion order)
            del self._table[next(iter(self._table))]
        session = Session(secrets.token_urlsafe(32), key, secrets.token_urlsafe(32), now, now)
        self._table[session.id] = session
        return session

    def get(self, session_id: str | None) -> Session | None:
        """The live session of a cookie value; None if unknown, expired, idle too long or its key revoked."""
        if not session_id:
            return None
        session = self._table.get(session_id)
        if session is None:
            return None
        now = self._clock()
        if now - session.created > LIFETIME_S or now - session.seen > IDLE_S or not self._valid(session.key):
            del self._table[session_id]
            return None
        session.seen = now
        return session

    def close(self, session_id: str) -> None:
        """End a session (logout)."""
        self._table.pop(session_id, None)

    def __len__(self) -> int:
        return len(self._table)

    def _expire(self, now: float) -> None:
        dead = [s.id for s in self._table.values() if now - s.created > LIFETIME_S or now - s.seen > IDLE_S]
        for sid in dead:
            del self._table[sid]
