"""The trajectory record: its msgpack encoding and where it and its index entries live in the bucket.

A record is one dict per sandbox::

    {"version": 1,
     "sandbox": {"id": "sb-…", "image": …, "image_digest": …, "created_at": <epoch s>, "ended_at": …,
                 "resources": {…}, "network": {…},
                 "metadata": {"task_id": …, "model": …, "harness": …, "harness_version": …, "labels": {…}}},
     "steps": [...],          # in order; shapes in artifacts.export
     "outcome": {"result": "pass"|"fail"|"infra_error", "reward": float|None, "reason": str|None,
                 "infra_errors"?: [{"t": <epoch s>, "reason": str}]} | None,
     "cost": {"cpu_s", "memory_gb_s", "memory_peak_mb", "disk_bytes", "s3_bytes", "running_s"} | None}

``cost`` is what the sandbox cost over its life (``grove.core.cost.Cost``), written when it ended; None in a
record of a sandbox still running or stored before costs were recorded.

``sandbox.lineage`` (when the sandbox's state came from another's trajectory): ``{"parent": <sandbox id>, "step":
<int>, "checkpoint": <id or null>, "kind": "fork"|"restore"|"replay"}``.

``sandbox`` is the router's public view of the sandbox; task_id, model, harness and harness_version
are read from ``sandbox.metadata`` (or, failing that, from ``sandbox`` itself).

Key layout (every name segment URL-quoted, see :func:`segment`)::

    trajectories/<YYYY-MM-DD of created_at, UTC>/<task_id or _none>/<sandbox_id>.msgpack
    index/by-id/<sandbox_id>                  JSON summary, including "key" of the trajectory
    index/by-task/<task_id>/<sandbox_id>      the same JSON (only when the field is set)
    index/by-model/<model>/<sandbox_id>
    index/by-harness/<harness>/<sandbox_id>
    index/by-parent/<parent sandbox_id>/<sandbox_id>   (a record with ``sandbox.lineage``)

so a pipeline lists one prefix and reads small JSON bodies instead of every trajectory. A sandbox
with no created_at files under ``_undated`` rather than today, so re-uploading it (after a spool)
overwrites the same key instead of making a second copy.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import msgpack

from grove.core.errors import Invalid

VERSION = 1
TRAJECTORY_PREFIX = "trajectories/"
INDEX_PREFIX = "index/"
RUNS_PREFIX = "runs/"
"""Rollout runs' files (results, summaries, reports, plots): ``runs/<run_id>/<name>``, beside the trajectories."""
# Index name → the summary field it lists by (``by-parent``: the sandbox a forked, restored or replayed one's
# ``lineage`` names, so a trajectory's children are one listing away).
INDEXES = {"by-task": "task_id", "by-model": "model", "by-harness": "harness", "by-parent": "parent"}
NONE_SEGMENT = "_none"
_MAX_SEGMENT = 180  # S3 keys are at most 1024 bytes; a few long names must still fit


def segment(name: str) -> str:
    """``name`` as one key segment: percent-quoted, never '.', '..', empty, or a leading '_' (reserved)."""
    if not name:
        raise Invalid("a key segment cannot be empty")
    # quote(safe="") escapes '/', '%', spaces and non-ASCII; what it leaves is [A-Za-z0-9_.~-].
    quoted = quote(name, safe="")
    if quoted[0] in "._":
        # A leading '.' could make '.' or '..' (path-like servers collapse them); a leading '_' could
        # collide with the reserved markers such as "_none".
        quoted = f"%{ord(quoted[0]):02X}{quoted[1:]}"
    if len(quoted) > _MAX_SEGMENT:
        digest = hashlib.sha256(name.encode()).hexdigest()[:16]
        quoted = f"{quoted[: _MAX_SEGMENT - 17]}~{digest}"
    return quoted


def sandbox_id(record: dict[str, Any]) -> str:
    """The record's sandbox id (Invalid if missing)."""
    sandbox = record.get("sandbox")
    sid = sandbox.get("id") if isinstance(sandbox, dict) else None
    if not isinstance(sid, str) or not sid:
        raise Invalid("trajectory record has no sandbox.id")
    return sid


def meta(record: dict[str, Any], name: str) -> Any:
    """A metadata field (task_id, model, …) from ``sandbox.metadata``, else from ``sandbox``."""
    sandbox = record.get("sandbox") or {}
    inner = sandbox.get("metadata")
    value = inner.get(name) if isinstance(inner, dict) else None
    return value if value is not None else sandbox.get(name)


def run_id(record: dict[str, Any]) -> str | None:
    """The rollout run a record belongs to: ``sandbox.metadata.labels.run_id``, if set."""
    labels = meta(record, "labels")
    value = labels.get("run_id") if isinstance(labels, dict) else None
    return value if isinstance(value, str) and value else None


def trajectory_key(record: dict[str, Any]) -> str:
    """Where the record is stored: ``trajectories/<date>/<task_id or _none>/<sandbox_id>.msgpack``."""
    created = (record.get("sandbox") or {}).get("created_at")
    day = _day(created) if created is not None else "_undated"
    task = meta(record, "task_id")
    task_seg = segment(task) if isinstance(task, str) and task else NONE_SEGMENT
    return f"{TRAJECTORY_PREFIX}{day}/{task_seg}/{segment(sandbox_id(record))}.msgpack"


def summary(record: dict[str, Any]) -> dict[str, Any]:
    """The small description an index entry holds (enough to filter and to fetch the record)."""
    sandbox = record.get("sandbox") or {}
    outcome = record.get("outcome") or {}
    steps = record.get("steps") or []
    return {
        "sandbox_id": sandbox_id(record),
        "project": sandbox.get("project"),
        "key": trajectory_key(record),
        "task_id": meta(record, "task_id"),
        "model": meta(record, "model"),
        "harness": meta(record, "harness"),
        "harness_version": meta(record, "harness_version"),
        "run_id": run_id(record),
        "image": sandbox.get("image"),
        "image_digest": sandbox.get("image_digest"),
        "created_at": sandbox.get("created_at"),
        "ended_at": sandbox.get("ended_at"),
        "result": outcome.get("result"),
        "reward": outcome.get("reward"),
        "infra_errors": len(outcome.get("infra_errors") or []),
        "steps": len(steps),
        "cost": cost if isinstance(cost := record.get("cost"), dict) else None,
        "lineage": lineage if isinstance(lineage := sandbox.get("lineage"), dict) else None,
        "parent": lineage.get("parent") if isinstance(lineage, dict) else None,
    }


def index_key(index: str, value: str, sid: str) -> str:
    """The key of one index entry, e.g. ``index/by-task/<task>/<sandbox_id>``."""
    return f"{INDEX_PREFIX}{index}/{segment(value)}/{segment(sid)}"


def index_prefix(index: str, value: str) -> str:
    """The prefix listing every entry of one value, e.g. ``index/by-task/<task>/``."""
    return f"{INDEX_PREFIX}{index}/{segment(value)}/"


def by_id_key(sid: str) -> str:
    """The key of a sandbox's ``by-id`` entry."""
    return f"{INDEX_PREFIX}by-id/{segment(sid)}"


def index_entries(record: dict[str, Any]) -> dict[str, bytes]:
    """Every index entry of the record, key → JSON body; ``by-id`` last (it marks the upload complete)."""
    info = summary(record)
    body = json.dumps(info, sort_keys=True, default=str).encode()
    entries = {}
    for index, field in INDEXES.items():
        value = info[field]
        if isinstance(value, str) and value:
            entries[index_key(index, value, info["sandbox_id"])] = body
    entries[by_id_key(info["sandbox_id"])] = body
    return entries


def encode(record: dict[str, Any]) -> bytes:
    """The record as msgpack (bytes stay bytes, e.g. undecodable output)."""
    if record.get("version") != VERSION:
        raise Invalid(f"trajectory record version must be {VERSION}, got {record.get('version')!r}")
    sandbox_id(record)
    try:
        return bytes(msgpack.packb(record, use_bin_type=True))
    except (TypeError, ValueError, OverflowError) as exc:
        raise Invalid(f"trajectory record cannot be encoded: {exc}") from exc


MAX_EVENT_DEPTH = 32
"""Deepest nesting of an event's data the router accepts (a map or list in a map counts two)."""
_MAX_STEP_DEPTH = MAX_EVENT_DEPTH + 4  # the step around an event's data, an artifacts step's items


def nests_deeper(value: Any, limit: int) -> bool:
    """Whether maps and lists in ``value`` nest more than ``limit`` levels (iterative: any depth is safe)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list | tuple) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def readable_steps(steps: Any) -> list[dict[str, Any]]:
    """The steps as every reader can take them: one that is not a map, or nests deeper than any the router
    accepts (written before the limit), becomes ``{"type": "bad_step", "error"}`` in its place."""
    if not isinstance(steps, list):
        return [{"type": "bad_step", "error": f"the record's steps are a {type(steps).__name__}, not a list"}]
    readable: list[dict[str, Any]] = []
    for step in steps:
        if not isinstance(step, dict):
            readable.append({"type": "bad_step", "error": f"a step that is a {type(step).__name__}, not a map"})
        elif nests_deeper(step, _MAX_STEP_DEPTH):
            readable.append({"type": "bad_step", "error": f"a step nested deeper than {_MAX_STEP_DEPTH} levels",
                             "t": step.get("t") if isinstance(step.get("t"), int | float) else None})
        else:
            readable.append(step)
    return readable


def decode(data: bytes) -> dict[str, Any]:
    """A record from msgpack (Invalid if it is not one)."""
    try:
        record = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise Invalid(f"not a msgpack trajectory record: {exc}") from exc
    if not isinstance(record, dict) or record.get("version") != VERSION:
        raise Invalid("not a version-1 trajectory record")
    record["steps"] = readable_steps(record.get("steps", []))
    return record


def _day(created: Any) -> str:
    try:
        if isinstance(created, int | float):
            moment = datetime.fromtimestamp(float(created), UTC)
        else:
            moment = datetime.fromisoformat(str(created)).astimezone(UTC)
    except (ValueError, OverflowError, OSError) as exc:
        raise Invalid(f"sandbox.created_at is not a time: {created!r}") from exc
    return moment.strftime("%Y-%m-%d")
