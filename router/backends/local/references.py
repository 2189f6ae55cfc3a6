"""Registry image references (``registry/name:tag``, ``name@sha256:...``) as the local image store names them.

A pulled image is named by the reference exactly as the user gave it (no ``docker.io/library/``
added), so that a create names the image the same way a Kubernetes pod spec would. Parsing follows
the distribution project's reference grammar, narrowed to what registries accept in practice.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from grove.core.errors import Invalid

_COMPONENT = r"[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*"
_HOST = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*|\[[0-9a-fA-F:]+\])"
_REFERENCE = re.compile(
    rf"(?:(?P<host>{_HOST}(?::[0-9]+)?)/)?"
    rf"(?P<path>{_COMPONENT}(?:/{_COMPONENT})*)"
    r"(?::(?P<tag>[\w][\w.-]{0,127}))?"
    r"(?:@(?P<digest>sha256:[0-9a-f]{64}))?"
)
DEFAULT_REGISTRY = "docker.io"


@dataclass(frozen=True)
class Reference:
    """One parsed reference."""

    given: str
    """The reference as the user wrote it (the image's name in the store)."""
    registry: str
    """The registry host (``docker.io`` when the reference names none)."""
    repository: str
    """The repository path as given, without registry, tag or digest."""
    tag: str | None
    """The tag, if any."""
    digest: str | None
    """The ``sha256:`` digest, if the reference pins one."""

    def at(self, digest: str) -> str:
        """This reference's repository, spelt as given, pinned to ``digest`` (what to copy, so that a tag
        moving meanwhile cannot make the copy differ from what was inspected)."""
        name = self.given.split("@", 1)[0]
        if self.tag is not None:
            name = name[: -len(self.tag) - 1]
        return f"{name}@{digest}"


def is_reference(name: str) -> bool:
    """Whether ``name`` can only be a registry reference (it has a registry, a path, a tag or a digest)."""
    return any(c in name for c in "/:@")


def parse(ref: str) -> Reference:
    """Parse ``ref``; Invalid, saying what a reference looks like, if it is not one."""
    match = _REFERENCE.fullmatch(ref) if len(ref) <= 255 else None
    host = match["host"] if match is not None else None
    # Without a registry part, the first component is a Docker Hub path ("library/python" or "python").
    on_hub = host is not None and not ("." in host or ":" in host or host == "localhost" or host.startswith("["))
    if match is None or (on_hub and not re.fullmatch(_COMPONENT, str(host))):
        raise Invalid(
            f"invalid image name or reference {ref!r}: expected [registry[:port]/]name[:tag][@sha256:<64 hex>] "
            "with a lowercase name, e.g. 127.0.0.1:5000/team/app:v1 or python:3.11-slim"
        )
    if on_hub:
        return Reference(ref, DEFAULT_REGISTRY, f"{host}/{match['path']}", match["tag"], match["digest"])
    return Reference(ref, host or DEFAULT_REGISTRY, match["path"], match["tag"], match["digest"])
