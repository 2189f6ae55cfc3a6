"""A task's services: programs its agent's tools talk to (a mail server, a database, an API), started before the
agent, checked healthy, and still answering when the check queries their final state.

A task line declares them::

    "services": [{"name": "office", "command": "python3 /srv/office/server.py --port 8025", "port": 8025,
                  "ready": {"http": "/health", "timeout_s": 60}, "in_agent_sandbox": true,
                  "env": {"K": "V"}, "cwd": "/srv/office"}]

With ``in_agent_sandbox: true`` a service runs beside the agent, as a background process of its sandbox
(``/v1/sandboxes/{id}/processes``), reachable there by its name (``http://office:8025/``: the name is added to
the sandbox's ``/etc/hosts``). It starts after the task's files and setup, inside the setup bracket; it is ready
once ``GET http://127.0.0.1:PORT<ready.http>`` answers below 400. One that exits first, or is not ready in time,
is an infrastructure fault of the task (``service_not_ready``, with its last output), retried and never scored.
When the agent's turn ends, every process it left is ended but the services', so an in-place check can query
them (``curl http://office:8025/state``).

By default (no ``in_agent_sandbox``) a service runs in a sibling sandbox of its own (its ``image``, else the
task's), on a private network (``network.group``) shared only with the agent's sandbox and the task's other
siblings, and named in the agent's ``/etc/hosts`` by its address there (:mod:`grove.rollouts.siblings`). The
agent's tools exec only in the agent's sandbox: they reach the sibling's port over the private network, never its
files or processes, and the end of the agent's turn leaves the sibling untouched.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from grove.client import AsyncSandbox
from grove.core.errors import GroveError
from grove.rollouts.fields import Fields
from grove.rollouts.harnesses import InfraFault

_NAME = re.compile(r"^[a-z][a-z0-9-]{0,62}$")
_FIELDS = {"name", "image", "command", "port", "ready", "in_agent_sandbox", "env", "cwd"}
READY_S = 60.0
"""How long a service may take to answer its readiness check, unless its ``ready.timeout_s`` says."""
_PROBE = """
import os, sys, time, urllib.request
pid, url, until = int(sys.argv[1]), sys.argv[2], time.monotonic() + float(sys.argv[3])
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
while True:
    try:
        with opener.open(url, timeout=2) as answer:
            if answer.status < 400:
                sys.exit(0)
    except Exception:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        sys.exit(3)
    if time.monotonic() > until:
        sys.exit(1)
    time.sleep(0.1)
"""


@dataclass(frozen=True)
class Service:
    """One service of a task."""

    name: str
    """Its host name in the agent's sandbox (lower-case letters, digits and dashes)."""
    command: str
    """What runs it (under ``/bin/sh -c``)."""
    port: int
    """The port it listens on, on the sandbox's loopback."""
    ready_http: str
    """The path whose ``GET`` answers below 400 once it is ready."""
    ready_s: float = READY_S
    """How long it may take to get ready."""
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    in_agent_sandbox: bool = False
    image: str | None = None
    """A sibling's image (None: the task's)."""


@dataclass(frozen=True)
class Running:
    """A service that answered its readiness check."""

    service: Service
    pid: int
    """Its process id in its sandbox (in the agent's: also its session's, what the end of the agent's turn
    spares)."""
    sandbox_id: str | None = None
    """A sibling's sandbox (None: the agent's)."""
    address: str | None = None
    """A sibling's address on the private network (None: the agent's loopback)."""


def parse_services(f: Fields) -> tuple[Service, ...]:
    """The task's ``services`` field; every mistake names its entry and field."""
    raw = f.raw.get("services")
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise f.fail("services", "must be a list of {name, command, port, ready: {http: PATH}}")
    services: list[Service] = []
    for i, item in enumerate(raw):
        where = f"services[{i}]"
        if not isinstance(item, dict):
            raise f.fail(where, "must be an object {name, command, port, ready: {http: PATH}}")
        unknown = sorted(set(item) - _FIELDS)
        if unknown:
            raise f.fail(f"{where}.{unknown[0]}", f"is unknown; known: {', '.join(sorted(_FIELDS))}")
        g = Fields(item, f.where, prefix=f"{where}.")
        name = g.text("name", required=True)
        if not _NAME.match(name):
            raise g.fail("name", f"must be a host name (a-z, 0-9, '-', starting with a letter), got {name!r}")
        if name in {s.name for s in services} or name == "localhost":
            raise g.fail("name", f"{name!r} is taken")
        port = item.get("port")
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise g.fail("port", f"must be a port number (1-65535), got {port!r}")
        ready = item.get("ready")
        if not isinstance(ready, dict):
            ready = {}
        path = ready.get("http")
        if not isinstance(path, str) or not path.startswith("/") or set(ready) - {"http", "timeout_s"}:
            raise g.fail("ready", "must be {\"http\": PATH} (PATH starting with '/'; optionally \"timeout_s\"): "
                                  "the service is ready once GET PATH on its port answers below 400")
        ready_s = Fields(ready, f.where, prefix=f"{where}.ready.").number("timeout_s", READY_S)
        inside = item.get("in_agent_sandbox", False)
        if not isinstance(inside, bool):
            raise g.fail("in_agent_sandbox", f"must be true or false, got {inside!r}")
        image = g.text("image") or None
        if inside and image is not None:
            raise g.fail("image", "goes with a sibling sandbox; a service in the agent's sandbox runs from the "
                                  "task's image: leave 'image' out, or 'in_agent_sandbox' to run it beside")
        services.append(Service(name, g.text("command", required=True), port, path, ready_s, g.string_map("env"),
                                g.abspath("cwd") or None, inside, image))
    return tuple(services)


def check_grading(f: Fields, services: tuple[Service, ...], grading: str) -> None:
    """A service's state is reached from the agent's sandbox: its task is graded there (or by a judge)."""
    if services and grading == "isolated":
        raise f.fail("check.grading", "must be \"in-place\" (or the check a 'judge') for a task with services: "
                                      "their final state is what is graded, and the agent's sandbox reaches them")


async def start_services(sandbox: AsyncSandbox, services: tuple[Service, ...],
                         siblings: tuple[Running, ...] = ()) -> list[Running]:
    """Name the siblings (already running) and each service of ``services`` meant for ``sandbox`` in its
    ``/etc/hosts``, start those, wait until they are ready; InfraFault if one is not."""
    services = tuple(s for s in services if s.in_agent_sandbox)
    hosts = [f"{sib.address} {sib.service.name}" for sib in siblings if sib.address]
    hosts += [f"127.0.0.1 {s.name}" for s in services]
    if not hosts:
        return []
    named = await sandbox.exec(["/bin/sh", "-c", f"printf '%s\\n' {' '.join(map(shlex.quote, hosts))} >> /etc/hosts"],
                               timeout_s=30)
    if not named.ok:
        raise InfraFault(f"cannot name the task's services in the sandbox's /etc/hosts: {named.text[-300:]}",
                         reason="service_not_ready")
    running = []
    for service in services:
        try:
            process = await sandbox.processes.start(service.command, env=service.env or None, cwd=service.cwd)
        except GroveError as exc:
            raise InfraFault(f"service {service.name!r} could not be started ({service.command!r}): {exc.message}",
                             reason="service_not_ready") from exc
        running.append(Running(service, process.pid))
    for up in running:
        await ready(sandbox, up)
    return running


async def ready(sandbox: AsyncSandbox, up: Running) -> None:
    """Wait until ``up`` answers its readiness check in ``sandbox``; InfraFault (with its output) if it does not."""
    service = up.service
    url = f"http://127.0.0.1:{service.port}{service.ready_http}"
    probe = await sandbox.exec(["python3", "-c", _PROBE, str(up.pid), url, str(service.ready_s)],
                               timeout_s=service.ready_s + 30)
    if probe.ok:
        return
    state = await sandbox.processes.get(up.pid)
    said = (await sandbox.processes.logs(up.pid))[-600:].decode("utf-8", "replace").strip() or "(it wrote nothing)"
    why = (f"exited with code {state.exit_code} before it answered" if not state.running
           else f"did not answer GET {url} below 400 within {service.ready_s:g}s" if probe.exit_code == 1
           else f"could not be probed (exit {probe.exit_code}: {probe.text[-200:]})")
    raise InfraFault(f"service {service.name!r} {why} (command: {service.command!r}); its output: {said}",
                     reason="service_not_ready")


def stop_script(spared: list[int]) -> str:
    """A shell script ending every process of the sandbox but its executor (PID 1), itself, and the sessions of
    ``spared`` (the services): frozen first, so nothing forks away between the look and the kill."""
    keep = " ".join(str(pid) for pid in spared)
    return (f'keep=" {keep} "; for sig in STOP STOP KILL; do for d in /proc/[0-9]*; do p=${{d#/proc/}}; '
            f'[ "$p" = 1 ] || [ "$p" = $$ ] && continue; '
            f's=$(sed "s/.*) //" "$d/stat" 2>/dev/null | cut -d" " -f4) || continue; [ -n "$s" ] || continue; '
            f'case "$keep" in *" $s "*) continue;; esac; kill -$sig "$p" 2>/dev/null; done; done; true')


def describe(running: list[Running]) -> list[dict[str, Any]]:
    """What the trajectory's setup event says of the services."""
    return [{"name": r.service.name, "pid": r.pid, "port": r.service.port, "url": f"http://{r.service.name}:"
             f"{r.service.port}/", "in_agent_sandbox": r.service.in_agent_sandbox,
             **({"sandbox_id": r.sandbox_id, "address": r.address} if r.sandbox_id else {})} for r in running]
