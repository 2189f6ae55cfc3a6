"""A browser task's site and screen, brought up before the agent acts (inside the trajectory's setup bracket).

The task's ``serve`` command starts in the background in its workdir, in a session of its own (an exec's end
does not take it down; the end of the agent's turn does, as every process the agent left). When ``start_url``
is an http(s) URL on the sandbox's loopback, its port is waited for — a site that never answers is a broken
task, an infrastructure fault with the server's own last words — and then the screen opens Chromium there.
"""

from __future__ import annotations

import shlex
import urllib.parse
from typing import Any

from grove.client import AsyncSandbox
from grove.rollouts.harnesses import InfraFault
from grove.rollouts.tasks import Task

SERVE_LOG = "/tmp/grove-serve.log"
"""Where the site's server writes its output (outside the workdir: no part of the attempt's changes)."""
READY_S = 60.0
"""How long the site may take to answer on its port."""
_LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")
_WAIT = """
import socket, sys, time
host, port, until = sys.argv[1], int(sys.argv[2]), time.monotonic() + float(sys.argv[3])
while True:
    try:
        socket.create_connection((host, port), timeout=1).close()
        sys.exit(0)
    except OSError:
        if time.monotonic() > until:
            sys.exit(1)
        time.sleep(0.05)
"""


def loopback_port(url: str | None) -> tuple[str, int] | None:
    """(host, port) of an http(s) URL on the loopback, whose server runs in the sandbox; None for any other."""
    if not url:
        return None
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or parts.hostname not in _LOOPBACK:
        return None
    host = "127.0.0.1" if parts.hostname == "localhost" else parts.hostname
    return host, parts.port or (443 if parts.scheme == "https" else 80)


async def open_site(sandbox: AsyncSandbox, task: Task) -> dict[str, Any] | None:
    """Start the task's site, wait for it, open the screen at ``start_url``; the display's state (None: no
    ``start_url``)."""
    if task.serve:
        line = f"nohup setsid /bin/sh -c {shlex.quote(task.serve)} >{SERVE_LOG} 2>&1 </dev/null &"
        started = await sandbox.exec(["/bin/sh", "-c", line], cwd=task.workdir, timeout_s=30)
        if not started.ok:
            raise InfraFault(f"the task's serve command could not be started: {started.text[-300:]}",
                             reason="setup_failed")
    where = loopback_port(task.start_url)
    if where is not None:
        await _wait_for(sandbox, task, *where)
    if not task.start_url:
        return None
    return await sandbox.computer.start(browser=task.start_url)


async def _wait_for(sandbox: AsyncSandbox, task: Task, host: str, port: int) -> None:
    """Until something listens on ``host:port`` in the sandbox (python3 if the image has it, else curl)."""
    script = (f"if command -v python3 >/dev/null; then exec python3 -c {shlex.quote(_WAIT)} {host} {port} {READY_S}; "
              f"fi; i=0; while [ $i -lt {int(READY_S * 10)} ]; do "
              f"curl -s -o /dev/null http://{host}:{port}/ && exit 0; sleep 0.1; i=$((i+1)); done; exit 1")
    waited = await sandbox.exec(["/bin/sh", "-c", script], timeout_s=READY_S + 15)
    if waited.ok:
        return
    log = await sandbox.exec(["/bin/sh", "-c", f"tail -c 600 {SERVE_LOG} 2>/dev/null; true"], timeout_s=30)
    said = log.text.strip() or "(it wrote nothing)"
    raise InfraFault(f"the task's site did not answer on {host}:{port} within {READY_S:g}s "
                     f"(serve: {task.serve!r}); its output: {said}", reason="setup_failed")
