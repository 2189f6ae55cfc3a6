"""Issue 29, low 6: a CR or LF in the viewer's ``next`` is a 400, not a dropped connection.

Before the fix the login opened a session, then aiohttp refused the ``Location`` header with the CR/LF in
it: the router dropped the connection and logged a traceback, and the session it had just opened stayed
in the table. Now the target is checked before any session is opened.
"""

from __future__ import annotations

from urllib.parse import urlencode

import pytest

from tests.support.router_fixtures import RouterProcess, error_of

FORM = {"Content-Type": "application/x-www-form-urlencoded"}


@pytest.mark.parametrize("bad", ["/ui/x\r\nSet-Cookie: planted=1", "/ui/\n", "/ui/\x00", "/ui/\x7f"])
def test_a_control_character_in_next_is_refused(router: RouterProcess, bad: str) -> None:
    before = router.log().count("Traceback")
    body = urlencode({"key": router.key, "next": bad}).encode()
    reply = router.http("POST", "/ui/login", body, headers={**FORM, "Origin": router.url}, auth=False)
    assert reply.status == 400 and "control character" in error_of(reply)["message"], reply.body
    assert "Set-Cookie" not in reply.headers and "Location" not in reply.headers
    reply = router.http("GET", "/ui/login?" + urlencode({"next": bad}), auth=False)
    assert reply.status == 400, reply.body
    assert router.log().count("Traceback") == before, router.log()[-2000:]


def test_a_plain_next_still_logs_in(router: RouterProcess) -> None:
    body = urlencode({"key": router.key, "next": "/ui/runs"}).encode()
    reply = router.http("POST", "/ui/login", body, headers={**FORM, "Origin": router.url}, auth=False)
    assert reply.status == 303 and reply.headers["Location"] == "/ui/runs" and "Set-Cookie" in reply.headers
