"""Computer-use actions in the two vocabularies models speak, checked and turned into one plan.

A body with ``"action"`` is Anthropic's computer-use tool input, read by the version named in ``"schema"``
(default ``computer_20250124``; ``computer_20251124`` adds ``zoom``). A body with ``"type"`` is an OpenAI
computer-use action. The two share names with different arguments (``double_click``, ``scroll``, ``type``),
so the key decides and a body with both, or neither, is refused. Every argument is checked against the
action's own list: a misspelt one is a 422 naming the ones it takes, never silently ignored.

The coordinate space is the screenshot's, and grove never scales a screenshot: the display is made at the
size the model should see (``desktop.width`` and ``height`` at create, 1280x800 by default).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from executor.computer import keys
from grove.core.errors import Invalid

SCHEMAS = ("computer_20241022", "computer_20250124", "computer_20251124")
DEFAULT_SCHEMA = "computer_20250124"
_CLICKS = ("left_click", "right_click", "middle_click", "double_click", "triple_click")
_ANTHROPIC: dict[str, dict[str, tuple[str, ...]]] = {
    "computer_20241022": {
        "screenshot": (), "cursor_position": (), "mouse_move": ("coordinate",), "key": ("text",),
        "type": ("text",), "left_click": (), "right_click": (), "middle_click": (), "double_click": (),
        "left_click_drag": ("coordinate",),
    },
}
_ANTHROPIC["computer_20250124"] = {
    "screenshot": (), "cursor_position": (), "mouse_move": ("coordinate", "text"), "key": ("text",),
    "hold_key": ("text", "duration"), "type": ("text",), "wait": ("duration",),
    **{name: ("coordinate", "text") for name in _CLICKS},
    "left_click_drag": ("start_coordinate", "coordinate", "text"), "left_mouse_down": ("coordinate", "text"),
    "left_mouse_up": ("coordinate", "text"),
    "scroll": ("coordinate", "scroll_direction", "scroll_amount", "text"),
}
_ANTHROPIC["computer_20251124"] = {**_ANTHROPIC["computer_20250124"], "zoom": ("region",)}
_OPENAI: dict[str, tuple[str, ...]] = {
    "click": ("button", "x", "y", "keys"), "double_click": ("x", "y", "keys"), "drag": ("path", "keys"),
    "keypress": ("keys",), "move": ("x", "y", "keys"), "screenshot": (),
    "scroll": ("x", "y", "scroll_x", "scroll_y", "keys"), "type": ("text",), "wait": (),
}
"""OpenAI's actions and their arguments; ``keys`` on a pointer action is the modifiers held through it."""
_OPENAI_BUTTONS = {"left": "1", "wheel": "2", "middle": "2", "right": "3", "back": "8", "forward": "9"}
_SCROLL_BUTTONS = {"up": "4", "down": "5", "left": "6", "right": "7"}
GROVE_FIELDS = ("settle",)
"""Fields of grove's own a body of either vocabulary may carry (how long to wait for the screen)."""
MAX_WAIT_S = 60.0
MAX_TYPE = 20_000
MAX_SCROLL = 100
SCROLL_PX = 100
"""An OpenAI scroll's pixels per wheel click: ``scroll_y=300`` is three clicks down (Chromium moves ~100 px
a click on X11). Anthropic's ``scroll_amount`` counts clicks itself."""
OPENAI_WAIT_S = 1.0
"""OpenAI's ``wait`` carries no duration: grove waits this long, then for the screen to settle."""
TYPE_DELAY_MS = 2


@dataclass
class Plan:
    """What one action does: xdotool's commands, any pause, and what the answer shows."""

    protocol: str
    """``anthropic`` or ``openai``."""
    schema: str | None
    action: str
    args: dict[str, Any]
    """The action's arguments as given (its record)."""
    commands: list[list[str]] = field(default_factory=list)
    """xdotool invocations, in order (``type`` takes the rest of its command line, so it runs on its own)."""
    pause_s: float = 0.0
    """Seconds to wait after the commands (``wait``), before the screen is watched."""
    settle: bool = True
    """Whether to wait for the screen to settle (not for a screenshot, a zoom or a cursor query: nothing moved)."""
    region: tuple[int, int, int, int] | None = None
    """``zoom``'s region, ``(x0, y0, x1, y1)``."""


def plan(body: Any, width: int, height: int) -> Plan:
    """The body's action, checked against the screen's size; a 422 naming what is wrong otherwise."""
    if not isinstance(body, dict):
        raise Invalid("a computer action is a JSON object: {\"action\": ...} (Anthropic) or {\"type\": ...} (OpenAI)")
    if "action" in body and "type" in body:
        raise Invalid("give 'action' (Anthropic's computer tool) or 'type' (an OpenAI computer action), not both")
    if "action" in body:
        return _anthropic(body, _Screen(width, height))
    if "type" in body:
        return _openai(body, _Screen(width, height))
    raise Invalid("a computer action needs 'action' (Anthropic's computer tool, e.g. {\"action\": \"screenshot\"}) "
                  "or 'type' (an OpenAI computer action, e.g. {\"type\": \"screenshot\"})")


@dataclass(frozen=True)
class _Screen:
    width: int
    height: int

    def point(self, value: Any, name: str) -> tuple[int, int]:
        if not (isinstance(value, list | tuple) and len(value) == 2):
            raise Invalid(f"'{name}' must be [x, y], two whole numbers of pixels")
        return self.xy(value[0], value[1], name)

    def xy(self, x: Any, y: Any, name: str) -> tuple[int, int]:
        if not all(_whole(v) for v in (x, y)):
            raise Invalid(f"'{name}' must be whole numbers of pixels, got ({x!r}, {y!r})")
        if not (0 <= int(x) < self.width and 0 <= int(y) < self.height):
            raise Invalid(f"'{name}' ({int(x)}, {int(y)}) is outside the {self.width}x{self.height} screen: x from 0 "
                          f"to {self.width - 1}, y from 0 to {self.height - 1} (the screenshot's own pixels)")
        return int(x), int(y)


def _whole(value: Any) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool)) or (isinstance(value, float) and value.is_integer())


def _check_args(body: dict[str, Any], allowed: tuple[str, ...], key: str, where: str) -> dict[str, Any]:
    args = {k: v for k, v in body.items() if k not in (key, "schema", *GROVE_FIELDS)}
    extra = sorted(set(args) - set(allowed))
    if extra:
        takes = ", ".join(allowed) if allowed else "no arguments"
        raise Invalid(f"{where} does not take {', '.join(repr(e) for e in extra)}; it takes {takes}")
    return args


def _anthropic(body: dict[str, Any], screen: _Screen) -> Plan:
    schema = body.get("schema", DEFAULT_SCHEMA)
    if schema not in _ANTHROPIC:
        raise Invalid(f"'schema' {schema!r} is not a computer-use tool version grove speaks: {', '.join(SCHEMAS)}")
    action = body["action"]
    table = _ANTHROPIC[schema]
    if action not in table:
        hint = " (zoom came with computer_20251124)" if action == "zoom" else ""
        raise Invalid(f"{action!r} is not an action of {schema}{hint}: {', '.join(table)}")
    where = f"{schema} action {action!r}"
    args = _check_args(body, table[action], "action", where)
    result = Plan("anthropic", schema, action, args)
    held = keys.modifiers(args.get("text"), where="'text'") if action in (*_CLICKS, "scroll", "mouse_move",
                                                                            "left_click_drag", "left_mouse_down",
                                                                            "left_mouse_up") else []
    at = screen.point(args["coordinate"], "coordinate") if args.get("coordinate") is not None else None
    move = [["mousemove", str(at[0]), str(at[1])]] if at else []
    if action in ("screenshot", "cursor_position"):
        result.settle = False
    elif action == "zoom":
        result.settle, result.region = False, _region(args.get("region"), screen)
    elif action == "mouse_move":
        if at is None:
            raise Invalid(f"{where} needs 'coordinate': [x, y]")
        result.commands = [_held(held, move)]
    elif action in _CLICKS:
        button = {"right_click": "3", "middle_click": "2"}.get(action, "1")
        repeat = {"double_click": "2", "triple_click": "3"}.get(action, "1")
        result.commands = [_held(held, [*move, ["click", "--repeat", repeat, "--delay", "60", button]])]
    elif action == "left_click_drag":
        start = screen.point(args.get("start_coordinate"), "start_coordinate")
        end = screen.point(args.get("coordinate"), "coordinate")
        result.commands = [_held(held, _drag([start, end]))]
    elif action in ("left_mouse_down", "left_mouse_up"):
        result.commands = [_held(held, [*move, ["mousedown" if action == "left_mouse_down" else "mouseup", "1"]])]
    elif action == "key":
        result.commands = [["key", "--delay", "20", *keys.sequence(args.get("text", ""), where="'text'")]]
    elif action == "hold_key":
        held_keys = keys.sequence(args.get("text", ""), where="'text'")
        seconds = _seconds(args.get("duration"), "duration")
        result.commands = [["keydown", *held_keys, "sleep", f"{seconds:g}", "keyup", *held_keys]]
    elif action == "type":
        result.commands = _typing(args.get("text"))
    elif action == "scroll":
        direction, amount = args.get("scroll_direction"), args.get("scroll_amount")
        if direction not in _SCROLL_BUTTONS:
            raise Invalid(f"'scroll_direction' must be one of up, down, left, right, got {direction!r}")
        if not (isinstance(amount, int | float) and _whole(amount) and 0 <= int(amount) <= MAX_SCROLL):
            raise Invalid(f"'scroll_amount' must be a whole number of wheel clicks from 0 to {MAX_SCROLL}")
        button = _SCROLL_BUTTONS[direction]
        clicks = [["click", "--repeat", str(int(amount)), "--delay", "30", button]] if amount else []
        result.commands = [_held(held, [*move, *clicks])]
    elif action == "wait":
        result.pause_s = _seconds(args.get("duration"), "duration")
    return result


def _openai(body: dict[str, Any], screen: _Screen) -> Plan:
    action = body["type"]
    if action not in _OPENAI:
        raise Invalid(f"{action!r} is not an OpenAI computer action: {', '.join(_OPENAI)}")
    where = f"OpenAI action {action!r}"
    args = _check_args(body, _OPENAI[action], "type", where)
    result = Plan("openai", None, action, args)
    held = _held_keys(args.get("keys")) if action != "keypress" else []
    if action == "screenshot":
        result.settle = False
    elif action in ("click", "double_click", "move"):
        x, y = screen.xy(args.get("x"), args.get("y"), "x, y")
        move = ["mousemove", str(x), str(y)]
        if action == "move":
            result.commands = [_held(held, [move])]
        else:
            button = "1" if action == "double_click" else _OPENAI_BUTTONS.get(str(args.get("button")))
            if button is None:
                raise Invalid(f"'button' must be one of {', '.join(_OPENAI_BUTTONS)}, got {args.get('button')!r}")
            repeat = "2" if action == "double_click" else "1"
            result.commands = [_held(held, [move, ["click", "--repeat", repeat, "--delay", "60", button]])]
    elif action == "drag":
        path = args.get("path")
        if not isinstance(path, list) or len(path) < 2 or not all(isinstance(p, dict) for p in path):
            raise Invalid("'path' must be a list of at least two points, each {\"x\": ..., \"y\": ...}")
        points = [screen.xy(p.get("x"), p.get("y"), f"path[{i}]") for i, p in enumerate(path)]
        result.commands = [_held(held, _drag(points))]
    elif action == "keypress":
        result.commands = [["key", keys.chord(args.get("keys"))]]
    elif action == "type":
        result.commands = _typing(args.get("text"))
    elif action == "scroll":
        x, y = screen.xy(args.get("x"), args.get("y"), "x, y")
        command = ["mousemove", str(x), str(y)]
        for name, negative, positive in (("scroll_y", "4", "5"), ("scroll_x", "6", "7")):
            value = args.get(name, 0)
            if not isinstance(value, int | float) or isinstance(value, bool):
                raise Invalid(f"'{name}' must be a number of pixels (positive: down or right)")
            clicks = min(MAX_SCROLL, round(abs(value) / SCROLL_PX)) or (1 if value else 0)
            if clicks:
                command += ["click", "--repeat", str(clicks), "--delay", "30", positive if value > 0 else negative]
        result.commands = [_held(held, [command])]
    elif action == "wait":
        result.pause_s = OPENAI_WAIT_S
    return result


def _held_keys(value: Any) -> list[str]:
    """An OpenAI pointer action's ``keys``: the modifiers held through it (``["SHIFT"]``); none for null or []."""
    if value is None or value == []:
        return []
    if not isinstance(value, list) or not all(isinstance(k, str) and k for k in value):
        raise Invalid("'keys' must be a list of modifier names held through the action, such as [\"SHIFT\"]")
    return keys.modifiers("+".join(value), where="'keys'")


def _held(held: list[str], commands: list[list[str]]) -> list[str]:
    """One xdotool command line: modifiers pressed, the commands, modifiers released."""
    line = ["keydown", *held] if held else []
    for command in commands:
        line += command
    return line + (["keyup", *held] if held else [])


def _drag(points: list[tuple[int, int]]) -> list[list[str]]:
    """Press at the first point, move through the others in small steps (a slider follows motion, not
    jumps), release at the last. No ``mousemove --sync`` anywhere: it waits for the pointer to move, and
    to where it already is it waits ~15 s (xdotool 3.2); one xdotool's requests reach the server in order."""
    (x, y), rest = points[0], points[1:]
    commands = [["mousemove", str(x), str(y)], ["mousedown", "1"]]
    for nx, ny in rest:
        steps = max(1, min(10, max(abs(nx - x), abs(ny - y)) // 20))
        for k in range(1, steps + 1):
            commands.append(["mousemove", str(x + (nx - x) * k // steps), str(y + (ny - y) * k // steps)])
            commands.append(["sleep", "0.01"])
        x, y = nx, ny
    commands.append(["mouseup", "1"])
    return commands


def _typing(text: Any) -> list[list[str]]:
    if not isinstance(text, str) or not text:
        raise Invalid("'text' must be the non-empty text to type")
    if len(text) > MAX_TYPE:
        raise Invalid(f"'text' is {len(text):,} characters; at most {MAX_TYPE:,} are typed in one action")
    if "\x00" in text:
        raise Invalid("'text' may not contain NUL characters")
    # `type` takes every remaining argument as text: each piece is a command line of its own.
    return [["type", "--delay", str(TYPE_DELAY_MS), "--", text[i: i + 500]] for i in range(0, len(text), 500)]


def _seconds(value: Any, name: str) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value <= MAX_WAIT_S:
        raise Invalid(f"'{name}' must be a number of seconds from 0 to {MAX_WAIT_S:g}")
    return float(value)


def _region(value: Any, screen: _Screen) -> tuple[int, int, int, int]:
    if not (isinstance(value, list | tuple) and len(value) == 4 and all(_whole(v) for v in value)):
        raise Invalid("'region' must be [x0, y0, x1, y1], whole numbers of pixels")
    x0, y0, x1, y1 = (int(v) for v in value)
    if not (0 <= x0 < x1 <= screen.width and 0 <= y0 < y1 <= screen.height):
        raise Invalid(f"'region' {[x0, y0, x1, y1]} must be a non-empty rectangle inside the "
                      f"{screen.width}x{screen.height} screen (x0 < x1 <= {screen.width}, y0 < y1 <= {screen.height})")
    return x0, y0, x1, y1
