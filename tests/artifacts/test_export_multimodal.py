"""The SFT export of GUI trajectories: computer actions as tool calls, the screens after them as images a
vision-language trainer loads, only the last few kept.

The trajectory is a real one: a real router, a real sandbox with Xvfb and Chromium, actions in both vendors'
vocabularies, harness messages, a refused action; exported by the real CLI, read back with ``datasets`` (what
TRL's SFTTrainer takes) and Pillow.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
from pathlib import Path
from typing import Any
from urllib.parse import quote

import datasets
import pytest
from PIL import Image

from artifacts.export import to_chat
from artifacts.export_screens import IMAGE_FORMATS, ScreenOptions
from executor.computer.png import encode
from grove.cli import trajectories
from grove.core.errors import GroveError, NotFound
from tests.support.readme import readme_block
from tests.support.router_fixtures import RouterProcess
from tests.support.trajectory_samples import make_record

PAGE = ("<title>gui</title><button style='font-size:40px' onclick=\"this.textContent='pressed'\">Press me"
        "</button><br><input style='font-size:40px' autofocus>")
KEEP = 2


@pytest.fixture(scope="module")
def gui_record(router: RouterProcess) -> dict[str, Any]:
    """A finished GUI trajectory, stored: its record as the router serves it."""
    with router.client() as grove:
        sandbox = grove.create(heartbeat=False, memory_mb=2048,
                               metadata={"task_id": "gui-export", "model": "m", "harness": "h"})
        try:
            sandbox.post_event("message", {"role": "system", "content": "You use a browser."})
            sandbox.post_event("message", {"role": "user", "content": "Press the button, then type hello."})
            sandbox.computer.start(browser="data:text/html," + quote(PAGE))
            sandbox.post_event("message", {"role": "assistant", "content": "Let me look at the screen."})
            sandbox.computer.screenshot()
            sandbox.post_event("message", {"role": "assistant", "content": "I will press the button."})
            sandbox.computer.click(90, 110)
            sandbox.computer.type("hello")
            with pytest.raises(GroveError):
                sandbox.computer.act({"action": "left_click", "coordinate": [-5, 5]})  # off the screen: refused
            sandbox.computer.act({"type": "move", "x": 30, "y": 30})  # OpenAI's vocabulary
            sandbox.computer.key("ctrl+a")
            sandbox.exec("echo checked")
            sandbox.post_event("message", {"role": "assistant", "content": "Done."})
            sandbox.post_event("result", {"result": "pass", "reward": 1.0})
        finally:
            sandbox.close()
        record: dict[str, Any] = grove.request("GET", f"/v1/trajectories/{sandbox.id}")
    return record


def export(router: RouterProcess, out: Path, *options: str) -> dict[str, Any]:
    """The one line ``grove trajectories export`` writes for the GUI task."""
    done = router.cli("trajectories", "export", "--task", "gui-export", "-o", str(out), *options)
    assert done.returncode == 0, done.stderr
    lines = out.read_text().splitlines()
    assert len(lines) == 1
    row: dict[str, Any] = json.loads(lines[0])
    return row


def screens(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The record's computer steps that have a screen (the refused one has none)."""
    return [s["screenshot"] for s in record["steps"] if s["type"] == "computer" and "error" not in s]


def check_turns(messages: list[dict[str, Any]]) -> None:
    """The order a chat template expects: the task first, every tool call answered at once and in order by a tool
    message of its id, no tool message without a call, no two assistant turns in a row."""
    assert [m["role"] for m in messages[:2]] == ["system", "user"]
    pending: list[str] = []
    for before, message in zip([None, *messages], messages, strict=False):
        if message["role"] == "tool":
            assert pending and message["tool_call_id"] == pending.pop(0), message
            continue
        assert not pending, f"calls {pending} not answered before a {message['role']} turn"
        if message["role"] == "assistant":
            assert before is None or before["role"] != "assistant"
            pending = [call["id"] for call in message.get("tool_calls") or []]
    assert not pending


def parts(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message["content"]
    return content if isinstance(content, list) else []


def decode(url: str) -> bytes:
    head, data = url.split(",", 1)
    assert head == "data:image/png;base64"
    return base64.b64decode(data)


def test_openai_format_keeps_the_last_screens_as_image_url_parts(router: RouterProcess, gui_record: dict[str, Any],
                                                                 tmp_path: Path) -> None:
    row = export(router, tmp_path / "gui.jsonl", "--keep-screenshots", str(KEEP))
    messages = row["messages"]
    check_turns(messages)
    calls = [(c["function"]["name"], json.loads(c["function"]["arguments"]))
             for m in messages for c in m.get("tool_calls") or []]
    assert calls == [
        ("computer", {"action": "screenshot"}),
        ("computer", {"action": "left_click", "coordinate": [90, 110]}),
        ("computer", {"action": "type", "text": "hello"}),
        ("computer", {"action": "left_click", "coordinate": [-5, 5]}),
        ("computer", {"type": "move", "x": 30, "y": 30}),  # in the vocabulary it was given
        ("computer", {"action": "key", "text": "ctrl+a"}),
        ("bash", {"command": "echo checked"}),
    ]
    # The model's words and its action are one turn; the refused action is answered with its error, no screen.
    assert messages[2]["content"] == "Let me look at the screen."
    refused = messages.index(next(m for m in messages if m["role"] == "tool" and m["content"].startswith("[error")))
    assert messages[refused]["content"].startswith("[error 422") and messages[refused + 1]["role"] == "assistant"

    shown = screens(gui_record)
    slots = [m for m in messages if m["role"] == "user" and isinstance(m["content"], list)]
    assert len(slots) == len(shown) == 5
    for slot in slots[:-KEEP]:
        assert slot["content"] == [{"type": "text", "text": "[screenshot omitted]"}]
    images = [p for m in messages for p in parts(m) if p["type"] == "image_url"]
    assert len(images) == KEEP
    for slot, shot in zip(slots[-KEEP:], shown[-KEEP:], strict=True):
        (part,) = slot["content"]
        png = decode(part["image_url"]["url"])
        assert hashlib.sha256(png).hexdigest() == shot["sha256"]
        with Image.open(io.BytesIO(png)) as image:
            assert image.format == "PNG" and image.size == (shot["width"], shot["height"]) == (1280, 800)
    assert row["metadata"]["screenshots"] == {"steps": 5, "images": KEEP, "omitted": 3, "missing": 0}
    assert row["metadata"]["resolved"] is True
    assert [t["function"]["name"] for t in row["tools"]] == ["computer", "bash"]
    assert "1280x800" in row["tools"][0]["function"]["description"]

    # A trainer's loader takes the file as it is (datasets infers the mixed text/parts content as JSON).
    loaded = datasets.Dataset.from_json(str(tmp_path / "gui.jsonl"), cache_dir=str(tmp_path / "cache"))
    assert len(loaded) == 1 and loaded[0]["messages"] == messages


def test_trl_format_has_image_placeholders_and_the_images_beside(router: RouterProcess, gui_record: dict[str, Any],
                                                                 tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                 ) -> None:
    row = export(router, tmp_path / "trl.jsonl", "--keep-screenshots", "3", "--image-format", "trl")
    messages = row["messages"]
    check_turns(messages)
    assert all(isinstance(m["content"], list) for m in messages)  # else TRL moves the images to the first user turn
    # TRL fills placeholders in every turn but a tool's, in order, and wants exactly as many as there are images.
    placeholders = [p for m in messages if m["role"] != "tool" for p in m["content"] if p["type"] == "image"]
    assert placeholders == [{"type": "image"}] * 3 and len(row["images"]) == 3
    assert not [p for m in messages if m["role"] == "tool" for p in m["content"] if p["type"] != "text"]

    # The README's loading, as written, up to the trainer: datasets reads the JSONL, the images become PIL images.
    (tmp_path / "trl.jsonl").rename(tmp_path / "gui.jsonl")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")  # not the user's ~/.cache
    namespace: dict[str, Any] = {}
    exec(compile(readme_block('ds.cast_column("images", List(Image()))'), "README.md", "exec"), namespace)
    ready = namespace["ds"]
    assert ready.column_names == ["messages", "tools", "metadata", "images"] and len(ready) == 1
    assert all(isinstance(image, Image.Image) for image in ready[0]["images"])
    sizes = [image.size for image in ready[0]["images"]]
    assert sizes == [(s["width"], s["height"]) for s in screens(gui_record)[-3:]]


# -- pure logic: the placeholders that say why ------------------------------------------------------------------


def png(width: int, height: int, shade: int) -> bytes:
    return encode(width, height, bytes([shade]) * (width * height * 3))


def computer_step(action: str, image: bytes | None, **screenshot: Any) -> dict[str, Any]:
    shot = {"sha256": hashlib.sha256(image or b"").hexdigest(), "bytes": len(image or b""), "width": 4,
            "height": 3, "stored": True, **screenshot}
    return {"type": "computer", "t": 1.0, "duration_ms": 5, "protocol": "anthropic", "schema": "computer_20250124",
            "action": action, "args": {}, "screenshot": shot, "cursor": [1, 2], "settle": {}}


@pytest.mark.fast
def test_screens_that_cannot_be_shown_say_why() -> None:
    good, other, wide = png(4, 3, 10), png(4, 3, 20), png(5, 3, 30)
    store = {hashlib.sha256(good).hexdigest(): good, hashlib.sha256(wide).hexdigest(): wide,
             hashlib.sha256(other).hexdigest(): good}  # damaged: not the bytes its hash names
    steps = [
        computer_step("screenshot", good, stored=False, key=None,
                      reason="the trajectory's screenshots reached 256 MiB (grove up --screenshot-mb)"),
        computer_step("screenshot", b"gone"),
        computer_step("screenshot", other),
        computer_step("screenshot", wide),
        computer_step("cursor_position", good),
    ]

    def read(sha: str) -> bytes:
        if sha not in store:
            raise NotFound(f"no screenshot {sha} in this project")
        return store[sha]

    chat = to_chat(make_record("sb-why", steps=steps), ScreenOptions(read, keep=10))
    texts = [p["text"] for m in chat["messages"] if m["role"] == "user" for p in m["content"] if p["type"] == "text"]
    assert texts == [
        "[screenshot not stored: the trajectory's screenshots reached 256 MiB (grove up --screenshot-mb)]",
        f"[screenshot unavailable: no screenshot {hashlib.sha256(b'gone').hexdigest()} in this project]",
        "[screenshot unavailable: the stored image is not the one its hash names]",
        "[screenshot unavailable: the stored image is not 4x3 as recorded]",
    ]
    last = chat["messages"][-1]["content"]
    assert len(last) == 1 and decode(last[0]["image_url"]["url"]) == good
    assert chat["messages"][-2]["content"] == "X=1,Y=2"  # cursor_position answers with the pointer
    assert chat["metadata"]["screenshots"] == {"steps": 5, "images": 1, "omitted": 0, "missing": 4}


@pytest.mark.fast
def test_nothing_is_read_for_omitted_screens_and_options_are_checked() -> None:
    asked: list[str] = []

    def read(sha: str) -> bytes:
        asked.append(sha)
        return b""

    steps = [computer_step("screenshot", png(4, 3, shade)) for shade in range(4)]
    chat = to_chat(make_record("sb-none", steps=steps), ScreenOptions(read, keep=0))
    assert asked == [] and chat["metadata"]["screenshots"]["omitted"] == 4
    plain = to_chat(make_record("sb-plain", steps=steps[:1]))  # no image store given: the call, and a note
    assert plain["messages"][-1]["content"] == [
        {"type": "text", "text": "[screenshot not exported: no image store was given to the export]"}]
    with pytest.raises(ValueError, match="0 or more"):
        ScreenOptions(keep=-1)
    with pytest.raises(ValueError, match="image format"):
        ScreenOptions(image_format="llava")
    assert trajectories.IMAGE_FORMATS == IMAGE_FORMATS  # the CLI's choices, kept without importing the exporter
