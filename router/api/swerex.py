"""``/v1/sandboxes/{id}/swerex/{call}``: SWE-ReX's remote-runtime protocol, forwarded to the sandbox's executor.

SWE-ReX's client works unchanged with ``RemoteRuntime(host="http://ROUTER/v1/sandboxes/ID/swerex",
auth_token=KEY)``: it posts JSON to ``<host>/<call>`` with the key in ``X-API-Key`` (accepted on these
routes). The executor speaks the protocol (:mod:`executor.swerex`); here each call is forwarded like any
data-path call and recorded in the trajectory — ``run_in_session`` and ``execute`` as exec steps (command,
exit code, output, timeout), file calls as file steps, session calls as ``swerex`` steps. ``is_alive``
polls are not recorded.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from typing import Any

from aiohttp import web

from grove.core.errors import NotFound
from router.api.appkeys import service_of
from router.api.datapath import call_executor, read_capped

MAX_BODY = 256 * 1024 * 1024
# What of an answer is kept for the record (the executor caps a command's output at 1 MiB by default).
_RECORD_LIMIT = 4 * 1024 * 1024
_UPLOAD_TAIL = 16 * 1024
_FORM_FIELD = r'name="{}"\r\n(?:[^\r\n]+\r\n)*\r\n(.*?)\r\n--'
#: The protocol's calls (what the executor serves under /swerex/). Only these are forwarded: anything else
#: in the tail — `..`, encoded or not — would reach the executor's other routes without being recorded.
CALLS = {
    "GET": frozenset({"", "is_alive"}),
    "POST": frozenset({"create_session", "run_in_session", "close_session", "execute", "read_file", "write_file",
                       "upload", "close"}),
}


class _Collect:
    """Keeps what passes through, up to a limit (then only counts)."""

    def __init__(self, limit: int) -> None:
        self.data = bytearray()
        self.size = 0
        self.limit = limit

    def __call__(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if len(self.data) < self.limit:
            self.data += chunk[: self.limit - len(self.data)]


class _Upload:
    """Size of a multipart upload and its last bytes (where SWE-ReX's client puts the form fields)."""

    def __init__(self) -> None:
        self.size = 0
        self.tail = b""

    def __call__(self, chunk: bytes) -> None:
        self.size += len(chunk)
        self.tail = (self.tail + chunk)[-_UPLOAD_TAIL:]

    def field(self, name: str) -> str | None:
        m = re.search(_FORM_FIELD.format(re.escape(name)).encode(), self.tail, re.S)
        return m.group(1).decode(errors="replace") if m else None


async def swerex_handler(request: web.Request) -> web.StreamResponse:
    """Any SWE-ReX call: forwarded to the executor's ``/swerex/<call>``, then recorded."""
    call = request.match_info["tail"]
    if call not in CALLS.get(request.method, frozenset()):
        raise NotFound(f"no SWE-ReX call {call!r} for {request.method}; the calls are: "
                       f"{', '.join(sorted(CALLS['POST'] | {'is_alive'}))}")
    upstream = "/swerex/" + call
    if request.method != "POST":
        _, response, _ = await call_executor(request, upstream)
        return response
    if call == "upload":
        upload = _Upload()
        record, response, started = await call_executor(request, upstream, request_tap=upload)
        step: dict[str, Any] | None = {
            "type": "file_upload", "via": "swerex", "t": started, "path": upload.field("target_path"),
            "unzip": (upload.field("unzip") or "false").lower() == "true", "bytes": upload.size,
            "status": response.status,
        }
    else:
        body = await read_capped(request, MAX_BODY)
        answer = _Collect(_RECORD_LIMIT)
        record, response, started = await call_executor(request, upstream, body=body, response_tap=answer)
        step = _step(call, body, answer, response.status, started)
    if step is not None:
        service_of(request).recorder.step(record, step)
    return response


def _step(call: str, body: bytes, answer: _Collect, status: int, started: float) -> dict[str, Any] | None:
    sent = _json(body)
    got = _json(bytes(answer.data)) if answer.size <= answer.limit else {}
    step: dict[str, Any] = {"t": started, "via": "swerex", "latency_s": round(time.time() - started, 6)}
    if call == "run_in_session" and sent.get("action_type", "bash") == "bash":
        step.update(type="exec", session=sent.get("session", "default"), command=sent.get("command"),
                    timeout_s=sent.get("timeout"), interactive=bool(sent.get("is_interactive_command")
                                                                    or sent.get("is_interactive_quit")))
        step.update(_result(got, status, stdout_key="output"))
    elif call == "execute":
        env = sent.get("env")
        step.update(type="exec", command=sent.get("command"), cwd=sent.get("cwd"), timeout_s=sent.get("timeout"),
                    env_keys=sorted(env) if isinstance(env, dict) else [])
        step.update(_result(got, status, stdout_key="stdout"))
    elif call in ("read_file", "write_file"):
        content = (got if call == "read_file" else sent).get("content")
        data = content.encode(errors="surrogateescape") if isinstance(content, str) else b""
        step.update(type="file_read" if call == "read_file" else "file_write", path=sent.get("path"), status=status)
        if status == 200:
            step.update(size=len(data), sha256=hashlib.sha256(data).hexdigest())
    elif call in ("create_session", "close_session", "close", "run_in_session"):
        op = "interrupt" if call == "run_in_session" else call
        step.update(type="swerex", op=op, session=sent.get("session"), status=status)
    else:
        return None
    if status >= 400 and "error" not in step:
        step["error"] = _error(got, status, answer)
    return step


def _result(got: dict[str, Any], status: int, *, stdout_key: str) -> dict[str, Any]:
    """The exec-step fields of an answer: the observation, or the exception SWE-ReX transferred."""
    if status == 200:
        return {"exit_code": got.get("exit_code"), "stdout": got.get(stdout_key, ""), "stderr": got.get("stderr", ""),
                "timed_out": False}
    transfer: dict[str, Any] = got["swerexception"] if isinstance(got.get("swerexception"), dict) else {}
    extra: dict[str, Any] = transfer["extra_info"] if isinstance(transfer.get("extra_info"), dict) else {}
    kind = str(transfer.get("class_path", "")).rpartition(".")[2]
    return {
        "exit_code": extra.get("exit_code"),
        "stdout": extra.get("output", extra.get("stdout", "")),
        "stderr": extra.get("stderr", ""),
        "timed_out": kind == "CommandTimeoutError",
        "error": {"status": status, "class": kind or None,
                  "message": str(transfer.get("message") or got.get("error") or "")[:2000]},
    }


def _error(got: dict[str, Any], status: int, answer: _Collect) -> dict[str, Any]:
    transfer = got.get("swerexception")
    if isinstance(transfer, dict):
        return {"status": status, "class": str(transfer.get("class_path", "")).rpartition(".")[2],
                "message": str(transfer.get("message", ""))[:2000]}
    return {"status": status, "body": bytes(answer.data[:2000]).decode("utf-8", "replace")}


def _json(raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
