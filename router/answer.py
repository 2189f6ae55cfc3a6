"""An answer streamed to a caller who may hang up before its end.

A client that leaves mid-answer (a trainer's Ctrl-C, a killed job, an MCP client that has what it wanted) is no
fault of the sandbox: writes to it fail with a ``ConnectionError``, and the answer's source must not read that as
its own connection breaking. :class:`Answer` turns the failed write into :attr:`Answer.gone`, so a relay can stop,
or read on to the end when the trajectory records what it carries.
"""

from __future__ import annotations

import logging

from aiohttp import web

log = logging.getLogger("grove.router")


class Answer:
    """``response`` on its way to the caller of ``request``; writes after the caller hung up are dropped."""

    def __init__(self, request: web.Request, response: web.StreamResponse) -> None:
        self._request = request
        self.response = response
        self.gone = False

    async def start(self) -> None:
        """Send the status and headers."""
        try:
            await self.response.prepare(self._request)
        except ConnectionError:
            self._hung_up()

    async def write(self, chunk: bytes) -> None:
        """Send ``chunk``, unless the caller is gone."""
        if self.gone:
            return
        try:
            await self.response.write(chunk)
        except ConnectionError:
            self._hung_up()

    async def end(self) -> None:
        """Close the answer (the chunked body's last chunk), unless the caller is gone."""
        if self.gone:
            return
        try:
            await self.response.write_eof()
        except ConnectionError:
            self._hung_up()

    def _hung_up(self) -> None:
        self.gone = True
        log.info("the caller of %s %s hung up before the answer's end", self._request.method, self._request.path)
