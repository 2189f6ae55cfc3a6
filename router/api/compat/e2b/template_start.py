"""An E2B template's start command: what E2B runs when a sandbox of the template starts (its code interpreter's
server, for ``code-interpreter-v1``), and the port it waits for before create answers.

grove reads both from the image's recorded config (``grove image build-debian --preset code-interpreter``
records them; a Dockerfile's ``CMD``/``ENTRYPOINT``/``EXPOSE`` too): ``Entrypoint`` + ``Cmd`` is started as a
background process on the sandbox's process table (``/v1/processes``: ``grove ps`` lists it, it ends with the
sandbox, its start is a trajectory step), and create waits until every TCP port of ``ExposedPorts`` accepts a
connection inside the sandbox. An image with no command starts nothing (``base``, grove's ``default``). A
command that exits, or ports that stay closed past the deadline, fail the create (502, 504) with the command's last
output, and the sandbox is deleted.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from grove.core.errors import BadGateway, UpstreamTimeout
from router.api.computer import call
from router.api.processes import log_tail, start_recorded, without_exits
from router.lifecycle.service import SandboxService
from router.ports.tunnels import open_upgraded
from router.records.image_config import ImageConfigs
from router.records.registry import SandboxRecord

READY_TIMEOUT_S = 120.0
"""How long create waits for the start command's ports (a Python kernel starting on a loaded host takes ~15 s)."""
_POLL_S = 0.2


def start_command(config: dict[str, Any]) -> list[str]:
    """The image's start command (``Entrypoint`` then ``Cmd``, as Docker joins them); empty for none."""
    return [str(part) for key in ("Entrypoint", "Cmd") for part in (config.get(key) or [])]


def exposed_ports(config: dict[str, Any]) -> list[int]:
    """The TCP ports of the image's ``ExposedPorts`` (``{"49999/tcp": {}}``), in order."""
    ports = []
    for name in config.get("ExposedPorts") or {}:
        number, _, protocol = str(name).partition("/")
        if number.isdigit() and protocol in ("", "tcp") and 0 < int(number) < 65536:
            ports.append(int(number))
    return sorted(ports)


async def start_template(service: SandboxService, record: SandboxRecord) -> None:
    """Start the image's command in the new sandbox and wait for its ports: ``BadGateway`` (502) if it exits first,
    ``UpstreamTimeout`` (504) if the ports stay closed, each with its last output (the caller deletes the
    sandbox). A broken template is not back-pressure: no 503 telling the client to retry."""
    backend = service.backend
    if not isinstance(backend, ImageConfigs):
        return
    config = await backend.image_config(record.request.image)
    argv = start_command(config)
    if not argv:
        return
    started = without_exits(service, record, await start_recorded(service, record, {"command": argv}))
    pid = int(started["pid"])
    deadline = time.monotonic() + READY_TIMEOUT_S
    for port in exposed_ports(config):
        while not await _accepts(service, record, port):
            state = without_exits(service, record, await call(service, record, "GET", f"/v1/processes/{pid}", None))
            if state.get("status") != "running":
                raise BadGateway(f"the template's start command {argv} exited with {state.get('exit_code')} "
                                 f"before port {port} answered: {await _tail(service, record, pid)}")
            if time.monotonic() > deadline:
                raise UpstreamTimeout(f"the template's start command {argv} did not open port {port} within "
                                      f"{READY_TIMEOUT_S:g}s: {await _tail(service, record, pid)}")
            await asyncio.sleep(_POLL_S)


async def _accepts(service: SandboxService, record: SandboxRecord, port: int) -> bool:
    """Whether something in the sandbox accepts a connection on ``port`` (the executor connects to it)."""
    with service.calling(record):
        endpoint = await service.endpoint(record)
    try:
        sock = await open_upgraded(endpoint, f"/v1/ports/{port}/tunnel", "grove-tunnel")
    except BadGateway:  # the executor's "nothing listens on port N" (a lost executor shows in the next call)
        return False
    sock.close()
    return True


async def _tail(service: SandboxService, record: SandboxRecord, pid: int) -> str:
    """The end of the command's output (what it said before failing), for the error's message."""
    tail = await log_tail(service, record, pid)
    if tail is None:
        return "its output could not be read"
    text = tail.decode(errors="replace")
    return f"its output ends {text!r}" if text else "it printed nothing"
