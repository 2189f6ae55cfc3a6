"""The request models of commits and derived images: an image's config and the record of how it was built."""

from __future__ import annotations

from dataclasses import dataclass

from grove.core.schema import spec


@dataclass(frozen=True)
class ImageConfig:
    """What a Dockerfile says about how the image runs (OCI image config ``config``), recorded in ``image.json``."""

    Env: list[str] = spec("`KEY=value` entries (ENV)", factory=list, max_items=1000)
    WorkingDir: str = spec("the working directory (WORKDIR)", default="", max_len=4096)
    User: str = spec("the user commands run as (USER)", default="", max_len=256)
    Cmd: list[str] | None = spec("the default command (CMD)", default=None, max_items=1000)
    Entrypoint: list[str] | None = spec("the entrypoint (ENTRYPOINT)", default=None, max_items=1000)
    Labels: dict[str, str] = spec("labels (LABEL)", factory=dict, max_items=1000)
    ExposedPorts: list[str] = spec("ports (EXPOSE), as `PORT/PROTO`", factory=list, max_items=1000)


@dataclass(frozen=True)
class BuildRecord:
    """How an image was built, so that a trajectory's image can be built again from its record."""

    dockerfile_digest: str = spec("`sha256:` of the Dockerfile's bytes", max_len=80)
    base: str = spec("the FROM image as the Dockerfile names it (after build arguments)", max_len=512)
    base_digest: str = spec("the digest of that base image when the build ran", max_len=80)
    build_args: dict[str, str] = spec("the build arguments given", factory=dict, max_items=1000, max_len=65536)
    step: str = spec("the instruction this image is the result of, `line N: ...` (a build step's cache image)",
                     default="", max_len=65536)


@dataclass(frozen=True)
class CommitRequest:
    """``POST /v1/sandboxes/{id}/commit``: the sandbox's writable layer, now, as a named image."""

    image: str = spec("the new image's name (an existing one is replaced; sandboxes made from it keep theirs)",
                      max_len=512)
    config: ImageConfig | None = spec("the image's config to record", default=None)
    build: BuildRecord | None = spec("how it was built (set by `grove image build`)", default=None)


@dataclass(frozen=True)
class DeriveRequest:
    """``POST /v1/images/{name}``: a new name for an image's layers, with its own config and build record."""

    source: str = spec("the image whose layers the new one has", max_len=512)
    config: ImageConfig | None = spec("the image's config to record", default=None)
    build: BuildRecord | None = spec("how it was built (set by `grove image build`)", default=None)
