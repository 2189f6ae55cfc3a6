"""Harbor's environment provider on grove: ``harbor run --env grove.integrations.harbor:GroveEnvironment``.

Every trial's environment is one grove sandbox (``pip install grove[harbor]``, Python >= 3.12 as Harbor needs):

- a task with ``environment/Dockerfile`` is built with ``grove image build`` (every step in a sandbox) and the
  image cached under a name made of the environment directory's content hash, so later trials and jobs reuse it
  (``force_build`` builds again); a task with a prebuilt ``docker_image`` uses that image (``--ek images=...``
  maps names; a router started with ``--pull-missing`` pulls a registry reference on first use); the router
  applies the image's ENV and WORKDIR, the provider runs every exec as its USER unless Harbor names another;
- ``--ek pool=NAME`` claims each trial's sandbox from a warm pool, which must be of the task's image (for a
  Dockerfile task: ``harbor-`` and its environment's content hash, as ``grove image ls`` shows it once built);
- Harbor's network policy becomes the sandbox's egress: ``no-network`` → deny, ``public`` → allow, an
  allowlist of IPv4 addresses and CIDRs → allow only those (hostnames are refused before the trial starts);
- the sandbox's trajectory is labelled with Harbor's job, trial and task (``harbor.job``, ``harbor.trial``,
  ``harbor.task``), its ``task_id`` is the task's name, its ``harness`` ``harbor`` and its outcome the verifier's
  reward;
- a compose task (``environment/docker-compose.yaml``) is a private network group of sandboxes
  (:mod:`grove.integrations.compose_group`): its ``main`` service (Harbor's convention; without one in the file,
  the task's Dockerfile or image as above) is the agent's sandbox, every other service a sibling reachable by its
  service name, its ``build:`` built like a Dockerfile task's, its ``image:`` mapped by ``--ek images=...``;
  healthchecks and ``depends_on`` are waited for, and what grove cannot map (host volumes, ``privileged``,
  ``network_mode``, published ``ports``...) is refused before the trial starts, naming the key
  (:mod:`grove.integrations.compose`). Harbor's network policy is every service's egress; the siblings are
  deleted with the trial, and reaped by their heartbeat timeout like the agent's sandbox if it is killed.
  Harbor's per-service calls (collect hooks, sidecar artifacts) exec in and download from the siblings.

The SDK heart-beats the sandbox while the trial runs; a trial killed outright stops heart-beating, and the router
deletes its sandbox after ``heartbeat_timeout_s`` (``--ek heartbeat_timeout_s=...``, default 60).
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from harbor.environments.base import BaseEnvironment, ExecResult, ServiceOperationsUnsupportedError
from harbor.environments.capabilities import EnvironmentCapabilities
from harbor.environments.definition import environment_content_hash
from harbor.environments.options import EnvironmentOptions
from harbor.models.task.config import NetworkMode
from harbor.models.trial.paths import EnvironmentPaths
from pydantic import Field

from grove.build.builder import BuildOptions, build
from grove.build.context import directories_tar
from grove.build.dockerfile import parse
from grove.client.aio import DEFAULT_URL, AsyncGrove, AsyncSandbox
from grove.client.shards import split_urls
from grove.core.errors import GroveError, NotFound
from grove.integrations import compose as compose_file
from grove.integrations.compose_group import ComposeGroup

_DOCKERFILE = "Dockerfile"
_COMPOSE = "docker-compose.yaml"  # the name Harbor's own environments read
_TIMEOUT_EXIT = 124  # what `timeout` returns: Harbor's agents read a timed-out command by it


class GroveOptions(EnvironmentOptions):
    """``--ek`` settings of the grove provider."""

    url: str | None = Field(default=None, description="the grove router's URL (default: $GROVE_URL, else the SDK's)")
    api_key: str | None = Field(default=None, description="its API key (default: $GROVE_API_KEY)")
    pool: str | None = Field(default=None, description="claim each trial's sandbox from this warm pool")
    cpu: float | None = Field(default=None, description="CPU limit in cores (default: the task's, else grove's)")
    memory_mb: int | None = Field(default=None, description="memory limit in MiB (default: the task's, else grove's)")
    disk_mb: int | None = Field(default=None, description="writable-layer size in MiB (default: the task's storage)")
    images: dict[str, str] = Field(default_factory=dict,
                                   description="task image name -> grove image name (JSON object)")
    build_network: str = Field(default="deny", pattern="^(deny|allow)$",
                               description="egress of a Dockerfile build's RUN steps: deny (default) or allow")
    heartbeat_timeout_s: float = Field(default=60.0, ge=5,
                                       description="a trial killed outright leaves its sandbox this long at most")


class GroveEnvironment(BaseEnvironment):
    """One grove sandbox per trial environment."""

    options_model = GroveOptions
    options: GroveOptions

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """As every Harbor environment; the network policy is checked here, before any trial starts."""
        self._client: AsyncGrove | None = None
        self._sandbox: AsyncSandbox | None = None
        self._compose: compose_file.Compose | None = None
        self._group: ComposeGroup | None = None
        super().__init__(*args, **kwargs)
        self._network()  # a policy grove cannot enforce exactly is refused now
        if self.extra_docker_compose_paths:
            raise ValueError("--extra-docker-compose: the grove environment reads the task's own "
                             "environment/docker-compose.yaml only; leave the extra compose files out")
        if self._compose is not None and self.options.pool:
            raise ValueError("--ek pool: a compose task's sandboxes join a private network of their own, which a "
                             "pool's sandboxes cannot; leave the pool out for this task")

    @staticmethod
    def type() -> str:
        """Harbor's name for this environment type."""
        return "grove"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        """What grove enforces: no network, or an allowlist of IPv4 addresses and CIDRs; compose tasks (their
        sidecars' exec and downloads; ``stop_service`` is not offered, which Harbor takes as a warning); no GPUs."""
        return EnvironmentCapabilities(disable_internet=True, network_allowlist=True,
                                       network_allowlist_ipv4_addresses=True, network_allowlist_ipv4_cidrs=True,
                                       docker_compose=True)

    @classmethod
    def preflight(cls, kwargs: dict[str, Any] | None = None) -> None:
        """Check the options and that the router answers, before Harbor queues any trial (Harbor 0.26 passes the
        job's ``--ek`` kwargs)."""
        super().preflight(kwargs)
        options = cls.parse_options(kwargs)
        assert isinstance(options, GroveOptions)
        for url in split_urls(options.url or os.environ.get("GROVE_URL") or DEFAULT_URL):  # one per shard
            try:
                urllib.request.urlopen(f"{url}/healthz", timeout=10).close()
            except (urllib.error.URLError, OSError) as exc:
                raise SystemExit(f"the grove router at {url} does not answer ({exc}); start one with `grove up` "
                                 "or pass --ek url=http://HOST:PORT") from None

    def _validate_definition(self) -> None:
        """A Dockerfile, a prebuilt image or a compose file grove can map (read here: a key grove cannot map is
        refused before any trial starts)."""
        if (self.environment_dir / _COMPOSE).exists():
            self._compose = compose_file.load(self.environment_dir / _COMPOSE)
            main = self._compose.services.get(compose_file.MAIN)
            if main is not None and (main.build or main.image):
                return
        if not (self.environment_dir / _DOCKERFILE).exists() and not self.task_env_config.docker_image:
            raise FileNotFoundError(f"{self.environment_dir / _DOCKERFILE} not found and the task names no "
                                    "docker_image: grove has nothing to build or run")

    def _network(self) -> dict[str, Any]:
        policy = self._network_policy
        if policy.network_mode == NetworkMode.NO_NETWORK:
            return {"egress": "deny"}
        if policy.network_mode == NetworkMode.PUBLIC:
            return {"egress": "allow"}
        allow = []
        for host in policy.allowed_hosts:
            try:
                net = ipaddress.ip_network(host, strict=False)
            except ValueError:
                raise ValueError(f"network allowlist entry {host!r}: grove's egress allow-lists take IPv4 addresses "
                                 "and CIDRs, not hostnames") from None
            if net.version != 4:
                raise ValueError(f"network allowlist entry {host!r}: grove's local egress takes IPv4 only")
            allow.append(str(net))
        return {"egress": "allow", "allow": allow}

    def _client_now(self) -> AsyncGrove:
        if self._client is None:
            self._client = AsyncGrove(self.options.url, self.options.api_key)
        return self._client

    async def _image(self, force_build: bool) -> str:
        """The grove image of this task: built (once per environment directory's content) or mapped."""
        dockerfile = self.environment_dir / _DOCKERFILE
        if not dockerfile.exists():
            return self._mapped(str(self.task_env_config.docker_image))
        return await self._built(dockerfile, self.environment_dir, {}, image_name_for(self.environment_dir),
                                 force_build)

    def _mapped(self, name: str) -> str:
        return self.options.images.get(name, name)

    async def _built(self, dockerfile: Path, context: Path, args: dict[str, str], tag: str, force_build: bool) -> str:
        """``tag``, built from ``dockerfile`` unless it exists (``force_build``: built again)."""
        client = self._client_now()
        if not force_build:
            try:
                await client.request("GET", f"/v1/images/{tag}")
                return tag
            except NotFound:
                pass
        options = BuildOptions(dockerfile, context, tag, build_args=args, network=self.options.build_network)
        await build(client, options, lambda line: self.logger.debug("build %s: %s", tag, line))
        return tag

    async def _service_image(self, service: compose_file.Service, force_build: bool) -> str:
        """A compose service's image: its ``build:`` built (cached by the context's content, the Dockerfile's
        bytes, which may lie outside the context, and the arguments), else its ``image:`` mapped; ``main`` without
        either is the task's own."""
        if service.build is not None:
            spec = service.build
            dockerfile = parse(spec.dockerfile.read_bytes(), spec.args).digest
            key = f"{environment_content_hash(spec.context, truncate=64)} {dockerfile} {sorted(spec.args.items())}"
            tag = "harbor-" + hashlib.sha256(key.encode()).hexdigest()[:24]
            return await self._built(spec.dockerfile, spec.context, spec.args, tag, force_build)
        if service.image is not None:
            return self._mapped(service.image)
        return await self._image(force_build)

    async def _pool_of(self, image: str) -> str:
        """The ``pool`` option, checked: a pool of this task's image (a claim runs the pool's image)."""
        pool = str(self.options.pool)
        shown = await self._client_now().request("GET", f"/v1/pools/{pool}")
        if shown["image"] != image:
            raise ValueError(f"--ek pool={pool}: that pool's sandboxes run image {shown['image']!r}, this task's "
                             f"environment is {image!r}; make a pool of {image!r} (grove pool create) or leave "
                             "the pool out")
        return pool

    async def start(self, force_build: bool) -> None:
        """Build or find the task's image, then create the trial's sandbox (for a compose task: the sandboxes of
        its services, the agent's among them)."""
        if self._compose is None:
            self._sandbox = await self._create_main(await self._image(force_build), {}, None, None)
        else:
            group = "harbor-" + hashlib.sha256(self.session_id.encode()).hexdigest()[:24]
            self._group = ComposeGroup(self._client_now(), self._compose, group, {
                "network": self._network(), "heartbeat_timeout_s": self.options.heartbeat_timeout_s,
                "metadata": self._metadata()})

            async def image_of(service: compose_file.Service) -> str:
                return await self._service_image(service, force_build)

            async def make_main(service: compose_file.Service, group: str) -> AsyncSandbox:
                image = await self._service_image(service, force_build)
                return await self._create_main(image, service.environment, service.working_dir, group)

            self._sandbox = await self._group.up(image_of, make_main)
        # Harbor's log directories, writable by the task's user (Docker's providers mount them from the host).
        paths = EnvironmentPaths.for_os(self.os)
        logs = [str(p) for p in (paths.logs_dir, paths.agent_dir, paths.verifier_dir, paths.artifacts_dir)]
        await self._sandbox.upload_tar(directories_tar(logs, 0o777), "/")
        await self._upload_environment_dir_after_start()

    def _metadata(self) -> dict[str, Any]:
        job = self.trial_paths.trial_dir.parent.name
        return {"task_id": self.environment_name, "harness": "harbor",
                "labels": {"harbor.job": job, "harbor.trial": self.session_id, "harbor.task": self.environment_name,
                           **({"harbor.context": str(self.context_id)} if self.context_id else {})}}

    async def _create_main(self, image: str, env: dict[str, str], workdir: str | None,
                           group: str | None) -> AsyncSandbox:
        """The agent's sandbox: the image's ENV and WORKDIR are the router's to apply
        (router/lifecycle/image_config.py), the compose service's and then the task's env and workdir over them."""
        # The image's recorded config: its USER runs every exec that names none (grove has no default user).
        config = (await self._client_now().request("GET", f"/v1/images/{image}")).get("config") or {}
        network = {**self._network(), **({"group": group} if group else {})}
        create: dict[str, Any] = {
            "env": {**env, **(self.task_env_config.env or {}), **self._persistent_env}, "network": network,
            "heartbeat_timeout_s": self.options.heartbeat_timeout_s, "metadata": self._metadata(),
        }
        workdir = self.task_env_config.workdir or workdir
        if workdir or not config.get("WorkingDir"):
            create["workdir"] = workdir or "/"  # Docker's when neither names one
        if self.options.pool:  # the pool's resources: a claim may not ask for others
            create["pool"] = await self._pool_of(image)
        else:
            cpu = self.options.cpu or self.task_env_config.cpus
            memory = self.options.memory_mb or self.task_env_config.memory_mb
            disk = self.options.disk_mb or self.task_env_config.storage_mb
            create.update({k: v for k, v in (("cpu", cpu), ("memory_mb", memory), ("disk_mb", disk)) if v})
        self.default_user = config.get("User") or None
        return await self._client_now().create(image, **create)

    async def stop(self, delete: bool) -> None:
        """Record the verifier's reward as the trajectory's outcome and delete the sandbox (its trajectory is
        stored); without ``delete`` it is left to its heartbeat timeout."""
        try:
            if self._sandbox is not None and delete:
                await self._record_reward(self._sandbox)
                await self._sandbox.close()
        finally:
            self._sandbox = None
            if self._group is not None:
                await self._group.down()
                self._group = None
            if self._client is not None:
                await self._client.close()
                self._client = None

    async def _record_reward(self, sandbox: AsyncSandbox) -> None:
        """The reward Harbor's verifier wrote (``reward.txt``), once it ran: ``pass`` above 0, else ``fail``."""
        path = str(EnvironmentPaths.for_os(self.os).reward_text_path)
        try:
            reward = float((await sandbox.read_file(path)).decode().strip())
        except (GroveError, ValueError, UnicodeDecodeError):
            return  # no verifier ran (the trial failed before it), or it wrote no number: no outcome to record
        await sandbox.post_event("result", {"result": "pass" if reward > 0 else "fail", "reward": reward,
                                            "reason": "Harbor's verifier"})

    def _live(self) -> AsyncSandbox:
        if self._sandbox is None:
            raise RuntimeError("the grove environment is not started")
        return self._sandbox

    async def exec(self, command: str, cwd: str | None = None, env: dict[str, str] | None = None,
                   timeout_sec: int | None = None, user: str | int | None = None) -> ExecResult:
        """Run ``command`` under ``/bin/sh -c``; a timeout is exit code 124 with the output so far."""
        who = user if user is not None else self.default_user
        return await _exec_in(self._live(), command, cwd, env, timeout_sec, who)

    def _service(self, service: str) -> AsyncSandbox:
        if self._group is None:
            raise ServiceOperationsUnsupportedError(f"compose service {service!r}: this task is not a compose task "
                                                    "(it has no services but main)")
        return self._group.sibling(service)

    async def service_exec(self, command: str, *, service: str | None = None, cwd: str | None = None,
                           env: dict[str, str] | None = None, timeout_sec: int | None = None,
                           user: str | int | None = None) -> ExecResult:
        """Run ``command`` in a compose service's sandbox (main: :meth:`exec`), as its own default user."""
        if service is None or self.is_main_service(service):
            return await self.exec(command, cwd=cwd, env=env, timeout_sec=timeout_sec, user=user)
        return await _exec_in(self._service(service), command, cwd, env, timeout_sec, user)

    async def service_download_file(self, source_path: str, target_path: Path | str, *,
                                    service: str | None = None) -> None:
        """Copy a file of a compose service's sandbox to the local machine."""
        if service is None or self.is_main_service(service):
            return await self.download_file(source_path, target_path)
        await _download_file(self._service(service), source_path, target_path)

    async def service_download_dir(self, source_dir: str, target_dir: Path | str, *,
                                   service: str | None = None) -> None:
        """Copy a directory of a compose service's sandbox to the local machine."""
        if service is None or self.is_main_service(service):
            return await self.download_dir(source_dir, target_dir)
        await self._service(service).download(source_dir, target_dir)

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        """Write a local file into the sandbox."""
        data = await asyncio.to_thread(Path(source_path).read_bytes)
        await self._live().write_file(target_path, data, mode=Path(source_path).stat().st_mode & 0o777)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        """Copy a local directory into the sandbox (one tar through the archive API)."""
        await self._live().upload(source_dir, target_dir)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        """Copy a file of the sandbox to the local machine."""
        await _download_file(self._live(), source_path, target_path)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        """Copy a directory of the sandbox to the local machine (overwriting what is there)."""
        await self._live().download(source_dir, target_dir)


async def _exec_in(sandbox: AsyncSandbox, command: str, cwd: str | None, env: dict[str, str] | None,
                   timeout_sec: int | None, user: str | int | None) -> ExecResult:
    """``command`` under ``/bin/sh -c`` in ``sandbox``; a timeout is exit code 124 with the output so far."""
    try:
        result = await sandbox.exec(command, cwd=cwd, env=env, timeout_s=timeout_sec,
                                    user=str(user) if user is not None else None)
    except GroveError as exc:
        return ExecResult(stdout="", stderr=f"grove: {exc}", return_code=1)
    code = _TIMEOUT_EXIT if result.timed_out else result.exit_code
    return ExecResult(stdout=result.stdout.decode(errors="replace"),
                      stderr=result.stderr.decode(errors="replace"), return_code=code)


async def _download_file(sandbox: AsyncSandbox, source_path: str, target_path: Path | str) -> None:
    data = await sandbox.read_file(source_path)
    target = Path(target_path)
    target.parent.mkdir(parents=True, exist_ok=True)
    await asyncio.to_thread(target.write_bytes, data)


def image_name_for(environment_dir: Path) -> str:
    """The grove image a Dockerfile task's environment directory is built as (its content hash)."""
    return "harbor-" + str(environment_content_hash(environment_dir, truncate=24))

