"""``sandbox.computer``: a sandbox's screen, mouse and keyboard, for GUI agents.

Each call is one action of Anthropic's computer-use tool (``POST /v1/sandboxes/{id}/computer``), recorded in
the trajectory with the screen after it. :meth:`AsyncComputer.act` sends any action body as it is, in either
vocabulary (``{"action": ...}`` or OpenAI's ``{"type": ...}``): what a drop-in tool class forwards.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from grove.client.aio import AsyncSandbox

ZOOM_SCHEMA = "computer_20251124"


@dataclass(frozen=True)
class Screen:
    """The screen after an action: the PNG the model is shown, and where the pointer is."""

    png: bytes
    width: int
    height: int
    sha256: str
    """The image's hash: its name in the trajectory and in ``GET /v1/screenshots/{sha}``."""
    cursor: tuple[int, int]
    settle: dict[str, Any] = field(default_factory=dict)
    """Whether the screen settled before the shot (``settled``), how long the action waited (``waited_ms``)."""

    @property
    def base64(self) -> str:
        """The PNG in base64, as a model's image content takes it."""
        return base64.b64encode(self.png).decode()

    def save(self, path: str | Path) -> Path:
        """Write the PNG to a file."""
        target = Path(path)
        target.write_bytes(self.png)
        return target

    @classmethod
    def of(cls, answer: dict[str, Any]) -> Screen:
        """From the router's answer."""
        shot = answer["screenshot"]
        cursor = answer.get("cursor") or (0, 0)
        return cls(base64.b64decode(shot["data"]), int(shot["width"]), int(shot["height"]), str(shot.get("sha256", "")),
                   (int(cursor[0]), int(cursor[1])), dict(answer.get("settle") or {}))


class AsyncComputer:
    """The screen of one sandbox (``sandbox.computer``); see the module's docstring."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sandbox = sandbox

    async def act(self, action: dict[str, Any]) -> Screen:
        """Send one action body as it is (Anthropic's ``{"action": ...}`` or OpenAI's ``{"type": ...}``)."""
        answer = await self._sandbox.client.request("POST", self._sandbox._path("/computer"), json_body=action)
        return Screen.of(answer)

    async def start(self, browser: str | None = None) -> dict[str, Any]:
        """Start the screen now (it starts by itself at the first action); ``browser``: open Chromium at that URL,
        or send the running one there. Answers once the screen has settled."""
        body = {"browser": browser} if browser else {}
        return dict(await self._sandbox.client.request("POST", self._sandbox._path("/display"), json_body=body))

    async def status(self) -> dict[str, Any]:
        """Whether the screen and a browser run, and the screen's size."""
        return dict(await self._sandbox.client.request("GET", self._sandbox._path("/display")))

    async def screenshot(self) -> Screen:
        """The screen now."""
        return await self.act({"action": "screenshot"})

    async def click(self, x: int, y: int, *, button: str = "left", count: int = 1, hold: str | None = None) -> Screen:
        """Click at ``(x, y)``: ``button`` left, right or middle; ``count`` 1 to 3; ``hold`` modifiers ("ctrl")."""
        name = {"left": {1: "left_click", 2: "double_click", 3: "triple_click"}.get(count),
                "right": "right_click" if count == 1 else None, "middle": "middle_click" if count == 1 else None}
        action = name.get(button)
        if action is None:
            raise ValueError(f"no {count}-click of the {button!r} button: left 1-3 times, right or middle once")
        return await self.act(_with_hold({"action": action, "coordinate": [x, y]}, hold))

    async def double_click(self, x: int, y: int) -> Screen:
        """Double-click at ``(x, y)``."""
        return await self.click(x, y, count=2)

    async def move(self, x: int, y: int) -> Screen:
        """Move the pointer to ``(x, y)``."""
        return await self.act({"action": "mouse_move", "coordinate": [x, y]})

    async def drag(self, start: tuple[int, int], end: tuple[int, int]) -> Screen:
        """Press at ``start``, move to ``end`` in small steps, release."""
        return await self.act({"action": "left_click_drag", "start_coordinate": list(start), "coordinate": list(end)})

    async def mouse_down(self) -> Screen:
        """Press the left button where the pointer is."""
        return await self.act({"action": "left_mouse_down"})

    async def mouse_up(self) -> Screen:
        """Release the left button where the pointer is."""
        return await self.act({"action": "left_mouse_up"})

    async def type(self, text: str) -> Screen:
        """Type text (any Unicode; a newline is Return)."""
        return await self.act({"action": "type", "text": text})

    async def key(self, keys: str, *, repeat: int = 1) -> Screen:
        """Press a key or combination, X names joined by "+": ``"Return"``, ``"ctrl+l"``, ``"ctrl+shift+t"``."""
        return await self.act({"action": "key", "text": " ".join([keys] * max(1, repeat))})

    async def hold_key(self, keys: str, seconds: float) -> Screen:
        """Hold a key or combination down for ``seconds``."""
        return await self.act({"action": "hold_key", "text": keys, "duration": seconds})

    async def scroll(self, x: int, y: int, direction: str = "down", amount: int = 3, *,
                     hold: str | None = None) -> Screen:
        """Turn the wheel ``amount`` clicks ``direction`` (up, down, left, right) with the pointer at ``(x, y)``."""
        return await self.act(_with_hold({"action": "scroll", "coordinate": [x, y], "scroll_direction": direction,
                                          "scroll_amount": amount}, hold))

    async def wait(self, seconds: float) -> Screen:
        """Wait, then show the screen."""
        return await self.act({"action": "wait", "duration": seconds})

    async def cursor_position(self) -> tuple[int, int]:
        """Where the pointer is."""
        return (await self.act({"action": "cursor_position"})).cursor

    async def zoom(self, x0: int, y0: int, x1: int, y1: int) -> Screen:
        """The region ``[x0, x1) x [y0, y1)`` enlarged by the largest whole factor that fits the screen."""
        return await self.act({"action": "zoom", "schema": ZOOM_SCHEMA, "region": [x0, y0, x1, y1]})


def _with_hold(body: dict[str, Any], hold: str | None) -> dict[str, Any]:
    return {**body, "text": hold} if hold else body
