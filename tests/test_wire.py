"""``grove.core.wire``, what every grove HTTP surface reads and sends: one kept JSON decoder reads what ``json.loads``
read and refuses what it refused; answers carry bytes as text, non-finite numbers as null, and are always valid JSON."""

from __future__ import annotations

import json

import msgpack
import pytest

from grove.core import wire
from grove.core.errors import BadRequest, Invalid

EXEC_ANSWER = {"exit_code": 0, "stdout": "é\n", "stderr": "", "stdout_truncated": False, "timed_out": False,
               "duration_s": 0.0012, "nested": [{"a": [1, 2.5, None]}]}


@pytest.mark.parametrize("body", [
    json.dumps(EXEC_ANSWER).encode(),
    json.dumps(EXEC_ANSWER, ensure_ascii=False).encode(),
    b"\xef\xbb\xbf" + json.dumps(EXEC_ANSWER).encode(),  # a UTF-8 byte order mark, as json.loads takes it
    json.dumps(EXEC_ANSWER).encode("utf-16"),
    json.dumps(EXEC_ANSWER).encode("utf-32-le"),
    b'"\\ud800"',  # a lone surrogate escape, kept as json.loads keeps it
    b"[]",
])
def test_decode_reads_what_json_loads_reads(body: bytes) -> None:
    assert wire.decode(body, "application/json") == json.loads(body)
    assert wire.decode(bytearray(body), None) == json.loads(body)


def test_the_kept_decoder_carries_no_state_from_one_body_to_the_next() -> None:
    with pytest.raises(BadRequest, match="not valid JSON"):
        wire.decode(b'{"command": ["true"', "application/json")
    assert wire.decode(b'{"command": ["true"]}', "application/json") == {"command": ["true"]}
    with pytest.raises(Invalid, match=r"env\.X is NaN"):
        wire.decode(b'{"env": {"X": NaN}}', "application/json")
    assert wire.decode(b'{"timeout_s": 1e308}', "application/json") == {"timeout_s": 1e308}


@pytest.mark.parametrize(("body", "error", "words"), [
    (b'{"reward": Infinity}', Invalid, "reward is Infinity: only finite numbers"),
    (b'[1, -Infinity]', Invalid, r"\[1\] is -Infinity"),
    (b"{'single': 1}", BadRequest, "body is not valid JSON: Expecting property name"),
    (b'{"a": 1} trailing', BadRequest, "Extra data"),
    (b"\xff\xfe\xfd", BadRequest, "body is not valid JSON"),  # not UTF-16 after all: a decode error, a 400
])
def test_bad_json_is_refused_naming_what_is_wrong(body: bytes, error: type[Exception], words: str) -> None:
    with pytest.raises(error, match=words):
        wire.decode(body, "application/json")


def test_bytes_become_text_with_invalid_utf8_replaced_at_any_depth() -> None:
    value = {"stdout": b"caf\xc3\xa9 \xff", "steps": [{"out": bytearray(b"ok")}, (b"t", 1)], "n": None}
    assert json.loads(wire.encode(value, as_msgpack=False)) == {
        "stdout": "café \ufffd", "steps": [{"out": "ok"}, ["t", 1]], "n": None}


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_number_is_null_and_the_rest_is_kept(bad: float) -> None:
    body = wire.encode({"reward": bad, "out": b"x", "ok": [1.5, bad]}, as_msgpack=False)
    assert json.loads(body, parse_constant=lambda name: pytest.fail(f"{name} sent")) == {
        "reward": None, "out": "x", "ok": [1.5, None]}


def test_what_json_cannot_hold_is_still_refused() -> None:
    with pytest.raises(TypeError, match="set is not JSON serializable"):
        wire.encode({"ids": {1, 2}}, as_msgpack=False)


def test_msgpack_keeps_bytes_as_bytes() -> None:
    assert msgpack.unpackb(wire.encode({"stdout": b"\xff"}, as_msgpack=True), raw=False) == {"stdout": b"\xff"}
