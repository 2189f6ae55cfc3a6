"""Anthropic's computer use on a grove sandbox, for harnesses built on the ``anthropic`` SDK.

Two shapes, each sync and async:

* :class:`GroveComputerToolset` — the SDK's computer toolset (``computer_toolset_20260801``): each member call
  (``left_click``, ``screenshot``, …) becomes one grove action. Hand it to the tool runner as you would your own
  driver::

      toolset = GroveComputerToolset(sandbox)
      runner = client.beta.messages.tool_runner(model=..., max_tokens=..., messages=..., tools=[toolset])

  or answer a ``tool_use`` yourself with ``toolset.tool_result(block)``. ``confirm`` defaults to approving every
  call: the keyboard it guards types into the sandbox's own screen, a disposable machine under grove's network
  policy (pass your own to gate it anyway).
* :class:`GroveComputerTool` — the single ``computer_20250124`` (or ``computer_20251124``) tool, for loops shaped
  like Anthropic's reference one: ``tool.to_params()`` is the ``tools`` entry and ``tool(**block.input)`` runs a
  ``tool_use`` and returns the ``tool_result`` content (the screen after the action as an image block;
  ``cursor_position`` as ``X=…,Y=…``). It is also a runnable tool of the SDK's tool runner, and
  ``tool.tool_result(block)`` builds the whole block.

A model's mistake (a point off the screen, an unknown key) comes back as the SDK's ``ToolError`` carrying grove's
422 message, which the runner turns into an ``is_error`` result the model reads; anything else grove raises is the
harness's to see.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Literal, TypeAlias, cast

from anthropic.lib.tools import BetaAsyncBuiltinFunctionTool, BetaBuiltinFunctionTool, ToolError
from anthropic.tools.computer import (
    BetaAbstractComputerToolset20260801,
    BetaAsyncAbstractComputerToolset20260801,
    BetaAsyncComputerConfirmCallable,
    BetaComputerConfirmCallable,
    BetaComputerConfirmContext,
    BetaComputerCursorPositionResult,
    BetaComputerMemberResult,
    BetaScreenshotResult,
    BetaToolConfigs,
    BetaToolsetCallContext,
)
from anthropic.types.beta import (
    BetaComputerMemberInput,
    BetaComputerMemberName,
    BetaComputerToolsetConfigsParam,
    BetaToolComputerUse20241022Param,
    BetaToolComputerUse20250124Param,
    BetaToolComputerUse20251124Param,
    BetaToolResultBlockParam,
    BetaToolUnionParam,
    BetaToolUseBlock,
)
from anthropic.types.beta.beta_tool_result_block_param import Content

from grove.client import AsyncSandbox, Sandbox
from grove.client.computer import Screen
from grove.core.errors import Invalid, NoDisplay
from grove.integrations.computer import screen_size

__all__ = ["AsyncGroveComputerTool", "AsyncGroveComputerToolset", "GroveComputerTool", "GroveComputerToolset",
           "approve"]

TOOLSET_SCHEMA = "computer_20251124"
"""The tool version a toolset member is sent as: the newest grove speaks, the one every member (zoom too) is in."""
MAX_REPEAT = 100
"""Most presses of one ``key`` member call (its ``repeat``)."""
UNSETTLED = "The screen was still changing when the action returned; take a screenshot to see it now."
"""The line a pure action adds when the screen had not settled by grove's cap (``settle.settled`` false)."""
ToolVersion: TypeAlias = Literal["computer_20241022", "computer_20250124", "computer_20251124"]
ComputerToolParam: TypeAlias = (
    BetaToolComputerUse20241022Param | BetaToolComputerUse20250124Param | BetaToolComputerUse20251124Param
)


def approve(context: BetaComputerConfirmContext) -> bool:
    """The toolsets' default ``confirm``: run every call (the screen is the sandbox's own)."""
    return True


class GroveComputerToolset(BetaAbstractComputerToolset20260801):
    """The SDK's computer toolset driving a grove sandbox's screen; see the module's docstring."""

    def __init__(self, sandbox: Sandbox, *, confirm: BetaComputerConfirmCallable = approve,
                 configs: BetaComputerToolsetConfigsParam | None = None,
                 tool_configs: BetaToolConfigs | None = None) -> None:
        super().__init__(configs=configs, confirm=confirm, tool_configs=tool_configs)
        self.sandbox = sandbox
        """The sandbox whose screen the members drive (the harness owns it: closing the toolset leaves it)."""

    def execute(self, context: BetaToolsetCallContext, name: BetaComputerMemberName,
                input: BetaComputerMemberInput) -> BetaComputerMemberResult:
        """Every member: one grove action, its result read off the screen grove answers with."""
        action = member_action(name, input)
        with model_errors():
            screen: Screen = self.sandbox.computer.act(action)
        return member_result(name, screen)


class AsyncGroveComputerToolset(BetaAsyncAbstractComputerToolset20260801):
    """:class:`GroveComputerToolset` for ``AsyncAnthropic``, on an :class:`~grove.client.AsyncSandbox`."""

    def __init__(self, sandbox: AsyncSandbox, *, confirm: BetaAsyncComputerConfirmCallable = approve,
                 configs: BetaComputerToolsetConfigsParam | None = None,
                 tool_configs: BetaToolConfigs | None = None) -> None:
        super().__init__(configs=configs, confirm=confirm, tool_configs=tool_configs)
        self.sandbox = sandbox
        """The sandbox whose screen the members drive (the harness owns it: closing the toolset leaves it)."""

    async def execute(self, context: BetaToolsetCallContext, name: BetaComputerMemberName,
                      input: BetaComputerMemberInput) -> BetaComputerMemberResult:
        """Every member: one grove action, its result read off the screen grove answers with."""
        action = member_action(name, input)
        with model_errors():
            screen = await self.sandbox.computer.act(action)
        return member_result(name, screen)


def member_action(name: str, input: BetaComputerMemberInput) -> dict[str, Any]:
    """A toolset member call as grove's action body: the member is the ``action``, its fields the arguments (a
    field the model made up too, which grove refuses by name), ``key``'s ``repeat`` spelt as repeated keys."""
    fields = input.model_dump(exclude_none=True)
    if name == "key" and "repeat" in fields:
        repeat = fields.pop("repeat")
        if not (isinstance(repeat, int) and 1 <= repeat <= MAX_REPEAT):
            raise ToolError(f"'repeat' must be a whole number from 1 to {MAX_REPEAT}")
        fields["text"] = " ".join([str(fields.get("text", ""))] * repeat)
    return {"action": name, "schema": TOOLSET_SCHEMA, **fields}


def member_result(name: str, screen: Screen) -> BetaComputerMemberResult:
    """What a member returns: the image for ``screenshot`` and ``zoom``, the pointer for ``cursor_position``,
    and for a pure action nothing (the SDK's acknowledgment) or a line saying the screen had not settled."""
    if name in ("screenshot", "zoom"):
        return BetaScreenshotResult(data=screen.base64, media_type="image/png")
    if name == "cursor_position":
        return BetaComputerCursorPositionResult(x=screen.cursor[0], y=screen.cursor[1])
    return UNSETTLED if screen.settle.get("settled") is False else None


@contextmanager
def model_errors() -> Iterator[None]:
    """grove's 422 for a bad action as the SDK's ``ToolError``, which the model reads; a screen missing from the
    image (``NoDisplay``) and every other error stay the harness's."""
    try:
        yield
    except NoDisplay:
        raise
    except Invalid as exc:
        raise ToolError(exc.message) from exc


class _ComputerToolDefinition:
    """What both single computer tools share: the ``tools`` entry and the translation of a ``tool_use``."""

    name = "computer"

    def __init__(self, info: Mapping[str, Any], version: ToolVersion, width: int | None, height: int | None,
                 enable_zoom: bool) -> None:
        default_width, default_height = screen_size(info)
        self.api_type: ToolVersion = version
        """The tool version (``type`` of the ``tools`` entry); also the schema grove reads the input by."""
        self.width = width or default_width
        self.height = height or default_height
        self.enable_zoom = enable_zoom
        """Offer ``zoom`` (``computer_20251124`` only)."""

    def to_params(self) -> ComputerToolParam:
        """The ``tools`` entry: ``{"type": "computer_20250124", "name": "computer", "display_width_px", ...}``."""
        params: dict[str, Any] = {"type": self.api_type, "name": self.name, "display_width_px": self.width,
                                  "display_height_px": self.height}
        if self.enable_zoom and self.api_type == "computer_20251124":
            params["enable_zoom"] = True
        return cast(ComputerToolParam, params)

    def _action(self, tool_input: object) -> dict[str, Any]:
        if not isinstance(tool_input, Mapping):
            raise ToolError("the computer tool's input is an object such as {\"action\": \"screenshot\"}")
        return {**tool_input, "schema": self.api_type}

    @staticmethod
    def _content(action: Mapping[str, Any], screen: Screen) -> list[Content]:
        if action.get("action") == "cursor_position":
            return [{"type": "text", "text": f"X={screen.cursor[0]},Y={screen.cursor[1]}"}]
        return [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": screen.base64}}]

    @staticmethod
    def _result(tool_use: BetaToolUseBlock, content: list[Content] | ToolError) -> BetaToolResultBlockParam:
        if isinstance(content, ToolError):
            error = content.content
            blocks: list[Content] = [{"type": "text", "text": error}] if isinstance(error, str) else list(error)
            return {"type": "tool_result", "tool_use_id": tool_use.id, "content": blocks, "is_error": True}
        return {"type": "tool_result", "tool_use_id": tool_use.id, "content": content}


class GroveComputerTool(_ComputerToolDefinition, BetaBuiltinFunctionTool):
    """The ``computer`` tool of a loop that runs its own ``tool_use`` blocks; see the module's docstring."""

    def __init__(self, sandbox: Sandbox, *, version: ToolVersion = "computer_20250124", width: int | None = None,
                 height: int | None = None, enable_zoom: bool = False) -> None:
        """``width`` and ``height``: the display the model is told of; default, the sandbox's own screen."""
        super().__init__(sandbox.info, version, width, height, enable_zoom)
        self.sandbox = sandbox

    def to_dict(self) -> BetaToolUnionParam:
        """The ``tools`` entry, for the SDK's tool runner."""
        return self.to_params()

    def call(self, input: object) -> list[Content]:
        """Run one ``tool_use`` input; the ``tool_result`` content."""
        action = self._action(input)
        with model_errors():
            screen: Screen = self.sandbox.computer.act(action)
        return self._content(action, screen)

    def __call__(self, **tool_input: Any) -> list[Content]:
        """``tool(**block.input)``, as the reference loop calls its tool."""
        return self.call(tool_input)

    def tool_result(self, tool_use: BetaToolUseBlock) -> BetaToolResultBlockParam:
        """The ``tool_result`` block answering ``tool_use`` (``is_error`` for a model's mistake)."""
        try:
            return self._result(tool_use, self.call(tool_use.input))
        except ToolError as exc:
            return self._result(tool_use, exc)


class AsyncGroveComputerTool(_ComputerToolDefinition, BetaAsyncBuiltinFunctionTool):
    """:class:`GroveComputerTool` for async loops, on an :class:`~grove.client.AsyncSandbox`."""

    def __init__(self, sandbox: AsyncSandbox, *, version: ToolVersion = "computer_20250124",
                 width: int | None = None, height: int | None = None, enable_zoom: bool = False) -> None:
        """``width`` and ``height``: the display the model is told of; default, the sandbox's own screen."""
        super().__init__(sandbox.info, version, width, height, enable_zoom)
        self.sandbox = sandbox

    def to_dict(self) -> BetaToolUnionParam:
        """The ``tools`` entry, for the SDK's tool runner."""
        return self.to_params()

    async def call(self, input: object) -> list[Content]:
        """Run one ``tool_use`` input; the ``tool_result`` content."""
        action = self._action(input)
        with model_errors():
            screen = await self.sandbox.computer.act(action)
        return self._content(action, screen)

    async def __call__(self, **tool_input: Any) -> list[Content]:
        """``await tool(**block.input)``, as the reference loop calls its tool."""
        return await self.call(tool_input)

    async def tool_result(self, tool_use: BetaToolUseBlock) -> BetaToolResultBlockParam:
        """The ``tool_result`` block answering ``tool_use`` (``is_error`` for a model's mistake)."""
        try:
            return self._result(tool_use, await self.call(tool_use.input))
        except ToolError as exc:
            return self._result(tool_use, exc)
