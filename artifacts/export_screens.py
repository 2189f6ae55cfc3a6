"""Computer steps in the SFT export: the action as a tool call, the screen after it as an image the model sees.

A ``computer`` step (``POST /v1/sandboxes/{id}/computer``) becomes three messages:

- an assistant tool call of ``computer`` whose arguments are the action in the vocabulary it was given:
  Anthropic's ``{"action": "left_click", "coordinate": [x, y]}`` or OpenAI's ``{"type": "click", "x", "y",
  "button"}`` (joined to the assistant's text before it, as every tool call of the export is);
- a ``tool`` message answering it in text (``X=..,Y=..`` for ``cursor_position``; a refused action's error, and
  then nothing more: it has no screen);
- a ``user`` message holding the screen after it as an image content part.

The image goes into a user turn, not the tool message, because that is where every trainer takes it: OpenAI's
chat format allows images in user messages only (a tool message is text), and TRL fills image placeholders in
every turn but a tool's. Two shapes (:data:`IMAGE_FORMATS`):

- ``openai``: ``{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}``, the usual chat
  format, self-contained in the line;
- ``trl``: ``{"type": "image"}`` placeholders and the images, in order, as data URLs in the line's ``images``
  (what TRL's vision SFT reads once they are decoded); every message's content is then a list of parts, since
  TRL puts every image before the first user message whose content is a plain string.

Only the last ``keep`` screenshots stay images, so a long trajectory's context stays bounded; older ones, and
any that cannot be shown (not stored past the router's ``--screenshot-mb``, gone from storage, not the PNG its
hash names), become a short text part saying so. Images a harness put into its own messages stay as posted.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("grove.export")

IMAGE_FORMATS = ("openai", "trl")
ImageReader = Callable[[str], bytes]
"""The stored PNG a screenshot's sha256 names (the router's ``GET /v1/screenshots/{sha}``); raises if none."""
SHA = re.compile(r"[0-9a-f]{64}")
_PNG = b"\x89PNG\r\n\x1a\n"
_REASON_CHARS = 300
OMITTED = "[screenshot omitted]"
"""What stands for a screenshot older than the last ``keep``."""


@dataclass(frozen=True)
class ScreenOptions:
    """How computer steps' screenshots go into the export."""

    read: ImageReader | None = None
    """Where the images come from; None: each screenshot is a text part saying that none was read."""
    keep: int = 3
    """How many of the trajectory's last screenshots stay images (0: none)."""
    image_format: str = "openai"
    """One of :data:`IMAGE_FORMATS`."""

    def __post_init__(self) -> None:
        if self.keep < 0:
            raise ValueError(f"keep must be 0 or more, not {self.keep}")
        if self.image_format not in IMAGE_FORMATS:
            raise ValueError(f"image format must be one of {', '.join(IMAGE_FORMATS)}, not {self.image_format!r}")


def computer_call(step: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """A computer step's tool-call arguments (in its own vocabulary) and the text of the tool's answer."""
    action, args = step.get("action"), step.get("args") or {}
    if not isinstance(action, str) or not isinstance(args, dict):
        raise ValueError("a computer step without an action name or with arguments that are not a map")
    key = "type" if step.get("protocol") == "openai" else "action"
    arguments = {key: action, **{k: v for k, v in args.items() if k != key}}
    error = step.get("error")
    if error is not None:
        message = error.get("message") if isinstance(error, dict) else error
        status = step.get("status")
        return arguments, f"[error{f' {status}' if status is not None else ''}: {str(message)[:_REASON_CHARS]}]"
    cursor = step.get("cursor")
    if action == "cursor_position" and isinstance(cursor, list | tuple) and len(cursor) == 2:
        return arguments, f"X={cursor[0]},Y={cursor[1]}"
    return arguments, "The zoomed region is below." if action == "zoom" else "The screen after the action is below."


def computer_tool(step: dict[str, Any]) -> dict[str, Any]:
    """The ``computer`` tool's schema in the step's vocabulary, with the screen's size."""
    size = _size(step.get("screenshot"))
    screen = f" The screen is {size[0]}x{size[1]} pixels." if size else ""
    openai = step.get("protocol") == "openai"
    return {"type": "function", "function": {
        "name": "computer",
        "description": "Use the sandbox's mouse and keyboard; answers with a screenshot of the screen after the "
                       f"action.{screen}",
        "parameters": _OPENAI_PARAMETERS if openai else _ANTHROPIC_PARAMETERS,
    }}


class Screenshots:
    """One record's screenshot slots: placed as the messages are made, filled once all are known."""

    def __init__(self, options: ScreenOptions) -> None:
        self.options = options
        self._slots: list[tuple[dict[str, Any], Any]] = []
        self._read: dict[str, bytes | str] = {}

    def slot(self, step: dict[str, Any]) -> dict[str, Any]:
        """The user message that will hold a step's screen (filled by :meth:`fill`)."""
        message: dict[str, Any] = {"role": "user", "content": []}
        self._slots.append((message, step.get("screenshot")))
        return message

    def fill(self) -> tuple[list[str], dict[str, int]]:
        """Put each slot's image or the text saying why there is none; the images in order (their data URLs, for
        ``trl``'s ``images``) and the counts for the metadata."""
        images: list[str] = []
        counts = {"steps": len(self._slots), "images": 0, "omitted": 0, "missing": 0}
        first_kept = len(self._slots) - self.options.keep
        for index, (message, shot) in enumerate(self._slots):
            if index < first_kept:
                counts["omitted"] += 1
                message["content"] = [_text(OMITTED)]
                continue
            png = self._png(shot)
            if isinstance(png, str):
                counts["missing"] += 1
                message["content"] = [_text(f"[screenshot {png}]")]
                continue
            counts["images"] += 1
            url = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
            if self.options.image_format == "trl":
                images.append(url)
                message["content"] = [{"type": "image"}]
            else:
                message["content"] = [{"type": "image_url", "image_url": {"url": url}}]
        return images, counts

    def _png(self, shot: Any) -> bytes | str:
        """The screenshot's PNG, checked against its hash and size; else why there is none (a placeholder's words)."""
        if not isinstance(shot, dict) or not isinstance(shot.get("sha256"), str) or not SHA.fullmatch(shot["sha256"]):
            return "not recorded"
        if shot.get("stored") is False:
            return f"not stored: {str(shot.get('reason') or 'no reason recorded')[:_REASON_CHARS]}"
        sha = shot["sha256"]
        if sha not in self._read:
            self._read[sha] = self._fetch(sha)
        png, size = self._read[sha], _size(shot)
        if isinstance(png, bytes) and size is not None and png_size(png) != size:
            return f"unavailable: the stored image is not {size[0]}x{size[1]} as recorded"
        return png

    def _fetch(self, sha: str) -> bytes | str:
        if self.options.read is None:
            return "not exported: no image store was given to the export"
        try:
            data = self.options.read(sha)
        except Exception as exc:  # one image that cannot be read is a placeholder, never the end of the export
            log.warning("screenshot %s left out of the export: %s", sha[:12], exc)
            return f"unavailable: {str(exc)[:_REASON_CHARS]}"
        if hashlib.sha256(data).hexdigest() != sha:
            return "unavailable: the stored image is not the one its hash names"
        if png_size(data) is None:
            return "unavailable: the stored image is not a PNG"
        return data


def as_parts(messages: list[dict[str, Any]]) -> None:
    """Every message's text content as a list of text parts (``trl``: TRL moves every image before the first
    user message whose content is a plain string)."""
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            message["content"] = [_text(content)] if content else []


def png_size(data: bytes) -> tuple[int, int] | None:
    """A PNG's width and height from its header; None if it is not a PNG."""
    if len(data) < 24 or not data.startswith(_PNG) or data[12:16] != b"IHDR":
        return None
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def _size(shot: Any) -> tuple[int, int] | None:
    """The width and height a step recorded for its screenshot, if it recorded both as numbers."""
    if not isinstance(shot, dict):
        return None
    width, height = shot.get("width"), shot.get("height")
    return (width, height) if type(width) is int and type(height) is int else None


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


# The vocabularies as the executor takes them (executor/computer/actions.py, which this layer may not import):
# a schema for the model's tool list, so a chat template can render the tool as the model was shown it.
_POINT = {"type": "array", "items": {"type": "integer"}, "description": "[x, y] in the screenshot's pixels"}
_ANTHROPIC_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "action": {"type": "string", "enum": [
            "screenshot", "cursor_position", "mouse_move", "key", "hold_key", "type", "wait", "left_click",
            "right_click", "middle_click", "double_click", "triple_click", "left_click_drag", "left_mouse_down",
            "left_mouse_up", "scroll", "zoom"]},
        "coordinate": _POINT,
        "start_coordinate": _POINT,
        "text": {"type": "string", "description": "text to type, keys to press (\"ctrl+l\"), or modifiers held"},
        "duration": {"type": "number", "description": "seconds (wait, hold_key)"},
        "scroll_direction": {"type": "string", "enum": ["up", "down", "left", "right"]},
        "scroll_amount": {"type": "integer"},
        "region": {"type": "array", "items": {"type": "integer"}, "description": "[x0, y0, x1, y1] to zoom into"},
    },
    "required": ["action"],
}
_OPENAI_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "type": {"type": "string", "enum": [
            "click", "double_click", "drag", "keypress", "move", "screenshot", "scroll", "type", "wait"]},
        "x": {"type": "integer"},
        "y": {"type": "integer"},
        "button": {"type": "string", "enum": ["left", "right", "wheel", "back", "forward"]},
        "keys": {"type": "array", "items": {"type": "string"}},
        "path": {"type": "array", "items": {"type": "object", "properties": {"x": {"type": "integer"},
                                                                               "y": {"type": "integer"}}}},
        "scroll_x": {"type": "integer"},
        "scroll_y": {"type": "integer"},
        "text": {"type": "string"},
    },
    "required": ["type"],
}
