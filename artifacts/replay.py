"""Replaying a trajectory: which of its steps are re-run, how a re-run output is compared, and what counts as a match.

A replay re-runs a stored trajectory's commands and file operations, in order, in a fresh sandbox of the same
image digest (the router does the running, :mod:`router.lifecycle.replay`); this module is the pure part of it.

**What is replayed.** ``exec`` steps (command, cwd, user, timeout; the env values of the step's ``env_keys`` only if
the caller gives them: the record keeps keys, never values), ``file_write`` (its recorded content), ``file_read``
(the file's sha256 compared with the recorded one), ``file_delete``. Setup is replayed like the agent's steps (it
built the state); steps after the ``grading`` event are not (grading is grove's, not the trajectory's). Events,
listings and manifests change nothing and are not replayed. A step whose input the record does not hold (a file
written bigger than the recorded content limit or not text, an exec with stdin, an archive upload) is reported
with ``match: false`` and its ``reason``.

**When a step matches.** Its exit code (or a file call's status) is the recorded one, and its stdout and stderr hash
the same after :func:`normalize`, which replaces what legitimately differs between two runs of the same command:

===========================================  =================
ISO timestamps ``2026-12-03T16:12:26.5Z``    ``<timestamp>``
dates ``2026-12-03``, ``ls`` dates ``Dec  3``  ``<date>``
clock times ``16:12``, ``16:12:26.123``      ``<time>``
durations ``0.05s``, ``12 ms``               ``<duration>``
addresses ``0x7f3a…``                         ``<addr>``
process ids ``pid 4242``, ``pid=4242``       ``pid <pid>``
sandbox ids ``sb-[<shard>-]<16 hex>``        ``<sandbox>``
===========================================  =================

An output the record holds only as a hash (truncated) is compared by its raw sha256.

**Volatile steps.** A task may mark commands whose output is expected to differ (a random seed, a network fetch):
``"volatile": [REGEX, ...]`` in its task line (rollouts put it in the trajectory's ``setup`` event), or in the
replay request. A command matching one is still run (the state after it matters), but reported apart, under
``volatile``, and not counted in ``total``/``matched``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from grove.core.errors import Invalid

REPLAYED = ("exec", "file_write", "file_read", "file_delete")
"""Step types a replay re-runs."""
STATEFUL_UNREPLAYABLE = ("archive_write", "computer")
"""Step types that changed the sandbox but whose input the record does not hold: reported as not matching."""

_MONTHS = "Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec"
_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?"), "<timestamp>"),
    (re.compile(r"\b\d{4}-\d{2}-\d{2}\b"), "<date>"),
    (re.compile(rf"\b(?:{_MONTHS})\s+\d{{1,2}}(?:\s+\d{{4}}\b)?"), "<date>"),
    (re.compile(r"\b\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?\b"), "<time>"),
    (re.compile(r"\b\d+(?:\.\d+)?\s?(?:ns|us|µs|ms|s|sec|secs|seconds)\b"), "<duration>"),
    (re.compile(r"\b0x[0-9a-fA-F]+\b"), "<addr>"),
    (re.compile(r"\b(pid)\b[ =:#]*\d+", re.IGNORECASE), r"\1 <pid>"),
    (re.compile(r"\bsb-(?:[a-z0-9]{1,12}-)?[0-9a-f]{16}\b"), "<sandbox>"),
)


def normalize(output: bytes) -> bytes:
    """``output`` with what differs between two runs of the same command replaced (the table above)."""
    text = output.decode("utf-8", "surrogateescape")
    for pattern, replacement in _RULES:
        text = pattern.sub(replacement, text)
    return text.encode("utf-8", "surrogateescape")


def output_hash(output: bytes) -> str:
    """The sha256 of the normalized output: what a replay compares."""
    return hashlib.sha256(normalize(output)).hexdigest()


@dataclass(frozen=True)
class PlannedStep:
    """One step of the record to re-run, by its index in the record's steps."""

    index: int
    step: dict[str, Any]
    volatile: bool
    reason: str | None = None
    """Why it cannot be re-run (its input is not in the record); None if it can."""


def volatile_patterns(steps: Iterable[dict[str, Any]], extra: Iterable[str] = ()) -> list[re.Pattern[str]]:
    """The volatile-command patterns: those of the record's ``setup`` events and ``extra`` (the request's)."""
    found = list(extra)
    for step in steps:
        data = step.get("data")
        if step.get("type") == "event" and step.get("kind") == "setup" and isinstance(data, dict):
            marks = data.get("volatile")
            if isinstance(marks, list):
                found += [m for m in marks if isinstance(m, str)]
    patterns = []
    for mark in found:
        try:
            patterns.append(re.compile(mark))
        except re.error as exc:
            raise Invalid(f"volatile pattern {mark!r} is not a regular expression: {exc}") from exc
    return patterns


def plan(steps: list[dict[str, Any]], until: int | None, volatile: list[re.Pattern[str]]) -> Iterator[PlannedStep]:
    """The steps to re-run, in order, up to index ``until`` (inclusive), stopping where grading starts."""
    for index, step in enumerate(steps):
        if until is not None and index > until:
            return
        kind = step.get("type")
        if kind == "event" and step.get("kind") == "grading":
            return
        if kind in STATEFUL_UNREPLAYABLE:
            yield PlannedStep(index, step, False, f"a {kind} step's input is not kept in the record")
        elif kind in REPLAYED and "error" not in step and int(step.get("status") or 200) < 400:
            yield PlannedStep(index, step, _is_volatile(step, volatile), _unreplayable(step))


def _is_volatile(step: dict[str, Any], volatile: list[re.Pattern[str]]) -> bool:
    command = step.get("command")
    text = command if isinstance(command, str) else " ".join(map(str, command)) if isinstance(command, list) else ""
    return step.get("type") == "exec" and any(p.search(text) for p in volatile)


def _unreplayable(step: dict[str, Any]) -> str | None:
    if step["type"] == "exec" and step.get("stdin_bytes"):
        return "the command's stdin is not kept in the record"
    if step["type"] == "file_write" and not isinstance(step.get("content"), str):
        return "the written content is not kept in the record (larger than 64 KiB, or not text)"
    return None


def content_matches(step: dict[str, Any]) -> bool:
    """Whether a ``file_write`` step's recorded content is what its recorded sha256 says (an edited record is not)."""
    content = step.get("content")
    return isinstance(content, str) and hashlib.sha256(content.encode()).hexdigest() == step.get("sha256")


def compare_exec(recorded: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    """The report of one re-run command against its recorded step."""
    report: dict[str, Any] = {"exit_code": result.get("exit_code"), "recorded_exit_code": recorded.get("exit_code")}
    differs = [] if report["exit_code"] == report["recorded_exit_code"] else ["exit_code"]
    for stream in ("stdout", "stderr"):
        raw = bool(recorded.get(f"{stream}_truncated") or result.get(f"{stream}_truncated"))
        now, then = _stream_hash(result, stream, raw), _stream_hash(recorded, stream, raw)
        report[f"{stream}_sha256"], report[f"recorded_{stream}_sha256"] = now, then
        if now != then:
            differs.append(stream)
    report["match"] = not differs
    if differs:
        report["differs"] = differs
    return report


def _stream_hash(step: dict[str, Any], stream: str, raw: bool) -> str | None:
    """The normalized hash of a step's output; with ``raw`` (an output was cut: only its hash is whole), the raw
    sha256."""
    output = step.get(stream)
    if isinstance(output, str):
        output = output.encode()
    if raw or not isinstance(output, bytes):
        whole = step.get(f"{stream}_sha256")
        return f"raw:{whole}" if isinstance(whole, str) else None
    return output_hash(output)
