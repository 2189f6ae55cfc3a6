"""The kit's check, run at grading once the agent has stopped: ``python3 check.py LOG EXPECT``, exit 0 = pass.

``LOG`` is the site's own database (``data/log.jsonl``, written by its server); ``EXPECT`` a JSON list of
expectations, each about the last entry of a ``kind`` (among those that match ``where``, if given)::

    [{"kind": "visit", "where": {"path": "/search.html"}, "fields": {"query": {"q": {"contains": "left hand"}}}},
     {"kind": "order", "fields": {"items": [{"id": "lamp", "qty": 1}], "name": "Ada"}, "count": 1}]

A field matches when equal, or inside ``{"min", "max"}``, or holding ``{"contains": TEXT}`` (any case); an
object matches when each of its fields does. ``count``: exactly that many entries of the kind. What was found
is printed, so the grading record says why.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def matches(value: Any, want: Any) -> bool:
    """Whether ``value`` is what ``want`` describes."""
    if isinstance(want, dict) and set(want) <= {"min", "max"} and want:
        return isinstance(value, int | float) and want.get("min", value) <= value <= want.get("max", value)
    if isinstance(want, dict) and set(want) == {"contains"}:
        return isinstance(value, str) and str(want["contains"]).lower() in value.lower()
    if isinstance(want, dict):
        return isinstance(value, dict) and all(matches(value.get(k), v) for k, v in want.items())
    return bool(value == want)


def verdict(entries: list[dict[str, Any]], expect: dict[str, Any]) -> tuple[bool, str]:
    """Whether one expectation holds, and what was found."""
    kind = expect["kind"]
    mine = [e for e in entries if e.get("kind") == kind and matches(e, expect.get("where", {}))]
    if "count" in expect and len(mine) != expect["count"]:
        return False, f"{len(mine)} {kind} entries, {expect['count']} expected"
    if not mine:
        return False, f"no {kind} entry" + (f" where {expect['where']}" if "where" in expect else "")
    last = {k: v for k, v in mine[-1].items() if k != "t"}
    return matches(last, expect.get("fields", {})), f"last {kind}: {json.dumps(last, sort_keys=True)}"


def main() -> int:
    """Check every expectation; 0 if all hold."""
    log, expect = sys.argv[1], sys.argv[2]
    entries = []
    try:
        with open(log, encoding="utf-8") as fh:
            entries = [json.loads(line) for line in fh if line.strip()]
    except FileNotFoundError:
        pass
    with open(expect, encoding="utf-8") as fh:
        expectations = json.load(fh)
    ok = True
    for item in expectations:
        good, found = verdict(entries, item)
        print(("ok   " if good else "FAIL ") + found)
        ok = ok and good
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
