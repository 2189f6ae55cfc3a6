"""A Docker Compose task environment read for grove: each service one sandbox of a private network group.

Parsed with PyYAML, then checked against what grove can map (Harbor's convention: the ``main`` service is the
agent's; every other service is a sibling reachable by its name):

- ``image`` (a grove image, or a registry reference the router pulls), ``build`` (a context, ``dockerfile``,
  ``args``: built with ``grove image build``), ``environment``, ``command``, ``entrypoint``, ``working_dir``,
  ``healthcheck`` (``test``, ``interval``, ``timeout``, ``retries``, ``start_period``, ``start_interval``,
  ``disable``) and ``depends_on`` (a list, or conditions ``service_started``, ``service_healthy``,
  ``service_completed_successfully``) are honoured;
- ``expose``, ``container_name``, ``init``, ``labels``, ``pull_policy``, ``stdin_open`` and ``tty`` change
  nothing on grove (every port is open on the private network) and are accepted;
- everything else is refused naming its key: host volumes, ``privileged``, ``network_mode``, published ``ports``
  and the rest would each break grove's isolation or mean something grove does not do.

Compose interpolates ``$VAR`` from the host's environment, and passes a variable named without a value
(``environment: [FOO]``, ``FOO:``) through from it; grove refuses both (the host's environment is not the task's)
and turns ``$$`` into ``$`` as Compose does.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from grove.core.errors import Invalid

MAIN = "main"
"""The agent's service (Harbor's convention)."""
CONDITIONS = ("service_started", "service_healthy", "service_completed_successfully")
_NAME = re.compile(r"^[a-z][a-z0-9-]{0,62}$")
_HONOURED = {"image", "build", "environment", "command", "entrypoint", "working_dir", "healthcheck", "depends_on"}
_NO_EFFECT = {"expose", "container_name", "init", "labels", "pull_policy", "stdin_open", "tty"}
_WHY = {
    "volumes": "mounts host paths or volumes, and a grove sandbox sees no host files (COPY them in with `build:`)",
    "privileged": "would lift the sandbox's isolation, which grove keeps fixed",
    "cap_add": "would lift the sandbox's isolation, which grove keeps fixed",
    "devices": "would give the sandbox host devices",
    "security_opt": "would change the sandbox's isolation, which grove keeps fixed",
    "network_mode": "every service of a grove task is on one private network with the others",
    "networks": "every service of a grove task is on one private network with the others",
    "ports": "publishes ports on the host; services reach each other's ports by name on their private network",
    "pid": "would share the host's or another container's processes",
    "ipc": "would share the host's or another container's IPC",
    "extra_hosts": "services are named by the task's own service names only",
}
_TOP = {"services", "version", "name"}
_VARIABLE = re.compile(r"\$(?!\$)")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(us|ms|s|m|h)")
_UNIT_S = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


class ComposeRefused(Invalid):
    """The compose file asks for something grove cannot map; the message names the key."""


@dataclass(frozen=True)
class Build:
    """A service's ``build:``."""

    context: Path
    dockerfile: Path
    args: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Healthcheck:
    """A service's ``healthcheck:`` (Docker's defaults where it says nothing)."""

    argv: list[str]
    """The check, as argv (``CMD-SHELL`` and a string become ``/bin/sh -c``)."""
    interval_s: float = 30.0
    timeout_s: float = 30.0
    retries: int = 3
    start_period_s: float = 0.0
    start_interval_s: float = 5.0


@dataclass(frozen=True)
class Service:
    """One service of the compose file."""

    name: str
    image: str | None = None
    build: Build | None = None
    environment: dict[str, str] = field(default_factory=dict)
    command: list[str] | None = None
    entrypoint: list[str] | None = None
    working_dir: str | None = None
    healthcheck: Healthcheck | None = None
    depends_on: dict[str, str] = field(default_factory=dict)
    """Service name -> condition (one of :data:`CONDITIONS`)."""


@dataclass(frozen=True)
class Compose:
    """The services of a compose file, ``main`` included when it names it."""

    path: Path
    services: dict[str, Service]

    def order(self) -> list[str]:
        """Every service (``main`` too, even unnamed), each after what it depends on."""
        names = sorted(set(self.services) | {MAIN})
        done: list[str] = []
        visiting: list[str] = []

        def visit(name: str) -> None:
            if name in done:
                return
            if name in visiting:
                cycle = " -> ".join([*visiting[visiting.index(name):], name])
                raise ComposeRefused(f"{self.path}: depends_on makes a cycle ({cycle})")
            visiting.append(name)
            service = self.services.get(name)
            for dep in sorted(service.depends_on) if service else ():
                visit(dep)
            visiting.pop()
            done.append(name)

        for name in names:
            visit(name)
        return done


def load(path: Path) -> Compose:
    """Read and check ``path``; :class:`ComposeRefused` names the first key grove cannot map."""
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ComposeRefused(f"{path}: not a readable compose file ({exc})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("services"), dict) or not raw["services"]:
        raise ComposeRefused(f"{path}: a compose file needs a `services:` mapping with at least one service")
    for key in raw:
        if key not in _TOP and not str(key).startswith("x-"):
            raise ComposeRefused(f"{path}: top-level `{key}:` is not supported by grove's compose mapping "
                                 f"(supported: {', '.join(sorted(_TOP))})")
    services = {}
    for name, body in raw["services"].items():
        services[str(name)] = _service(path, str(name), body)
    for service in services.values():
        for dep in service.depends_on:
            if dep not in services and dep != MAIN:
                raise ComposeRefused(f"{path}: services.{service.name}.depends_on names {dep!r}, which is no service "
                                     "of the file")
    return Compose(path, services)


def _service(path: Path, name: str, body: Any) -> Service:
    where = f"{path}: services.{name}"
    if not _NAME.match(name):
        raise ComposeRefused(f"{where}: a grove service name is a host name (a-z, 0-9, '-', starting with a letter)")
    if not isinstance(body, dict):
        raise ComposeRefused(f"{where}: must be a mapping")
    for key in body:
        if key in _WHY:
            raise ComposeRefused(f"{where}.{key}: grove cannot map this key: it {_WHY[key]}")
        if key not in _HONOURED and key not in _NO_EFFECT:
            raise ComposeRefused(f"{where}.{key}: not supported by grove's compose mapping (supported: "
                                 f"{', '.join(sorted(_HONOURED | _NO_EFFECT))})")
    body = _literal(where, body)
    return Service(
        name, _text(where, body, "image"), _build(where, path.parent, body.get("build")),
        _environment(where, body.get("environment")), _argv(where, body, "command"), _argv(where, body, "entrypoint"),
        _text(where, body, "working_dir"), _healthcheck(where, body.get("healthcheck")),
        _depends_on(where, body.get("depends_on")))


def _literal(where: str, value: Any) -> Any:
    """``value`` with Compose's ``$$`` unescaped; a ``$VAR`` (interpolated from the host by Compose) refused."""
    if isinstance(value, str):
        if _VARIABLE.search(value.replace("$$", "")):
            raise ComposeRefused(f"{where}: {value!r} interpolates a variable from the host's environment, which "
                                 "grove does not pass to a task; write the value, or `$$` for a literal `$`")
        return value.replace("$$", "$")
    if isinstance(value, dict):
        return {k: _literal(f"{where}.{k}", v) for k, v in value.items()}
    if isinstance(value, list):
        return [_literal(where, v) for v in value]
    return value


def _text(where: str, body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise ComposeRefused(f"{where}.{key}: must be a string, got {value!r}")
    return value


def _argv(where: str, body: dict[str, Any], key: str) -> list[str] | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, str):
        return shlex.split(value)  # Compose splits a string command shell-like, without a shell
    if isinstance(value, list) and all(isinstance(v, str | int | float) for v in value):
        return [str(v) for v in value]
    raise ComposeRefused(f"{where}.{key}: must be a string or a list of strings, got {value!r}")


def _pairs(where: str, value: Any) -> dict[str, str]:
    """A mapping or a ``K=V`` list (Compose's two spellings); a key without a value (passed through from the
    host's environment by Compose) is refused."""
    if value is None:
        return {}
    if isinstance(value, list):
        items = [str(v).partition("=") for v in value]
        for k, sep, _ in items:
            if not sep:
                _refuse_host_value(f"{where}.{k}")
        return {k: v for k, _, v in items}
    if isinstance(value, dict):
        for k, v in value.items():
            if v is None:
                _refuse_host_value(f"{where}.{k}")
        return {str(k): _scalar(f"{where}.{k}", v) for k, v in value.items()}
    raise ComposeRefused(f"{where}: must be a mapping or a list of KEY=VALUE, got {value!r}")


def _refuse_host_value(where: str) -> None:
    raise ComposeRefused(f"{where}: has no value, so Compose would take it from the host's environment, which "
                         "grove does not pass to a task; write the value")


def _scalar(where: str, value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    raise ComposeRefused(f"{where}: must be a string or a number, got {value!r}")


def _environment(where: str, value: Any) -> dict[str, str]:
    return _pairs(f"{where}.environment", value)


def _build(where: str, base: Path, value: Any) -> Build | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = {"context": value}
    if not isinstance(value, dict):
        raise ComposeRefused(f"{where}.build: must be a context path or a mapping")
    for key in value:
        if key not in ("context", "dockerfile", "args"):
            raise ComposeRefused(f"{where}.build.{key}: not supported by grove image build (supported: context, "
                                 "dockerfile, args)")
    args = _pairs(f"{where}.build.args", value.get("args"))
    context = (base / str(value.get("context") or ".")).resolve()
    if not context.is_relative_to(base.resolve()):
        raise ComposeRefused(f"{where}.build.context: {value.get('context')!r} leaves the task's environment "
                             "directory")
    if not context.is_dir():
        raise ComposeRefused(f"{where}.build.context: {context} is not a directory")
    dockerfile = (context / str(value.get("dockerfile") or "Dockerfile")).resolve()
    if not dockerfile.is_relative_to(base.resolve()) or not dockerfile.is_file():
        raise ComposeRefused(f"{where}.build.dockerfile: {dockerfile} is not a file of the task's environment")
    return Build(context, dockerfile, args)


def _healthcheck(where: str, value: Any) -> Healthcheck | None:
    where = f"{where}.healthcheck"
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ComposeRefused(f"{where}: must be a mapping")
    known = {"test", "interval", "timeout", "retries", "start_period", "start_interval", "disable"}
    for key in value:
        if key not in known:
            raise ComposeRefused(f"{where}.{key}: not a healthcheck key (known: {', '.join(sorted(known))})")
    test = value.get("test")
    if value.get("disable") is True or test == ["NONE"]:
        return None
    if isinstance(test, str):
        argv = ["/bin/sh", "-c", test]
    elif isinstance(test, list) and test and test[0] == "CMD" and len(test) > 1:
        argv = [str(t) for t in test[1:]]
    elif isinstance(test, list) and len(test) == 2 and test[0] == "CMD-SHELL":
        argv = ["/bin/sh", "-c", str(test[1])]
    else:
        raise ComposeRefused(f"{where}.test: must be a string, [\"CMD\", ARG...] or [\"CMD-SHELL\", COMMAND]")
    given: dict[str, Any] = {}
    if (retries := value.get("retries")) is not None:
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 1:
            raise ComposeRefused(f"{where}.retries: must be a whole number of at least 1, got {retries!r}")
        given["retries"] = retries
    for key in ("interval", "timeout", "start_period", "start_interval"):
        if value.get(key) is not None:
            given[f"{key}_s"] = _seconds(f"{where}.{key}", value[key])
    return Healthcheck(argv, **given)  # what the file leaves out: Healthcheck's (Docker's) defaults


def _seconds(where: str, value: Any) -> float:
    """A Compose duration (``1m30s``, ``500ms``, ``10s``; a bare number is seconds)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    text = str(value).strip()
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ComposeRefused(f"{where}: {value!r} is not a duration (like 10s, 1m30s or 500ms)")
    return sum(float(n) * _UNIT_S[u] for n, u in parts)


def _depends_on(where: str, value: Any) -> dict[str, str]:
    where = f"{where}.depends_on"
    if value is None:
        return {}
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return {v: "service_started" for v in value}
    if not isinstance(value, dict):
        raise ComposeRefused(f"{where}: must be a list of service names or a mapping of them to conditions")
    found = {}
    for name, spec in value.items():
        condition = (spec or {}).get("condition", "service_started") if spec is None or isinstance(spec, dict) else None
        if condition not in CONDITIONS:
            raise ComposeRefused(f"{where}.{name}.condition: must be one of {', '.join(CONDITIONS)}, got "
                                 f"{condition!r}")
        found[str(name)] = str(condition)
    return found
