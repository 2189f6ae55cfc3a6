"""``grove image build``: a Dockerfile built without Docker, every step in a grove sandbox, through the router's API.

Each filesystem step (``RUN``, ``COPY``/``ADD``, ``WORKDIR``) runs in a fresh sandbox made from the previous
step's image, under the same isolation and egress policy as any sandbox (``--network deny`` by default: a
``RUN`` reaches no address at all). ``COPY`` goes in through the archive API; the sandbox's writable layer is then
committed (``POST /v1/sandboxes/{id}/commit``) as the step's image, one layer over its parent's, so images built
on one base share its layers. Config instructions (``ENV``, ``WORKDIR``, ``USER``, ``ARG``, ``CMD``,
``ENTRYPOINT``, ``LABEL``, ``EXPOSE``) are recorded in the final image's config, named with
``POST /v1/images/{name}`` together with the build's record: the Dockerfile's digest, the base and its digest, and
the build arguments.

A step's image is its cache entry, named ``build-cache-<key>`` for the key: the parent image's digest, the
instruction as expanded, the environment, user and directory it runs with and, for a ``COPY``, the digest of
what it copies. A rebuild finds every unchanged step and runs none of them.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import posixpath
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grove.build.context import BuildContext, directories_tar
from grove.build.dockerfile import LAYER_STEPS, Plan, Step, parse
from grove.build.stages import created, stage_files
from grove.client.aio import AsyncGrove, AsyncSandbox
from grove.core.errors import GroveError, Invalid, NotFound

CACHE_PREFIX = "build-cache-"
_RUN_TIMEOUT_S = 3600.0
_ARCHIVES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".tar.zst")


class BuildFailed(Invalid):
    """A step of the Dockerfile failed; the message names its line."""


@dataclass(frozen=True)
class BuildOptions:
    """What to build and how."""

    dockerfile: Path
    """The Dockerfile."""
    context: Path
    """The build context directory."""
    tag: str
    """The image's name."""
    build_args: dict[str, str] = field(default_factory=dict)
    """``--build-arg`` values."""
    network: str = "deny"
    """``deny`` (default: a RUN reaches no address) or ``allow``."""
    cache: bool = True
    """Reuse the images of unchanged steps."""
    memory_mb: int | None = None
    """Memory of each step's sandbox (None: the router's default)."""


@dataclass
class BuildResult:
    """What a build made."""

    image: str
    digest: str
    steps: int = 0
    """Filesystem steps in the Dockerfile."""
    cached: int = 0
    """Of them, found in the cache (not run)."""
    seconds: float = 0.0


@dataclass
class _State:
    image: str
    digest: str
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = "/"
    user: str = ""
    config: dict[str, Any] = field(default_factory=dict)


async def build(client: AsyncGrove, options: BuildOptions, emit: Callable[[str], None] = print) -> BuildResult:
    """Build ``options.dockerfile``; ``emit`` gets the build's output line by line as it comes."""
    started = time.monotonic()
    try:
        text = options.dockerfile.read_bytes()
    except OSError as exc:
        raise NotFound(f"cannot read the Dockerfile {options.dockerfile}: {exc.strerror}") from None
    plan = parse(text, options.build_args)
    context = BuildContext(options.context)
    result = BuildResult(options.tag, "")
    total, number = sum(len(stage.steps) for stage in plan.stages), 0
    done: dict[str, _State] = {}  # finished stages, by index and by name: what FROM and COPY --from name
    for index, (stage, image) in enumerate(zip(plan.stages, plan.image_bases(), strict=True)):
        if len(plan.stages) > 1:
            emit(f"STAGE {index}{' ' + stage.name if stage.name else ''}: FROM {stage.base}")
        state = await _start(client, stage.base, image, done)
        base_digest = state.digest
        for step in stage.steps:
            number += 1
            emit(f"STEP {number}/{total}: {step.instruction} {step.value}")
            if step.instruction in LAYER_STEPS:
                result.steps += 1
                if await _layer_step(client, options, context, done, step, state, emit):
                    result.cached += 1
            else:
                _config_step(step, state)
        done[str(index)] = state
        if stage.name:
            done[stage.name] = state
    record = {"dockerfile_digest": plan.digest, "base": plan.base, "base_digest": base_digest,
              "build_args": dict(options.build_args)}
    made = await client.request("POST", f"/v1/images/{options.tag}",
                                json_body={"source": state.image, "config": _config(state), "build": record})
    result.digest = str(made["digest"])
    result.seconds = time.monotonic() - started
    emit(f"built {options.tag} {result.digest} ({result.steps} steps, {result.cached} cached, "
         f"{result.seconds:.1f}s)")
    return result


async def _found(client: AsyncGrove, image: str) -> dict[str, Any]:
    """The router's answer for ``image``: its digest and (on a backend that keeps them) its recorded config."""
    try:
        found: dict[str, Any] = await client.request("GET", f"/v1/images/{image}")
    except NotFound as exc:
        raise NotFound(f"FROM {image}: {exc}") from None
    return found


async def _start(client: AsyncGrove, base: str, image: str | None, done: dict[str, _State]) -> _State:
    """A stage's state at its FROM ``base``: the base ``image``'s, or with none the earlier stage's that ``base``
    names (which of the two: :meth:`~grove.build.dockerfile.Plan.image_bases`)."""
    if image is None:
        earlier = done[base.lower()]
        return dataclasses.replace(earlier, env=dict(earlier.env), config=copy.deepcopy(earlier.config))
    found = await _found(client, image)
    return _inherited(image, str(found["digest"]), found.get("config") or {})


async def _digest(client: AsyncGrove, image: str) -> str:
    return str((await _found(client, image))["digest"])


def _inherited(image: str, digest: str, config: dict[str, Any]) -> _State:
    """The build's state at its FROM: the base image's config, as Docker starts from it (its ENV, WORKDIR, USER,
    CMD, labels...), for the Dockerfile's steps to change."""
    env = dict(str(e).partition("=")[::2] for e in config.get("Env") or [] if "=" in str(e))
    rest = {k: v for k, v in config.items() if k not in ("Env", "WorkingDir", "User")}
    return _State(image, digest, env, str(config.get("WorkingDir") or "/"), str(config.get("User") or ""), rest)


def _config_step(step: Step, state: _State) -> None:
    if step.instruction == "ENV":
        state.env.update(step.line_envs)
    elif step.instruction == "USER":
        state.user = " ".join(step.words())
    elif step.instruction in ("CMD", "ENTRYPOINT"):
        state.config["Cmd" if step.instruction == "CMD" else "Entrypoint"] = (
            step.json_form() or ["/bin/sh", "-c", step.value])
    elif step.instruction == "LABEL":
        state.config.setdefault("Labels", {}).update(step.line_labels)
    elif step.instruction == "MAINTAINER":
        state.config.setdefault("Labels", {})["maintainer"] = step.value
    elif step.instruction == "EXPOSE":
        ports = state.config.setdefault("ExposedPorts", [])
        ports.extend(w if "/" in w else f"{w}/tcp" for w in step.words() if w not in ports)
    # ARG: dockerfile-parse has put its value in scope of the steps after it.


def _workdir(state: _State, step: Step) -> str:
    return posixpath.normpath(posixpath.join(state.workdir, " ".join(step.words())))


def image_config(plan: Plan) -> dict[str, Any]:
    """The config (``Env``, ``WorkingDir``, ``User``, ``Cmd``, ...) the image built from ``plan`` records, without
    building it: what a sandbox of that image should start with."""
    state = _State(plan.base, "")
    for step in plan.steps:
        if step.instruction == "WORKDIR":
            state.workdir = _workdir(state, step)
        elif step.instruction not in LAYER_STEPS:
            _config_step(step, state)
    return _config(state)


def _config(state: _State) -> dict[str, Any]:
    return {**state.config, "Env": [f"{k}={v}" for k, v in state.env.items()], "WorkingDir": state.workdir,
            "User": state.user}


async def _layer_step(client: AsyncGrove, options: BuildOptions, context: BuildContext, done: dict[str, _State],
                      step: Step, state: _State, emit: Callable[[str], None]) -> bool:
    """Run one filesystem step (or find it cached); the state moves to its image. Whether it was cached."""
    packed, origin = None, None
    if step.instruction == "WORKDIR":
        state.workdir = _workdir(state, step)
        what = f"WORKDIR {state.workdir}"
    elif step.instruction == "RUN":
        what = f"RUN {json.dumps(step.json_form() or step.value)} args={json.dumps(step.args, sort_keys=True)}"
    else:
        sources, dest, stage = _copy_args(step, state)
        if stage is None:
            packed = context.pack(context.sources(sources, step.where), dest)
            what = f"COPY {packed.digest} to {dest}"
        else:  # the stage's image digest stands for what it holds: the files are fetched only if not cached
            origin = _from_stage(step, stage, done)
            what = f"COPY --from {origin.digest} {json.dumps(sources)} to {dest}"
    key_text = json.dumps([state.digest, what, state.env, state.user, state.workdir], sort_keys=True)
    name = CACHE_PREFIX + hashlib.sha256(key_text.encode()).hexdigest()[:40]
    try:
        if options.cache:
            try:
                state.image, state.digest = name, await _digest(client, name)
                emit("  --> cached")
                return True
            except NotFound:
                pass
        if origin is not None:
            packed = await stage_files(client, origin.image, sources, dest, step.where)
        await _run_step(client, options, step, state, name, packed, emit)
        return False
    finally:
        if packed is not None:
            packed.tar.close()


async def _run_step(client: AsyncGrove, options: BuildOptions, step: Step, state: _State, name: str,
                    packed: Any, emit: Callable[[str], None]) -> None:
    create: dict[str, Any] = {"network": {"egress": options.network}, "env": state.env,
                              "metadata": {"labels": {"grove.build": options.tag}}}
    if options.memory_mb:
        create["memory_mb"] = options.memory_mb
    sandbox = await created(client.create(state.image, **create))
    try:
        if step.instruction == "WORKDIR":
            await sandbox.upload_tar(directories_tar([state.workdir]), "/")
        elif step.instruction == "RUN":
            await _run(sandbox, step, state, emit)
        else:
            await sandbox.upload_tar(packed.tar, "/")
            emit(f"  --> {packed.members} entries copied")
        record = {"dockerfile_digest": "", "base": state.image, "base_digest": state.digest, "step": step.where}
        made = await client.request("POST", f"/v1/sandboxes/{sandbox.id}/commit",
                                    json_body={"image": name, "build": record})
    finally:
        await sandbox.close()
    state.image, state.digest = name, str(made["digest"])
    emit(f"  --> {name}")


async def _run(sandbox: AsyncSandbox, step: Step, state: _State, emit: Callable[[str], None]) -> None:
    command: str | list[str] = step.json_form() or step.value
    env = {**step.args, **state.env}  # ARGs are in a RUN's environment, ENV wins over them
    pending = {"stdout": b"", "stderr": b""}
    result = None
    async for kind, data in sandbox.exec_stream(command, cwd=state.workdir, env=env, user=state.user or None,
                                                timeout_s=_RUN_TIMEOUT_S):
        if kind == "result":
            result = data
            continue
        lines = (pending[kind] + bytes(data)).split(b"\n")
        pending[kind] = lines.pop()
        for line in lines:
            emit("  " + line.decode(errors="replace"))
    for rest in pending.values():
        if rest:
            emit("  " + rest.decode(errors="replace"))
    if result is None:
        raise GroveError(f"{step.where}: the command's result never came")
    if result.exit_code != 0 or result.timed_out:
        why = "timed out" if result.timed_out else f"exited with code {result.exit_code}"
        raise BuildFailed(f"{step.where} failed: the command {why}")


def _from_stage(step: Step, stage: str, done: dict[str, _State]) -> _State:
    origin = done.get(stage.lower())
    if origin is None:
        earlier = ", ".join(sorted(done)) or "none"
        raise Invalid(f"{step.where}: --from={stage} names no earlier stage of this Dockerfile (earlier: {earlier}); "
                      "grove image build copies from earlier stages only, not from other images")
    return origin


def _copy_args(step: Step, state: _State) -> tuple[list[str], str, str | None]:
    """A COPY/ADD's sources, its destination (absolute) and the stage its ``--from`` names (None: the context)."""
    words = step.words()
    stage = None
    if step.instruction == "COPY" and words and words[0].startswith("--from="):
        stage = words.pop(0).partition("=")[2]
    if words and words[0].startswith("--"):
        raise Invalid(f"{step.where}: {words[0].partition('=')[0]} is not supported by grove image build; the files "
                      "are copied as root's (change owners in a RUN step)")
    if len(words) < 2:
        raise Invalid(f"{step.where}: {step.instruction} needs a source and a destination")
    if step.instruction == "ADD":
        if any("://" in w for w in words[:-1]):
            raise Invalid(f"{step.where}: ADD from a URL is not supported; download it in a RUN step")
        if any(w.endswith(_ARCHIVES) for w in words[:-1]):
            raise Invalid(f"{step.where}: ADD of an archive (unpacked by Docker) is not supported; COPY it and "
                          "unpack it in a RUN step")
    dest = words[-1]
    if not dest.startswith("/"):
        dest = posixpath.join(state.workdir, dest) + ("/" if dest.endswith("/") else "")
    return words[:-1], dest, stage
