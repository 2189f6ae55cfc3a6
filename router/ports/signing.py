"""Signed port URLs: a token that lets its holder reach one port of one sandbox until it expires.

The token names the sandbox, the port, the expiry and the fingerprint of the key that minted it, under an HMAC
of a secret the router draws when it starts (so a router restart ends every signed URL). Using one acts as
that key: its project decides whether the sandbox may be seen, and a revoked key's URLs stop working.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass

from grove.core.errors import Invalid, Unauthorized

MAX_EXPIRES_S = 7 * 86400.0
DEFAULT_EXPIRES_S = 3600.0


@dataclass(frozen=True)
class Grant:
    """What a valid token lets in."""

    sandbox_id: str
    port: int
    expires_at: float
    key_id: str
    """The fingerprint of the key that minted it (:func:`router.auth.fingerprint`)."""


class Signer:
    """Mints and checks port tokens with a secret of its own."""

    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = secret or secrets.token_bytes(32)

    def mint(self, sandbox_id: str, port: int, key_id: str, expires_s: float) -> str:
        """The token for ``port`` of ``sandbox_id``, valid ``expires_s`` seconds."""
        if not 1 <= expires_s <= MAX_EXPIRES_S:
            raise Invalid(f"expires_s {expires_s:g} must be from 1 to {MAX_EXPIRES_S:g} seconds (7 days)")
        body = json.dumps({"s": sandbox_id, "p": port, "e": round(time.time() + expires_s, 3), "k": key_id},
                          separators=(",", ":")).encode()
        payload = base64.urlsafe_b64encode(body).decode().rstrip("=")
        return f"{payload}.{self._mac(payload)}"

    def check(self, token: str, sandbox_id: str, port: int) -> Grant:
        """The grant of a token for this sandbox and port; ``Unauthorized`` saying why not otherwise."""
        payload, _, mac = token.partition(".")
        if not mac or not hmac.compare_digest(mac, self._mac(payload)):
            raise Unauthorized("the signed URL's token is not valid (it was altered, or the router restarted "
                               "since it was minted): mint another with POST /v1/sandboxes/{id}/ports/{port}/url")
        fields = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        grant = Grant(str(fields["s"]), int(fields["p"]), float(fields["e"]), str(fields["k"]))
        if (grant.sandbox_id, grant.port) != (sandbox_id, port):
            raise Unauthorized(f"this signed URL is for port {grant.port} of {grant.sandbox_id}, not port {port} "
                               f"of {sandbox_id}")
        if time.time() >= grant.expires_at:
            raise Unauthorized(f"the signed URL expired {time.time() - grant.expires_at:.0f}s ago: mint another "
                               f"with POST /v1/sandboxes/{sandbox_id}/ports/{port}/url")
        return grant

    def _mac(self, payload: str) -> str:
        return hmac.new(self._secret, payload.encode(), hashlib.sha256).hexdigest()
