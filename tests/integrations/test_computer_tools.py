"""The drop-in computer-use tools (grove/integrations/computer) driven by the vendors' own SDKs, no model called.

A real router, a real sandbox with Chromium on its screen showing the test site, and the SDKs' real loops: the
``anthropic`` tool runner and a Messages API loop of the reference's shape, and a Responses API loop as OpenAI's
CUA sample writes it, each against a model API that answers from a script (a real HTTP server; the SDK parses
its replies and serializes what the tools return). Each test checks the effect on the page, that what the
tools return is the SDK's own type, and that the trajectory recorded each action in its vendor's vocabulary.
"""

from __future__ import annotations

import asyncio
import base64
import io
import time
from collections.abc import Iterator, Mapping
from typing import Any

import anthropic
import openai
import pytest
from anthropic.types.beta import BetaToolComputerUse20250124Param, BetaToolResultBlockParam, BetaToolUseBlock
from anthropic.types.beta.beta_tool_result_block_param import Content
from openai.types.responses import ComputerUsePreviewToolParam, ResponseComputerToolCall, ResponseInputItemParam
from openai.types.responses.response_input_item_param import ComputerCallOutput
from PIL import Image
from pydantic import TypeAdapter

from grove.client import AsyncGrove, Sandbox
from grove.errors import Invalid
from grove.integrations.computer.anthropic import (
    AsyncGroveComputerTool,
    AsyncGroveComputerToolset,
    GroveComputerTool,
    GroveComputerToolset,
)
from grove.integrations.computer.openai import AsyncGroveComputer, GroveComputer, SafetyCheckDeclined
from tests.support.gui_site import SCRIPT, URL, box, centre, fresh_page, site_sandbox, site_state, wait_state
from tests.support.router_fixtures import RouterProcess
from tests.support.scripted_api import scripted_api

GREEN = (0, 160, 0)
KEYS_PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>keys</title>
<style>body{margin:0;font:16px sans-serif} #mod{position:absolute;left:100px;top:60px;width:220px;height:70px}</style>
</head><body><button id="mod" data-t="mod"
  onclick="report({event: 'modclick', shift: event.shiftKey, ctrl: event.ctrlKey})">Shift-click me</button>
<script>SCRIPT</script></body></html>""".replace("SCRIPT", SCRIPT)


@pytest.fixture(scope="module")
def desk(router: RouterProcess) -> Iterator[Sandbox]:
    """A sandbox with the test site served (and a page of its own for held keys)."""
    with site_sandbox(router, {"keys.html": KEYS_PAGE}) as sandbox:
        yield sandbox


@pytest.fixture
def page(desk: Sandbox) -> Sandbox:
    """The site's page, freshly loaded (its state file emptied first)."""
    return fresh_page(desk)


def steps(router: RouterProcess, sandbox: Sandbox) -> list[dict[str, Any]]:
    """The computer steps of the sandbox's live trajectory."""
    trajectory = router.http("GET", f"/v1/sandboxes/{sandbox.id}/trajectory").json()
    return [s for s in trajectory["steps"] if s["type"] == "computer"]


def pixel(png: bytes, x: int, y: int) -> tuple[int, int, int]:
    """One pixel of a screenshot."""
    with Image.open(io.BytesIO(png)) as image:
        assert image.size == (1280, 800)
        found = image.convert("RGB").getpixel((x, y))
    assert isinstance(found, tuple)
    return (int(found[0]), int(found[1]), int(found[2]))


def message(stop: str, content: list[dict[str, Any]]) -> dict[str, Any]:
    """A Messages API reply, as the API writes it."""
    return {"id": "msg_test", "type": "message", "role": "assistant", "model": "claude-test", "content": content,
            "stop_reason": stop, "stop_sequence": None, "usage": {"input_tokens": 10, "output_tokens": 10}}


def tool_use(block_id: str, name: str, input: dict[str, Any], toolset: str | None = None) -> dict[str, Any]:
    """A ``tool_use`` block: of the single ``computer`` tool, or a member of a toolset."""
    return {"type": "tool_use", "id": block_id, "name": name, "input": input,
            **({"toolset_name": toolset} if toolset else {})}


def tool_results(request: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The ``tool_result`` blocks a Messages request answered the last reply with, each checked as the SDK's
    ``BetaToolResultBlockParam`` (its content blocks too, and no key the type does not have)."""
    last = request["messages"][-1]
    assert last["role"] == "user"
    blocks = [b for b in last["content"] if b["type"] == "tool_result"]
    for block in blocks:
        valid(BetaToolResultBlockParam, block)
    return blocks


def valid(kind: Any, value: Mapping[str, Any]) -> None:
    """``value`` is an instance of the SDK's TypedDict ``kind``: pydantic validates it, and it has no key ``kind``
    lacks. A ``tool_result``'s content is checked as a list of the SDK's content blocks (pydantic checks an
    ``Iterable`` field's items only as they are read)."""
    TypeAdapter(kind).validate_python(value)
    assert set(value) <= kind.__required_keys__ | kind.__optional_keys__, (set(value), kind)
    if kind is BetaToolResultBlockParam:
        TypeAdapter(list[Content]).validate_python(value["content"], strict=True)


def image_of(block: Mapping[str, Any]) -> bytes:
    """The PNG of a ``tool_result``'s only content block, an image."""
    (image,) = block["content"]
    assert image["type"] == "image" and image["source"]["type"] == "base64"
    assert image["source"]["media_type"] == "image/png"
    return base64.b64decode(image["source"]["data"])


def test_the_toolset_runs_in_the_anthropic_tool_runner(router: RouterProcess, page: Sandbox) -> None:
    x, y = centre(page, "go")
    known = len(steps(router, page))
    toolset = GroveComputerToolset(page)
    script = [
        message("tool_use", [tool_use("toolu_1", "left_click", {"coordinate": [x, y]}, "computer"),
                             tool_use("toolu_2", "screenshot", {}, "computer")]),
        message("tool_use", [tool_use("toolu_3", "left_click", {"coordinate": [5000, 10]}, "computer")]),
        message("end_turn", [{"type": "text", "text": "Pressed it."}]),
    ]
    with scripted_api(script) as api:
        client = anthropic.Anthropic(base_url=api.url, api_key="sk-test", max_retries=0)
        runner = client.beta.messages.tool_runner(model="claude-test", max_tokens=1024, tools=[toolset],
                                                  messages=[{"role": "user", "content": "Press Go."}])
        final = runner.until_done()
    assert final.content[0].type == "text" and final.content[0].text == "Pressed it."
    first, second, third = api.bodies("/v1/messages")
    assert first["tools"] == [{"type": "computer_toolset_20260801"}]  # every member served, none disabled

    clicked, shot = tool_results(second)
    assert clicked["tool_use_id"] == "toolu_1" and clicked["toolset_name"] == "computer"
    assert clicked["content"] == [{"type": "text", "text": "Clicked."}] and "is_error" not in clicked
    assert wait_state(page, "click")["id"] == "go"
    assert shot["tool_use_id"] == "toolu_2" and pixel(image_of(shot), x, y + 80) == GREEN  # the page turned green

    (refused,) = tool_results(third)
    assert refused["is_error"] is True and refused["toolset_name"] == "computer"
    assert "outside the 1280x800 screen" in refused["content"][0]["text"]  # grove's own words, for the model

    recorded = steps(router, page)[known:]
    assert [s["action"] for s in recorded] == ["left_click", "screenshot", "left_click"]
    assert all(s["protocol"] == "anthropic" for s in recorded)
    assert [s.get("schema") for s in recorded[:2]] == ["computer_20251124"] * 2
    assert recorded[0]["args"] == {"coordinate": [x, y]} and recorded[2]["status"] == 422


def test_the_computer_tool_in_a_loop_of_the_reference_shape(router: RouterProcess, page: Sandbox) -> None:
    x, y = centre(page, "go")
    known = len(steps(router, page))
    tool = GroveComputerTool(page)
    params = tool.to_params()
    assert params == {"type": "computer_20250124", "name": "computer", "display_width_px": 1280,
                      "display_height_px": 800}
    valid(BetaToolComputerUse20250124Param, params)
    script = [
        message("tool_use", [tool_use("toolu_1", "computer", {"action": "left_click", "coordinate": [x, y]})]),
        message("tool_use", [tool_use("toolu_2", "computer", {"action": "cursor_position"}),
                             tool_use("toolu_3", "computer", {"action": "key", "text": "ctrl+Bogus"})]),
        message("end_turn", [{"type": "text", "text": "Done."}]),
    ]
    with scripted_api(script) as api:
        client = anthropic.Anthropic(base_url=api.url, api_key="sk-test", max_retries=0)
        messages: list[Any] = [{"role": "user", "content": "Press Go."}]
        # The reference loop: the model's turn, then each tool_use run by `tool(**input)` into a tool_result.
        while True:
            reply = client.beta.messages.create(model="claude-test", max_tokens=1024, messages=messages,
                                                tools=[tool.to_params()], betas=["computer-use-2025-01-24"])
            messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]})
            results: list[Any] = []
            for block in reply.content:
                if block.type == "tool_use":
                    try:
                        results.append({"type": "tool_result", "tool_use_id": block.id, "content": tool(**block.input)})
                    except anthropic.lib.tools.ToolError as exc:
                        results.append({"type": "tool_result", "tool_use_id": block.id, "is_error": True,
                                        "content": [{"type": "text", "text": str(exc)}]})
            if not results:
                break
            messages.append({"role": "user", "content": results})
    first, second, third = api.bodies("/v1/messages")
    assert first["tools"] == [params]
    (clicked,) = tool_results(second)
    assert clicked["tool_use_id"] == "toolu_1" and pixel(image_of(clicked), x, y + 80) == GREEN
    assert wait_state(page, "click")["id"] == "go"
    where, refused = tool_results(third)
    assert where["content"] == [{"type": "text", "text": f"X={x},Y={y}"}]
    assert refused["is_error"] is True and "unknown key 'Bogus'" in refused["content"][0]["text"]

    # The same through tool_result(), from the SDK's own block: a whole tool_result, an error flagged as such.
    block = BetaToolUseBlock(type="tool_use", id="toolu_4", name="computer", input={"action": "screenshot"})
    answer = tool.tool_result(block)
    valid(BetaToolResultBlockParam, answer)
    assert answer["tool_use_id"] == "toolu_4" and "is_error" not in answer and image_of(answer).startswith(b"\x89PNG")
    bad = tool.tool_result(BetaToolUseBlock(type="tool_use", id="toolu_5", name="computer",
                                            input={"action": "zoom", "region": [0, 0, 10, 10]}))
    assert bad["is_error"] is True and "zoom came with computer_20251124" in str(bad["content"])

    # And as a runnable tool of the SDK's tool runner, which finds it by its name, "computer".
    script = [message("tool_use", [tool_use("toolu_6", "computer", {"action": "mouse_move", "coordinate": [9, 9]})]),
              message("end_turn", [{"type": "text", "text": "Moved."}])]
    with scripted_api(script) as api:
        client = anthropic.Anthropic(base_url=api.url, api_key="sk-test", max_retries=0)
        client.beta.messages.tool_runner(model="claude-test", max_tokens=1024, tools=[tool],
                                         messages=[{"role": "user", "content": "Move."}]).until_done()
    first, second = api.bodies("/v1/messages")
    assert first["tools"] == [params]
    (moved,) = tool_results(second)
    assert moved["tool_use_id"] == "toolu_6" and image_of(moved).startswith(b"\x89PNG")

    recorded = steps(router, page)[known:]
    assert [s["action"] for s in recorded] == ["left_click", "cursor_position", "key", "screenshot", "zoom",
                                               "mouse_move"]
    assert [s.get("schema") for s in recorded if "error" not in s] == ["computer_20250124"] * 4
    assert recorded[-1]["cursor"] == [9, 9]
    assert all(s["protocol"] == "anthropic" for s in recorded)


def response(output: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
    """A Responses API reply, as the API writes it."""
    return {"id": f"resp_{len(output)}", "object": "response", "created_at": 1_700_000_000, "model": "cua-test",
            "status": "completed", "output": output, "parallel_tool_calls": False, "tool_choice": "auto",
            "tools": tools, "error": None, "incomplete_details": None, "instructions": None, "metadata": {},
            "temperature": 1.0, "top_p": 1.0}


def computer_call(call_id: str, **fields: Any) -> dict[str, Any]:
    """A ``computer_call`` output item, with one ``action`` or the GA tool's ``actions``."""
    return {"type": "computer_call", "id": "cu_" + call_id, "call_id": call_id, "status": "completed",
            "pending_safety_checks": [], **fields}


def test_the_openai_computer_answers_a_responses_loop(router: RouterProcess, page: Sandbox) -> None:
    go = centre(page, "go")
    name = centre(page, "name")
    known = len(steps(router, page))
    computer = GroveComputer(page)
    tool = computer.to_params()
    assert tool == {"type": "computer_use_preview", "display_width": 1280, "display_height": 800,
                    "environment": "browser"}
    valid(ComputerUsePreviewToolParam, tool)
    script = [
        response([computer_call("call_1", action={"type": "click", "button": "left", "x": go[0], "y": go[1]})],
                 [dict(tool)]),
        # The GA computer tool's batch: click the field, type, press Enter; one screenshot after the last.
        response([computer_call("call_2", actions=[
            {"type": "click", "button": "left", "x": name[0], "y": name[1]},
            {"type": "type", "text": "Grace"}, {"type": "keypress", "keys": ["ENTER"]}])], [dict(tool)]),
        response([{"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                   "content": [{"type": "output_text", "text": "Done.", "annotations": []}]}], [dict(tool)]),
    ]
    with scripted_api(script) as api:
        client = openai.OpenAI(base_url=api.url + "/v1", api_key="sk-test", max_retries=0)
        # The CUA sample's loop: every computer_call answered with its computer_call_output.
        reply = client.responses.create(model="cua-test", tools=[tool], truncation="auto",
                                        input=[{"role": "user", "content": "Press Go, then sign as Grace."}])
        while calls := [item for item in reply.output if item.type == "computer_call"]:
            assert all(isinstance(call, ResponseComputerToolCall) for call in calls)
            outputs = [computer.handle(call) for call in calls]
            reply = client.responses.create(model="cua-test", tools=[tool], truncation="auto",
                                            previous_response_id=reply.id, input=outputs)
    assert reply.output_text == "Done."
    assert wait_state(page, "click")["id"] == "go"
    assert wait_state(page, "submit")["name"] == "Grace"

    _, second, third = api.bodies("/v1/responses")
    for request, call_id in ((second, "call_1"), (third, "call_2")):
        (item,) = request["input"]
        valid(ComputerCallOutput, item)
        TypeAdapter(ResponseInputItemParam).validate_python(item)
        assert item["type"] == "computer_call_output" and item["call_id"] == call_id
        assert item["output"]["type"] == "computer_screenshot"
        assert item["output"]["image_url"].startswith("data:image/png;base64,")
    clicked = base64.b64decode(second["input"][0]["output"]["image_url"].split(",", 1)[1])
    assert pixel(clicked, go[0], go[1] + 80) == GREEN

    recorded = steps(router, page)[known:]
    assert [s["action"] for s in recorded] == ["click", "click", "type", "keypress"]
    assert all(s["protocol"] == "openai" for s in recorded)
    assert recorded[0]["args"] == {"button": "left", "x": go[0], "y": go[1]}


def test_the_openai_computers_own_methods_held_keys_and_safety_checks(router: RouterProcess,
                                                                       page: Sandbox) -> None:
    computer = GroveComputer(page)
    assert computer.get_environment() == "browser" and computer.get_dimensions() == (1280, 800)
    assert computer.get_current_url() == URL  # the page the fixture opened
    assert pixel(base64.b64decode(computer.screenshot()), 5, 795) != GREEN
    known = len(steps(router, page))
    computer.move(300, 300)
    computer.wait()
    computer.wait(200)  # not OpenAI's one second: sent as a wait with its duration
    recorded = steps(router, page)[known:]
    assert [(s["protocol"], s["action"]) for s in recorded] == [("openai", "move"), ("openai", "wait"),
                                                               ("anthropic", "wait")]
    assert recorded[2]["args"] == {"duration": 0.2}

    # A call with a pending safety check runs nothing until the check is acknowledged.
    page.computer.start(browser=URL + "keys.html")
    x, y = centre_of(page, "mod", "/keys.html")
    item = computer_call("call_9", action={"type": "click", "button": "left", "x": x, "y": y, "keys": ["SHIFT"]},
                         pending_safety_checks=[{"id": "sc_1", "code": "malicious_instructions",
                                                 "message": "The page asks for something odd."}])
    call = ResponseComputerToolCall.model_validate(item)
    known = len(steps(router, page))
    with pytest.raises(SafetyCheckDeclined, match="malicious_instructions"):
        computer.handle(call)
    with pytest.raises(SafetyCheckDeclined):
        computer.handle(call, acknowledge=lambda check: False)
    assert len(steps(router, page)) == known
    seen: list[dict[str, Any]] = []
    output = computer.handle(call, acknowledge=lambda check: seen.append(check) is None)
    valid(ComputerCallOutput, output)
    assert output["acknowledged_safety_checks"] == [{"id": "sc_1", "code": "malicious_instructions",
                                                     "message": "The page asks for something odd."}] == seen
    # The click's held keys (the action's `keys`) were down through it.
    assert wait_state(page, "modclick") == {"event": "modclick", "shift": True, "ctrl": False}
    (step,) = steps(router, page)[known:]
    assert step["protocol"] == "openai" and step["args"]["keys"] == ["SHIFT"]
    with pytest.raises(Invalid, match=r"'keys' .*'BOGUS' is not a modifier"):
        computer.handle({**item, "pending_safety_checks": [],
                         "action": {"type": "click", "button": "left", "x": x, "y": y, "keys": ["BOGUS"]}})


def centre_of(sandbox: Sandbox, name: str, path: str) -> tuple[int, int]:
    """The middle of an element of the page at ``path``, once that page has reported its layout."""
    deadline = time.monotonic() + 10
    while not any(e.get("page") == path for e in site_state(sandbox) if e.get("event") == "layout"):
        assert time.monotonic() < deadline, f"{path} reported no layout"
        time.sleep(0.1)
    x, y, w, h = box(sandbox, name, path)
    return x + w // 2, y + h // 2


def test_the_async_tools_on_an_async_sandbox(router: RouterProcess, page: Sandbox) -> None:
    x, y = centre(page, "name")
    known = len(steps(router, page))

    async def run() -> tuple[Any, Any, Any]:
        async with AsyncGrove(router.url, router.key) as client:
            sandbox = await client.attach(page.id)
            toolset = AsyncGroveComputerToolset(sandbox)
            script = [
                message("tool_use", [tool_use("toolu_1", "left_click", {"coordinate": [x, y]}, "computer"),
                                     tool_use("toolu_2", "type", {"text": "Adaxx"}, "computer"),
                                     tool_use("toolu_3", "key", {"text": "BackSpace", "repeat": 2}, "computer"),
                                     tool_use("toolu_4", "key", {"text": "Return"}, "computer")]),
                message("end_turn", [{"type": "text", "text": "Signed."}]),
            ]
            with scripted_api(script) as api:
                model = anthropic.AsyncAnthropic(base_url=api.url, api_key="sk-test", max_retries=0)
                runner = model.beta.messages.tool_runner(model="claude-test", max_tokens=1024, tools=[toolset],
                                                         messages=[{"role": "user", "content": "Sign as Ada."}])
                await runner.until_done()
            tool = AsyncGroveComputerTool(sandbox, version="computer_20251124", enable_zoom=True)
            zoomed = await tool.tool_result(BetaToolUseBlock(type="tool_use", id="toolu_5", name="computer",
                                                             input={"action": "zoom", "region": [0, 0, 320, 200]}))
            computer = AsyncGroveComputer(sandbox)
            output = await computer.handle(computer_call("call_1", action={"type": "screenshot"}))
            return api.bodies("/v1/messages")[1], (tool.to_params(), zoomed), output

    second, (params, zoomed), output = asyncio.run(run())
    assert wait_state(page, "submit")["name"] == "Ada"  # typed, two characters taken back, submitted
    assert [r["content"] for r in tool_results(second)] == [
        [{"type": "text", "text": "Clicked."}], [{"type": "text", "text": "Typed."}],
        [{"type": "text", "text": "Pressed BackSpace."}], [{"type": "text", "text": "Pressed Return."}]]
    assert params == {"type": "computer_20251124", "name": "computer", "display_width_px": 1280,
                      "display_height_px": 800, "enable_zoom": True}
    valid(BetaToolResultBlockParam, zoomed)
    assert image_of(zoomed).startswith(b"\x89PNG")
    valid(ComputerCallOutput, output)
    recorded = steps(router, page)[known:]
    assert [(s["protocol"], s["action"]) for s in recorded] == [
        ("anthropic", "left_click"), ("anthropic", "type"), ("anthropic", "key"), ("anthropic", "key"),
        ("anthropic", "zoom"), ("openai", "screenshot")]
    assert recorded[2]["args"] == {"text": "BackSpace BackSpace"}
