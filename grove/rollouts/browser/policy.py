"""The scripted browser policy (``--harness scripted`` on a browser task): a plan of steps, no model.

It follows the task's ``scripted`` field::

    {"p_solve": 0.8, "seed": 0, "think_s": 0.0,
     "steps": [{"click": "#product-lamp"},
               {"type": "Ada Lovelace", "into": "#name", "wrong": {"type": "Ada", "into": "#name"}},
               {"select": "#topic", "option": "Billing"},
               {"slide": "#volume", "to": 75},
               {"key": "Return"}, {"scroll_to": "#terms"}, {"wait_for": "text=Thank you"},
               {"answer": "Open 10:00-16:00", "wrong": {}}]}

Each step finds its target in the page's report of its own layout (:mod:`.layout`) and acts through the computer
API with screen coordinates — ``click``, ``type`` (into a field it clicks first; ``"enter": true`` presses Return
after), ``select`` (clicks the list open, types the option, presses Return), ``slide`` (drags a range input's
thumb, then steps it with the arrow keys), ``scroll_to`` (the wheel, until the element is on the screen), ``key``;
``answer`` posts the agent's final answer as its message. Before each step it says what it does (a message).

As the coding policy (:func:`grove.rollouts.scripted.draws_right`), an attempt follows the right plan with
probability ``p_solve``, a pure function of task, attempt and seed; otherwise each step with a ``wrong`` takes it
instead (``{}``: skipped). This proves the plumbing — screen, actions, record, grading — not a model's skill.

A target that never shows up ends the agent's turn (:class:`~grove.rollouts.harnesses.PolicyError`: the check
still decides, as for an agent that got lost); a malformed plan is the task's bug, a harness error never scored.
"""

from __future__ import annotations

import time
from typing import Any

from grove.client import Sandbox
from grove.rollouts.browser.layout import FIND_S, LAYOUT, Layout, Page
from grove.rollouts.harnesses import PolicyError

MAX_SCROLLS = 25
_WHEEL_PX = 100
"""About what one wheel click scrolls in Chromium (the policy reads where the page went; this only sizes a turn)."""
_VERBS = ("click", "type", "select", "slide", "scroll_to", "key", "answer", "wait_for")


def run_browser(task: dict[str, Any], sandbox: Sandbox, *, right: bool) -> None:
    """Act on a browser task in ``sandbox`` as its ``scripted`` plan says; ``right``: the right plan, else each
    step's ``wrong``."""
    policy = task.get("scripted") or {}
    steps = policy.get("steps")
    if not isinstance(steps, list) or not all(isinstance(step, dict) for step in steps):
        raise ValueError("a browser task's scripted policy needs 'steps', a list of objects")  # the task's bug
    hand = Hand(sandbox, Page(sandbox, str(policy.get("layout") or LAYOUT)), float(policy.get("think_s", 0.0)))
    hand.calibrate()
    for step in steps:
        chosen = step if right or "wrong" not in step else step["wrong"]
        if chosen:
            hand.do(chosen)


class Hand:
    """The policy's hand on the screen: each step, one or a few computer actions at screen coordinates."""

    def __init__(self, sandbox: Sandbox, page: Page, think_s: float) -> None:
        self.sandbox, self.page, self.think_s = sandbox, page, think_s
        self.computer: Any = sandbox.computer

    def calibrate(self) -> None:
        """The pointer onto the page: the page measures where its viewport is on the screen from that move."""
        layout = self.page.fresh(0, timeout_s=10.0)
        self._act("move", *layout.centre())

    def do(self, step: dict[str, Any]) -> None:
        """One step of the plan."""
        verb = next((v for v in _VERBS if v in step), None)
        if verb is None:
            raise ValueError(f"a step of the plan needs one of {', '.join(_VERBS)}: {step}")
        if self.think_s:
            time.sleep(self.think_s)
        what = step[verb]
        self.sandbox.post_event("message", {"role": "assistant", "content": _say(verb, step)})
        if verb == "click":
            self.click(what)
        elif verb == "type":
            self.type(str(step.get("into") or ""), str(what), enter=bool(step.get("enter")))
        elif verb == "select":
            self.select(what, str(step["option"]))
        elif verb == "slide":
            self.slide(what, float(step["to"]))
        elif verb == "scroll_to":
            self.reveal(what)
        elif verb == "key":
            self._act("key", str(what))
        elif verb == "wait_for":
            self.page.find(what, timeout_s=float(step.get("timeout_s", FIND_S)))

    def click(self, target: str) -> Layout:
        """Click the element's centre (scrolled onto the screen first)."""
        layout, element = self.reveal(target)
        return self._act("click", *layout.on_screen(element))

    def type(self, target: str, text: str, *, enter: bool) -> None:
        """Click into the field (if one is named), type the text, and press Return if asked."""
        if target:
            self.click(target)
        self._act("type", text)
        if enter:
            self._act("key", "Return")

    def select(self, target: str, option: str) -> None:
        """Open a drop-down list, type the option's text (which picks it), press Return."""
        self.click(target)
        self._act("type", option)
        layout = self._act("key", "Return")
        element = layout.find(target)
        if element is not None and option not in (element.get("selected"), element.get("value")):
            raise PolicyError(f"{target} shows {element.get('selected')!r} after choosing {option!r}")

    def slide(self, target: str, value: float) -> None:
        """Drag a range input's thumb to where ``value`` is, then step it there with the arrow keys."""
        layout, element = self.reveal(target)
        low, high = float(element.get("min", 0)), float(element.get("max", 100))
        at = (float(element.get("value") or low) - low) / ((high - low) or 1)
        to = (value - low) / ((high - low) or 1)
        start, end = layout.on_screen(element, _thumb(element, at)), layout.on_screen(element, _thumb(element, to))
        layout = self._act("drag", start, end)
        for _ in range(int(high - low) + 1):  # the range has the focus now: each arrow key is one step
            element = layout.find(target) or element
            now = float(element.get("value") or 0)
            if now == value:
                return
            key = "Right" if now < value else "Left"
            layout = self._act("key", key)
        raise PolicyError(f"{target} did not reach {value}")

    def reveal(self, target: str) -> tuple[Layout, dict[str, Any]]:
        """The element, scrolled onto the screen with the wheel (the pointer at the viewport's centre)."""
        layout, element = self.page.find(target)
        for _ in range(MAX_SCROLLS):
            if layout.visible(element):
                return layout, element
            below = int(element["y"]) + int(element["h"]) // 2 - layout.height // 2
            clicks = max(1, min(10, round(abs(below) / _WHEEL_PX)))
            direction = "down" if below > 0 else "up"
            layout = self._act("scroll", *layout.centre(), direction, clicks)
            element = layout.find(target) or element
        raise PolicyError(f"{target} stayed off the screen after {MAX_SCROLLS} turns of the wheel")

    def _act(self, action: str, *args: Any) -> Layout:
        """One computer action (a method of ``sandbox.computer``); the page's layout after it."""
        before = self.page.seen
        getattr(self.computer, action)(*args)
        return self.page.fresh(before)


def _thumb(element: dict[str, Any], fraction: float) -> float:
    """Where a range input's thumb is, as a fraction of its width (the thumb, ~16 px, travels inside the box)."""
    width = max(1, int(element.get("w") or 1))
    inset = min(8, width / 4)
    return (inset + fraction * (width - 2 * inset)) / width


def _say(verb: str, step: dict[str, Any]) -> str:
    """What the policy says before a step (its "thought", as a model's message before its tool call)."""
    what = step[verb]
    return {"click": f"I click {what}.", "type": f"I type {step[verb]!r} into {step.get('into') or 'the page'}.",
            "select": f"I choose {step.get('option')!r} in {what}.", "slide": f"I set {what} to {step.get('to')}.",
            "scroll_to": f"I scroll to {what}.", "key": f"I press {what}.", "answer": str(what),
            "wait_for": f"I wait for {what}."}[verb]
