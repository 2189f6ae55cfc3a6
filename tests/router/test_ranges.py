"""Which bytes a ``Range`` header asks for (RFC 9110), pure logic."""

from __future__ import annotations

import pytest

from grove.core.errors import RangeNotSatisfiable
from router.api.ranges import ByteRange, requested

pytestmark = pytest.mark.fast


@pytest.mark.parametrize(("header", "expected"), [
    ("bytes=0-9", ByteRange(0, 9, 100)),
    ("bytes=90-", ByteRange(90, 99, 100)),
    ("bytes=90-500", ByteRange(90, 99, 100)),
    ("bytes=-10", ByteRange(90, 99, 100)),
    ("bytes=-500", ByteRange(0, 99, 100)),
    (None, None),
    ("bytes=5-1", None),        # invalid: ignored, the whole object
    ("bytes=0-1,4-5", None),    # several ranges: the whole object
    ("items=0-1", None),
    ("bytes=-", None),
    ("bytes=x-1", None),
])
def test_ranges(header: str | None, expected: ByteRange | None) -> None:
    assert requested(header, 100) == expected


@pytest.mark.parametrize(("header", "size"), [("bytes=100-", 100), ("bytes=200-300", 100), ("bytes=-0", 100),
                                              ("bytes=0-", 0), ("bytes=-5", 0)])
def test_past_the_end_is_not_satisfiable(header: str, size: int) -> None:
    with pytest.raises(RangeNotSatisfiable):
        requested(header, size)


def test_if_range_serves_the_whole_object_once_it_changed() -> None:
    assert requested("bytes=5-", 100, if_range='"abc"', etag="abc") == ByteRange(5, 99, 100)
    assert requested("bytes=5-", 100, if_range='"old"', etag="abc") is None
    assert requested("bytes=5-", 100, if_range="Tue, 01 Dec 2026 00:00:00 GMT", etag="abc") is None
    assert ByteRange(5, 99, 100).content_range() == "bytes 5-99/100" and ByteRange(5, 99, 100).length == 95
