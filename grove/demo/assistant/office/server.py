"""The office service: mail, calendar and notes behind a tiny JSON HTTP API, state in memory (standard library
only: it runs inside the agent's sandbox on the default image).

    python3 server.py --port 8025 --seed seed.json

    GET  /health                         {"ok": true}
    GET  /state                          everything (what the check grades)
    GET  /mail/inbox                     messages not archived: id, from, subject, date, read
    GET  /mail/messages/ID               one message, whole (marks it read)
    POST /mail/messages/ID/archive       out of the inbox
    POST /mail/send                      {to, subject, body, in_reply_to?} -> 201 {id}
    GET  /calendar/events?date=D         events (of one day)
    POST /calendar/events                {title, date, start, end, attendees?} -> 201 {id}
    PATCH /calendar/events/ID            any of title, date, start, end, attendees
    DELETE /calendar/events/ID
    GET  /notes  ·  POST /notes {title, body} -> 201 {id}  ·  PATCH /notes/ID {title?, body?}

Errors are ``{"error": {"code", "message"}}`` with 400 (a field missing or of the wrong type), 404 (no such id or
route) or 405.
"""

from __future__ import annotations

import argparse
import json
import re
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
TIME = re.compile(r"^\d{2}:\d{2}$")
EVENT_FIELDS: dict[str, type] = {"title": str, "date": str, "start": str, "end": str, "attendees": list}


class Refused(Exception):
    """A request the service answers with an error."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class Office:
    """The service's state and its rules."""

    def __init__(self, seed: dict[str, Any]) -> None:
        self.state: dict[str, Any] = {"inbox": [], "archived": [], "sent": [], "events": [], "notes": []}
        for name in self.state:
            self.state[name] = list(seed.get(name, []))
        self.lock = threading.Lock()
        self.serial = 100

    def next_id(self, prefix: str) -> str:
        """A fresh id for a new item (``s101``, ``e102``, ...)."""
        self.serial += 1
        return f"{prefix}{self.serial}"

    def find(self, kind: str, item_id: str) -> dict[str, Any]:
        """The item of a collection with that id (itself, to change in place); 404 if none."""
        for item in self.state[kind]:
            if item["id"] == item_id:
                found: dict[str, Any] = item
                return found
        raise Refused(404, "not_found", f"no {kind.rstrip('s')} with id {item_id!r}")

    def route(self, method: str, path: str, query: dict[str, str], body: Any) -> tuple[int, Any]:
        """One request: its status and the JSON value answered."""
        parts = [p for p in path.split("/") if p]
        if parts == ["health"] and method == "GET":
            return 200, {"ok": True}
        if parts == ["state"] and method == "GET":
            return 200, self.state
        if parts[:1] == ["mail"]:
            return self.mail(method, parts[1:], body)
        if parts[:2] == ["calendar", "events"]:
            return self.calendar(method, parts[2:], query, body)
        if parts[:1] == ["notes"]:
            return self.notes(method, parts[1:], body)
        raise Refused(404, "not_found", f"no such route: {method} {path}")

    def mail(self, method: str, rest: list[str], body: Any) -> tuple[int, Any]:
        """``/mail/...``: the inbox, a message, archiving, sending."""
        if rest == ["inbox"] and method == "GET":
            return 200, [{k: m.get(k) for k in ("id", "from", "subject", "date", "read")} for m in self.state["inbox"]]
        if len(rest) == 2 and rest[0] == "messages" and method == "GET":
            message = self.find("inbox", rest[1])
            message["read"] = True
            return 200, message
        if len(rest) == 3 and rest[0] == "messages" and rest[2] == "archive" and method == "POST":
            message = self.find("inbox", rest[1])
            self.state["inbox"].remove(message)
            self.state["archived"].append(message)
            return 200, {"id": message["id"], "archived": True}
        if rest == ["send"] and method == "POST":
            fields = need(body, {"to": str, "subject": str, "body": str})
            if "@" not in fields["to"]:
                raise Refused(400, "bad_request", f"'to' must be an email address, got {fields['to']!r}")
            sent = {"id": self.next_id("s"), **fields, "in_reply_to": body.get("in_reply_to")}
            self.state["sent"].append(sent)
            return 201, {"id": sent["id"]}
        raise Refused(405 if rest else 404, "no_route", f"no mail route {method} /mail/{'/'.join(rest)}")

    def calendar(self, method: str, rest: list[str], query: dict[str, str], body: Any) -> tuple[int, Any]:
        """``/calendar/events...``: list, create, change, delete."""
        if not rest and method == "GET":
            date = query.get("date")
            return 200, [e for e in self.state["events"] if date is None or e["date"] == date]
        if not rest and method == "POST":
            fields = need(body, {k: v for k, v in EVENT_FIELDS.items() if k != "attendees"})
            event = {"id": self.next_id("e"), **fields, "attendees": list(body.get("attendees") or [])}
            check_when(event)
            self.state["events"].append(event)
            return 201, {"id": event["id"]}
        if len(rest) == 1 and method == "PATCH":
            event = self.find("events", rest[0])
            changed = {**event, **given(body, EVENT_FIELDS)}
            check_when(changed)
            event.update(changed)
            return 200, event
        if len(rest) == 1 and method == "DELETE":
            self.state["events"].remove(self.find("events", rest[0]))
            return 200, {"id": rest[0], "deleted": True}
        raise Refused(405, "no_route", f"no calendar route {method} /calendar/events/{'/'.join(rest)}")

    def notes(self, method: str, rest: list[str], body: Any) -> tuple[int, Any]:
        """``/notes...``: list, create, change."""
        if not rest and method == "GET":
            return 200, self.state["notes"]
        if not rest and method == "POST":
            note = {"id": self.next_id("n"), **need(body, {"title": str, "body": str})}
            self.state["notes"].append(note)
            return 201, {"id": note["id"]}
        if len(rest) == 1 and method == "PATCH":
            note = self.find("notes", rest[0])
            note.update(given(body, {"title": str, "body": str}))
            return 200, note
        raise Refused(405, "no_route", f"no notes route {method} /notes/{'/'.join(rest)}")


def need(body: Any, fields: dict[str, type]) -> dict[str, Any]:
    """The required fields of a body, each of its type."""
    if not isinstance(body, dict):
        raise Refused(400, "bad_request", f"the body must be a JSON object with {', '.join(fields)}")
    missing = [k for k in fields if k not in body]
    if missing:
        raise Refused(400, "bad_request", f"missing field(s): {', '.join(missing)}")
    return given(body, fields)


def given(body: Any, fields: dict[str, type]) -> dict[str, Any]:
    """The known fields a body gives, each checked for its type."""
    if not isinstance(body, dict):
        raise Refused(400, "bad_request", "the body must be a JSON object")
    unknown = sorted(set(body) - set(fields) - {"in_reply_to", "attendees"})
    if unknown:
        raise Refused(400, "bad_request", f"unknown field(s): {', '.join(unknown)}")
    out = {}
    for key, kind in fields.items():
        if key in body:
            if not isinstance(body[key], kind):
                raise Refused(400, "bad_request", f"'{key}' must be a {kind.__name__}")
            out[key] = body[key]
    return out


def check_when(event: dict[str, Any]) -> None:
    """An event's date and times are well formed, and it ends after it starts."""
    if not DATE.match(event["date"]):
        raise Refused(400, "bad_request", f"'date' must be YYYY-MM-DD, got {event['date']!r}")
    for key in ("start", "end"):
        if not TIME.match(event[key]):
            raise Refused(400, "bad_request", f"'{key}' must be HH:MM, got {event[key]!r}")
    if event["end"] <= event["start"]:
        raise Refused(400, "bad_request", "an event must end after it starts")


def handler_for(office: Office) -> type[BaseHTTPRequestHandler]:
    """The request handler class serving ``office``."""
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.answer()

        def do_POST(self) -> None:
            self.answer()

        def do_PATCH(self) -> None:
            self.answer()

        def do_DELETE(self) -> None:
            self.answer()

        def answer(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            query = dict(urllib.parse.parse_qsl(url.query))
            try:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    raise Refused(400, "bad_request", "the body is not valid JSON") from None
                with office.lock:
                    status, value = office.route(self.command, url.path, query, body)
            except Refused as exc:
                status, value = exc.status, {"error": {"code": exc.code, "message": exc.message}}
            data = json.dumps(value).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            print(f"{self.command} {self.path} {args[1] if len(args) > 1 else ''}", flush=True)

    return Handler


def main() -> None:
    """Serve the office on the loopback until killed."""
    parser = argparse.ArgumentParser(description="the office service: mail, calendar, notes")
    parser.add_argument("--port", type=int, default=8025)
    parser.add_argument("--host", default="127.0.0.1",
                        help="where to listen (0.0.0.0 in a sibling sandbox: reached over its private network)")
    parser.add_argument("--seed", help="a JSON file of the starting state")
    args = parser.parse_args()
    seed: dict[str, Any] = {}
    if args.seed:
        with open(args.seed, encoding="utf-8") as fh:
            seed = json.load(fh)
    server = ThreadingHTTPServer((args.host, args.port), handler_for(Office(seed)))
    print(f"office: serving on {args.host}:{args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
