"""An image's recorded run config (``image.json`` ``config``, the OCI image config's ``Env``, ``WorkingDir`` and
``User``, from a Dockerfile build or a registry pull) applied to the sandboxes made from it, as Docker applies
it to a container: the image's environment under the create's ``env`` (the create's values win), its working
directory unless the create names one.

``User`` is recorded but not applied: the executor has no default user, so commands run as root unless a call
names ``user`` (the Harbor provider passes the image's ``User`` with every exec itself).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from router.models import CreateRequest

_KEYS = ("Env", "WorkingDir", "User")
"""What of an image config a sandbox's start reads (``Cmd``, ``Entrypoint``: nothing; every exec names its command)."""


@runtime_checkable
class ImageConfigs(Protocol):
    """A backend that keeps images with their recorded config (the local backend; Knative's images are the
    cluster registry's, whose config the container runtime itself applies)."""

    async def image_config(self, image: str) -> dict[str, Any]:
        """The image's recorded OCI ``config`` (``{}``: none); NotFound if there is no such image."""


@dataclass(frozen=True)
class ImageRunConfig:
    """What of an image's config a sandbox starts with."""

    env: dict[str, str]
    """``Env``'s ``KEY=value`` entries, in order (a later one wins, as in Docker)."""
    workdir: str | None
    """``WorkingDir`` (absolute), or None."""
    user: str | None
    """``User``, recorded only (see the module docstring)."""
    digest: str
    """``sha256:`` of these three as the image recorded them (canonical JSON)."""

    @classmethod
    def of(cls, config: dict[str, Any]) -> ImageRunConfig | None:
        """The run config of an image config; None if it sets none of ``Env``, ``WorkingDir``, ``User``."""
        kept = {k: config[k] for k in _KEYS if config.get(k)}
        if not kept:
            return None
        env: dict[str, str] = {}
        for entry in kept.get("Env", []):
            key, sep, value = str(entry).partition("=")
            if sep and key:  # Docker keeps `KEY=value` entries only; anything else names no variable
                env[key] = value
        workdir = str(kept.get("WorkingDir") or "") or None
        if workdir is not None and not workdir.startswith("/"):
            workdir = "/" + workdir  # Docker resolves a relative WORKDIR against /
        canonical = json.dumps(kept, sort_keys=True, separators=(",", ":")).encode()
        return cls(env, workdir, str(kept.get("User") or "") or None,
                   "sha256:" + hashlib.sha256(canonical).hexdigest())

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> ImageRunConfig:
        """Rebuild what :meth:`record` wrote."""
        return cls(dict(data.get("env") or {}), data.get("workdir"), data.get("user"), str(data["digest"]))

    def record(self) -> dict[str, Any]:
        """As a sandbox's record, its API answer and its trajectory show it."""
        return {"digest": self.digest, "env": dict(self.env), "workdir": self.workdir, "user": self.user}

    def apply(self, req: CreateRequest, given: frozenset[str]) -> CreateRequest:
        """``req`` with the image's environment under its own and, if its body named no ``workdir``, the
        image's working directory."""
        workdir = self.workdir if self.workdir is not None and "workdir" not in given else req.workdir
        env = {**self.env, **req.env}
        if env == req.env and workdir == req.workdir:
            return req
        return dataclasses.replace(req, env=env, workdir=workdir)


async def run_config_of(backend: object, image: str) -> ImageRunConfig | None:
    """The run config of ``image`` as ``backend`` keeps it; None if it keeps none (or the image sets none)."""
    if not isinstance(backend, ImageConfigs):
        return None
    return ImageRunConfig.of(await backend.image_config(image))
