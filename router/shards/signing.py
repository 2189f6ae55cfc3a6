"""How routers sign the calls they pass on to each other: the caller they checked, vouched for with the secret
they share.

A router that passes a call on has already checked its caller's API key; it sends, instead of the key, who the
caller is (project, admin or not, key fingerprint), the time and its own shard name, and an HMAC-SHA256 over
those, the method and the path with its query. The owner checks the HMAC and the time (at most
:data:`MAX_SKEW_S` apart) and acts as that caller: its own project check then applies as to any call. The body is
not signed, so that streams pass through unread; the peers' links carry TLS across clusters.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Mapping

from grove.core.errors import Unauthorized
from router.projects.model import Caller, check_name

PEER = "Grove-Peer"
"""The shard of the router that passed the call on."""
DATE = "Grove-Peer-Date"
CALLER = "Grove-Peer-Caller"
SIGNATURE = "Grove-Peer-Signature"
HEADERS = (PEER, DATE, CALLER, SIGNATURE)
MAX_SKEW_S = 60.0


def _caller_text(caller: Caller) -> str:
    return f"project={caller.project};admin={int(caller.admin)};key={caller.key_id}"


def _parse_caller(text: str) -> Caller:
    fields = dict(part.partition("=")[::2] for part in text.split(";"))
    try:
        return Caller(check_name(fields["project"]), admin=fields["admin"] == "1", key_id=fields["key"])
    except (KeyError, ValueError) as exc:
        raise Unauthorized(f"a peer's call names no valid caller ({text[:100]!r})") from exc


def _mac(secret: bytes, method: str, path: str, date: str, peer: str, caller: str) -> str:
    message = "\n".join((method.upper(), path, date, peer, caller)).encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def sign(secret: bytes, shard: str, method: str, path: str, caller: Caller, now: float | None = None) -> dict[str, str]:
    """The headers vouching for ``caller`` on a call of ``method path`` (path with its query, as sent)."""
    date, who = f"{time.time() if now is None else now:.3f}", _caller_text(caller)
    return {PEER: shard, DATE: date, CALLER: who, SIGNATURE: _mac(secret, method, path, date, shard, who)}


def verify(secret: bytes | None, headers: Mapping[str, str], method: str, path: str) -> Caller:
    """The caller a peer vouched for; ``Unauthorized`` saying what is wrong (no secret here, a bad signature, a
    stale date)."""
    if secret is None:
        raise Unauthorized("this router has no peers (no GROVE_PEER_SECRET): it takes no call signed by one")
    peer, date, who, given = (headers.get(name, "") for name in HEADERS)
    if not hmac.compare_digest(_mac(secret, method, path, date, peer, who), given):
        raise Unauthorized(f"the call from peer {peer[:20]!r} is not signed with this router's peer secret "
                           "(GROVE_PEER_SECRET must be the same on every router)")
    try:
        skew = abs(time.time() - float(date))
    except ValueError:
        skew = float("inf")
    if skew > MAX_SKEW_S:
        raise Unauthorized(f"the call from peer {peer!r} is dated {date!r}, more than {MAX_SKEW_S:.0f} s from this "
                           "router's clock (keep the routers' clocks in sync)")
    return _parse_caller(who)
