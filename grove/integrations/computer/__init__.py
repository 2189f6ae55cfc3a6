"""Drop-in computer-use tools: a harness keeps its loop and swaps its local computer for a grove sandbox's screen.

Each vendor's classes live in their own module and import that vendor's SDK; this package imports neither.

* :mod:`grove.integrations.computer.anthropic` — for the ``anthropic`` SDK: ``GroveComputerToolset`` (and
  ``AsyncGroveComputerToolset``), a driver of its ``computer_toolset_20260801`` toolset for
  ``client.beta.messages.tool_runner``; ``GroveComputerTool`` (and ``AsyncGroveComputerTool``), the
  ``computer_20250124``/``computer_20251124`` tool, runnable by the tool runner and shaped like the reference
  loop's ``ComputerTool`` (``to_params()``, ``tool(**tool_input)``).
* :mod:`grove.integrations.computer.openai` — for the Responses API's computer-use loop: ``GroveComputer`` (and
  ``AsyncGroveComputer``), the ``Computer`` of OpenAI's CUA sample, whose ``handle(computer_call)`` answers a
  ``computer_call`` item with its ``computer_call_output``.

Every action is one ``POST /v1/sandboxes/{id}/computer`` in the vendor's own vocabulary, so the trajectory
records it as that protocol's step, with the screen after it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

DEFAULT_SIZE = (1280, 800)
"""The screen of a sandbox made without ``desktop`` (the router's ``DesktopModel`` defaults)."""


def screen_size(info: Mapping[str, Any]) -> tuple[int, int]:
    """A sandbox's screen ``(width, height)`` from its record (``sandbox.info``): the ``desktop`` it was made
    with, else grove's default. Screenshots are exactly this size: grove never scales them."""
    desktop = info.get("desktop") or {}
    return int(desktop.get("width") or DEFAULT_SIZE[0]), int(desktop.get("height") or DEFAULT_SIZE[1])
