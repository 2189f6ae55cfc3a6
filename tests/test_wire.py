"""The JSON every grove surface sends: bytes as text, non-finite numbers as null, always valid JSON."""

from __future__ import annotations

import json

import msgpack
import pytest

from grove.core import wire


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
