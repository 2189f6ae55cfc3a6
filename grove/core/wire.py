"""Content negotiation shared by every grove HTTP surface: JSON by default, msgpack on request."""

from __future__ import annotations

import json
import math
from typing import Any

import msgpack

from grove.core.errors import BadRequest, Invalid

MSGPACK = "application/msgpack"
JSON = "application/json"
_MSGPACK_ALIASES = frozenset({MSGPACK, "application/x-msgpack", "application/vnd.msgpack"})


def is_msgpack(content_type: str | None) -> bool:
    """Whether a Content-Type or Accept value names msgpack."""
    if not content_type:
        return False
    return any(part.split(";")[0].strip().lower() in _MSGPACK_ALIASES for part in content_type.split(","))


def decode(body: bytes, content_type: str | None) -> Any:
    """Decode a request body as msgpack or JSON; an empty body is ``{}``; bad input is a 400."""
    if not body:
        return {}
    if is_msgpack(content_type):
        try:
            return msgpack.unpackb(body, raw=False, strict_map_key=True)
        except Exception as exc:  # msgpack raises several unrelated types
            raise BadRequest(f"body is not valid msgpack: {exc}") from exc
    try:
        return _JSON_IN.decode(body.decode(json.detect_encoding(body), "surrogatepass"))  # json.loads' own steps
    except _NonFinite as exc:
        # JSON has no NaN or Infinity (Python's parser takes them by default): say which field held one.
        where = non_finite_path(json.loads(body)) or "a number"
        raise Invalid(f"{where} is {exc.args[0]}: only finite numbers are accepted (JSON has no NaN or Infinity)") \
            from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(f"body is not valid JSON: {exc}") from exc


class _NonFinite(ValueError):
    pass


def _refuse_constant(name: str) -> Any:
    raise _NonFinite(name)


_JSON_IN = json.JSONDecoder(parse_constant=_refuse_constant)
"""One decoder for every body: ``json.loads(..., parse_constant=...)`` builds a new one (and its scanner) per call,
which cost as much as decoding an exec's request and answer (twice per exec on the router)."""


def non_finite_path(value: Any, where: str = "") -> str | None:
    """Where in a decoded structure the first non-finite number is (``events[0].data.reward``), or None.

    Iterative: a body may nest as deep as the parser allowed."""
    stack: list[tuple[Any, str]] = [(value, where)]
    while stack:
        item, path = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return path or "the body"
        elif isinstance(item, dict):
            stack.extend((v, f"{path}.{k}" if path else str(k)) for k, v in reversed(item.items()))
        elif isinstance(item, list | tuple):
            stack.extend((v, f"{path}[{i}]") for i, v in reversed(list(enumerate(item))))
    return None


def encode(value: Any, as_msgpack: bool) -> bytes:
    """Encode a response body; JSON turns bytes into text with invalid UTF-8 replaced."""
    if as_msgpack:
        return msgpack.packb(value, use_bin_type=True)  # type: ignore[no-any-return]
    try:
        # The C encoder asks _bytes_as_text only for what it cannot encode itself: one pass, no copy of the
        # structure (to_text's walk cost 15 of 22 µs for an exec's result, on every answer of every hop).
        return _JSON_OUT.encode(value).encode()
    except ValueError:  # a non-finite number, which allow_nan=False refuses: the walk turns it into null
        return json.dumps(to_text(value), separators=(",", ":")).encode()


def _bytes_as_text(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


_JSON_OUT = json.JSONEncoder(separators=(",", ":"), default=_bytes_as_text, allow_nan=False)


def to_text(value: Any) -> Any:
    """Replace every ``bytes`` in a structure by text (invalid UTF-8 replaced), and a non-finite number by null
    (stored before grove refused them), for JSON: what grove sends is always valid JSON."""
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, dict):
        return {k: to_text(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_text(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
