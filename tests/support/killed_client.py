"""A trainer killed while it waits on a long command: an SDK client in a process of its own, SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from grove.client import Sandbox
from tests.support.router_fixtures import wait_for

_DIES_MID_COMMAND = """
import sys
from grove.client import Grove
with Grove(sys.argv[1], sys.argv[2]) as grove:
    grove.attach(sys.argv[3]).exec("touch /tmp/began; sleep 600", timeout_s=900)
"""


def kill_a_client_mid_command(url: str, key: str, sandbox: Sandbox) -> float:
    """Have a client of the router at ``url`` run ``sleep 600`` in ``sandbox``; SIGKILL it (its whole process
    group) once the command runs. Returns when it was killed (``time.monotonic()``)."""
    client = subprocess.Popen([sys.executable, "-c", _DIES_MID_COMMAND, url, key, sandbox.id],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        wait_for(lambda: sandbox.exec("test -f /tmp/began").exit_code == 0, 30, 0.3, "the client's command")
    finally:
        os.killpg(client.pid, signal.SIGKILL)
        client.wait(30)
    return time.monotonic()
