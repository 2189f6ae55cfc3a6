"""The trajectory recorder: the one owner of what each step of a sandbox's trajectory records.

Handlers hand it what happened on the wire (an exec's request and answer, a file transfer's size and
hash, harness events, a fault) and make one call; the rules — what an exec step keeps, that a retried
``request_id`` is one step, that a fault the sandbox caused itself is its own and not ``infra_error``,
how a ``result`` event becomes the outcome — live here and nowhere else. Every step goes to the
sandbox's :class:`~router.trajectory.journal.Journal` as it happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

from artifacts.catalog import artifact_key
from grove.core import wire
from grove.core.api import final_result
from grove.core.errors import BadGateway, InternalError, Invalid, Unavailable, UpstreamTimeout
from router.records.registry import SandboxRecord
from router.trajectory.journal import Journal
from router.upstream.proxy import StreamAborted

log = logging.getLogger("grove.router")
_REMEMBERED_REQUESTS = 4096
CONTENT_RECORDED = 65536
"""File contents up to this size are kept in the trajectory (so exports can show an edit as a tool call)."""


class Recorder:
    """Writes every step of every sandbox's trajectory."""

    def __init__(self, journal: Journal, backend_name: str) -> None:
        self.journal = journal
        self._backend_name = backend_name
        self._requests: dict[str, OrderedDict[str, None]] = {}
        """Per sandbox, the exec request ids already recorded (a retry the executor answered again is one step)."""

    # -- the record's life ---------------------------------------------------------------------------

    def start(self, record: SandboxRecord) -> None:
        """Open the trajectory with the sandbox's metadata."""
        self.journal.start(record.id, self.metadata(record))

    def start_later(self, records: list[SandboxRecord]) -> None:
        """:meth:`start` for a batch of claims, the headers written later (:meth:`write_started`, or the
        journal's first read or append): a thousand claims answer without a thousand file writes first."""
        self.journal.defer_start((record.id, functools.partial(self.metadata, record)) for record in records)

    async def write_started(self, records: list[SandboxRecord]) -> None:
        """Write the headers :meth:`start_later` deferred, in one worker-thread hop."""
        await asyncio.to_thread(self.journal.write_deferred, [record.id for record in records])

    def metadata(self, record: SandboxRecord) -> dict[str, Any]:
        """The trajectory's sandbox metadata: the API's summary of it, flattened, plus what only the record knows."""
        req = record.request
        summary = req.summary()
        meta = summary.pop("metadata")
        return {
            "id": record.id,
            "project": record.project,
            **{k: meta[k] for k in ("task_id", "model", "harness", "harness_version")},
            "labels": meta["labels"],
            **summary,
            "image_digest": record.image_digest,
            **({"image_config": record.image_config} if record.image_config else {}),
            "backend": self._backend_name,
            "env_keys": sorted(req.env),
            "created_at": record.created_at,
            **({"lineage": record.lineage} if record.lineage else {}),
        }

    def ended(self, sandbox_id: str, ended_at: float | None, reason: str, *,
              cost: dict[str, Any] | None = None) -> None:
        """The sandbox ended: say when and why, and what it cost (the record's ``cost``, beside its outcome;
        :class:`grove.core.cost.Cost`, its S3 bytes added when the record is stored); forget its request ids."""
        self._requests.pop(sandbox_id, None)
        entry: dict[str, Any] = {"ended": {"ended_at": ended_at, "end_reason": reason}}
        if cost is not None:
            entry["cost"] = cost
        self.journal.append(sandbox_id, entry)

    def note(self, record: SandboxRecord, entry: dict[str, Any]) -> None:
        """A lifecycle entry (scale to zero, wake-up, an update of the sandbox's metadata)."""
        self.journal.append(record.id, entry)

    def step(self, record: SandboxRecord, step: dict[str, Any]) -> None:
        """Append one step as it is (SWE-ReX calls, artifact pushes, full-output stores)."""
        self.journal.append(record.id, step)

    # -- exec ----------------------------------------------------------------------------------------

    def exec(self, record: SandboxRecord, step: dict[str, Any]) -> bool:
        """Record an exec step built by :func:`exec_step`; False if a retry of a recorded request (not again).

        A failed call is always a step; a result is one step however often a retry fetched it. A truncated
        output's full text is linked by the key it will have in S3.
        """
        if "error" not in step and not self._first_time(record.id, step.get("request_id")):
            return False
        for stream in ("stdout", "stderr"):
            if isinstance(path := step.get(f"{stream}_file"), str):
                step[f"{stream}_artifact"] = artifact_key(record.id, path)
        self.journal.append(record.id, step)
        return True

    def _first_time(self, sandbox_id: str, request_id: object) -> bool:
        if not isinstance(request_id, str):
            return True
        seen = self._requests.setdefault(sandbox_id, OrderedDict())
        if request_id in seen:
            return False
        seen[request_id] = None
        if len(seen) > _REMEMBERED_REQUESTS:
            seen.popitem(last=False)
        return True

    # -- files -----------------------------------------------------------------------------------------

    def transfer(self, record: SandboxRecord, kind: str, op: str, *, path: str | None, status: int, started: float,
                 moved: Digest | None) -> None:
        """A file or archive call: its path and status, and for reads and writes the size and sha256 of what
        moved (and a small text file's content, so an export shows the edit as a tool call)."""
        step: dict[str, Any] = {"type": f"{kind}_{op}", "t": started, "path": path, "status": status}
        if moved is not None:
            step["size"], step["sha256"] = moved.size, moved.hash.hexdigest()
            if kind == "file" and status < 300 and (text := moved.content()) is not None:
                step["content"] = text
        self.journal.append(record.id, step)

    # -- faults ----------------------------------------------------------------------------------------

    def infra_error(self, record: SandboxRecord, reason: str) -> None:
        """A fault of the environment (not of the policy): the outcome becomes ``infra_error`` unless the
        harness posts a result, which then carries the fault in ``infra_errors``."""
        log.warning("infra error in %s: %s", record.id, reason)
        self.journal.append(record.id, {"infra_error": {"t": time.time(), "reason": reason}})

    def fault(self, record: SandboxRecord, reason: str) -> None:
        """An infra error, unless the loss was the sandbox's own doing (``record.own_fault``): a sandbox
        must not turn its own failure into ``infra_error``, which training drops."""
        own, record.own_fault = record.own_fault, None
        if own is None:
            self.infra_error(record, reason)
            return
        log.info("sandbox %s lost its executor by its own doing: %s", record.id, own)
        self.journal.append(record.id, {"sandbox_error": {"t": time.time(), "reason": f"{reason}: {own}"}})

    @contextlib.contextmanager
    def faults(self, record: SandboxRecord, what: str) -> Iterator[None]:
        """Record the environment faults raised in the block (executor lost, sandbox not resumable, a
        service timeout), then let them propagate."""
        try:
            yield
        except StreamAborted as exc:
            self.fault(record, f"{what}: {exc}")
            raise
        except (BadGateway, Unavailable, UpstreamTimeout, InternalError) as exc:
            self.fault(record, f"{what}: {exc.code}: {exc.message}")
            raise

    # -- harness events ------------------------------------------------------------------------------

    def events(self, record: SandboxRecord, events: list[dict[str, Any]]) -> dict[str, Any] | None:
        """Append harness events; a ``result`` event sets the trajectory's outcome, which is returned."""
        outcomes = [outcome_of(e["data"]) if e["kind"] == "result" else None for e in events]  # validate first
        now = time.time()
        for event, outcome in zip(events, outcomes, strict=True):
            self.journal.append(record.id, {"type": "event", "t": now, "kind": event["kind"], "data": event["data"]})
            if outcome is not None:
                self.journal.append(record.id, {"outcome": outcome})
        return next((o for o in reversed(outcomes) if o is not None), None)


def outcome_of(data: Any) -> dict[str, Any]:
    """Validate a ``result`` event's data into the trajectory outcome (the task's result, never the infra's)."""
    if not isinstance(data, dict) or data.get("result") not in ("pass", "fail", "infra_error"):
        raise Invalid(
            "a 'result' event needs data {\"result\": \"pass\"|\"fail\"|\"infra_error\"} (and optionally \"reward\")"
        )
    reward = data.get("reward")
    if reward is not None and (isinstance(reward, bool) or not isinstance(reward, int | float)):
        raise Invalid("'reward' of a result event must be a number")
    return {"result": data["result"], "reward": reward, "reason": data.get("reason")}


def exec_step(body: bytes, content_type: str, answer: bytes, answer_type: str, streamed: bool, status: int,
              started: float) -> dict[str, Any] | None:
    """The exec step of one call: what was asked (never the env's values or stdin's bytes) and what came
    back; None when the body was not an exec request at all (the executor refused it, nothing ran)."""
    try:
        sent = wire.decode(body, content_type)
    except Exception:
        return None
    if not isinstance(sent, dict):
        return None
    env = sent.get("env")
    stdin = sent.get("stdin")
    step: dict[str, Any] = {
        "type": "exec",
        "t": started,
        "latency_s": round(time.time() - started, 6),
        "command": sent.get("command"),
        "cwd": sent.get("cwd"),
        "user": sent.get("user"),
        "env_keys": sorted(env) if isinstance(env, dict) else [],
        "stdin_bytes": len(stdin) if isinstance(stdin, bytes | str) else 0,
        "timeout_s": sent.get("timeout_s"),
        "request_id": sent.get("request_id"),
    }
    result = _final_result(answer, answer_type, streamed)
    if status >= 400 or result is None:
        step["error"] = {"status": status, "body": answer[:2000].decode("utf-8", "replace")}
        return step
    step.update(result)
    return step


def _final_result(answer: bytes, content_type: str, streamed: bool) -> dict[str, Any] | None:
    try:
        if streamed:
            return final_result(answer, content_type)
        value = wire.decode(answer, content_type)
    except Exception:  # what the executor answered is not ours to trust: an unreadable answer has no result
        return None
    return value if isinstance(value, dict) and "exit_code" in value else None


class Digest:
    """Size and sha256 of bytes passing through, and the head of them (up to :data:`CONTENT_RECORDED`)."""

    def __init__(self) -> None:
        self.size = 0
        self.hash = hashlib.sha256()
        self.head = bytearray()

    def __call__(self, chunk: bytes) -> None:
        self.size += len(chunk)
        self.hash.update(chunk)
        if len(self.head) <= CONTENT_RECORDED:
            self.head.extend(chunk[: CONTENT_RECORDED + 1 - len(self.head)])

    def content(self) -> str | None:
        """The whole content as text, if it was small and valid UTF-8."""
        if len(self.head) > CONTENT_RECORDED:
            return None
        try:
            return bytes(self.head).decode("utf-8")
        except UnicodeDecodeError:
            return None
