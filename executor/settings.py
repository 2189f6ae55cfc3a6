"""The executor's configuration: one typed object, built once, passed to ``create_app``."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from grove.core.api import DEFAULT_OUTPUT_BYTES, DEFAULT_TIMEOUT_S, MAX_OUTPUT_BYTES, MAX_TIMEOUT_S
from grove.core.errors import Invalid

MiB = 1024 * 1024


@dataclass(frozen=True)
class DesktopSettings:
    """The sandbox's screen (:mod:`executor.computer.desktop`): started at the first computer action, or with
    the sandbox if ``start``."""

    width: int = 1280
    """Screen width in pixels (the screenshots' too: grove never scales them)."""
    height: int = 800
    """Screen height in pixels."""
    browser: str | None = None
    """A URL Chromium opens when the display starts; None: no browser until one is asked for."""
    start: bool = False
    """Start the display (and browser) as the sandbox starts, not at the first action (a warm pool's desktops)."""
    quiet_ms: int = 250
    """After an input action, the screen must be unchanged this long to count as settled."""
    cap_ms: int = 3000
    """The longest an action waits for the screen to settle."""

    @classmethod
    def parse(cls, raw: Mapping[str, object] | None) -> DesktopSettings:
        """From the router's JSON (the create's ``desktop``); None: the defaults."""
        if not raw:
            return cls()
        known = {f: raw[f] for f in ("width", "height", "browser", "start", "quiet_ms", "cap_ms") if f in raw}
        return cls(**known)  # type: ignore[arg-type]


@dataclass(frozen=True)
class ExecutorSettings:
    """Everything the executor needs to know; nothing else is read from the environment."""

    token: str
    """Bearer token every call but ``/healthz`` must carry (compared in constant time)."""
    root: str = "/"
    """Filesystem root that API paths resolve against; "/" inside a sandbox, a directory in tests."""
    workdir: str = "/"
    """Directory (an API path, under ``root``) for relative paths and for commands without ``cwd``."""
    env: Mapping[str, str] = field(default_factory=dict)
    """The sandbox's environment; each exec's ``env`` is merged over it. Nothing else is inherited."""
    output_dir: str = "/tmp/grove-output"
    """Where the full output of a truncated command is kept (an API path, under ``root``)."""
    default_timeout_s: float = DEFAULT_TIMEOUT_S
    """Per-command timeout when a request gives none."""
    max_timeout_s: float = MAX_TIMEOUT_S
    """Largest per-command timeout a request may ask for."""
    default_max_output_bytes: int = DEFAULT_OUTPUT_BYTES
    """Per-stream output cap when a request gives none."""
    max_output_bytes_limit: int = MAX_OUTPUT_BYTES
    """Largest per-stream output cap a request may ask for."""
    max_file_bytes: int = 4096 * MiB
    """Largest file a PUT may write (413 beyond)."""
    max_archive_bytes: int = 8192 * MiB
    """Largest total of member sizes an archive PUT may extract (413 beyond)."""
    max_archive_members: int = 1_000_000
    """Most members an archive PUT may extract (413 beyond)."""
    max_request_bytes: int = 256 * MiB
    """Largest JSON/msgpack body of an exec request (stdin included)."""
    dedup_entries: int = 4096
    """How many finished ``request_id`` results are remembered for retries."""
    command_oom_score_adj: int | None = None
    """If set, every command gets this OOM score so the kernel kills it before the executor."""
    oom_control_path: str | None = None
    """A cgroup v1 ``memory.oom_control`` file whose ``oom_kill`` counter tells OOM kills apart."""
    snapshot_upload_url: str | None = None
    """The router's snapshot-upload endpoint: each snapshot (on SIGTERM and when idle) is a multipart upload
    it starts and completes, its parts PUT to presigned URLs; None: no snapshots."""
    snapshot_upload_token: str | None = None
    """This sandbox's token for that endpoint (its own snapshot key, up to its disk's worth)."""
    snapshot_get_url: str | None = None
    """Presigned GET URL of the same snapshot, restored before the executor listens."""
    snapshot_dir: str | None = None
    """The directory (an API path) that snapshots keep, made at start if missing; None: ``workdir``."""
    idle_snapshot_s: float = 0.0
    """Snapshot after this long without a request (0: only on SIGTERM)."""
    desktop: DesktopSettings = field(default_factory=DesktopSettings)
    """The sandbox's screen, for computer-use actions."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ExecutorSettings:
        """Build settings from ``GROVE_EXECUTOR_*`` variables (called by gunicorn's factory, never at import)."""
        env = os.environ if environ is None else environ
        token = env.get("GROVE_EXECUTOR_TOKEN", "")
        token_file = env.get("GROVE_EXECUTOR_TOKEN_FILE")
        if not token and token_file:
            with open(token_file, encoding="utf-8") as fh:
                token = fh.read().strip()
        if not token:
            raise Invalid("the executor needs a token: set GROVE_EXECUTOR_TOKEN or GROVE_EXECUTOR_TOKEN_FILE")
        sandbox_env: dict[str, str] = {}
        if env.get("GROVE_EXECUTOR_ENV"):
            sandbox_env = dict(json.loads(env["GROVE_EXECUTOR_ENV"]))
        else:
            sandbox_env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root"}
        kwargs: dict[str, object] = {}
        for name, conv in (
            ("default_timeout_s", float),
            ("max_timeout_s", float),
            ("default_max_output_bytes", int),
            ("max_file_bytes", int),
            ("idle_snapshot_s", float),
        ):
            raw = env.get("GROVE_EXECUTOR_" + name.upper())
            if raw:
                kwargs[name] = conv(raw)
        return cls(
            token=token,
            root=env.get("GROVE_EXECUTOR_ROOT", "/"),
            workdir=env.get("GROVE_EXECUTOR_WORKDIR", "/"),
            env=sandbox_env,
            output_dir=env.get("GROVE_EXECUTOR_OUTPUT_DIR", "/tmp/grove-output"),
            snapshot_upload_url=env.get("GROVE_EXECUTOR_SNAPSHOT_UPLOAD_URL") or None,
            snapshot_upload_token=env.get("GROVE_EXECUTOR_SNAPSHOT_UPLOAD_TOKEN") or None,
            snapshot_get_url=env.get("GROVE_EXECUTOR_SNAPSHOT_GET_URL") or None,
            snapshot_dir=env.get("GROVE_EXECUTOR_SNAPSHOT_DIR") or None,
            desktop=DesktopSettings.parse(json.loads(env["GROVE_EXECUTOR_DESKTOP"]))
            if env.get("GROVE_EXECUTOR_DESKTOP") else DesktopSettings(),
            **kwargs,  # type: ignore[arg-type]
        )
