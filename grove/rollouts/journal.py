"""The run directory: ``run.json`` (what the run is) and ``journal.jsonl`` (what happened, append-only).

Every line of the journal is written and fsync'ed before the runner acts on it, so a runner killed at
any instant leaves a journal that says which attempts finished, which try of which attempt was under
way and in which sandbox. A torn last line (the kill hit mid-write) is ignored on reading.

Entries (``e``): ``try`` (a try of an attempt starts; its create ``request_id``), ``sandbox`` (the
try's sandbox), ``infra`` (the try ended on an infrastructure fault, with the reason; the attempt
is retried), ``interrupted`` (a try the runner did not live to finish, found and cleaned up on resume),
``done`` (the attempt's result line: graded, or ``infra_error`` once the retries are spent),
``throttled`` (a create the router turned away with 503 + Retry-After; retried after the wait), ``unreachable`` (a
create that found no router at all: waited for it, then retried).
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grove.core.errors import Conflict

RUN_FILE = "run.json"
JOURNAL_FILE = "journal.jsonl"

UNSCORED = ("infra_error", "harness_error")
"""Outcomes that are nobody's score: the environment's faults, and the harness's own bugs."""

AttemptKey = tuple[int, str, int]
"""(variant index, task id, attempt number)."""


def new_run_id() -> str:
    """A run id: UTC time plus randomness, sortable and unique."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(3)


def open_run(out: Path, spec: dict[str, Any]) -> dict[str, Any]:
    """Create the run directory, or reopen it for a resume; the spec must match the one it was made with."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / RUN_FILE
    if path.exists():
        run: dict[str, Any] = json.loads(path.read_text())
        differs = sorted(k for k in spec if run.get("spec", {}).get(k) != spec[k])
        if differs:
            raise Conflict(f"{out} holds run {run['run_id']} made with other settings ({', '.join(differs)} "
                           "differ): resume it with the same command, or pick another --out")
        return run
    run = {"run_id": new_run_id(), "created_at": time.time(), "spec": spec}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(run, indent=2))
    os.replace(tmp, path)
    return run


@dataclass
class JournalState:
    """What the journal says, folded."""

    done: dict[AttemptKey, dict[str, Any]] = field(default_factory=dict)
    tries: dict[AttemptKey, int] = field(default_factory=dict)
    """How many tries each attempt has started."""
    open_tries: dict[AttemptKey, dict[str, Any]] = field(default_factory=dict)
    """Tries started and never ended (the runner died): their ``try`` entry, with ``sandbox_id`` if known."""
    infra: list[dict[str, Any]] = field(default_factory=list)
    interrupted: int = 0
    throttled: int = 0
    unreachable: int = 0
    """Creates that found no router (it was down or away), each waited for and retried."""
    """Creates the router answered with 503 + Retry-After (back-pressure), each retried after the wait."""


class Journal:
    """The append-only journal of one run."""

    def __init__(self, out: Path) -> None:
        self.path = out / JOURNAL_FILE
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:  # one runner per run directory; the kernel drops the lock however the runner dies
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            os.close(self._fd)
            raise Conflict(f"another runner is working on {out}; wait for it or stop it first") from exc

    def write(self, entry: dict[str, Any]) -> None:
        """Append one entry durably."""
        line = json.dumps({**entry, "t": round(time.time(), 3)}, separators=(",", ":")) + "\n"
        os.write(self._fd, line.encode())
        os.fsync(self._fd)

    def close(self) -> None:
        """Close the file."""
        os.close(self._fd)


def key_of(entry: dict[str, Any]) -> AttemptKey:
    """The attempt an entry is about."""
    return int(entry["variant"]), str(entry["task"]), int(entry["attempt"])


def read_journal(out: Path) -> JournalState:
    """Fold the journal of a run directory (empty state if there is none)."""
    state = JournalState()
    path = out / JOURNAL_FILE
    if not path.exists():
        return state
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue  # the torn tail of a killed writer
        key, kind = key_of(entry), entry.get("e")
        if kind == "try":
            state.tries[key] = max(state.tries.get(key, 0), int(entry["try"]) + 1)
            state.open_tries[key] = dict(entry)
        elif kind == "sandbox" and key in state.open_tries:
            state.open_tries[key]["sandbox_id"] = entry["sandbox_id"]
        elif kind == "infra":
            state.infra.append(entry)
            state.open_tries.pop(key, None)
        elif kind == "throttled":
            state.throttled += 1
        elif kind == "unreachable":
            state.unreachable += 1
        elif kind == "interrupted":
            state.interrupted += 1
            state.open_tries.pop(key, None)
        elif kind == "done":
            state.done[key] = _finite_reward(entry["result"])
            state.open_tries.pop(key, None)
    return state


def _finite_reward(result: dict[str, Any]) -> dict[str, Any]:
    """A result as the report takes it: a non-finite reward (journaled before grove refused them) is a fail."""
    reward = result.get("reward")
    if isinstance(reward, float) and not math.isfinite(reward):
        return {**result, "outcome": "fail", "reward": 0.0,
                "reason": f"the check gave the reward {reward}, not a finite number: scored as a fail with reward 0"}
    return result
