"""A task's setup in a sandbox: its files in, its setup commands run, bracketed as setup in the trajectory.

The agent's sandbox gets it, and so does every isolated grader (:mod:`grove.rollouts.isolated`): the state after
setup is the base an attempt's changes are taken against, and put back onto. The agent's sandbox then gets the
task's services (:mod:`grove.rollouts.services`), and its site and screen if it is a browser task
(:mod:`grove.rollouts.browser.site`): still setup, not the agent's doing, and after the base was taken (what the
site writes as it runs is the attempt's doing).
"""

from __future__ import annotations

from pathlib import Path

from grove.client import AsyncSandbox
from grove.client.upload import open_tarball
from grove.rollouts.browser.site import open_site
from grove.rollouts.changes import Manifest, manifest
from grove.rollouts.harnesses import InfraFault
from grove.rollouts.services import Running, describe, start_services
from grove.rollouts.tasks import Task


async def setup(sandbox: AsyncSandbox, task: Task, *, prompt: bool, site: bool = False,
                services: list[Running] | None = None, siblings: tuple[Running, ...] = ()) -> Manifest:
    """Put the task's files in and run its setup; with ``prompt``, the task as the agent's first message; with
    ``site``, a browser task's site started and its screen opened; given ``services`` (a list to fill), the
    task's services meant for the agent's sandbox started and checked ready, and added to it, after ``siblings``
    (services already running in sibling sandboxes: named in its ``/etc/hosts``). Returns the workdir's manifest
    after setup (taken as part of it: the base of the attempt's changes)."""
    await sandbox.post_event("setup", {"status": "started"})
    await put_files(sandbox, task)
    for command in task.setup:
        result = await sandbox.exec(command, cwd=task.workdir, timeout_s=task.timeout_s)
        if not result.ok:
            tail = (result.stderr or result.stdout)[-300:].decode("utf-8", "replace")
            raise InfraFault(f"setup command {command!r} failed (exit {result.exit_code}): {tail}",
                             reason="setup_failed")
    base = await manifest(sandbox, task.workdir)
    if services is not None:
        services.extend(siblings)
        services.extend(await start_services(sandbox, task.services, siblings))
    if site:
        await open_site(sandbox, task)
    # One call: the end of setup, then (for the agent) the task as its first message.
    finished: dict[str, object] = {"status": "finished"}
    if services:
        finished["services"] = describe(services)
    if task.volatile:  # for a replay: these commands' outputs may differ (artifacts.replay)
        finished["volatile"] = list(task.volatile)
    events = [{"kind": "setup", "data": finished}]
    if prompt:
        events.append({"kind": "message", "data": {"role": "user", "content": task.prompt}})
    await sandbox.client.request("POST", f"/v1/sandboxes/{sandbox.id}/events", json_body={"events": events})
    return base


async def put_files(sandbox: AsyncSandbox, task: Task) -> None:
    """The task's files into ``sandbox`` (the agent's, a grader's, a sibling service's)."""
    if isinstance(task.files, dict):
        for path, content in task.files.items():
            await sandbox.write_file(path if path.startswith("/") else f"{task.workdir}/{path}", content)
    elif task.files:
        source = Path(task.files)
        if source.is_dir():
            await sandbox.upload(source, task.workdir)
        else:
            with open_tarball(source) as tarball:
                await sandbox.upload_tar(tarball, task.workdir)
