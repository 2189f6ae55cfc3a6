"""Named tests' statuses from a check's output: what ``pytest -rA`` and ``unittest -v`` print for each test.

A native task that names its tests (``check.tests``) is graded by those tests' own statuses, never by the
check's exit code: any module the tests import can end the process with ``os._exit(0)``, and a run that never
reached a named test has no status for it — it did not pass. (SWE-bench instances use the ``swebench`` package's
per-repository parsers instead: :mod:`grove.rollouts.swebench`.)
"""

from __future__ import annotations

import re

PASSING = frozenset({"PASSED", "XFAIL", "ok", "expected failure"})
_PYTEST = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED)\s+(\S+)")
_UNITTEST = re.compile(r"^(\w+) \(([\w.]+)\)(?:\s.*)?\s\.\.\.\s+(ok|FAIL|ERROR|skipped.*|expected failure)$")


def statuses(output: str) -> dict[str, str]:
    """Each test's status as the run printed it (``pytest -rA``'s summary, ``unittest -v``'s lines)."""
    found: dict[str, str] = {}
    for line in output.splitlines():
        line = line.rstrip()
        if m := _PYTEST.match(line):
            found[m.group(2)] = m.group(1)
        elif m := _UNITTEST.match(line):
            method, where, status = m.group(1), m.group(2), m.group(3)
            cls = where[: -len(method) - 1] if where.endswith("." + method) else where
            for name in (f"{method} ({where})", f"{method} ({cls})", f"{cls}.{method}"):
                found[name] = status
    return found


def named_verdict(found: dict[str, str], named: tuple[str, ...]) -> tuple[bool, dict[str, str]]:
    """Whether every named test passed, and each one's status (``missing`` if the run never reported it)."""
    each = {name: found.get(name, "missing") for name in named}
    return all(status in PASSING for status in each.values()), each
