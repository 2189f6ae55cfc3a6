"""A router's shard: its name, its peers' URLs and the secret the routers of one deployment share."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from grove.core.errors import Invalid
from grove.core.sandbox_ids import DEFAULT_SHARD, check_shard

MIN_SECRET_BYTES = 16


@dataclass(frozen=True)
class ShardConfig:
    """Who this router is among its peers (the default: the only router, ``default``, with no peers)."""

    name: str = DEFAULT_SHARD
    """This router's shard: every sandbox id it makes names it (``sb-<name>-...``; ``default`` makes ids of the
    shape they had before sharding)."""
    peers: Mapping[str, str] = field(default_factory=dict)
    """Shard name → base URL of its router, this router's own entry allowed (every router can be given the
    same map)."""
    secret: bytes | None = None
    """The secret every router of the deployment shares, signing the calls they pass on to each other; needed
    as soon as there are peers."""

    def __post_init__(self) -> None:
        check_shard(self.name)
        for name, url in self.peers.items():
            check_shard(name)
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise Invalid(f"peer {name}={url!r}: give the router's base URL, http(s)://host:port")
        if self.others and (self.secret is None or len(self.secret) < MIN_SECRET_BYTES):
            raise Invalid(f"peers need a shared secret of at least {MIN_SECRET_BYTES} bytes in GROVE_PEER_SECRET "
                          "(the same on every router; e.g. `openssl rand -hex 32`)")

    @property
    def others(self) -> dict[str, str]:
        """The peers but this router."""
        return {name: url.rstrip("/") for name, url in self.peers.items() if name != self.name}


def parse_peers(text: str) -> dict[str, str]:
    """``--peers a=http://r-a:8470,b=https://r-b.example`` as a mapping (``Invalid`` naming a bad entry)."""
    peers: dict[str, str] = {}
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        name, sep, url = entry.partition("=")
        if not sep or not url:
            raise Invalid(f"--peers entry {entry!r} must look like NAME=URL (e.g. b=http://10.0.0.2:8470)")
        if name in peers:
            raise Invalid(f"--peers names shard {name!r} twice")
        peers[check_shard(name)] = url
    return peers
