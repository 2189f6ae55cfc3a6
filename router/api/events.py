"""The shapes of harness events the router accepts: bounded nesting, and data of the kind's type.

Readers of the record (the live and stored trajectory, ``grove trajectories export``) take whatever was
stored, so every event is checked at the door: an event nested 900 deep used to be accepted and then made
every read of its trajectory fail, and a ``message`` whose data was a list broke the export (issue 18,
finding 10). The size is bounded by the router's body limit (``max_body_bytes``).
"""

from __future__ import annotations

from typing import Any

from artifacts.trajectory import MAX_EVENT_DEPTH, nests_deeper
from grove.core.errors import Invalid

ROLES = ("system", "user", "assistant", "tool")


def check_event(index: int, kind: str, data: Any) -> None:
    """Refuse (422, naming the event and the rule) data that readers of the record could not take."""
    where = f"event {index} ({kind!r})"
    if nests_deeper(data, MAX_EVENT_DEPTH):
        raise Invalid(f"{where}: data nests deeper than {MAX_EVENT_DEPTH} levels")
    if kind == "message":
        if not isinstance(data, dict) or data.get("role") not in ROLES:
            raise Invalid(f"{where}: data must be an object with a 'role' of {', '.join(ROLES)} and a 'content'")
        content = data.get("content")
        if content is not None and not isinstance(content, str | list):
            raise Invalid(f"{where}: 'content' must be text or a list of content parts")
        if data.get("tool_calls") is not None and not isinstance(data["tool_calls"], list):
            raise Invalid(f"{where}: 'tool_calls' must be a list")
    elif kind == "tool_call":
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            raise Invalid(f"{where}: data must be an object with a string 'name' (and 'arguments')")
    elif kind == "tool_result" and not isinstance(data, dict):
        raise Invalid(f"{where}: data must be an object with 'tool_call_id' and 'content'")
