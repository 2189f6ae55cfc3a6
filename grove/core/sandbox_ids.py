"""Sandbox ids and the shard each names: shared by the router (which makes them) and the SDK (which routes by them).

An id is ``sb-<16 hex>`` from a router without a shard name (every id made before sharding: such ids stay
readable, and belong to the shard named ``default``), or ``sb-<shard>-<16 hex>`` from the router of shard
``<shard>`` (1-12 lower-case letters and digits). Both are DNS-1123 labels well within 63 characters (a Knative
Service named by the id, its revision ``<id>-00001`` and that revision's ``-private`` Service), safe in paths,
S3 keys and host names (``{id}-{port}.<domain>``).
"""

from __future__ import annotations

import re
import secrets

from grove.core.errors import Invalid

DEFAULT_SHARD = "default"
"""The shard of a router started without ``--shard``, and of every id without a shard in it."""
SHARD_RE = re.compile(r"^[a-z0-9]{1,12}$")
ID_RE = re.compile(r"^sb-(?:([a-z0-9]{1,12})-)?[0-9a-f]{16}$")
"""What the router makes: group 1 is the shard (absent: ``default``)."""
ID_PATTERN = r"sb-(?:[a-z0-9]{1,12}-)?[a-z0-9]{1,64}"
"""What any id in a route, a host name or a file name may look like (records imported or sampled from elsewhere
may carry other letters than hex); none can hold a path."""
LONGEST_ID = "sb-" + "s" * 12 + "-" + "0" * 16


def check_shard(name: str) -> str:
    """``name`` if it is a shard name, else ``Invalid`` saying what one looks like."""
    if not SHARD_RE.match(name):
        raise Invalid(f"shard name {name!r}: use 1-12 lower-case letters and digits (it is part of every sandbox id)")
    return name


def new_id(shard: str = DEFAULT_SHARD) -> str:
    """A fresh sandbox id of ``shard`` (the ``default`` shard's keep the shape ids had before sharding)."""
    return "sb-" + ("" if shard == DEFAULT_SHARD else f"{check_shard(shard)}-") + secrets.token_hex(8)


def shard_of(sandbox_id: str) -> str | None:
    """The shard a sandbox id names, or None if it is not an id a router makes."""
    match = ID_RE.match(sandbox_id)
    if match is None:
        return None
    return match.group(1) or DEFAULT_SHARD
