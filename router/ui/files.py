"""What a file step shows: its text, a diff against what the record last knew of the file, or its size and hash.

The recorder keeps a transferred file's content when it is UTF-8 text of at most
:data:`~router.trajectory.recorder.CONTENT_RECORDED` bytes, and only the size and sha256 otherwise. A write
of a path that the trajectory read or wrote before, both contents known, shows as a unified diff against
that earlier content; the view names the step it compares with, because commands run in between may have
changed the file too. Every other file step shows its text (the page numbers the lines), or, not kept, why:
binary or too large. In an outline a view is a preview (:data:`PREVIEW_LINES`); ``whole=True`` gives all of it.
"""

from __future__ import annotations

import difflib
import itertools
import posixpath
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from router.trajectory.recorder import CONTENT_RECORDED

FILE_STEPS = ("file_read", "file_write")
"""The step types that move one file's content."""
PREVIEW_LINES = 60
"""Lines of a file's text or diff in a step outline (the rest comes when the reader asks)."""
PREVIEW_CHARS = 6000
"""Characters of a file's text or diff in a step outline, at most."""
CONTEXT_LINES = 3
"""Unchanged lines around each change in a diff (as ``diff -u``)."""
DIFF_COST = 1_000_000
"""Most line pairs (changed lines before times after, once the common head and tail are set aside) a diff in an
outline may weigh: aligning lines costs up to their product (``difflib``), and a page must open at once.
A heavier one is ``deferred``: computed when the reader asks for it."""
PAGE_COST = 4_000_000
"""Most line pairs the diffs of one page of outlines weigh together (the rest are deferred)."""
WHOLE_COST = 25_000_000
"""Most line pairs a diff asked for alone may weigh; past it the changed middle is shown as one replacement
(``coarse``), which is a correct diff, only not the smallest."""
_NO_NEWLINE = "\\ No newline at end of file\n"
_Op = tuple[Literal["replace", "delete", "insert", "equal"], int, int, int, int]
"""One edit operation, as ``difflib`` gives them: (tag, old start, old end, new start, new end)."""


@dataclass(frozen=True)
class _Known:
    """The last content of a path the record holds: which step, of what type, and the text."""

    index: int
    type: str
    text: str


def is_file_step(step: Any) -> bool:
    """Whether ``step`` is a file read or write."""
    return isinstance(step, dict) and step.get("type") in FILE_STEPS


def _succeeded(step: dict[str, Any]) -> bool:
    status = step.get("status")
    return not (isinstance(status, int) and not isinstance(status, bool) and status >= 300)


def _text(step: dict[str, Any]) -> str | None:
    """The step's content if the record holds it as text (a NUL byte makes it binary, as git decides)."""
    content = step.get("content")
    if not isinstance(content, str) or "\x00" in content or step.get("binary") is True:
        return None
    return content


def _path(step: dict[str, Any]) -> str | None:
    path = step.get("path")
    return posixpath.normpath(path) if isinstance(path, str) and path else None


def views(steps: list[Any], indices: Iterable[int], *, whole: bool = False) -> dict[int, dict[str, Any]]:
    """The view of each file step among ``indices``, by index (one pass over the record up to the last one)."""
    wanted = {i for i in indices if 0 <= i < len(steps) and is_file_step(steps[i])}
    out: dict[int, dict[str, Any]] = {}
    known: dict[str, _Known] = {}
    budget = [WHOLE_COST if whole else PAGE_COST]
    for index in range(max(wanted) + 1 if wanted else 0):
        step = steps[index]
        if not is_file_step(step):
            continue
        path = _path(step)
        if index in wanted:
            out[index] = _view(step, known.get(path) if path is not None else None, whole, budget)
        if path is None or not _succeeded(step):
            continue  # a failed call changed nothing the record knows of
        text = _text(step)
        if text is None:
            known.pop(path, None)  # the file is now something the record does not hold
        else:
            known[path] = _Known(index, str(step["type"]), text)
    return out


def _view(step: dict[str, Any], before: _Known | None, whole: bool, budget: list[int]) -> dict[str, Any]:
    if not _succeeded(step):
        return {"show": "failed"}
    text = _text(step)
    if text is None:
        size = step.get("size")
        large = isinstance(size, int) and size > CONTENT_RECORDED and step.get("binary") is not True
        # The recorder keeps all UTF-8 text up to its limit: a smaller file it did not keep is not text.
        return {"show": "large" if large else "binary", "limit": CONTENT_RECORDED}
    if step.get("type") != "file_write" or before is None:
        return {"show": "content", **_body(text, whole)}
    facts = {"against": before.index, "against_type": before.type}
    if before.text == text:
        return {"show": "same", **facts, **_body(text, whole)}
    old, new = split_lines(before.text), split_lines(text)
    cost = weight(old, new)
    if not whole and (cost > DIFF_COST or cost > budget[0]):
        return {"show": "diff", **facts, "deferred": True, "lines": len(new)}
    budget[0] -= cost
    coarse = cost > WHOLE_COST
    diff = unified(before.text, text, coarse=coarse)
    added = sum(1 for line in split_lines(diff) if line.startswith("+"))
    removed = sum(1 for line in split_lines(diff) if line.startswith("-"))
    return {"show": "diff", **facts, "added": added, "removed": removed, "coarse": coarse, **_body(diff, whole)}


def _body(text: str, whole: bool) -> dict[str, Any]:
    """``{body, lines, cut}``: the text, or its first lines in an outline."""
    lines = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
    if whole:
        return {"body": text, "lines": lines, "cut": False}
    head = "".join(itertools.islice(split_lines(text), PREVIEW_LINES))[:PREVIEW_CHARS]
    return {"body": head, "lines": lines, "cut": len(head) < len(text)}


def split_lines(text: str) -> list[str]:
    """Lines split at ``\\n`` only, each with its newline (``str.splitlines`` also splits at form feeds and
    the like, which would number lines differently from the page)."""
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def _common(old: list[str], new: list[str]) -> tuple[int, int]:
    """Lines the two share at the head and, after it, at the tail."""
    head = 0
    while head < min(len(old), len(new)) and old[head] == new[head]:
        head += 1
    tail = 0
    while tail < min(len(old), len(new)) - head and old[-1 - tail] == new[-1 - tail]:
        tail += 1
    return head, tail


def weight(old: list[str], new: list[str]) -> int:
    """What aligning two texts' lines costs at most: the product of their changed middles' lengths."""
    head, tail = _common(old, new)
    return (len(old) - head - tail) * (len(new) - head - tail)


class _Aligned(difflib.SequenceMatcher[str]):
    """Opcodes computed here, grouped into hunks by difflib's own rule."""

    def __init__(self, opcodes: list[_Op]) -> None:
        super().__init__(None, [], [])
        self._given = opcodes

    def get_opcodes(self) -> list[_Op]:
        return self._given


def _opcodes(old: list[str], new: list[str], coarse: bool) -> list[_Op]:
    """Edit operations from ``old`` to ``new``: the common head and tail set aside first (an edit in one place of
    a long file aligns only the lines around it), the middle aligned by ``difflib`` or, ``coarse``, replaced."""
    head, tail = _common(old, new)
    end_old, end_new = len(old) - tail, len(new) - tail
    ops: list[_Op] = [("equal", 0, head, 0, head)] if head else []
    if coarse:
        ops.append(("replace", head, end_old, head, end_new))
    else:
        middle = difflib.SequenceMatcher(None, old[head:end_old], new[head:end_new])
        ops += [(tag, i1 + head, i2 + head, j1 + head, j2 + head) for tag, i1, i2, j1, j2 in middle.get_opcodes()]
    if tail:
        ops.append(("equal", end_old, len(old), end_new, len(new)))
    return ops


def _range(start: int, length: int) -> str:
    """A hunk's line range as ``diff -u`` writes it."""
    first = start + 1 if length else start
    return f"{first}" if length == 1 else f"{first},{length}"


def unified(before: str, after: str, *, coarse: bool = False) -> str:
    """A unified diff of two texts: its hunks only (the page names the file), a missing final newline said
    as ``diff`` says it; ``coarse``, the changed middle as one replacement (for texts too costly to align)."""
    old, new = split_lines(before), split_lines(after)
    out: list[str] = []
    for group in _Aligned(_opcodes(old, new, coarse)).get_grouped_opcodes(CONTEXT_LINES):
        out.append(f"@@ -{_range(group[0][1], group[-1][2] - group[0][1])} "
                   f"+{_range(group[0][3], group[-1][4] - group[0][3])} @@\n")
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                out += (" " + line for line in old[i1:i2])
                continue
            out += ("-" + line for line in old[i1:i2])
            out += ("+" + line for line in new[j1:j2])
    return "".join(line if line.endswith("\n") else line + "\n" + _NO_NEWLINE for line in out)
