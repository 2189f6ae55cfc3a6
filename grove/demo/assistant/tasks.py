"""The assistant demo's tasks: ten offline personal-assistant tasks on the office service, graded by its final state.

Every task runs the office service (``office/server.py``: mail, calendar, notes) in a sibling sandbox of the
agent's, as a service of the task (``services``, :mod:`grove.rollouts.services`; beside the agent on request),
seeded with one small world (:data:`SEED`). The scripted assistant policy (:mod:`grove.rollouts.assistant`) calls it
over HTTP from inside the agent's sandbox, following the right plan with the task's odds; the check
(``office/check.py``) queries the service's final state once the agent has stopped. :func:`task_lines` makes them a
rollouts task file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from typing import Any

PORT = 8025
NAME = "office"
URL = f"http://{NAME}:{PORT}"
SERVICE_DIR = "/srv/office"
P_SOLVE = {"easy": 0.9, "medium": 0.7, "hard": 0.5}
"""The scripted policy's chance of following the right plan, by the task's difficulty label."""

SEED: dict[str, Any] = {
    "inbox": [
        {"id": "m1", "from": "ada@example.org", "subject": "Meeting", "date": "2026-12-03", "read": False,
         "body": "Can we meet next week? Tuesday or Wednesday works for me. - Ada"},
        {"id": "m2", "from": "news@weekly.example", "subject": "This week in engines", "date": "2026-12-02",
         "read": False, "body": "Our newsletter."},
        {"id": "m3", "from": "billing@supplier.example", "subject": "Invoice 42", "date": "2026-12-01", "read": False,
         "body": "Please find invoice 42 attached: 1,200 EUR due on 2026-12-31."},
        {"id": "m4", "from": "news@weekly.example", "subject": "Last week in engines", "date": "2026-11-25",
         "read": True, "body": "Our newsletter."},
        {"id": "m5", "from": "alan@example.org", "subject": "Quick sync on Friday?", "date": "2026-12-03",
         "read": False, "body": "Could we talk on Friday 2026-12-11 at 11:00 for half an hour? - Alan"},
    ],
    "events": [
        {"id": "e1", "title": "Dentist", "date": "2026-12-09", "start": "08:30", "end": "09:30", "attendees": []},
        {"id": "e2", "title": "Design review", "date": "2026-12-10", "start": "14:00", "end": "15:00",
         "attendees": ["grace@example.org"]},
    ],
    "notes": [
        {"id": "n1", "title": "Todo", "body": "- renew passport"},
    ],
}


@dataclass(frozen=True)
class Chore:
    """One assistant task: what the user asks, the plan that does it (with its wrong turns), what must hold."""

    name: str
    difficulty: str
    prompt: str
    calls: list[dict[str, Any]]
    expect: list[dict[str, Any]]
    answer: str


def _call(method: str, path: str, body: dict[str, Any] | None = None, *, say: str | None = None,
          wrong: dict[str, Any] | None = None) -> dict[str, Any]:
    call: dict[str, Any] = {"method": method, "url": URL + path}
    if body is not None:
        call["body"] = body
    if say:
        call["say"] = say
    if wrong is not None:
        call["wrong"] = wrong
    return call


_INBOX = _call("GET", "/mail/inbox", say="Let me look at the inbox.")

CHORES = [
    Chore("reply-ada", "easy", "Ada asked when we can meet. Reply to her that Tuesday works.",
          [_INBOX, _call("GET", "/mail/messages/m1"),
           _call("POST", "/mail/send", {"to": "ada@example.org", "subject": "Re: Meeting", "in_reply_to": "m1",
                                        "body": "Hi Ada, Tuesday works for me."},
                 wrong=_call("POST", "/mail/send", {"to": "alan@example.org", "subject": "Re: Meeting",
                                                    "body": "Hi Ada, Tuesday works for me."}))],
          [{"in": "sent", "match": {"to": "ada@example.org", "body": {"contains": "tuesday"}}, "count": 1}],
          "I replied to Ada that Tuesday works."),
    Chore("standup", "easy", "Put a team standup in my calendar on 2026-12-07 from 09:30 to 09:45 with Grace.",
          [_call("GET", "/calendar/events?date=2026-12-07", say="Checking that morning."),
           _call("POST", "/calendar/events", {"title": "Team standup", "date": "2026-12-07", "start": "09:30",
                                              "end": "09:45", "attendees": ["grace@example.org"]},
                 wrong=_call("POST", "/calendar/events", {"title": "Team standup", "date": "2026-12-07",
                                                          "start": "19:30", "end": "19:45"}))],
          [{"in": "events", "match": {"title": {"contains": "standup"}, "date": "2026-12-07", "start": "09:30",
                                      "end": "09:45", "attendees": {"has": "grace@example.org"}}, "count": 1}],
          "The standup is in your calendar."),
    Chore("cancel-dentist", "easy", "Cancel my dentist appointment.",
          [_call("GET", "/calendar/events", say="Finding the appointment."),
           _call("DELETE", "/calendar/events/e1", wrong=_call("DELETE", "/calendar/events/e2"))],
          [{"in": "events", "match": {"title": "Dentist"}, "count": 0},
           {"in": "events", "match": {"title": "Design review"}, "count": 1}],
          "The dentist appointment is cancelled."),
    Chore("groceries", "easy", "Make a note titled Groceries: milk, eggs and bread.",
          [_call("POST", "/notes", {"title": "Groceries", "body": "milk, eggs, bread"},
                 wrong=_call("POST", "/notes", {"title": "Groceries", "body": "milk, eggs"}))],
          [{"in": "notes", "match": {"title": "Groceries", "body": {"contains": "bread"}}, "count": 1}],
          "Noted."),
    Chore("archive-news", "medium", "Archive every newsletter in my inbox; leave the rest.",
          [_INBOX, _call("POST", "/mail/messages/m2/archive"),
           _call("POST", "/mail/messages/m4/archive", wrong={})],
          [{"in": "inbox", "match": {"from": "news@weekly.example"}, "count": 0},
           {"in": "archived", "match": {"from": "news@weekly.example"}, "count": 2},
           {"in": "inbox", "match": {}, "count": 3}],
          "Both newsletters are archived."),
    Chore("forward-invoice", "medium", "Forward the invoice from our supplier to accounts@example.org.",
          [_INBOX, _call("GET", "/mail/messages/m3"),
           _call("POST", "/mail/send", {"to": "accounts@example.org", "subject": "Fwd: Invoice 42",
                                        "body": "Forwarding: Please find invoice 42 attached: 1,200 EUR due on "
                                                "2026-12-31."},
                 wrong=_call("POST", "/mail/send", {"to": "accounts@example.org", "subject": "Fwd: Invoice",
                                                    "body": "See the supplier's mail."}))],
          [{"in": "sent", "match": {"to": "accounts@example.org", "subject": {"contains": "invoice 42"},
                                    "body": {"contains": "1,200 EUR"}}, "count": 1}],
          "Forwarded to accounts."),
    Chore("move-review", "medium", "Move the design review to 16:00 the same day, still one hour.",
          [_call("GET", "/calendar/events?date=2026-12-10", say="Finding the review."),
           _call("PATCH", "/calendar/events/e2", {"start": "16:00", "end": "17:00"},
                 wrong=_call("PATCH", "/calendar/events/e2", {"start": "16:00", "end": "16:30"}))],
          [{"in": "events", "match": {"id": "e2", "date": "2026-12-10", "start": "16:00", "end": "17:00"},
            "count": 1}],
          "The design review now runs 16:00-17:00."),
    Chore("todo-plumber", "medium", "Add 'call the plumber' to my Todo note, keeping what is there.",
          [_call("GET", "/notes", say="Reading the Todo note."),
           _call("PATCH", "/notes/n1", {"body": "- renew passport\n- call the plumber"},
                 wrong=_call("PATCH", "/notes/n1", {"body": "- call the plumber"}))],
          [{"in": "notes", "match": {"title": "Todo", "body": {"contains": "renew passport"}}, "count": 1},
           {"in": "notes", "match": {"title": "Todo", "body": {"contains": "call the plumber"}}, "count": 1}],
          "Added to your Todo note."),
    Chore("alan-sync", "hard", "Alan asked for a call. Put it in my calendar as 'Sync with Alan' at the time he "
          "proposed, invite him, and reply to confirm.",
          [_INBOX, _call("GET", "/mail/messages/m5"),
           _call("POST", "/calendar/events", {"title": "Sync with Alan", "date": "2026-12-11", "start": "11:00",
                                              "end": "11:30", "attendees": ["alan@example.org"]},
                 wrong=_call("POST", "/calendar/events", {"title": "Sync with Alan", "date": "2026-12-04",
                                                          "start": "11:00", "end": "11:30",
                                                          "attendees": ["alan@example.org"]})),
           _call("POST", "/mail/send", {"to": "alan@example.org", "subject": "Re: Quick sync on Friday?",
                                        "in_reply_to": "m5", "body": "Friday 11:00 works, invite sent."})],
          [{"in": "events", "match": {"title": "Sync with Alan", "date": "2026-12-11", "start": "11:00",
                                      "attendees": {"has": "alan@example.org"}}, "count": 1},
           {"in": "sent", "match": {"to": "alan@example.org"}, "count": 1}],
          "The sync with Alan is booked for Friday 11:00 and he has a confirmation."),
    Chore("inbox-summary", "hard", "Write a note titled 'Inbox summary' listing the subjects of my unread mail.",
          [_INBOX,
           _call("POST", "/notes", {"title": "Inbox summary",
                                    "body": "Meeting; This week in engines; Invoice 42; Quick sync on Friday?"},
                 wrong=_call("POST", "/notes", {"title": "Inbox summary",
                                                "body": "Meeting; Invoice 42; Last week in engines"}))],
          [{"in": "notes", "match": {"title": "Inbox summary", "body": {"contains": subject}}, "count": 1}
           for subject in ("Meeting", "This week in engines", "Invoice 42", "Quick sync on Friday?")]
          + [{"in": "notes", "match": {"title": "Inbox summary", "body": {"contains": "Last week"}}, "count": 0}],
          "The summary is in your notes."),
]


def _office(name: str) -> str:
    return (resources.files("grove.demo.assistant") / "office" / name).read_text(encoding="utf-8")


def service(*, in_agent_sandbox: bool = False) -> dict[str, Any]:
    """The office service as a task's ``services`` entry, ready once ``/health`` answers: in a sibling sandbox on a
    private network with the agent's (the default), or beside the agent."""
    host = "127.0.0.1" if in_agent_sandbox else "0.0.0.0"  # a sibling is reached over its private network
    return {"name": NAME, "command": f"exec python3 {SERVICE_DIR}/server.py --host {host} --port {PORT} --seed "
                                     f"{SERVICE_DIR}/seed.json", "port": PORT, "ready": {"http": "/health"},
            **({"in_agent_sandbox": True} if in_agent_sandbox else {})}


def task_line(chore: Chore, *, p_solve: float | None = None, in_agent_sandbox: bool = False) -> dict[str, Any]:
    """One chore as a rollouts task line (``p_solve``: the policy's odds, else those of its difficulty;
    ``in_agent_sandbox``: the office service beside the agent, not in a sibling sandbox)."""
    check = {"test": f"python3 /grader/check.py {URL}/state /grader/expect.json", "grading": "in-place",
             "timeout_s": 60, "files": {"/grader/check.py": _office("check.py"),
                                        "/grader/expect.json": json.dumps(chore.expect)}}
    return {
        "id": f"assistant-{chore.name}", "prompt": chore.prompt, "workdir": "/workspace",
        "files": {f"{SERVICE_DIR}/server.py": _office("server.py"), f"{SERVICE_DIR}/seed.json": json.dumps(SEED)},
        "services": [service(in_agent_sandbox=in_agent_sandbox)], "check": check, "timeout_s": 120,
        "resources": {"cpu": 0.5, "memory_mb": 256},
        "labels": {"difficulty": chore.difficulty, "kind": "assistant"},
        "scripted": {"p_solve": P_SOLVE[chore.difficulty] if p_solve is None else p_solve, "calls": chore.calls,
                     "answer": chore.answer},
    }


def task_lines(names: list[str] | None = None, *, p_solve: float | None = None) -> list[dict[str, Any]]:
    """The tasks of the named chores (default: all ten, in order of :data:`CHORES`)."""
    return [task_line(c, p_solve=p_solve) for c in CHORES if names is None or c.name in names]
