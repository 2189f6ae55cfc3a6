"""The check of an assistant task: the office service's final state against what the task expects (standard
library only; it runs in the agent's sandbox once the agent has stopped, the service still up).

    python3 check.py http://office:8025/state expect.json      # or - : the expectations on stdin

``expect.json`` is a list of expectations, each ``{"in": COLLECTION, "match": {FIELD: VALUE}, "count": N}``:
COLLECTION one of ``inbox``, ``archived``, ``sent``, ``events``, ``notes``; a VALUE is matched exactly, or
``{"contains": TEXT}`` (case-insensitive, in a string or a list's items), or ``{"has": ITEM}`` (in a list);
``count`` is the exact number of matching items (default: at least one). Exit 0 when all hold; otherwise each
failure is printed and the exit code is 1.
"""

from __future__ import annotations

import json
import sys
import urllib.request
from typing import Any


def matches(value: Any, want: Any) -> bool:
    """Whether an item's field holds what an expectation wants of it."""
    if isinstance(want, dict) and "contains" in want:
        text = str(want["contains"]).lower()
        if isinstance(value, list):
            return any(text in str(v).lower() for v in value)
        return isinstance(value, str) and text in value.lower()
    if isinstance(want, dict) and "has" in want:
        return isinstance(value, list) and want["has"] in value
    return bool(value == want)


def failures(state: dict[str, Any], expect: list[dict[str, Any]]) -> list[str]:
    """Each expectation the state does not meet, said in a line."""
    wrong = []
    for rule in expect:
        items = state.get(rule["in"], [])
        found = [i for i in items if all(matches(i.get(k), v) for k, v in rule.get("match", {}).items())]
        count = rule.get("count")
        if (count is None and not found) or (count is not None and len(found) != count):
            wanted = "at least one" if count is None else f"exactly {count}"
            wrong.append(f"{rule['in']}: wanted {wanted} matching {json.dumps(rule.get('match', {}))}, "
                         f"found {len(found)}")
    return wrong


def main() -> None:
    """Read the state, grade it, say why, exit 0 or 1."""
    url, expect_path = sys.argv[1], sys.argv[2]
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=30) as answer:
        state = json.load(answer)
    if expect_path == "-":
        expect = json.load(sys.stdin)
    else:
        with open(expect_path, encoding="utf-8") as fh:
            expect = json.load(fh)
    wrong = failures(state, expect)
    for line in wrong:
        print(f"FAIL {line}")
    print("PASS" if not wrong else f"{len(wrong)} of {len(expect)} expectations not met")
    sys.exit(1 if wrong else 0)


if __name__ == "__main__":
    main()
