"""The router's request models: the lifecycle API's inputs, defined (and documented) once, the OpenAPI document
generated from them. The exec request is the kernel's (:class:`grove.core.api.ExecBody`): the router publishes it and
forwards it, the executor enforces it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from grove.core.errors import BadRequest
from grove.core.schema import spec

DAY = 86400.0
_GROUP = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


@dataclass(frozen=True)
class NetworkModel:
    """Egress policy: ``deny`` (default) reaches no address at all; ``allow`` reaches the listed ones."""

    egress: str = spec("`deny` or `allow`", default="deny", enum=("deny", "allow"))
    allow: tuple[str, ...] = spec("with `allow`: destinations as `CIDR[:port]` (a port opens TCP and UDP; "
                                  "IPv6 as `[ADDRESS]:PORT`, knative only); none listed: every address. "
                                  "Never the host, metadata or other sandboxes",
                                  factory=tuple)
    group: str | None = spec("a private network of the project's sandboxes: every sandbox created with the same "
                             "group reaches the others on it (each gets an address in `10.232.0.0/24`, shown as "
                             "`network.address`), and no other sandbox does (local backend only)",
                             default=None, max_len=63)

    def __post_init__(self) -> None:
        if self.group is not None and not _GROUP.match(self.group):
            raise BadRequest(f"network.group {self.group!r} must be 1-63 of a-z, 0-9 and '-', starting with a "
                             "letter or digit")

    def to_dict(self) -> dict[str, Any]:
        """Every field (``dataclasses.asdict`` without the reflection)."""
        return {"egress": self.egress, "allow": list(self.allow), "group": self.group}

    def summary(self) -> dict[str, Any]:
        """The policy as the API shows it (``group`` only when there is one)."""
        return {"egress": self.egress, "allow": list(self.allow), **({"group": self.group} if self.group else {})}


@dataclass(frozen=True)
class DesktopModel:
    """A screen for GUI agents: Xvfb, a window manager and Chromium inside the sandbox, driven through
    ``POST /v1/sandboxes/{id}/computer``. Without it a sandbox still gets a 1280x800 screen at its first
    computer action; with it the router counts the memory a desktop takes when admitting the create."""

    width: int = spec("screen width in pixels (screenshots are this size: grove never scales them)", default=1280,
                      minimum=320, maximum=3840)
    height: int = spec("screen height in pixels", default=800, minimum=240, maximum=2160)
    browser: str | None = spec("a URL Chromium opens on the screen when it starts (none: no browser until asked)",
                               default=None, max_len=65536)
    start: bool = spec("start the screen (and browser) with the sandbox, so its first screenshot needs no wait "
                       "(a warm pool's desktops); else at the first computer action", default=False)
    quiet_ms: int = spec("after an input action, the screen must stay unchanged this long to count as settled",
                         default=250, minimum=0, maximum=10000)
    cap_ms: int = spec("the longest an action waits for the screen to settle", default=3000, minimum=0,
                       maximum=60000)


@dataclass(frozen=True)
class LineageModel:
    """Where a sandbox's state came from: another sandbox's trajectory at a step (recorded in its own trajectory,
    shown as a tree by the viewer)."""

    parent: str = spec("the sandbox whose trajectory this one branches from", max_len=64)
    step: int = spec("the index of the parent's step after which the state was taken", minimum=0,
                     maximum=1 << 31)
    checkpoint: str | None = spec("the checkpoint the state came from (none: rebuilt by replay)", default=None,
                                  max_len=64)
    kind: str = spec("how the state was made", default="replay", enum=("fork", "restore", "replay"))


@dataclass(frozen=True)
class Metadata:
    """What the sandbox is for; recorded in its trajectory and usable as list filters."""

    task_id: str | None = spec("the task this rollout works on", default=None, max_len=256)
    model: str | None = spec("the policy model driving the agent", default=None, max_len=256)
    harness: str | None = spec("the agent harness (e.g. mini-swe-agent)", default=None, max_len=256)
    harness_version: str | None = spec("the harness version", default=None, max_len=128)
    labels: dict[str, str] = spec("free labels, filterable with `?label=k=v`", factory=dict, max_items=64,
                                  max_len=1024)


@dataclass(frozen=True)
class CreateRequest:
    """Create a sandbox from an image."""

    image: str = spec("image name (`grove image ls`)", default="default", max_len=256)
    cpu: float = spec("CPU limit in cores", default=1.0, minimum=0.05, maximum=64)
    memory_mb: int = spec("memory limit in MiB", default=1024, minimum=16, maximum=262144)
    pids_max: int = spec("most processes and threads the sandbox's commands may have", default=512,
                         minimum=8, maximum=65536)
    disk_mb: int = spec("disk quota in MiB: how much the sandbox may write (its changes to the image); "
                        "past it, writes fail with ENOSPC inside the sandbox", default=10240, minimum=64,
                        maximum=1048576)
    # The kernel takes at most 128 KiB per `KEY=VALUE` string: a longer one would fail every exec (E2BIG).
    env: dict[str, str] = spec("environment of every command, over the image's recorded ENV (each `KEY=VALUE` "
                               "under 128 KiB, at most 1,024 variables)", factory=dict, max_items=1024,
                               max_len=128 * 1024 - 2)
    workdir: str = spec("default working directory (absolute); left out: the image's recorded WORKDIR if it has "
                        "one, else `/workspace`", default="/workspace", max_len=1024)
    network: NetworkModel = spec("egress policy", factory=NetworkModel)
    ttl_s: float = spec("lifetime: deleted this long after creation", default=6 * 3600.0, minimum=1, maximum=7 * DAY)
    idle_timeout_s: float = spec("no API call or heartbeat this long: scale to zero (files kept)", default=600.0,
                                 minimum=1, maximum=7 * DAY)
    heartbeat_timeout_s: float = spec("no API call or heartbeat this long: the client is gone, delete",
                                      default=900.0, minimum=5, maximum=7 * DAY)
    metadata: Metadata = spec("task, model, harness, labels", factory=Metadata)
    wait: bool = spec("answer once the sandbox is ready (else at once, status `pending`)", default=True)
    request_id: str | None = spec("idempotency key: a retried create returns the same sandbox", default=None,
                                  max_len=200)
    pool: str | None = spec("claim a ready sandbox from this warm pool (its image, resources and network; "
                            "an empty pool makes a fresh one)", default=None, max_len=63)
    desktop: DesktopModel | None = spec("a screen for GUI agents (see DesktopModel)", default=None)
    checkpoint: str | None = spec("start with the files of this checkpoint (`POST /v1/sandboxes/{id}/checkpoints`); "
                                  "its image and disk_mb are the checkpoint's", default=None, max_len=64)
    lineage: LineageModel | None = spec("the trajectory this sandbox branches from (see LineageModel)", default=None)

    def to_dict(self) -> dict[str, Any]:
        """Every field, nested models as dicts: ``dataclasses.asdict`` (a deep copy by reflection, 13 % of
        the event loop in a batch of claims, which write records twice each) without the reflection."""
        data = dict(vars(self))
        data["env"] = dict(self.env)
        data["network"] = self.network.to_dict()
        data["metadata"] = {**vars(self.metadata), "labels": dict(self.metadata.labels)}
        data["desktop"] = dict(vars(self.desktop)) if self.desktop is not None else None
        data["lineage"] = dict(vars(self.lineage)) if self.lineage is not None else None
        return data

    def with_request_id(self, request_id: str | None) -> CreateRequest:
        """This create with another (already checked) request id: ``dataclasses.replace`` without running
        ``__init__`` again, a sixth of its cost (a batch of 1,000 claims makes one per item)."""
        clone = object.__new__(CreateRequest)
        clone.__dict__.update(self.__dict__)
        object.__setattr__(clone, "request_id", request_id)
        return clone

    def summary(self) -> dict[str, Any]:
        """The sandbox's configuration in the one shape the API, the trajectory and the viewer all show."""
        return {
            "image": self.image,
            "resources": {"cpu": self.cpu, "memory_mb": self.memory_mb, "pids_max": self.pids_max,
                          "disk_mb": self.disk_mb},
            "network": self.network.summary(),
            "workdir": self.workdir,
            "timeouts": {"ttl_s": self.ttl_s, "idle_timeout_s": self.idle_timeout_s,
                         "heartbeat_timeout_s": self.heartbeat_timeout_s},
            # Not dataclasses.asdict (a deep copy by reflection): this runs for every answer and claim.
            "metadata": {**vars(self.metadata), "labels": dict(self.metadata.labels)},
            **({"desktop": dict(vars(self.desktop))} if self.desktop is not None else {}),
            **({"lineage": dict(vars(self.lineage))} if self.lineage is not None else {}),
        }


MAX_BATCH = 1000
"""Most sandboxes one ``POST /v1/sandboxes/batch`` may ask for (the SDK splits larger asks)."""


@dataclass(frozen=True)
class BatchCreateRequest:
    """Create many sandboxes in one call (``POST /v1/sandboxes/batch``); each item is answered on its own."""

    # Only the published shape: the handler validates each item on its own (router/api/batch.py), so one bad
    # item is that item's error, not the batch's. The limit is in prose, not `maxItems`: a fuzzer's boundary
    # case would otherwise be 1,000 sandboxes.
    sandboxes: list[CreateRequest] = spec(f"the creates, each exactly a `POST /v1/sandboxes` body, answered in this "
                                          f"order (1 to {MAX_BATCH:,} items)")
    shared: bool = spec("answer fields every sandbox has alike once, in `shared`, and each sandbox's own beside "
                        "it: a sandbox's record is `shared` updated with its item (error items are left whole). "
                        "A thousand alike claims answer in a fifth of the bytes", default=False)
    stream: bool = spec("answer in parts as the sandboxes are made (JSON lines, or msgpack objects one after "
                        "another): each part `{shared, sandboxes}` whose items carry their `index`, the last "
                        "`{done: N}`; a stream cut before it lost nothing (resend the items not answered)",
                        default=False)


@dataclass(frozen=True)
class Event:
    """One harness event: a model message, a tool call, a reward, the task's result."""

    kind: str = spec("`message`, `tool_call`, `tool_result`, `reward`, `result`, or your own", max_len=64)
    data: Any = spec("the event's content; for `result`: `{\"result\": \"pass\"|\"fail\", \"reward\": n}`",
                     default=None)


@dataclass(frozen=True)
class EventsRequest:
    """Harness events appended, in order, to the sandbox's trajectory."""

    events: list[Event] = spec("the events", factory=list)


@dataclass(frozen=True)
class Empty:
    """A body with no fields."""


@dataclass(frozen=True)
class PushRequest:
    """Files of the sandbox to store in S3 as artifacts."""

    paths: list[str] = spec("paths in the sandbox (relative ones from its workdir)")
    url_expires_s: float | None = spec("lifetime of the presigned GET URLs in the answer (default: the router's, "
                                       "1 h); `GET /v1/artifacts/{sandbox_id}/{path}?redirect=1` makes fresh ones",
                                       default=None, minimum=1, maximum=7 * DAY)


@dataclass(frozen=True)
class ArtifactQuery:
    """Which stored artifacts to list, one page at a time (every filter given must match)."""

    sandbox_id: str | None = spec("only this sandbox's", default=None, max_len=64)
    task_id: str | None = spec("only those of sandboxes with this `metadata.task_id`", default=None, max_len=256)
    run_id: str | None = spec("only those of sandboxes labelled `metadata.labels.run_id` with this value (a rollout "
                              "run)", default=None, max_len=256)
    limit: int = spec("most entries on one page", default=100, minimum=1, maximum=1000)
    page_token: str | None = spec("`next_page_token` of the previous page", default=None, max_len=2048)


@dataclass(frozen=True)
class SandboxArtifactQuery:
    """One page of a sandbox's stored artifacts."""

    limit: int = spec("most entries on one page", default=100, minimum=1, maximum=1000)
    page_token: str | None = spec("`next_page_token` of the previous page", default=None, max_len=2048)


@dataclass(frozen=True)
class FetchQuery:
    """How to answer a fetch of one artifact."""

    redirect: bool = spec("answer 307 with a fresh presigned GET URL of the object instead of its bytes",
                          default=False)
    expires_s: float | None = spec("with `redirect`: the URL's lifetime (default: the router's, 1 h)", default=None,
                                   minimum=1, maximum=7 * DAY)


@dataclass(frozen=True)
class Resources:
    """A pooled sandbox's limits (the create fields of the same names)."""

    cpu: float = spec("CPU limit in cores", default=1.0, minimum=0.05, maximum=64)
    memory_mb: int = spec("memory limit in MiB", default=1024, minimum=16, maximum=262144)
    pids_max: int = spec("most processes and threads", default=512, minimum=8, maximum=65536)
    disk_mb: int = spec("disk quota in MiB", default=10240, minimum=64, maximum=1048576)


@dataclass(frozen=True)
class PoolRequest:
    """A warm pool: ``size`` sandboxes kept started ahead of time, claimed by creates naming the pool."""

    name: str = spec("the pool's name: lower-case letters, digits and '-'", max_len=63)
    image: str = spec("image name (`grove image ls`)", default="default", max_len=256)
    resources: Resources = spec("limits of each sandbox", factory=Resources)
    network: NetworkModel = spec("egress policy of each sandbox (a claim must ask for the same)",
                                 factory=NetworkModel)
    workdir: str = spec("working directory the sandboxes start with (a claim may name another)",
                        default="/workspace", max_len=1024)
    size: int = spec("how many ready sandboxes to keep", default=1, minimum=0, maximum=10000)
    desktop: DesktopModel | None = spec("a screen for each sandbox (with `start`, up before a member is ready, "
                                        "its browser too: a claim's first screenshot waits for nothing)",
                                        default=None)

    def __post_init__(self) -> None:
        if self.network.group is not None:
            raise BadRequest("network.group: a warm pool's members cannot share a private network (every claim "
                             "would join the same group); create the group's sandboxes without a pool")


@dataclass(frozen=True)
class PoolResize:
    """A pool's new size."""

    size: int = spec("how many ready sandboxes to keep", minimum=0, maximum=10000)
