"""The GUI demo's tasks: ten small offline sites, each a browser task of known difficulty.

Each site is a folder of pages (``sites/<name>/``) served by the kit's server (``site/server.py``, the standard
library only) inside the agent's sandbox; its pages report their layout (``site/kit.js``) for the scripted
browser policy, and write what the user did to the site's own log, which the check reads in place once the
agent has stopped (``site/check.py``). The open-ended one is graded by a judge instead
(:func:`grove.demo.gui.judge.opening_hours`). :func:`task_lines` makes them a rollouts task file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

WORKDIR = "/workspace/site"
PORT = 8000
P_SOLVE = {"easy": 0.9, "medium": 0.7, "hard": 0.5}
"""The scripted policy's chance of following the right plan, by the task's difficulty label."""


@dataclass(frozen=True)
class Site:
    """One site and its task."""

    name: str
    difficulty: str
    prompt: str
    steps: list[dict[str, Any]]
    expect: list[dict[str, Any]] = field(default_factory=list)
    """What the site's log must hold (``site/check.py``); empty: the task is judged."""
    judge: str | None = None


def _last(kind: str, **fields: Any) -> dict[str, Any]:
    return {"kind": kind, "fields": fields}


SITES = [
    Site("links", "easy", "On the documentation site, open the guide for installing grove on Debian.",
         [{"click": "text=Guides"}, {"click": "text=Installing"},
          {"click": "text=On Debian", "wrong": {"click": "text=On Fedora"}}],
         [_last("visit", path="/guides/install-debian.html")]),
    Site("scroll", "easy", "Read the terms of service and accept them (the button is at the bottom of the page).",
         [{"click": "#accept", "wrong": {"click": "#decline"}},
          {"wait_for": "text~Accepted", "wrong": {"wait_for": "text~Declined"}}],
         [_last("terms", accepted=True)]),
    Site("form", "medium", "Send the support team a message about billing: name Ada Lovelace, email "
         "ada@example.org, message 'Invoice 42 is wrong', and subscribe to the newsletter.",
         [{"type": "Ada Lovelace", "into": "#name"},
          {"type": "ada@example.org", "into": "#email", "wrong": {"type": "ada@example", "into": "#email"}},
          {"select": "#topic", "option": "Billing"}, {"type": "Invoice 42 is wrong", "into": "#message"},
          {"click": "#subscribe"}, {"click": "#send"}, {"wait_for": "text~Thank you"}],
         [{**_last("contact", name="Ada Lovelace", email="ada@example.org", topic="Billing",
                   message="Invoice 42 is wrong", subscribe=True), "count": 1}]),
    Site("search", "medium", "Search the library's catalogue for 'left hand' and open the page of "
         "'The Left Hand of Darkness'.",
         [{"type": "left hand", "into": "#q", "enter": True}, {"wait_for": "text=The Left Hand of Darkness"},
          {"click": "text=The Left Hand of Darkness", "wrong": {"click": "text=The Left Hand of God"}}],
         [{"kind": "visit", "where": {"path": "/search.html"}, "fields": {"query": {"q": {"contains": "left hand"}}}},
          _last("visit", path="/book.html", query={"id": "7"})]),
    Site("slider", "medium", "Set the volume to 75 and save the settings.",
         [{"slide": "#volume", "to": 75, "wrong": {"slide": "#volume", "to": 57}}, {"click": "#save"},
          {"wait_for": "text~Saved"}],
         [_last("settings", volume=75)]),
    Site("login", "medium", "Sign in as ada (password: lovelace) and download the Q3 report.",
         [{"type": "ada", "into": "#user"},
          {"type": "lovelace", "into": "#password", "wrong": {"type": "lovelace!", "into": "#password"}},
          {"click": "#login"}, {"click": "#download-q3"}],
         [_last("login", user="ada", ok=True), _last("download", user="ada", report="Q3")]),
    Site("shop", "hard", "Buy one desk lamp: put it in the cart and check out as Ada Lovelace, "
         "12 Analytical Row.",
         [{"click": "#product-lamp", "wrong": {"click": "#product-mug"}}, {"click": "#add"}, {"click": "#cart-link"},
          {"click": "#checkout"}, {"type": "Ada Lovelace", "into": "#name"},
          {"type": "12 Analytical Row", "into": "#address"}, {"click": "#place"}, {"wait_for": "text~Order placed"}],
         [{**_last("order", items=[{"id": "lamp", "qty": 1}], name="Ada Lovelace", address="12 Analytical Row"),
           "count": 1}]),
    Site("wizard", "hard", "Sign up for the Pro plan for the company Analytical Engines Ltd in the United Kingdom, "
         "agreeing to the terms.",
         [{"click": "#plan-pro", "wrong": {"click": "#plan-team"}}, {"click": "#next1"},
          {"type": "Analytical Engines Ltd", "into": "#company"}, {"select": "#country", "option": "United Kingdom"},
          {"click": "#next2"}, {"click": "#agree"}, {"click": "#finish"}, {"wait_for": "#welcome"}],
         [_last("signup", plan="pro", company="Analytical Engines Ltd", country="United Kingdom")]),
    Site("table", "hard", "In the staff directory, pick the best-paid person of the Engineering team.",
         [{"type": "Engineering", "into": "#filter"}, {"click": "#sort-salary"}, {"click": "#sort-salary"},
          {"click": "#pick-0", "wrong": {"click": "#pick-1"}}, {"wait_for": "text~Picked"}],
         [_last("pick", name="Grace Hopper")]),
    Site("museum", "medium", "When is the Museum of Computing open on Sundays? Give the opening hours as your "
         "final answer.",
         [{"click": "text=Visit"}, {"wait_for": "#sunday"},
          {"answer": "On Sundays the museum is open 10:00-16:00.",
           "wrong": {"answer": "On Sundays the museum is open 09:00-17:00."}}],
         judge="grove.demo.gui.judge:opening_hours"),
]


def site_files(name: str) -> dict[str, str]:
    """The files of a site's workdir: the kit's server and page script, and the site's pages."""
    root = resources.files("grove.demo.gui")
    files = {"server.py": (root / "site" / "server.py").read_text(encoding="utf-8")}
    for kit in ("kit.js", "style.css"):
        files[f"www/{kit}"] = (root / "site" / kit).read_text(encoding="utf-8")
    pending = [(root / "sites" / name, "www")]
    while pending:
        folder, rel = pending.pop()
        for entry in folder.iterdir():
            if entry.is_dir():
                pending.append((entry, f"{rel}/{entry.name}"))
            else:
                files[f"{rel}/{entry.name}"] = entry.read_text(encoding="utf-8")
    return files


def task_line(site: Site, *, p_solve: float | None = None) -> dict[str, Any]:
    """One site as a rollouts task line (``p_solve``: the policy's odds, else those of the site's difficulty)."""
    check: dict[str, Any]
    if site.judge:
        check = {"judge": site.judge, "timeout_s": 60}
    else:
        checker = (resources.files("grove.demo.gui") / "site" / "check.py").read_text(encoding="utf-8")
        expect = json.dumps(site.expect)
        check = {"test": "python3 /grader/check.py data/log.jsonl /grader/expect.json", "grading": "in-place",
                 "timeout_s": 60, "files": {"/grader/check.py": checker, "/grader/expect.json": expect}}
    return {
        "id": f"gui-{site.name}", "workdir": WORKDIR, "files": site_files(site.name), "prompt": site.prompt,
        "serve": f"python3 server.py --port {PORT}", "start_url": f"http://127.0.0.1:{PORT}/",
        "desktop": {"width": 1280, "height": 800}, "check": check, "timeout_s": 180,
        "resources": {"cpu": 1, "memory_mb": 1536}, "labels": {"difficulty": site.difficulty, "kind": "browser"},
        "scripted": {"p_solve": P_SOLVE[site.difficulty] if p_solve is None else p_solve, "steps": site.steps},
    }


def task_lines(names: list[str] | None = None, *, p_solve: float | None = None) -> list[dict[str, Any]]:
    """The tasks of the named sites (default: all ten, in order of :data:`SITES`)."""
    chosen = [s for s in SITES if names is None or s.name in names]
    return [task_line(s, p_solve=p_solve) for s in chosen]
