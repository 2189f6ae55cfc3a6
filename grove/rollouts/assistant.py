"""The scripted assistant policy (``--harness scripted`` on a task whose ``scripted`` plan has ``calls``): HTTP
calls to the task's services, no model.

It follows the task's ``scripted`` field::

    {"p_solve": 0.8, "seed": 0,
     "calls": [{"say": "Reading the inbox.", "method": "GET", "url": "http://office:8025/mail/inbox"},
               {"method": "POST", "url": "http://office:8025/mail/send", "body": {"to": "ada@example.org", ...},
                "wrong": {"method": "POST", "url": "...", "body": {...}}}],
     "answer": "Done: I replied to Ada."}

Each call is an agent's tool call made the way an agent in the sandbox makes it — ``curl`` run by exec inside the
agent's sandbox, to the service by its name — so the trajectory holds it as an exec step with the service's
answer. As the other scripted policies (:func:`grove.rollouts.scripted.draws_right`), an attempt follows the right
plan with probability ``p_solve``; otherwise each call with a ``wrong`` makes that one instead (``{}``: skipped).
The service's answers are not read: the plan is fixed, and the check grades what the service holds at the end.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from grove.client import Sandbox

_METHODS = ("GET", "POST", "PATCH", "PUT", "DELETE")


def run_assistant(task: dict[str, Any], sandbox: Sandbox, *, right: bool) -> None:
    """Act on an assistant task in ``sandbox`` as its ``scripted`` plan says; ``right``: the right plan."""
    policy = task.get("scripted") or {}
    calls = policy.get("calls")
    if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
        raise ValueError("an assistant task's scripted policy needs 'calls', a list of objects")  # the task's bug
    for planned in calls:
        call = planned if right or "wrong" not in planned else planned["wrong"]
        if not call:
            continue
        if call.get("say"):
            sandbox.post_event("message", {"role": "assistant", "content": str(call["say"])})
        sandbox.exec(["/bin/sh", "-c", curl_line(call)], stdin=_body(call), timeout_s=60)
    if policy.get("answer"):
        sandbox.post_event("message", {"role": "assistant", "content": str(policy["answer"])})


def curl_line(call: dict[str, Any]) -> str:
    """The shell command of one call: its answer's body, then its status on a line of its own."""
    method = str(call.get("method", "GET")).upper()
    if method not in _METHODS:
        raise ValueError(f"a call's method must be one of {', '.join(_METHODS)}, got {method!r}")
    url = str(call["url"])
    data = " -H 'Content-Type: application/json' --data-binary @-" if "body" in call else ""
    return f"curl -sS --noproxy '*' -X {method}{data} -w '\\n%{{http_code}}\\n' {shlex.quote(url)}"


def _body(call: dict[str, Any]) -> bytes | None:
    return json.dumps(call["body"]).encode() if "body" in call else None
