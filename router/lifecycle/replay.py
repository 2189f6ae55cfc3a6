"""Replay: a stored trajectory's commands and file operations re-run, in order, in a fresh sandbox of the same image
digest, each compared with what was recorded (the rules: :mod:`artifacts.replay`).

The fresh sandbox is an ordinary one of the caller's project, its trajectory recorded like any other (the steps
the replay ran), with ``lineage: {"parent", "step", "checkpoint": null, "kind": "replay"}``; it is kept (the state
after step ``until``, for a continuation to start from) unless the request says ``"keep": false``.

A replay always starts from the image and re-runs every step up to ``until``. Where a run kept a checkpoint of
the state at a step (``grove rollouts run --checkpoint-every``), a continuation is made from that checkpoint
instead, without replay (``grove/rollouts/rebuild.py`` decides): replay is what rebuilds a state no checkpoint
kept, or one whose checkpoint is gone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from artifacts.replay import PlannedStep, compare_exec, content_matches, plan, volatile_patterns
from grove.core import wire
from grove.core.errors import BadGateway, Conflict, GroveError, Invalid, NotFound
from grove.core.schema import parse, spec
from router.backends.base import Endpoint
from router.lifecycle.service import SandboxService
from router.models import CreateRequest
from router.records.registry import SandboxRecord
from router.trajectory.recorder import Digest, exec_step
from router.upstream.proxy import Upstreams

_FILE_TIMEOUT_S = 120.0
_EXEC_TIMEOUT_S = 3600.0
"""A recorded command without its own timeout: the longest the replay waits for it."""


@dataclasses.dataclass(frozen=True)
class ReplayRequest:
    """Re-run a stored trajectory in a fresh sandbox."""

    until: int | None = spec("replay up to this step index (inclusive; the record's step numbering); none: every "
                             "step before grading", default=None, minimum=0, maximum=1 << 31)
    env: dict[str, str] = spec("values of the environment the trajectory ran with (the record keeps only the keys): "
                               "the sandbox's env, and each replayed command's keys' values", factory=dict,
                               max_items=1024, max_len=128 * 1024 - 2)
    volatile: tuple[str, ...] = spec("regular expressions of commands whose output may differ: run, but reported "
                                     "apart (added to the task's own, from the trajectory's setup event)",
                                     factory=tuple, max_items=256, max_len=1024)
    keep: bool = spec("keep the replayed sandbox (the rebuilt state); false: delete it after", default=True)
    labels: dict[str, str] = spec("labels of the replayed sandbox (beside `replay_of`: the trajectory's id)",
                                  factory=dict, max_items=64, max_len=1024)


class Replayer:
    """Runs replays through the service (sandboxes) and the recorder (the replay's own trajectory)."""

    def __init__(self, service: SandboxService) -> None:
        self.service = service

    async def replay(self, record: dict[str, Any], req: ReplayRequest, project: str) -> dict[str, Any]:
        """Replay ``record`` as ``req`` asks; the report."""
        steps = record.get("steps") or []
        planned = list(plan(steps, req.until, volatile_patterns(steps, req.volatile)))
        if not planned:
            raise Invalid("the trajectory has no step to replay up to that index (commands and file writes before "
                          "grading)")
        sandbox = record.get("sandbox") or {}
        await self._same_image(sandbox)
        last = planned[-1].index if req.until is None else req.until
        created = await self.service.create(self._create_request(sandbox, req, last), frozenset({"workdir"}),
                                            project=project)
        try:
            reports = [await self._run(created, step, req.env) for step in planned]
        except BaseException:
            with contextlib.suppress(GroveError):
                await self.service.delete(created.id, reason="replay failed")
            raise
        if not req.keep:
            await self.service.delete(created.id, reason="replay finished")
        counted = [r for r, p in zip(reports, planned, strict=True) if not p.volatile]
        return {"sandbox_id": created.id, "parent": sandbox.get("id"), "until": last, "total": len(counted),
                "matched": sum(r["match"] for r in counted), "steps": counted,
                "volatile": [r for r, p in zip(reports, planned, strict=True) if p.volatile],
                "first_mismatch": next((r["index"] for r in counted if not r["match"]), None),
                "kept": req.keep}

    async def _same_image(self, sandbox: dict[str, Any]) -> None:
        """409 unless the image the trajectory ran on is still here with the same digest."""
        image, digest = sandbox.get("image"), sandbox.get("image_digest")
        if not isinstance(image, str) or not image:
            raise Conflict("the trajectory does not name its image: it cannot be replayed")
        try:
            current = await self.service.backend.image_digest(image)
        except NotFound as exc:
            raise Conflict(f"the trajectory's image {image!r} ({digest}) is gone: it cannot be replayed "
                           "(import or build that image again)") from exc
        if digest and current and current != digest:
            raise Conflict(f"the trajectory ran on image {image!r} with digest {digest}; that name now has digest "
                           f"{current}: replay needs the image it ran on")

    @staticmethod
    def _create_request(sandbox: dict[str, Any], req: ReplayRequest, last: int) -> CreateRequest:
        """The fresh sandbox: the recorded image, resources, workdir and network; the caller's env values."""
        resources = sandbox.get("resources") or {}
        parent = str(sandbox.get("id"))
        labels = {**req.labels, "replay_of": parent}
        body = {"image": sandbox["image"], **{k: v for k, v in resources.items() if k in _RESOURCES},
                "workdir": sandbox.get("workdir") or "/workspace", "env": dict(req.env),
                "network": sandbox.get("network") or {"egress": "deny"},
                "metadata": {**{k: sandbox.get(k) for k in ("task_id", "model", "harness", "harness_version")},
                             "labels": labels},
                "lineage": {"parent": parent, "step": last, "checkpoint": None, "kind": "replay"}}
        return parse(CreateRequest, body)

    async def _run(self, record: SandboxRecord, planned: PlannedStep, env: dict[str, str]) -> dict[str, Any]:
        step = planned.step
        report: dict[str, Any] = {"index": planned.index, "type": step["type"]}
        report["command" if step["type"] == "exec" else "path"] = step.get("command", step.get("path"))
        if planned.reason is not None:
            return {**report, "match": False, "reason": planned.reason}
        service = self.service
        with service.calling(record), service.recorder.faults(record, f"replaying step {planned.index}"):
            endpoint = await service.endpoint(record)
            if step["type"] == "exec":
                return {**report, **await self._exec(record, endpoint, step, env)}
            return {**report, **await self._file(record, endpoint, step)}

    async def _exec(self, record: SandboxRecord, endpoint: Endpoint, step: dict[str, Any],
                    env: dict[str, str]) -> dict[str, Any]:
        sent: dict[str, Any] = {"command": step.get("command"), "cwd": step.get("cwd"),
                                "env": {k: env[k] for k in step.get("env_keys") or [] if k in env},
                                "timeout_s": step.get("timeout_s")}
        if step.get("user") is not None:
            sent["user"] = step["user"]
        body = wire.encode({k: v for k, v in sent.items() if v is not None}, True)
        started = time.time()
        limit = float(step.get("timeout_s") or _EXEC_TIMEOUT_S) + 60  # the executor ends the command before
        async with self._call(endpoint, "POST", "/v1/exec", limit, data=body,
                              headers={"Accept": wire.MSGPACK, "Content-Type": wire.MSGPACK}) as resp:
            answer, status = await resp.read(), resp.status
        if status >= 500:
            raise BadGateway(f"the executor failed replaying {step.get('command')!r}: "
                             f"{answer[:300].decode('utf-8', 'replace')}")
        ran = exec_step(body, wire.MSGPACK, answer, wire.MSGPACK, False, status, started)
        if ran is None:
            return {"match": False, "exit_code": None, "recorded_exit_code": step.get("exit_code"),
                    "reason": f"the executor refused the command ({status})"}
        self.service.recorder.exec(record, ran)
        if "error" in ran:  # it ran once; now the executor refuses it (a cwd or user that is not there)
            return {"match": False, "exit_code": None, "recorded_exit_code": step.get("exit_code"),
                    "reason": f"the executor refused it now: {ran['error']['body'][:300]}"}
        return compare_exec(step, ran)

    async def _file(self, record: SandboxRecord, endpoint: Endpoint, step: dict[str, Any]) -> dict[str, Any]:
        kind, path = step["type"], str(step.get("path"))
        op = kind.removeprefix("file_")
        method = {"write": "PUT", "read": "GET", "delete": "DELETE"}[op]
        data = str(step.get("content") or "").encode() if op == "write" else None
        digest = Digest()
        started = time.time()
        async with self._call(endpoint, method, "/v1/files", _FILE_TIMEOUT_S, params={"path": path},
                              data=data) as resp:
            status = resp.status
            if op == "read" and status < 300:
                async for chunk in resp.content.iter_chunked(1 << 16):  # hashed as it comes: any size
                    digest(chunk)
        if status >= 500:
            raise BadGateway(f"the executor failed replaying {kind} of {path!r} ({status})")
        if data is not None:
            digest(data)
        moved = digest if op in ("write", "read") else None
        self.service.recorder.transfer(record, "file", op, path=path, status=status, started=started, moved=moved)
        report: dict[str, Any] = {"status": status, "recorded_status": step.get("status")}
        ok = (status < 300) == (int(step.get("status") or 200) < 300)
        if op in ("write", "read"):
            report["sha256"], report["recorded_sha256"] = digest.hash.hexdigest(), step.get("sha256")
            ok = ok and report["sha256"] == report["recorded_sha256"]
        if op == "write" and not content_matches(step):
            report["reason"] = "the recorded content does not hash to the recorded sha256 (the record was edited)"
        report["match"] = ok
        return report

    @contextlib.asynccontextmanager
    async def _call(self, endpoint: Endpoint, method: str, path: str, timeout_s: float, *,
                    headers: dict[str, str] | None = None, **kwargs: Any) -> AsyncIterator[aiohttp.ClientResponse]:
        """One call to the replayed sandbox's executor; one it does not answer is a ``BadGateway`` (an
        environment fault, noted in the replay's own trajectory by the caller's ``faults``)."""
        session, base = self.service.upstreams.session(endpoint)
        try:
            async with session.request(method, base + path, headers=Upstreams.headers(endpoint, headers),
                                       timeout=aiohttp.ClientTimeout(total=timeout_s), **kwargs) as resp:
                yield resp
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise BadGateway(f"the sandbox's executor did not answer {method} {path} during the replay: {exc}") from exc


_RESOURCES = ("cpu", "memory_mb", "pids_max", "disk_mb")
