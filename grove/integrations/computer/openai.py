"""OpenAI's computer use on a grove sandbox, for harnesses built on the Responses API's computer-use loop.

:class:`GroveComputer` is the ``Computer`` of OpenAI's CUA sample app (``screenshot()`` in base64, ``click(x, y,
button)``, ``double_click``, ``scroll(x, y, scroll_x, scroll_y)``, ``type``, ``wait``, ``move``, ``keypress(keys)``,
``drag(path)``, ``get_dimensions()``, ``get_environment()``), each call one grove action in OpenAI's vocabulary. A
loop of one's own answers each ``computer_call`` item with :meth:`GroveComputer.handle`::

    computer = GroveComputer(sandbox)
    response = client.responses.create(model=..., tools=[computer.to_params()], input=..., truncation="auto")
    while calls := [item for item in response.output if item.type == "computer_call"]:
        outputs = [computer.handle(call) for call in calls]
        response = client.responses.create(model=..., tools=[...], previous_response_id=response.id, input=outputs)

``handle`` takes the SDK's own ``ResponseComputerToolCall`` (or the item as a dict), runs its ``action`` (or, from
the GA ``computer`` tool, each of its ``actions``) and returns the ``computer_call_output`` item with the screen
after it — the screenshot grove answered the action with, so no second round trip. Pending safety checks are
acknowledged only when the ``acknowledge`` callback approves every one; otherwise :class:`SafetyCheckDeclined`.
A bad action (a point off the screen, an unknown key) raises grove's ``Invalid``: this loop has no error result
for the model, so the harness decides. :class:`AsyncGroveComputer` is the same on an ``AsyncSandbox``.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping
from typing import Any, Literal, TypeAlias, cast

from openai.types.responses import ComputerToolParam, ComputerUsePreviewToolParam, ResponseComputerToolCall
from openai.types.responses.response_input_item_param import ComputerCallOutput

from grove.client import AsyncSandbox, Sandbox
from grove.client.computer import Screen
from grove.integrations.computer import screen_size

__all__ = ["AsyncGroveComputer", "GroveComputer", "SafetyCheckDeclined"]

Environment: TypeAlias = Literal["windows", "mac", "linux", "ubuntu", "browser"]
Acknowledge: TypeAlias = Callable[[dict[str, Any]], bool]
"""Asked about each pending safety check (``{"id", "code", "message"}``); True acknowledges it."""
WAIT_MS = 1000
"""What OpenAI's ``wait`` (which carries no duration) waits in grove, and the CUA sample's default ``wait(ms)``."""


class SafetyCheckDeclined(ValueError):
    """A ``computer_call`` came with pending safety checks that were not all acknowledged; nothing was run."""


class _ComputerShape:
    """What the sync and async computers share: the screen's description and reading a ``computer_call``."""

    def __init__(self, info: Mapping[str, Any], environment: Environment, width: int | None,
                 height: int | None) -> None:
        default_width, default_height = screen_size(info)
        self.environment: Environment = environment
        """What the model is told it drives (``browser``: grove's screen shows Chromium)."""
        self.dimensions = (width or default_width, height or default_height)
        """The display ``(width, height)`` the model is told of; default, the sandbox's own screen."""

    def get_environment(self) -> Environment:
        """The tool's ``environment``."""
        return self.environment

    def get_dimensions(self) -> tuple[int, int]:
        """The display's ``(width, height)``."""
        return self.dimensions

    def to_params(self, kind: Literal["computer_use_preview", "computer"] = "computer_use_preview"
                  ) -> ComputerUsePreviewToolParam | ComputerToolParam:
        """The ``tools`` entry: ``computer_use_preview`` with the display and environment, or the GA ``computer``."""
        if kind == "computer":
            return {"type": "computer"}
        return {"type": "computer_use_preview", "display_width": self.dimensions[0],
                "display_height": self.dimensions[1], "environment": self.environment}

    @staticmethod
    def _read(call: ResponseComputerToolCall | Mapping[str, Any],
              acknowledge: Acknowledge | None) -> tuple[str, list[dict[str, Any]], list[dict[str, Any]]]:
        """The call's id, its actions (fields left unset dropped) and the safety checks it acknowledges."""
        item = call.model_dump(exclude_none=True) if isinstance(call, ResponseComputerToolCall) else dict(call)
        if item.get("type") != "computer_call" or not isinstance(item.get("call_id"), str):
            raise ValueError(f"not a computer_call item: type {item.get('type')!r}")
        raw = item.get("actions") or ([item["action"]] if item.get("action") else [{"type": "screenshot"}])
        actions = [{k: v for k, v in dict(action).items() if v is not None} for action in raw]
        checks = [dict(check) for check in item.get("pending_safety_checks") or []]
        declined = [c for c in checks if acknowledge is None or acknowledge(c) is not True]
        if declined:
            said = "; ".join(f"{c.get('code') or c.get('id')}: {c.get('message') or ''}" for c in declined)
            raise SafetyCheckDeclined(f"computer_call {item['call_id']} has safety checks not acknowledged ({said})")
        return item["call_id"], actions, checks

    @staticmethod
    def _output(call_id: str, screen: Screen, checks: list[dict[str, Any]]) -> ComputerCallOutput:
        output: dict[str, Any] = {
            "type": "computer_call_output", "call_id": call_id,
            "output": {"type": "computer_screenshot",
                       "image_url": "data:image/png;base64," + base64.b64encode(screen.png).decode()},
        }
        if checks:
            output["acknowledged_safety_checks"] = checks
        return cast(ComputerCallOutput, output)


def _wait(ms: int) -> dict[str, Any]:
    # OpenAI's wait has no duration: another one is spelt as Anthropic's wait, which has (the step says so).
    return {"type": "wait"} if ms == WAIT_MS else {"action": "wait", "duration": ms / 1000}


class GroveComputer(_ComputerShape):
    """The CUA sample's ``Computer`` on a grove sandbox; see the module's docstring. Each action returns the
    screen after it (a :class:`~grove.client.computer.Screen`), which the protocol's callers may ignore."""

    def __init__(self, sandbox: Sandbox, *, environment: Environment = "browser", width: int | None = None,
                 height: int | None = None) -> None:
        super().__init__(sandbox.info, environment, width, height)
        self.sandbox = sandbox

    def act(self, action: dict[str, Any]) -> Screen:
        """One action as the model wrote it (``{"type": "click", ...}``)."""
        screen: Screen = self.sandbox.computer.act(action)
        return screen

    def handle(self, call: ResponseComputerToolCall | Mapping[str, Any], *,
               acknowledge: Acknowledge | None = None) -> ComputerCallOutput:
        """Run a ``computer_call`` item; its ``computer_call_output`` item with the screen after it."""
        call_id, actions, checks = self._read(call, acknowledge)
        screens = [self.act(action) for action in actions]  # in order; _read gives at least one
        return self._output(call_id, screens[-1], checks)

    def screenshot(self) -> str:
        """The screen now, a base64 PNG."""
        return self.act({"type": "screenshot"}).base64

    def get_current_url(self) -> str:
        """The browser's page (``""`` when no browser runs): the CUA sample's check of where the agent went."""
        return str(self.sandbox.computer.status().get("url") or "")

    def click(self, x: int, y: int, button: str = "left") -> Screen:
        """Click ``button`` (left, right, wheel, back, forward) at ``(x, y)``."""
        return self.act({"type": "click", "x": x, "y": y, "button": button})

    def double_click(self, x: int, y: int) -> Screen:
        """Double-click at ``(x, y)``."""
        return self.act({"type": "double_click", "x": x, "y": y})

    def scroll(self, x: int, y: int, scroll_x: int, scroll_y: int) -> Screen:
        """Scroll by ``(scroll_x, scroll_y)`` pixels with the pointer at ``(x, y)``."""
        return self.act({"type": "scroll", "x": x, "y": y, "scroll_x": scroll_x, "scroll_y": scroll_y})

    def type(self, text: str) -> Screen:
        """Type text."""
        return self.act({"type": "type", "text": text})

    def wait(self, ms: int = WAIT_MS) -> Screen:
        """Wait ``ms`` milliseconds, then for the screen to settle."""
        return self.act(_wait(ms))

    def move(self, x: int, y: int) -> Screen:
        """Move the pointer to ``(x, y)``."""
        return self.act({"type": "move", "x": x, "y": y})

    def keypress(self, keys: list[str]) -> Screen:
        """Press keys together (``["CTRL", "L"]``)."""
        return self.act({"type": "keypress", "keys": keys})

    def drag(self, path: list[dict[str, int]]) -> Screen:
        """Press at the first point of ``path`` (``[{"x": .., "y": ..}, ...]``), move through the rest, release."""
        return self.act({"type": "drag", "path": path})


class AsyncGroveComputer(_ComputerShape):
    """:class:`GroveComputer` on an :class:`~grove.client.AsyncSandbox`, every action awaited."""

    def __init__(self, sandbox: AsyncSandbox, *, environment: Environment = "browser", width: int | None = None,
                 height: int | None = None) -> None:
        super().__init__(sandbox.info, environment, width, height)
        self.sandbox = sandbox

    async def act(self, action: dict[str, Any]) -> Screen:
        """One action as the model wrote it (``{"type": "click", ...}``)."""
        return await self.sandbox.computer.act(action)

    async def handle(self, call: ResponseComputerToolCall | Mapping[str, Any], *,
                     acknowledge: Acknowledge | None = None) -> ComputerCallOutput:
        """Run a ``computer_call`` item; its ``computer_call_output`` item with the screen after it."""
        call_id, actions, checks = self._read(call, acknowledge)
        screens = [await self.act(action) for action in actions]  # in order; _read gives at least one
        return self._output(call_id, screens[-1], checks)

    async def screenshot(self) -> str:
        """The screen now, a base64 PNG."""
        return (await self.act({"type": "screenshot"})).base64

    async def get_current_url(self) -> str:
        """The browser's page (``""`` when no browser runs)."""
        return str((await self.sandbox.computer.status()).get("url") or "")

    async def click(self, x: int, y: int, button: str = "left") -> Screen:
        """Click ``button`` (left, right, wheel, back, forward) at ``(x, y)``."""
        return await self.act({"type": "click", "x": x, "y": y, "button": button})

    async def double_click(self, x: int, y: int) -> Screen:
        """Double-click at ``(x, y)``."""
        return await self.act({"type": "double_click", "x": x, "y": y})

    async def scroll(self, x: int, y: int, scroll_x: int, scroll_y: int) -> Screen:
        """Scroll by ``(scroll_x, scroll_y)`` pixels with the pointer at ``(x, y)``."""
        return await self.act({"type": "scroll", "x": x, "y": y, "scroll_x": scroll_x, "scroll_y": scroll_y})

    async def type(self, text: str) -> Screen:
        """Type text."""
        return await self.act({"type": "type", "text": text})

    async def wait(self, ms: int = WAIT_MS) -> Screen:
        """Wait ``ms`` milliseconds, then for the screen to settle."""
        return await self.act(_wait(ms))

    async def move(self, x: int, y: int) -> Screen:
        """Move the pointer to ``(x, y)``."""
        return await self.act({"type": "move", "x": x, "y": y})

    async def keypress(self, keys: list[str]) -> Screen:
        """Press keys together (``["CTRL", "L"]``)."""
        return await self.act({"type": "keypress", "keys": keys})

    async def drag(self, path: list[dict[str, int]]) -> Screen:
        """Press at the first point of ``path`` (``[{"x": .., "y": ..}, ...]``), move through the rest, release."""
        return await self.act({"type": "drag", "path": path})
