"""What every ``grove`` subcommand shares: where the state dir is, and a client for the router."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

DEFAULT_STATE = Path.home() / ".local" / "share" / "grove"


def state_dir(args: argparse.Namespace) -> Path:
    """``--state-dir``, else ``$GROVE_STATE_DIR``, else ``~/.local/share/grove``."""
    return Path(getattr(args, "state_dir", None) or os.environ.get("GROVE_STATE_DIR") or DEFAULT_STATE).resolve()


def router_url(args: argparse.Namespace) -> str | None:
    """``--url``, else the URL of a router running on the state dir, else None (the SDK's default)."""
    if url := getattr(args, "url", None):
        return str(url)
    if os.environ.get("GROVE_URL"):
        return None
    from grove.runfile import running_router

    running = running_router(state_dir(args))
    return running.url if running else None


def api_key(args: argparse.Namespace) -> str | None:
    """``$GROVE_API_KEY``, else the first key in the state dir's key file."""
    from router.auth import read_key

    return os.environ.get("GROVE_API_KEY") or read_key(state_dir(args))


def client(args: argparse.Namespace) -> Any:
    """A synchronous SDK client for the router these arguments name."""
    from grove.client import Grove

    return Grove(router_url(args), api_key(args))


def texty(value: Any) -> Any:
    """``value`` with every bytes decoded (UTF-8, replacing), for printing as JSON."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, dict):
        return {k: texty(v) for k, v in value.items()}
    if isinstance(value, list):
        return [texty(v) for v in value]
    return value


def key_values(items: list[str], flag: str) -> dict[str, str]:
    """``K=V`` items of a repeatable flag as a dict; a missing ``=`` is an error naming the flag."""
    from grove.core.errors import Invalid

    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise Invalid(f"{flag} takes K=V, got {item!r}")
        out[key] = value
    return out
