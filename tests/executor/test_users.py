"""The ``user`` of an exec, resolved against a sandbox's passwd and group files."""

from __future__ import annotations

import pytest

from executor.users import RunAs, resolve
from grove.core.errors import Invalid

PASSWD = """root:x:0:0:root:/root:/bin/sh
# a comment
agent:x:1000:1000:Agent:/home/agent:/bin/bash
svc:x:1001:1001::/srv:/usr/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
"""
GROUP = """root:x:0:
agent:x:1000:
svc:x:1001:
docker:x:998:agent,svc
wheel:x:10:agent
nogroup:x:65534:
"""


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("agent", RunAs(1000, 1000, (10, 998), "/home/agent", "agent")),
        ("1000", RunAs(1000, 1000, (10, 998), "/home/agent", "agent")),  # a known uid is that user
        ("svc:docker", RunAs(1001, 998, (), "/srv", "svc")),  # an explicit group: no others
        ("agent:0", RunAs(1000, 0, (), "/home/agent", "agent")),
        ("4242", RunAs(4242, 4242, (), "/", None)),  # unknown numeric ids work, as in docker --user
        ("4242:998", RunAs(4242, 998, (), "/", None)),
        ("nobody", RunAs(65534, 65534, (), "/nonexistent", "nobody")),
    ],
)
def test_resolves(spec: str, expected: RunAs) -> None:
    assert resolve(spec, PASSWD, GROUP) == expected


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("ghost", "no user 'ghost' in the sandbox's /etc/passwd"),
        ("agent:ghosts", "no group 'ghosts' in the sandbox's /etc/group"),
        ("-1", "between 0 and 65535"),
        ("65536", "between 0 and 65535"),
        ("1:70000", "between 0 and 65535"),
        ("", "'user' must be"),
        (":", "'user' must be"),
        ("a:b:c", "'user' must be"),
    ],
)
def test_bad_users_are_named(spec: str, message: str) -> None:
    with pytest.raises(Invalid, match=message.replace("(", r"\(")):
        resolve(spec, PASSWD, GROUP)


def test_an_image_without_the_files_takes_numeric_ids_only() -> None:
    assert resolve("7:8", "", "") == RunAs(7, 8, (), "/", None)
    with pytest.raises(Invalid, match="no user 'agent'"):
        resolve("agent", "", "")
