"""The router's configuration: one typed object built by the CLI (or a test) and passed to ``create_app``."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from artifacts.s3config import S3Config
from grove.core.errors import Invalid
from grove.statedir import StateDir
from router.backends.knative.options import KnativeOptions
from router.backends.local.unpack_limits import UnpackLimits
from router.shards.config import ShardConfig


@dataclass(frozen=True)
class RouterSettings:
    """Everything the router needs; nothing is read from the environment after this is built."""

    state_dir: Path
    """Records, API keys, images, the runtime bundle and the sandboxes' files live here."""
    api_keys: tuple[str, ...]
    """Accepted API keys (``Authorization: Bearer <key>`` on every call but ``/healthz``)."""
    host: str = "127.0.0.1"
    """Address to listen on."""
    port: int = 8470
    """Port to listen on (0: any free port)."""
    backend: str = "local"
    """Which backend makes sandboxes: ``local`` or ``knative``."""
    reap_interval_s: float = 1.0
    """How often TTL, heartbeat and idle timeouts are checked."""
    max_body_bytes: int = 16 * 1024 * 1024
    """Largest lifecycle request body (an exec body has its own cap, ``router.api.datapath.MAX_EXEC_BODY``, for
    its stdin; file and archive bodies are streamed, capped by the executor)."""
    max_sandboxes: int = 5000
    """Most live sandboxes at once (503 with Retry-After beyond)."""
    memory_reserve_mb: float | None = None
    """Local backend: memory the host keeps for itself; a create is admitted only while the host's available
    memory, less what the starts in flight take, stays above it (None: 5 % of the host's, at least 1 GiB)."""
    disk_reserve_mb: float | None = None
    """Local backend: free space the state dir's file system keeps (None: 5 % of it, at least 2 GiB)."""
    full_output_bytes_per_s: float = 8 * 1024 * 1024
    """Pace at which the full outputs of truncated commands are stored, all sandboxes together: storing
    costs host CPU outside the sandboxes' quotas (see ``router/trajectory/outflow.py``)."""
    full_output_burst_bytes: int = 64 * 1024 * 1024
    """Full output stored at once before that pace applies."""
    artifact_retention_days: int | None = None
    """Days S3 keeps artifacts (pushed files, truncated commands' full outputs, their index entries): a
    lifecycle rule set when the router starts. 0 removes grove's rule (kept for ever); None leaves the
    bucket's rules alone."""
    trajectory_retention_days: int | None = None
    """The same for trajectory records and their index entries (their own rule: usually longer, or none)."""
    gc_interval_h: float = 6.0
    """Hours between the router's own collection passes: what is past its project's ``retention_days`` and
    owned by nothing live, and image layers nothing uses (:mod:`router.housekeeping`); 0: never."""
    screenshot_mb: float = 256.0
    """Most screenshot bytes one trajectory stores (distinct images, full size and thumbnail): past it a computer
    step still answers with its screen, and records the image's hash and size without storing it."""
    artifact_url_expires_s: float = 3600.0
    """Lifetime of the presigned GET URLs the router hands out (after a push, and for ``?redirect=1``)."""
    header_timeout_s: float = 30.0
    """A new connection must send its first request's complete headers within this (slowloris)."""
    idle_timeout_s: float = 75.0
    """A kept-alive connection with no complete request for this long is closed."""
    body_timeout_s: float = 60.0
    """Longest wait for the next chunk of a request body the router reads itself (408 past it)."""
    max_connections: int = 4096
    """Most client connections at once (lowered to fit the process's descriptor limit). Past it the oldest
    one still without a request is closed to make room, or the newcomer gets 503 with Retry-After."""
    s3: S3Config | None = None
    """Object storage for trajectories and artifacts; None starts an embedded S3 server on loopback."""
    knative: KnativeOptions | None = None
    """The ``knative`` backend's options (namespace, cluster credentials, runtime image, ...)."""
    pull_missing: bool = False
    """Local backend: a create naming a registry reference the store lacks pulls it first (404 or 502
    naming the registry's answer when that fails). Off by default: a create never reaches out unasked."""
    insecure_registries: tuple[str, ...] = ()
    """Registries (``host:port``) such pulls may reach over plain HTTP (a registry on loopback)."""
    image_limits: UnpackLimits = dataclasses.field(default_factory=UnpackLimits)
    """Local backend: how large such a pull may unpack (per layer, per image)."""
    ports_port: int = 0
    """The listener that serves sandboxes' ports by host name, ``{id}-{port}.<ports_domain>``, on ``host`` (an
    origin apart from the API and viewer: a sandbox's page never shares theirs); 0: any free port."""
    ports_domain: str = "localhost"
    """The domain under which those host names are served (``*.localhost`` reaches loopback in browsers)."""
    shards: ShardConfig = dataclasses.field(default_factory=ShardConfig)
    """This router's shard, its peers and their shared secret (the default: the only router)."""

    @property
    def layout(self) -> StateDir:
        """Paths inside the state dir."""
        return StateDir(self.state_dir)

    def with_env(self, env: Mapping[str, str]) -> RouterSettings:
        """These settings with the connection limits named in ``GROVE_ROUTER_<FIELD>`` (e.g.
        ``GROVE_ROUTER_HEADER_TIMEOUT_S=5``), for operators and tests; the CLI calls this at start."""
        changed: dict[str, Any] = {}
        for name in ("header_timeout_s", "idle_timeout_s", "body_timeout_s", "max_connections", "reap_interval_s"):
            if (raw := env.get(f"GROVE_ROUTER_{name.upper()}")) is not None:
                kind = int if name == "max_connections" else float
                try:
                    changed[name] = kind(raw)
                except ValueError as exc:
                    raise Invalid(f"GROVE_ROUTER_{name.upper()}={raw!r} is not a number") from exc
                if changed[name] <= 0:
                    raise Invalid(f"GROVE_ROUTER_{name.upper()} must be > 0, got {raw!r}")
        return dataclasses.replace(self, **changed)
