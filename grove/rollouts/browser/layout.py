"""What the scripted browser policy sees of a page: its elements' boxes, as the page itself reports them.

A page of the site kit (``grove/demo/gui/site/kit.js``) posts its layout to its server whenever it changes
(after every click, key, scroll and mutation, and on load), and the server keeps the latest in :data:`LAYOUT`::

    {"n": 12, "path": "/cart.html", "width": 1280, "height": 713, "scroll": [0, 0], "page_height": 900,
     "offset": {"x": 0, "y": 87, "measured": true},
     "elements": [{"tag": "button", "id": "checkout", "text": "Check out", "x": 20, "y": 300, "w": 90, "h": 24,
                   "value": ..., "checked": ..., "min": ..., "max": ..., "options": [...], "selected": ...}, ...]}

Boxes are in the page's coordinates (CSS pixels of the viewport); ``offset`` is where the viewport's corner is on
the screen (measured from a mouse event: screen minus client coordinates), so an element's centre on the
screen is ``offset + box centre``. ``n`` numbers the posts: after an action the policy waits for a newer one.
A page being left posts ``{"leaving": path}``, so the layout of a page on its way out is never acted on.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from grove.client import Sandbox
from grove.core.errors import NotFound
from grove.rollouts.harnesses import PolicyError

LAYOUT = "/tmp/grove-layout.json"
"""Where the kit's server keeps the page's latest layout."""
_POLL_S = 0.1
FIND_S = 20.0
"""How long a step waits for the element it names to appear: a page loading on a busy host can take seconds (a
CI run's workers share two cores with Chromium), and a scripted policy that gives up early scores a false fail."""
_CLICKABLE = ("a", "button", "input", "select", "textarea", "label")


@dataclass(frozen=True)
class Layout:
    """One report of the page."""

    raw: dict[str, Any]

    @property
    def n(self) -> int:
        """Its number: later reports have larger ones."""
        return int(self.raw.get("n") or 0)

    @property
    def height(self) -> int:
        """The viewport's height (CSS pixels)."""
        return int(self.raw.get("height") or 0)

    @property
    def width(self) -> int:
        """The viewport's width (CSS pixels)."""
        return int(self.raw.get("width") or 0)

    def find(self, target: str) -> dict[str, Any] | None:
        """The element ``target`` names: ``#id``, ``name=NAME``, ``text=TEXT`` (whole text, any case) or
        ``text~TEXT`` (part of it). Of several, a link, button or field first (not the box around one)."""
        found = [e for e in self.raw.get("elements") or [] if isinstance(e, dict) and _matches(e, target)]
        found.sort(key=lambda e: e.get("tag") not in _CLICKABLE)
        return found[0] if found else None

    def visible(self, element: dict[str, Any]) -> bool:
        """Whether the element is wholly inside the viewport (and so on the screen)."""
        x, y, w, h = (int(element.get(k) or 0) for k in ("x", "y", "w", "h"))
        return x >= 0 and y >= 0 and x + w <= self.width and y + h <= self.height

    def on_screen(self, element: dict[str, Any], fraction: float = 0.5) -> tuple[int, int]:
        """A point of the element on the screen: ``fraction`` of its width from its left edge, its middle row."""
        offset = self.raw.get("offset") or {}
        x = int(offset.get("x") or 0) + int(element["x"]) + round(int(element["w"]) * fraction)
        return x, int(offset.get("y") or 0) + int(element["y"]) + int(element["h"]) // 2

    def centre(self) -> tuple[int, int]:
        """The viewport's centre on the screen."""
        offset = self.raw.get("offset") or {}
        return int(offset.get("x") or 0) + self.width // 2, int(offset.get("y") or 0) + self.height // 2


def _matches(element: dict[str, Any], target: str) -> bool:
    if target.startswith("#"):
        return element.get("id") == target[1:]
    if target.startswith("name="):
        return element.get("name") == target[5:]
    text = str(element.get("text") or "").strip().lower()
    if target.startswith("text="):
        return text == target[5:].strip().lower()
    if target.startswith("text~"):
        return target[5:].strip().lower() in text
    raise PolicyError(f"target {target!r}: use #id, name=NAME, text=TEXT or text~TEXT")


class Page:
    """The page's layout, read from the sandbox through the file API."""

    def __init__(self, sandbox: Sandbox, path: str = LAYOUT) -> None:
        self.sandbox, self.path = sandbox, path
        self.seen = 0
        """The number of the latest layout read."""

    def read(self) -> Layout | None:
        """The latest layout; None while there is none, or the page is being left."""
        try:
            raw = json.loads(self.sandbox.read_file(self.path))
        except (NotFound, ValueError):
            return None
        if not isinstance(raw, dict) or "leaving" in raw or not isinstance(raw.get("elements"), list):
            return None
        layout = Layout(raw)
        self.seen = max(self.seen, layout.n)
        return layout

    def fresh(self, after: int, timeout_s: float = 1.5) -> Layout:
        """A layout newer than number ``after`` (the page reports after every input), or after ``timeout_s`` the
        latest there is (an action the page did not notice)."""
        deadline = time.monotonic() + timeout_s
        latest: Layout | None = None
        while True:
            latest = self.read() or latest
            if latest is not None and latest.n > after:
                return latest
            if time.monotonic() > deadline and latest is not None:
                return latest
            if time.monotonic() > deadline + 10:
                raise PolicyError(f"the page reported no layout to {self.path} (is it a page of the site kit?)")
            time.sleep(_POLL_S)

    def find(self, target: str, timeout_s: float = FIND_S) -> tuple[Layout, dict[str, Any]]:
        """The element ``target`` names, waiting up to ``timeout_s`` for it to appear (a page still loading)."""
        deadline = time.monotonic() + timeout_s
        while True:
            layout = self.read()
            element = layout.find(target) if layout is not None else None
            if layout is not None and element is not None:
                return layout, element
            if time.monotonic() > deadline:
                where = layout.raw.get("path") if layout is not None else "no page"
                raise PolicyError(f"no element {target!r} on the page ({where})")
            time.sleep(_POLL_S)
