"""What every ``grove`` subcommand shares: where the state dir is, and a client for the router."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

from grove.core.errors import GroveError, Unavailable

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


def client(args: argparse.Namespace, *, project: str | None = None) -> Any:
    """A synchronous SDK client for the router these arguments name, acting in ``project`` (else
    ``$GROVE_PROJECT``, else the key's own project)."""
    from grove.client import Grove

    return Grove(*router_and_key(args), project=project)


def router_and_key(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """:func:`router_url` and :func:`api_key`; with neither a URL nor a key to go on, the error saying that no
    router runs on the state dir (a state dir no router ever ran on: that, not a missing key, is the news)."""
    url, key = router_url(args), api_key(args)
    if key is None and _to_default(args):
        raise no_router(args, tried=False)
    return url, key


def _to_default(args: argparse.Namespace) -> bool:
    """Whether the router these arguments name is the SDK's default URL, for want of any other."""
    return not getattr(args, "url", None) and not os.environ.get("GROVE_URL") and router_url(args) is None


def no_router(args: argparse.Namespace, *, tried: bool = True) -> GroveError:
    """The error of a command that found no router: which URL it tried, whose state dir has none, what to do."""
    from grove.client import DEFAULT_URL

    state = state_dir(args)
    why = (f"and none answers at {DEFAULT_URL} (the default URL, tried for want of one)" if tried
           else "nor ever did (it holds no API key)")
    return Unavailable(f"no router runs on the state dir {state}, {why}; start one with `grove --state-dir {state} "
                       "up`, or name a running router with --url or $GROVE_URL")


def explain(args: argparse.Namespace, exc: GroveError) -> GroveError:
    """``exc``, or :func:`no_router` if it is a refused connection to the default URL, tried because no
    router runs on the state dir (the bare "cannot connect to 127.0.0.1:8470" names neither)."""
    import aiohttp

    refused = isinstance(exc, Unavailable) and isinstance(exc.__cause__, aiohttp.ClientConnectionError | TimeoutError)
    return no_router(args) if refused and _to_default(args) else exc


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


def utc(epoch: float | None) -> str:
    """A Unix time as a person reads it: ``2025-05-01 12:03:04`` (UTC); ``-`` for none."""
    if epoch is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(epoch))


def age(seconds: float) -> str:
    """A duration in its two largest units: ``45s``, ``4m12s``, ``3h05m``, ``2d04h``."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"
