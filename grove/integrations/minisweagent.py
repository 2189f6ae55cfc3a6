"""mini-swe-agent on grove: :class:`GroveEnvironment` runs the agent's commands in a grove sandbox.

In Python::

    from grove.integrations.minisweagent import GroveEnvironment
    with GroveEnvironment(image="default", memory_mb=1024, timeout=60, task_id="t1", model="my-model") as env:
        agent = DefaultAgent(model, env, **agent_config)
        agent.run(task)
        env.post_result("pass", reward=1.0)      # the task's result, for the trajectory's outcome

In a mini-swe-agent config file (or ``-c environment.environment_class=...`` on its CLI)::

    environment:
      environment_class: grove.integrations.minisweagent.GroveEnvironment
      image: default
      cwd: /workspace
      timeout: 60
      task_id: my-task

The router is reached through ``GROVE_URL`` and ``GROVE_API_KEY`` (or ``url=``/``api_key=``), like the
SDK. The sandbox is created when the environment is, with grove's create options as keyword arguments,
and deleted by :meth:`GroveEnvironment.close` (also ``cleanup()``, mini-swe-agent's own hook, and the end
of a ``with`` block). An environment dropped without either still has its sandbox deleted when it is
garbage-collected or the interpreter exits (a :func:`weakref.finalize` doing one plain HTTP DELETE — no
``__del__``, no event loop), since mini-swe-agent's batch runners never call ``cleanup()``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import platform
import threading
import urllib.request
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import minisweagent
from minisweagent.exceptions import Submitted
from minisweagent.utils.serialize import recursive_merge

from grove.client import DEFAULT_URL, ExecResult, Grove, Sandbox
from grove.core.errors import GroveError, Invalid

SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


@dataclass
class GroveEnvironmentConfig:
    """mini-swe-agent's environment settings plus grove's create options (``POST /v1/sandboxes``)."""

    image: str = "default"
    """The grove image (``grove image ls``)."""
    cwd: str = ""
    """Working directory of commands; empty: the sandbox's ``workdir``."""
    workdir: str = "/workspace"
    """The sandbox's default working directory (created with it)."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment of every command (the sandbox's ``env``)."""
    forward_env: list[str] = field(default_factory=list)
    """Variables copied from this process's environment into ``env`` when set here (``env`` wins)."""
    timeout: int = 30
    """Per-command timeout in seconds (grove kills the command's whole process tree at it)."""
    interpreter: list[str] = field(default_factory=lambda: ["bash", "-c"])
    """argv prefix the command is appended to; empty: the command string runs under ``/bin/sh -c``."""
    cpu: float = 1.0
    """CPU limit in cores."""
    memory_mb: int = 1024
    """Memory limit in MiB."""
    pids_max: int = 512
    """Most processes and threads in the sandbox."""
    disk_mb: int | None = None
    """Disk quota in MiB (grove's default, 10 GiB, when None)."""
    network: dict[str, Any] | None = None
    """Egress policy, e.g. ``{"egress": "deny"}`` (grove's default)."""
    ttl_s: float | None = None
    """Lifetime of the sandbox (grove's default when None)."""
    idle_timeout_s: float | None = None
    """Idle time before the sandbox scales to zero (grove's default when None)."""
    heartbeat_timeout_s: float | None = None
    """Silence after which grove deletes the sandbox (the client heart-beats in the background)."""
    max_output_bytes: int | None = None
    """Per-stream output cap of a command (grove's default, 1 MiB, when None)."""
    task_id: str | None = None
    """Recorded in the trajectory (and filterable): the task this run works on."""
    model: str | None = None
    """Recorded in the trajectory: the policy model."""
    harness: str = "mini-swe-agent"
    """Recorded in the trajectory: the harness."""
    harness_version: str = minisweagent.__version__
    """Recorded in the trajectory: the harness version (the installed mini-swe-agent's by default)."""
    labels: dict[str, str] = field(default_factory=dict)
    """Free labels, filterable with ``GET /v1/sandboxes?label=k=v``."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """The create call's ``metadata``, as the SDK's ``create`` takes it; its keys win over the fields above
    (``labels`` are merged)."""
    url: str | None = None
    """The router; ``GROVE_URL`` (then ``http://127.0.0.1:8470``) when None."""
    api_key: str | None = field(default=None, repr=False)
    """The API key; ``GROVE_API_KEY`` when None. Never serialized."""

    def public(self) -> dict[str, Any]:
        """The settings without the API key (what trajectories and template variables may show)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "api_key"}

    def merged_metadata(self) -> dict[str, Any]:
        """The trajectory's metadata: the fields, overridden by ``metadata`` (labels merged)."""
        given = dict(self.metadata)
        labels = {**self.labels, **(given.pop("labels", None) or {})}
        base = {"task_id": self.task_id, "model": self.model, "harness": self.harness,
                "harness_version": self.harness_version}
        return {**base, **given, "labels": labels}

    def create_options(self) -> dict[str, Any]:
        """The body of grove's create call."""
        env = {k: v for k in self.forward_env if (v := os.environ.get(k)) is not None}
        options: dict[str, Any] = {
            "cpu": self.cpu,
            "memory_mb": self.memory_mb,
            "pids_max": self.pids_max,
            "env": {**env, **self.env},
            "workdir": self.workdir,
            "metadata": self.merged_metadata(),
        }
        for name in ("network", "ttl_s", "idle_timeout_s", "heartbeat_timeout_s", "disk_mb"):
            if (value := getattr(self, name)) is not None:
                options[name] = value
        return options


class GroveEnvironment:
    """A mini-swe-agent environment whose commands run in a grove sandbox (created here, deleted by close)."""

    def __init__(self, *, config_class: type[GroveEnvironmentConfig] = GroveEnvironmentConfig,
                 sandbox: Sandbox | None = None, **kwargs: Any) -> None:
        """Create a sandbox from the config; or, given ``sandbox``, act in that one (its owner — e.g. grove's
        rollout runner — made it and deletes it; this environment's ``close`` then leaves it alone)."""
        self.config = config_class(**kwargs)
        self.grove: Grove | None = None
        if sandbox is not None:
            self.sandbox: Sandbox = sandbox
            self._finalizer: Any = weakref.finalize(self, lambda: None)
            return
        url = (self.config.url or os.environ.get("GROVE_URL") or DEFAULT_URL).rstrip("/")
        key = self.config.api_key or os.environ.get("GROVE_API_KEY")
        if not key:
            raise Invalid("no grove API key: set GROVE_API_KEY or pass api_key=")
        self.grove = Grove(url, key)
        try:
            self.sandbox = self.grove.create(self.config.image, **self.config.create_options())
        except BaseException:
            self.grove.close()
            raise
        self._finalizer = weakref.finalize(self, _abandon, self.grove, url, key, self.sandbox.id)

    # -- mini-swe-agent's interface ------------------------------------------------------------------

    def execute(self, action: dict[str, Any] | str, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        """Run one action's command; ``{"output", "returncode", "exception_info"}`` like mini-swe-agent's
        own environments (a timeout: returncode -1 and the output so far). Raises ``Submitted`` when the
        output starts with the submit marker."""
        command = str(action.get("command", "")) if isinstance(action, dict) else action
        limit = timeout or self.config.timeout
        argv: str | list[str] = [*self.config.interpreter, command] if self.config.interpreter else command
        try:
            result = self.sandbox.exec(argv, cwd=cwd or self.config.cwd or None, timeout_s=limit,
                                       max_output_bytes=self.config.max_output_bytes)
            output = _observation(result, command, limit)
        except GroveError as exc:
            # The environment failed, not the command; grove notes it in the trajectory as an infra error.
            output = {
                "output": "",
                "returncode": -1,
                "exception_info": f"An error occurred while executing the command: {exc}",
                "extra": {"exception_type": type(exc).__name__, "exception": str(exc),
                          "infra_error": exc.status >= 500},
            }
        _check_finished(output)
        return output

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        """The config, this machine's ``platform.uname()`` (as mini's prompts expect) and the sandbox id."""
        extra = {"sandbox_id": self.sandbox.id}
        return recursive_merge(self.config.public(), platform.uname()._asdict(), extra, kwargs)

    def serialize(self) -> dict[str, Any]:
        """What mini-swe-agent saves with its trajectory."""
        return {
            "info": {
                "config": {
                    "environment": self.config.public(),
                    "environment_type": f"{type(self).__module__}.{type(self).__name__}",
                },
                "grove": {"sandbox_id": self.sandbox.id, "image_digest": self.sandbox.info.get("image_digest"),
                          "url": self.sandbox.inner.client.url},
            }
        }

    # -- grove extras --------------------------------------------------------------------------------

    def upload(self, local_dir: str | Path, remote_dir: str) -> int:
        """Copy a local directory into the sandbox; the member count."""
        return self.sandbox.upload(local_dir, remote_dir)

    def download(self, remote_dir: str, local_dir: str | Path) -> None:
        """Copy a sandbox directory out."""
        self.sandbox.download(remote_dir, local_dir)

    def write_file(self, path: str, data: bytes | str) -> None:
        """Write one file in the sandbox."""
        self.sandbox.write_file(path, data)

    def read_file(self, path: str) -> bytes:
        """Read one file of the sandbox."""
        return self.sandbox.read_file(path)

    def post_event(self, kind: str, data: Any) -> dict[str, Any]:
        """Append a harness event (a model message, a reward, …) to the sandbox's trajectory."""
        return self.sandbox.post_event(kind, data)

    def post_result(self, result: str, *, reward: float | None = None, reason: str | None = None) -> dict[str, Any]:
        """The task's result (``pass``/``fail``), which becomes the trajectory's outcome."""
        return self.post_event("result", {"result": result, "reward": reward, "reason": reason})

    def close(self) -> None:
        """Delete the sandbox and close the client (idempotent)."""
        if not self._finalizer.detach() or self.grove is None:
            return  # closed already, or the sandbox is not ours to delete
        try:
            self.sandbox.close()
        finally:
            self.grove.close()

    def cleanup(self) -> None:
        """mini-swe-agent's name for :meth:`close`."""
        self.close()

    def __enter__(self) -> GroveEnvironment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _observation(result: ExecResult, command: str, timeout: int) -> dict[str, Any]:
    # mini's environments merge stderr into stdout; grove keeps them apart, so stderr follows stdout.
    text = (result.stdout + result.stderr).decode("utf-8", "replace")
    if result.timed_out:
        message = f"Command '{command}' timed out after {timeout} seconds"
        return {
            "output": text,
            "returncode": -1,
            "exception_info": f"An error occurred while executing the command: {message}",
            "extra": {"exception_type": "TimeoutExpired", "exception": message},
        }
    return {"output": text, "returncode": result.exit_code, "exception_info": ""}


def _check_finished(output: dict[str, Any]) -> None:
    """mini-swe-agent's submission convention: the marker as the first line of a successful command."""
    lines = str(output.get("output", "")).lstrip().splitlines(keepends=True)
    if lines and lines[0].strip() == SUBMIT_MARKER and output["returncode"] == 0:
        submission = "".join(lines[1:])
        raise Submitted(
            {"role": "exit", "content": submission, "extra": {"exit_status": "Submitted", "submission": submission}}
        )


def _abandon(grove: Grove, url: str, key: str, sandbox_id: str) -> None:
    """Finalizer of an environment nobody closed: delete its sandbox with one blocking HTTP call (safe in any
    thread, the client's own included), then close the client from a thread of its own."""
    request = urllib.request.Request(f"{url}/v1/sandboxes/{sandbox_id}", method="DELETE",
                                     headers={"Authorization": f"Bearer {key}"})
    with contextlib.suppress(Exception), urllib.request.urlopen(request, timeout=30):
        pass
    with contextlib.suppress(RuntimeError):  # at interpreter shutdown no thread may start: nothing to close then
        threading.Thread(target=grove.close, name="grove-env-close", daemon=True).start()
